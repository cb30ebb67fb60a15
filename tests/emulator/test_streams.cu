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

TEST_CASE("stream capture records work without running it, each graph launch runs it again",
          "[emulator]") {
  const int n = 300;
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, n * 4) == cudaSuccess);
  cudaStream_t s, side;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  std::vector<float> h(n, 1.0f), back(n, -1.0f);
  REQUIRE(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);

  // Captured: a copy from host memory (read when the graph runs, not at capture), a kernel, and
  // a fork to a second stream through an event and back.
  float v = 5.0f;
  float* dv = nullptr;
  REQUIRE(cudaMalloc(&dv, 4) == cudaSuccess);
  cudaEvent_t fork, join;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  ENGINE_LAUNCH(add_value, (LaunchConfig{dim3(2), dim3(256), 0, s}), d, n, 2.0f);
  REQUIRE(cudaEventRecord(fork, s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(side, fork, 0) == cudaSuccess);  // `side` joins the capture
  REQUIRE(cudaStreamIsCapturing(side, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  ENGINE_LAUNCH(add_value, (LaunchConfig{dim3(2), dim3(256), 0, side}), d, n, 10.0f);
  REQUIRE(cudaEventRecord(join, side) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s, join, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(dv, &v, 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  REQUIRE(cudaStreamIsCapturing(side, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusNone);
  size_t nodes = 0;
  REQUIRE(cudaGraphGetNodes(graph, nullptr, &nodes) == cudaSuccess);
  CHECK(nodes == 3);  // two kernels and the copy (event nodes only order)
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaMemcpy(back.data(), d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back[0] == 1.0f);  // capture ran nothing

  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int replay = 1; replay <= 3; ++replay) {
    v = 100.0f * replay;  // the copy node reads the host value at launch time
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    float got = 0;
    REQUIRE(cudaMemcpy(back.data(), d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    REQUIRE(cudaMemcpy(&got, dv, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(back[n - 1] == 1.0f + 12.0f * replay);
    CHECK(got == v);
  }
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cudaEventDestroy(fork) == cudaSuccess);
  REQUIRE(cudaEventDestroy(join) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
  REQUIRE(cudaFree(dv) == cudaSuccess);
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("a synchronising call during a capture fails it, as the real runtime does",
          "[emulator]") {
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 64) == cudaSuccess);
  float host[16] = {};
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) ==
        cudaErrorStreamCaptureUnsupported);  // not the legacy stream
  cudaGetLastError();
  CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorIllegalState);  // none begun
  cudaGetLastError();

  // Each of these inside a capture: the call fails and so does the capture's end.
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
    ENGINE_LAUNCH(add_value, (LaunchConfig{dim3(1), dim3(16), 0, s}), d, 16, 1.0f);
    cudaError_t e = cudaSuccess;
    switch (call) {
      case 0:
        e = cudaStreamSynchronize(s);
        break;
      case 1:
        e = cudaMemcpy(host, d, 64, cudaMemcpyDeviceToHost);
        break;
      case 2:
        e = cudaDeviceSynchronize();
        break;
      case 3:
        e = cudaFree(d);
        break;
    }
    CHECK(e == cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusInvalidated);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    cudaGetLastError();
  }
  // cudaMalloc: refused in the global mode, allowed in the relaxed one.
  void* extra = nullptr;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaMalloc(&extra, 64) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  CHECK(cudaMalloc(&extra, 64) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cudaFree(extra) == cudaSuccess);
  // An event recorded inside a capture cannot be waited for by the host.
  cudaEvent_t e;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  CHECK(cudaEventSynchronize(e) == cudaErrorCapturedEvent);
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  cudaGetLastError();
  // Nothing captured ran; the stream works as before.
  ENGINE_LAUNCH(add_value, (LaunchConfig{dim3(1), dim3(16), 0, s}), d, 16, 1.0f);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaFree(d) == cudaSuccess);
}
