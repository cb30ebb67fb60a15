// [cuda] The CUDA backend's core primitives against the CPU backend: transfers, converting
// strided copies, fill, accumulate, sum over broadcast dims, allocator counters.
#include <catch2/catch.hpp>

#include "ops/ops.h"

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
