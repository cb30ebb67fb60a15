// [cuda] The caching allocator: size classes, reuse without cudaMalloc in steady state (100 steps
// of a training-like loop make no driver allocation after the first), blocks used on another
// stream held back until that stream passes them, and out-of-memory as one clear error.
#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/cuda/allocator.h"
#include "ops/ops.h"

using namespace engine;

namespace {
const Device kGpu = Device::cuda(0);

// One "step": activations of varying sizes allocated and freed in a pattern, as forward and
// backward do.
float step(const Tensor& w, Generator& g, int i) {
  Tensor x = Tensor::randn({32 + (i % 3) * 8, 64}, g).to(kGpu);
  Tensor h = x.clone();
  h.add_(w.slice(0, 0, x.shape()[0]), 0.5);
  Tensor s = Tensor::empty({64}, DType::f32, kGpu);
  backend(DeviceType::CUDA).sum_to(h, s);
  Tensor big = Tensor::empty({3 << 18}, DType::f32, kGpu);  // 3 MiB: a large size class
  big.slice(0, 0, 1024).fill_(1.0);  // used, on the stream (filling it all costs 0.8M threads)
  return s.to(Device::cpu()).to_vector<float>()[0];
}
}  // namespace

TEST_CASE("100 steps of a loop: no driver allocation after the first step", "[cuda]") {
  Allocator& a = allocator_for(kGpu);
  Generator g(5);
  Tensor w = Tensor::randn({64, 64}, g).to(kGpu);
  step(w, g, 0);
  step(w, g, 1);
  step(w, g, 2);  // the first step's cycle of shapes
  const AllocatorStats warm = a.stats();
  for (int i = 3; i < 103; ++i) step(w, g, i);
  const AllocatorStats after = a.stats();
  INFO("driver allocations " << warm.driver_allocs << " -> " << after.driver_allocs << ", served "
                             << warm.num_allocs << " -> " << after.num_allocs);
  REQUIRE(after.num_allocs >= warm.num_allocs + 400);
  REQUIRE(after.driver_allocs == warm.driver_allocs);
  REQUIRE(after.reserved_bytes == warm.reserved_bytes);
  REQUIRE(after.live_bytes == warm.live_bytes);
}

TEST_CASE("size classes round up by at most a quarter", "[cuda]") {
  using cuda_size = size_t;
  Allocator& a = allocator_for(kGpu);
  const int64_t before = a.stats().live_bytes;
  {
    Tensor t = Tensor::empty({1000}, DType::u8, kGpu);  // 1000 -> 1024
    REQUIRE(a.stats().live_bytes - before == 1024);
    Tensor u = Tensor::empty({(5 << 20) / 4 + 1}, DType::f32, kGpu);  // just over 5 MiB -> 6 MiB
    REQUIRE(a.stats().live_bytes - before == 1024 + cuda_size(6 << 20));
  }
  REQUIRE(a.stats().live_bytes == before);
}

TEST_CASE("a block used on another stream is reused once that stream has passed it", "[cuda]") {
  cuda::CachingAllocator& ca = cuda::caching_allocator(0);
  cudaStream_t side;
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  const size_t n = 3 << 20;
  void* p = ca.allocate(n);
  REQUIRE(cudaMemsetAsync(p, 7, n, side) == cudaSuccess);  // e.g. a collective on the comm stream
  ca.record_stream(p, side);
  ca.deallocate(p, n);
  REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
  const int64_t driver = ca.stats().driver_allocs;
  void* q = ca.allocate(n);  // the side stream has passed the block: it is reused
  REQUIRE(q == p);
  REQUIRE(ca.stats().driver_allocs == driver);
  unsigned char byte = 0;
  REQUIRE(cudaMemcpy(&byte, static_cast<char*>(q) + n - 1, 1, cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  REQUIRE(byte == 7);
  ca.deallocate(q, n);
  int host = 0;
  REQUIRE_THROWS_WITH(ca.record_stream(&host, side), Catch::Contains("not a live block"));
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
}

TEST_CASE("out of device memory is one error naming the request and the figures", "[cuda]") {
  REQUIRE_THROWS_WITH(Tensor::empty({int64_t(1) << 40}, DType::f32, kGpu),
                      Catch::Contains("[alloc] out of memory on cuda:0") &&
                          Catch::Contains("4398046511104 bytes") && Catch::Contains("in use"));
  Tensor ok = Tensor::empty({16}, DType::f32, kGpu);  // the allocator still works
  ok.fill_(1.0);
  REQUIRE(ok.to(Device::cpu()).to_vector<float>()[15] == 1.0f);
}
