// [cuda] The CUDA backend's core primitives against the CPU backend: transfers, converting
// strided copies, fill, accumulate, sum over broadcast dims, allocator counters.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/work_log.h"
#include "ops/ops.h"
#include "tests/cuda/cuda_test_support.h"

using namespace engine;

namespace {
const Device kGpu = Device::cuda(0);
}

TEST_CASE("host <-> device round trip in every dtype", "[cuda]") {
  Generator g(3);
  Tensor x = Tensor::randn({3, 5, 7}, g, 0, 1, DType::f64);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    INFO(dtype_name(dt));
    Tensor h = x.to(dt);
    Tensor d = h.to(kGpu);
    REQUIRE(d.device() == kGpu);
    REQUIRE(d.to(Device::cpu()).to_vector<double>() == h.to_vector<double>());
    // Conversions on the device agree with the CPU's (same rounding rules).
    REQUIRE(x.to(kGpu).to(dt).to_vector<double>() == h.to_vector<double>());
  }
}

TEST_CASE("strided views, fill, add_ and sum_to agree with the CPU", "[cuda]") {
  Generator g(4);
  Tensor x = Tensor::randn({4, 6, 5}, g, 0, 1, DType::f32);
  Tensor d = x.to(kGpu);
  REQUIRE(d.transpose(0, 2).contiguous().to_vector<float>() ==
          x.transpose(0, 2).contiguous().to_vector<float>());
  REQUIRE(d.slice(1, 1, 6, 2).contiguous().to_vector<float>() ==
          x.slice(1, 1, 6, 2).contiguous().to_vector<float>());
  Tensor row = Tensor::randn({5}, g);
  Tensor xc = x.clone(), dc = d.clone();
  xc.add_(row, 0.5);
  dc.add_(row.to(kGpu), 0.5);
  REQUIRE(dc.to_vector<float>() == xc.to_vector<float>());
  dc.slice(2, 0, 2).fill_(3.0);
  xc.slice(2, 0, 2).fill_(3.0);
  REQUIRE(dc.to_vector<float>() == xc.to_vector<float>());
  for (Shape to : {Shape{5}, Shape{4, 1, 5}, Shape{6, 1}, Shape{}}) {
    Tensor a = Tensor::empty(to, DType::f32), b = Tensor::empty(to, DType::f32, kGpu);
    backend(DeviceType::CPU).sum_to(x, a);
    backend(DeviceType::CUDA).sum_to(d, b);
    std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
    for (size_t i = 0; i < av.size(); ++i) REQUIRE(bv[i] == Approx(av[i]).epsilon(1e-6));
  }
}

namespace {
// sum_to of view(base) to `to` on both backends (the same view of the same values): the GPU's
// result within f32 tolerance of the CPU's (its order differs), its reruns bit for bit the same.
void check_sum_to(const Tensor& base, const std::function<Tensor(const Tensor&)>& view,
                  const Shape& to, const std::string& what) {
  const DType dt = base.dtype();
  const DType ct = dt == DType::bf16 || dt == DType::f16 ? DType::f32 : dt;
  const Tensor src = view(base.to(ct)), dev = view(base.to(kGpu));
  INFO(what << ": " << describe(dev) << " -> " << shape_str(to));
  Tensor a = Tensor::empty(to, ct);
  backend(DeviceType::CPU).sum_to(src, a);
  Tensor b = Tensor::empty(to, dt, kGpu), b2 = Tensor::empty(to, dt, kGpu);
  backend(DeviceType::CUDA).sum_to(dev, b);
  backend(DeviceType::CUDA).sum_to(dev, b2);
  const double rel = ct == dt ? (dt == DType::f64 ? 1e-12 : 1e-5) : 1e-2;
  if (is_floating(dt)) {
    testing::require_close(b, a, rel, rel, rel);
  } else {
    REQUIRE(b.to(Device::cpu()).to_vector<double>() == a.to_vector<double>());
  }
  testing::require_equal(b2, b);  // deterministic
}
void check_sum_to(const Tensor& src, const Shape& to, const std::string& what) {
  check_sum_to(
      src, [](const Tensor& t) { return t; }, to, what);
}
}  // namespace

TEST_CASE("sum_to: every reduction shape of the model, fast paths and fallbacks", "[cuda]") {
  Generator g(41);
  auto rnd = [&](const Shape& s, DType dt = DType::f32) { return Tensor::randn(s, g).to(dt); };
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    const std::string d(dtype_name(dt));
    // bias gradients: rows reduced, the contiguous dim kept (16-byte loads; odd widths scalar;
    // many rows: several chunks and the second pass)
    check_sum_to(rnd({4, 7, 768}, dt), {768}, d + " bias");
    check_sum_to(rnd({3000, 40}, dt), {40}, d + " bias, many rows");
    check_sum_to(rnd({257, 13}, dt), {13}, d + " bias, odd width");
    check_sum_to(rnd({5, 3, 16}, dt), {3, 16}, d + " leading dim");
    // the positional bias's gradient over the batch: (B, H, T, T) -> (1, H, T, T)
    check_sum_to(rnd({3, 2, 12, 12}, dt), {1, 2, 12, 12}, d + " batch");
    // [CLS] reset thetas: (H, T, T) -> (H, 1, 1); full sums, long and short
    check_sum_to(rnd({3, 40, 40}, dt), {3, 1, 1}, d + " per head");
    check_sum_to(rnd({70001}, dt), {}, d + " full, long");
    check_sum_to(rnd({5}, dt), {1}, d + " full, short");
    check_sum_to(rnd({2, 3, 8, 8}, dt), {1, 3, 1, 1}, d + " outer and inner reduced");
    check_sum_to(rnd({4, 6, 5}, dt), {4, 1, 5}, d + " middle dim");
    check_sum_to(rnd({4, 6, 8}, dt), {6, 1}, d + " kept dim between reduced ones");
    // no contiguous innermost dim, misaligned views, nothing reduced, one element
    check_sum_to(
        rnd({16, 24}, dt), [](const Tensor& t) { return t.transpose(0, 1); }, {24, 1},
        d + " transposed, rows");
    check_sum_to(
        rnd({16, 24}, dt), [](const Tensor& t) { return t.transpose(0, 1); }, {16},
        d + " transposed, columns");
    check_sum_to(
        rnd({9, 33}, dt), [](const Tensor& t) { return t.slice(1, 1, 33); }, {32},
        d + " misaligned columns");
    check_sum_to(
        rnd({9, 33}, dt), [](const Tensor& t) { return t.slice(1, 1, 33); }, {9, 1},
        d + " misaligned rows");
    check_sum_to(rnd({1, 6, 1}, dt), {6, 1}, d + " size-1 dims only");
    check_sum_to(rnd({1, 1}, dt), {1}, d + " one element");
  }
  check_sum_to(Tensor::randn({50, 30}, g).to(DType::i32), {30}, "i32 columns");
  check_sum_to(Tensor::randn({50, 30}, g).to(DType::i64), {50, 1}, "i64 rows");
  // Empty: the sum over no elements is 0.
  Tensor e = Tensor::empty({0, 4}, DType::f32, kGpu),
         out = Tensor::full({4}, 7.0, DType::f32, kGpu);
  backend(DeviceType::CUDA).sum_to(e, out);
  REQUIRE(out.to(Device::cpu()).to_vector<float>() == std::vector<float>(4, 0.f));
}

TEST_CASE("layout kernels: 16-byte strided copies, conversions, fills, adds against the CPU",
          "[cuda]") {
  Generator g(43);
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::u8}) {
    INFO(dtype_name(dt));
    Tensor x = Tensor::randn({3, 5, 4, 16}, g, 0, 4).to(dt);
    Tensor d = x.to(kGpu);
    // the heads' split: innermost contiguous both sides, 16-byte units
    testing::require_equal(d.permute({0, 2, 1, 3}).contiguous(),
                           x.permute({0, 2, 1, 3}).contiguous());
    // innermost not contiguous in the source: element by element
    testing::require_equal(d.permute({3, 1, 0, 2}).contiguous(),
                           x.permute({3, 1, 0, 2}).contiguous());
    // a misaligned slice: element by element
    testing::require_equal(d.slice(3, 1, 9).contiguous(), x.slice(3, 1, 9).contiguous());
    // contiguous conversions, both ways
    for (DType to : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64}) {
      INFO("to " << dtype_name(to));
      testing::require_equal(d.to(to), x.to(to));
      testing::require_equal(d.slice(1, 1, 4).to(to), x.slice(1, 1, 4).to(to));
    }
    // fill and add_, contiguous and strided
    Tensor xc = x.clone(), dc = d.clone();
    xc.slice(2, 1, 3).fill_(2.0);
    dc.slice(2, 1, 3).fill_(2.0);
    testing::require_equal(dc, xc);
    xc.fill_(-3.0);
    dc.fill_(-3.0);
    testing::require_equal(dc, xc);
  }
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4096 + 3}}) {
    Tensor a = Tensor::randn({n}, g), b = Tensor::randn({n}, g);
    Tensor da = a.to(kGpu);
    a.add_(b, -0.75);
    da.add_(b.to(kGpu), -0.75);
    // alpha * b + a: one rounding or two (an FMA where both compilers contract alike)
    testing::require_close(da, a, 1e-6, 1e-7);
  }
}

TEST_CASE("add_ of a bf16 / f16 gradient into an f32 .grad: convert-then-add's bits", "[cuda]") {
  Generator g(44);
  for (DType half : {DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{768}, int64_t{4096 + 3}}) {
      INFO(dtype_name(half) << ", " << n << " elements");
      const Tensor d = Tensor::randn({n}, g), s = Tensor::randn({n}, g).to(half);
      Tensor want = d.clone();
      want.add_(s.to(DType::f32));
      Tensor cpu = d.clone(), gpu = d.to(kGpu);
      backend(DeviceType::CPU).add_(cpu, s, 1.0);
      backend(DeviceType::CUDA).add_(gpu, s.to(kGpu), 1.0);
      {
        INFO("the CPU backend");
        testing::require_equal(cpu, want);
      }
      INFO("the CUDA backend");
      testing::require_equal(gpu, want);
    }
  }
}

TEST_CASE("slices' gradients on the device are added into their input's gradient in place",
          "[cuda]") {
  // Several slices of one non-leaf tensor (TUPE's projected positions: the T positions and the
  // [CLS] rows): the first slice's backward makes the zero-filled whole, the others add into it
  // (Node::grad_sink): one fill, no copy of the whole; the gradient equals the CPU's.
  Generator g(61);
  const Tensor x0 = Tensor::randn({3, 10, 4}, g);
  const Tensor w0 = Tensor::randn({3, 8, 4}, g), w1 = Tensor::randn({3, 1, 4}, g),
               w2 = Tensor::randn({3, 5, 4}, g);
  std::vector<Tensor> grads;
  for (Device dev : {Device::cpu(), kGpu}) {
    Tensor leaf = (dev.is_cpu() ? x0.clone() : x0.to(dev)).set_requires_grad();
    const Tensor x = leaf * 2.0;  // a non-leaf
    const Tensor loss = sum(x.slice(1, 0, 8) * w0.to(dev)) + sum(x.slice(1, 8, 9) * w1.to(dev)) +
                        sum(x.slice(1, 1, 10, 2) * w2.to(dev));  // overlapping, strided
    start_work_recording();
    loss.backward();
    int fills = 0, adds = 0;
    for (const WorkRecord& r : stop_work_recording()) {
      fills += r.op == "fill" && r.shape == "(3, 10, 4) f32";
      adds += r.op == "add_" && r.shape.rfind("(3, 10, 4) f32", 0) == 0;
    }
    if (!dev.is_cpu()) {
      CHECK(fills == 1);  // the first slice's whole; the others add their slices
      CHECK(adds == 0);   // no add of a whole tensor
    }
    grads.push_back(leaf.grad());
  }
  engine::testing::require_close(grads[1], grads[0], 1e-6, 1e-6);
}

TEST_CASE("the device allocator counts live and peak bytes", "[cuda]") {
  Allocator& a = allocator_for(kGpu);
  int64_t live0 = a.stats().live_bytes;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::f32, kGpu);
    REQUIRE(a.stats().live_bytes >= live0 + (4 << 20));
  }
  REQUIRE(a.stats().live_bytes == live0);
  REQUIRE(a.stats().peak_bytes >= live0 + (4 << 20));
}

TEST_CASE("mixing devices is an error naming both tensors", "[cuda][errors]") {
  using Catch::Contains;
  Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({2, 3}, DType::f32, kGpu);
  REQUIRE_THROWS_WITH(a + b,
                      Contains("[add] inputs are on different devices") && Contains("cuda:0"));
  REQUIRE_THROWS_WITH(a.add_(b), Contains("[add_]") && Contains("different devices"));
  REQUIRE_THROWS_WITH(matmul(a, b.transpose(0, 1)),
                      Contains("[matmul]") && Contains("different devices"));
  REQUIRE_THROWS_WITH(Tensor::zeros({2}, DType::f32, Device::cuda(999)),
                      Contains("cuda:999 does not exist"));
}
