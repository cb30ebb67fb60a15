// [emulator] The CUDA runtime shim: deferred in-order streams (a result read without
// synchronising is stale), events across streams, the legacy stream's ordering, pointer checks
// and error codes as the real runtime returns them; the engine's host-to-device writes queue
// without waiting.
#include <catch2/catch.hpp>

#include <vector>

#include "emu/runtime.h"
#include "engine/cuda/context.h"
#include "engine/cuda/launch.h"
#include "engine/tensor.h"

using engine::cuda::LaunchConfig;

namespace {

__global__ void add_value(float* x, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}

}  // namespace

TEST_CASE("async work runs in stream order and only once the host waits for it", "[emulator]") {
  const int n = 300;
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, n * 4) == cudaSuccess);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  std::vector<float> h(n, 1.0f), back(n, -1.0f);
  REQUIRE(cudaMemcpyAsync(d, h.data(), n * 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
  ENGINE_LAUNCH(add_value, (LaunchConfig{dim3(2), dim3(256), 0, s}), d, n, 2.0f);
  REQUIRE(cudaMemcpyAsync(back.data(), d, n * 4, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(back[0] == -1.0f);  // not synchronised yet: a GPU may not have written it either
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(back[0] == 3.0f);
  CHECK(back[n - 1] == 3.0f);

  // An event orders a second stream after the first.
  cudaStream_t s2;
  cudaEvent_t e;
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  ENGINE_LAUNCH(add_value, (LaunchConfig{dim3(2), dim3(256), 0, s}), d, n, 10.0f);
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s2, e, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(back.data(), d, n * 4, cudaMemcpyDeviceToHost, s2) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
  CHECK(back[7] == 13.0f);
  REQUIRE(cudaEventQuery(e) == cudaSuccess);

  // The legacy default stream waits for a blocking stream's earlier work.
  cudaStream_t blocking;
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  ENGINE_LAUNCH(add_value, (LaunchConfig{dim3(2), dim3(256), 0, blocking}), d, n, 100.0f);
  REQUIRE(cudaMemcpy(back.data(), d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back[9] == 113.0f);

  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s2) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(blocking) == cudaSuccess);
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("pointer and handle errors come back as the real runtime's codes", "[emulator]") {
  float host[4] = {};
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 16) == cudaSuccess);
  CHECK(cudaMemcpy(host, host + 1, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);                                         // not sticky
  CHECK(cudaMemcpy(d, host, 32, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // past the end
  CHECK(cudaFree(host) == cudaErrorInvalidValue);
  CHECK(cudaSetDevice(7) == cudaErrorInvalidDevice);
  CHECK(std::string(cudaGetErrorString(cudaErrorInvalidValue)) == "invalid argument");
  size_t free_b = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total) == cudaSuccess);
  void* huge = nullptr;
  CHECK(cudaMalloc(&huge, total + 1) == cudaErrorMemoryAllocation);
  cudaGetLastError();
  cudaDeviceProp p;
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(p.major == 9);
  CHECK(p.multiProcessorCount == 132);
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("a host-to-device write does not wait for the device, and frees the host buffer at once",
          "[emulator]") {
  using namespace engine;
  const Device gpu = Device::cuda(0);
  Tensor x = Tensor::zeros({300}, DType::f32, gpu);
  x.raw_data();  // the device work so far is queued on the compute stream, not run
  // A marker queued behind it: it runs only when something waits for the compute stream.
  bool ran = false;
  emu::stream_enqueue(
      cuda::compute_stream(0), [&ran] { ran = true; }, "marker");
  std::vector<float> host(300);
  for (int i = 0; i < 300; ++i) host[size_t(i)] = float(i);
  Tensor up = Tensor::from_vector(host, {300}).to(gpu);  // through the pinned staging buffer
  CHECK_FALSE(ran);                // the write queued its copy; it did not drain the stream
  for (float& v : host) v = -1.f;  // the caller's buffer is free at once
  // Many writes reuse the staging buffers as their copies complete; every value arrives.
  std::vector<Tensor> more;
  for (int k = 0; k < 40; ++k)
    more.push_back(Tensor::from_vector(std::vector<float>(5000, float(k)), {5000}).to(gpu));
  const std::vector<float> back = up.to(Device::cpu()).to_vector<float>();  // waits
  CHECK(ran);
  for (int i = 0; i < 300; ++i) REQUIRE(back[size_t(i)] == float(i));
  for (int k = 0; k < 40; ++k)
    REQUIRE(more[size_t(k)].to(Device::cpu()).to_vector<float>() ==
            std::vector<float>(5000, float(k)));
}
