// [cuda] The shared kernel helpers (engine/cuda/kernels.cuh) against host arithmetic: warp and
// block reductions (sum, max, Welford) for every block size a kernel may use, and the
// vectorised elementwise launcher on aligned and misaligned operands with ragged tails.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/strided.cuh"
#include "ops/ops.h"

using namespace engine;
using namespace engine::cuda;

namespace {

const Device kGpu = Device::cuda(0);

// One block per row: out[row] = {sum, max, mean, variance (population), same} of x[row, :cols].
__global__ void row_stats(const float* x, int64_t cols, float* out) {
  const float* r = x + blockIdx.x * cols;
  float s = 0.f, m = -INFINITY;
  WelfordStat w;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    s += r[c];
    m = max_nan(m, r[c]);
    welford_add(w, r[c]);
  }
  s = block_sum(s);
  m = block_max(m, -INFINITY);
  w = block_welford(w);
  // Every thread must hold the same results: the last thread writes them, thread 0 compares.
  if (threadIdx.x == blockDim.x - 1) {
    out[blockIdx.x * 5 + 0] = s;
    out[blockIdx.x * 5 + 1] = m;
    out[blockIdx.x * 5 + 2] = w.mean;
    out[blockIdx.x * 5 + 3] = w.count > 0 ? w.m2 / w.count : 0.f;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    out[blockIdx.x * 5 + 4] =
        (out[blockIdx.x * 5 + 0] == s && out[blockIdx.x * 5 + 2] == w.mean) ? 1.f : 0.f;
}

__global__ void warp_sums(const float* x, float* out) {
  const float v = warp_sum(x[threadIdx.x]);
  out[threadIdx.x] = v;
}

struct Fma {
  float k;
  __device__ float operator()(float a, float b) const { return a * b + k; }
};

}  // namespace

TEST_CASE("block_sum, block_max and block_welford for every block size", "[cuda]") {
  Generator g(11);
  for (int threads : {32, 64, 96, 256, 1024}) {
    for (int64_t cols : {1, 31, 33, 1000, 5000}) {
      INFO("threads " << threads << " cols " << cols);
      const int rows = 3;
      Tensor x = Tensor::randn({rows, cols}, g, 0.5, 2.0, DType::f32);
      Tensor out = Tensor::zeros({rows, 5}, DType::f32, kGpu);
      Tensor dx = x.to(kGpu);
      ENGINE_LAUNCH(row_stats, (LaunchConfig{dim3(rows), dim3(threads), 0, compute_stream(0)}),
                    dx.data<float>(), cols, out.data<float>());
      std::vector<float> o = out.to_vector<float>(), h = x.to_vector<float>();
      for (int r = 0; r < rows; ++r) {
        double s = 0, m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) {
          s += h[r * cols + c];
          m = std::max<double>(m, h[r * cols + c]);
        }
        const double mean = s / cols;
        double var = 0;
        for (int64_t c = 0; c < cols; ++c)
          var += (h[r * cols + c] - mean) * (h[r * cols + c] - mean);
        var /= cols;
        CHECK(o[r * 5 + 0] == Approx(s).epsilon(1e-5).margin(1e-4));
        CHECK(o[r * 5 + 1] == static_cast<float>(m));
        CHECK(o[r * 5 + 2] == Approx(mean).epsilon(1e-5).margin(1e-5));
        CHECK(o[r * 5 + 3] == Approx(var).epsilon(1e-4).margin(1e-6));
        CHECK(o[r * 5 + 4] == 1.f);  // thread 0 and the last thread got the same bits
      }
    }
  }
}

TEST_CASE("warp_sum gives every lane the same total", "[cuda]") {
  std::vector<float> h(32);
  for (int i = 0; i < 32; ++i) h[i] = 0.1f * static_cast<float>(i * i % 7) - 0.3f;
  Tensor x = Tensor::from_vector(h, {32}).to(kGpu);
  Tensor out = Tensor::zeros({32}, DType::f32, kGpu);
  ENGINE_LAUNCH(warp_sums, (LaunchConfig{dim3(1), dim3(32), 0, compute_stream(0)}), x.data<float>(),
                out.data<float>());
  std::vector<float> o = out.to_vector<float>();
  double s = 0;
  for (float v : h) s += v;
  for (int i = 0; i < 32; ++i) {
    CHECK(o[i] == o[0]);
    CHECK(o[i] == Approx(s).margin(1e-5));
  }
}

TEST_CASE("block_max propagates NaN", "[cuda]") {
  std::vector<float> h(100, 1.f);
  h[57] = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector(h, {1, 100}).to(kGpu);
  Tensor out = Tensor::zeros({1, 5}, DType::f32, kGpu);
  ENGINE_LAUNCH(row_stats, (LaunchConfig{dim3(1), dim3(64), 0, compute_stream(0)}), x.data<float>(),
                int64_t{100}, out.data<float>());
  CHECK(std::isnan(out.to_vector<float>()[1]));
}

TEST_CASE("launch_elementwise: aligned, misaligned, ragged tails, bf16", "[cuda]") {
  using B = __nv_bfloat16;
  Generator g(12);
  for (int64_t n : {0, 1, 7, 8, 9, 1031, 70000}) {
    for (int64_t offset : {0, 1, 3}) {
      INFO("n " << n << " offset " << offset);
      Tensor a = Tensor::randn({n + offset}, g), b = Tensor::randn({n + offset}, g);
      Tensor da = a.to(kGpu), db = b.to(kGpu);
      Tensor dy = Tensor::zeros({n + offset}, DType::f32, kGpu);
      launch_elementwise("fma_test", n, compute_stream(0), Fma{0.25f}, dy.data<float>() + offset,
                         static_cast<const float*>(da.data<float>() + offset),
                         static_cast<const float*>(db.data<float>() + offset));
      std::vector<float> y = dy.to_vector<float>(), av = a.to_vector<float>(),
                         bv = b.to_vector<float>();
      for (int64_t i = 0; i < offset; ++i) REQUIRE(y[i] == 0.f);  // not written
      // a * b + 0.25 in device code is one FMA (nvcc contracts it; the emulation build too).
      for (int64_t i = offset; i < n + offset; ++i) REQUIRE(y[i] == std::fma(av[i], bv[i], 0.25f));
      // bf16 operands: computed in f32, rounded once.
      Tensor ha = a.to(DType::bf16), hb = b.to(DType::bf16);
      Tensor da16 = ha.to(kGpu), db16 = hb.to(kGpu);
      Tensor dy16 = Tensor::zeros({n + offset}, DType::bf16, kGpu);
      launch_elementwise("fma_test_bf16", n, compute_stream(0), Fma{0.25f},
                         static_cast<B*>(dy16.raw_data()) + offset,
                         static_cast<const B*>(da16.raw_data()) + offset,
                         static_cast<const B*>(db16.raw_data()) + offset);
      std::vector<float> y16 = dy16.to(DType::f32).to_vector<float>(),
                         a16 = ha.to(DType::f32).to_vector<float>(),
                         b16 = hb.to(DType::f32).to_vector<float>();
      std::vector<float> want(n + offset, 0.f);
      for (int64_t i = offset; i < n + offset; ++i) want[i] = std::fma(a16[i], b16[i], 0.25f);
      std::vector<float> want16 =
          Tensor::from_vector(want, {n + offset}).to(DType::bf16).to(DType::f32).to_vector<float>();
      for (int64_t i = 0; i < n + offset; ++i) REQUIRE(y16[i] == want16[i]);
      // Mixed operand types (f32 and bf16 in, f32 out): each read as its own type.
      Tensor dym = Tensor::zeros({n + offset}, DType::f32, kGpu);
      launch_elementwise("fma_test_mixed", n, compute_stream(0), Fma{0.25f},
                         dym.data<float>() + offset,
                         static_cast<const float*>(da.data<float>() + offset),
                         static_cast<const B*>(db16.raw_data()) + offset);
      std::vector<float> ym = dym.to_vector<float>();
      for (int64_t i = offset; i < n + offset; ++i)
        REQUIRE(ym[i] == std::fma(av[i], b16[i], 0.25f));
    }
  }
}

namespace {
// y[0] = a * b + c and y[1] = mul_rn(a, b) + c, as written in device code.
template <class T>
__global__ void contract_probe(const T* in, T* y) {
  y[0] = in[0] * in[1] + in[2];
  y[1] = dmath::mul_rn(in[0], in[1]) + in[2];
}
}  // namespace

TEST_CASE("a * b + c in device code is one FMA, as nvcc contracts it, mul_rn is not", "[cuda]") {
  // (1 + e)(1 + e) - (1 + 2e) is e^2 with one rounding and 0 when the product rounds first.
  auto run = [](auto one) {
    using T = decltype(one);
    const T e = std::ldexp(T(1), std::is_same_v<T, double> ? -27 : -13);
    Tensor in = Tensor::from_vector(std::vector<T>{1 + e, 1 + e, -(1 + 2 * e)}, {3}).to(kGpu);
    Tensor y = Tensor::zeros({2}, std::is_same_v<T, double> ? DType::f64 : DType::f32, kGpu);
    ENGINE_LAUNCH(contract_probe<T>, (LaunchConfig{dim3(1), dim3(1), 0, compute_stream(0)}),
                  static_cast<const T*>(in.template data<T>()), y.template data<T>());
    const std::vector<T> got = y.to(Device::cpu()).template to_vector<T>();
    INFO(sizeof(T) * 8 << "-bit: a * b + c = " << got[0] << ", mul_rn(a, b) + c = " << got[1]);
    REQUIRE(got[0] == e * e);  // contracted, like nvcc's -fmad=true
    REQUIRE(got[1] == T(0));   // the product rounded on its own
  };
  run(1.0f);
  run(1.0);
}

TEST_CASE("FastDiv divides exactly below 2^31", "[cuda]") {
  uint64_t x = 88172645463325252ull;
  auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  for (uint32_t d : {1u, 2u, 3u, 7u, 12u, 64u, 100u, 768u, 4095u, 65536u, 1000003u, 2147483647u}) {
    const FastDiv f(d);
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2147483647u, 2147483646u})
      if (n < 2147483648u) REQUIRE(f.div(n) == n / d);
    for (int i = 0; i < 20000; ++i) {
      const uint32_t n = static_cast<uint32_t>(next() & 0x7fffffffu);
      REQUIRE(f.div(n) == n / d);
    }
  }
}
