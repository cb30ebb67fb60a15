// [cuda] Tensor cores through the WMMA API (engine/cuda/wmma.cuh): a tiled GEMM of 16 x 16 x 16
// warp products against the host's product of the same 16-bit inputs, for bf16 and f16, B stored
// row- or column-major, an accumulator loaded column-major and scaled elementwise before it is
// stored. Under nvcc the GPU's tensor cores; in build-emu the emulator's wmma (emu/wmma.h), whose
// fragment layouts are its own: a kernel that depended on a layout would fail here.
#include <catch2/catch.hpp>

#include <vector>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/wmma.cuh"
#include "ops/ops.h"

using namespace engine;
using namespace engine::cuda;

namespace {

const Device kGpu = Device::cuda(0);
constexpr int kWarps = 2;  // warps (output tiles) a block

// C (m x n, row-major) = alpha A B + beta C0, C0 stored column-major (ld m); A (m x k) row-major;
// B (k x n) row-major (ld n) or column-major (ld k). Every dimension a multiple of 16; a warp per
// 16 x 16 output tile.
template <class T, class LayoutB>
__global__ void wmma_gemm(const T* a, const T* b, const float* c0, float* c, int m, int n, int k,
                          float alpha, float beta) {
  const int tile = blockIdx.x * kWarps + threadIdx.x / kWarpSize;
  const int tiles_n = n / 16;
  if (tile >= (m / 16) * tiles_n) return;  // the whole warp
  const int i0 = tile / tiles_n * 16, j0 = tile % tiles_n * 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc, prior;
  wmma::fill_fragment(acc, 0.0f);
  for (int p = 0; p < k; p += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
    wmma::load_matrix_sync(fa, a + size_t(i0) * k + p, k);
    if constexpr (std::is_same_v<LayoutB, wmma::row_major>)
      wmma::load_matrix_sync(fb, b + size_t(p) * n + j0, n);
    else
      wmma::load_matrix_sync(fb, b + size_t(j0) * k + p, k);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::load_matrix_sync(prior, c0 + size_t(j0) * m + i0, m, wmma::mem_col_major);
  for (int e = 0; e < acc.num_elements; ++e) acc.x[e] = alpha * acc.x[e] + beta * prior.x[e];
  wmma::store_matrix_sync(c + size_t(i0) * n + j0, acc, n, wmma::mem_row_major);
}

template <class T>
void check_gemm(DType dt, bool b_col_major) {
  const int m = 48, n = 32, k = 64;
  Generator g(61);
  // Values rounded to the 16-bit type first: the host product of the same inputs.
  const Tensor a = Tensor::randn({m, k}, g).to(dt), b = Tensor::randn({k, n}, g).to(dt);
  const Tensor c0 = Tensor::randn({n, m}, g);  // C0^T row-major = C0 column-major
  const Tensor b_stored = b_col_major ? b.transpose(0, 1).contiguous() : b;
  Tensor c = Tensor::zeros({m, n}, DType::f32, kGpu);
  const Tensor da = a.to(kGpu), db = b_stored.to(kGpu), dc0 = c0.to(kGpu);
  const float alpha = 0.5f, beta = -2.0f;
  const LaunchConfig cfg{dim3((m / 16) * (n / 16) / kWarps), dim3(kWarps * kWarpSize), 0,
                         compute_stream(0)};
  if (b_col_major)
    ENGINE_LAUNCH((wmma_gemm<T, wmma::col_major>), cfg, dptr<const T>(da), dptr<const T>(db),
                  dc0.data<float>(), c.data<float>(), m, n, k, alpha, beta);
  else
    ENGINE_LAUNCH((wmma_gemm<T, wmma::row_major>), cfg, dptr<const T>(da), dptr<const T>(db),
                  dc0.data<float>(), c.data<float>(), m, n, k, alpha, beta);
  const std::vector<double> ha = a.to(DType::f64).to_vector<double>(),
                            hb = b.to(DType::f64).to_vector<double>(),
                            hc0 = c0.to(DType::f64).to_vector<double>();
  const std::vector<float> got = c.to(Device::cpu()).to_vector<float>();
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += ha[size_t(i) * k + p] * hb[size_t(p) * n + j];
      const double want = alpha * s + beta * hc0[size_t(j) * m + i];
      INFO("C[" << i << ", " << j << "]");
      REQUIRE(got[size_t(i) * n + j] == Approx(want).epsilon(1e-5).margin(1e-4));
    }
}

}  // namespace

TEST_CASE("wmma m16n16k16 GEMM tiles match the host product", "[cuda]") {
  for (bool col : {false, true}) {
    INFO("B column-major " << col);
    check_gemm<__nv_bfloat16>(DType::bf16, col);
    check_gemm<__half>(DType::f16, col);
  }
}
