// Per-device contexts (see context.h).
#include "engine/cuda/context.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/work_counts.h"
#include "engine/error.h"
#include "engine/work_log.h"

namespace engine::cuda {
namespace {
std::atomic<int64_t> g_kernel_launches{0}, g_gemms{0};
}  // namespace

void count_kernel_launch(const char* name) {
  g_kernel_launches.fetch_add(1, std::memory_order_relaxed);
  note_work_launch(name, false);
}
void count_gemm() {
  g_gemms.fetch_add(1, std::memory_order_relaxed);
  note_work_launch("cublasLtMatmul", true);
}
WorkCounts work_counts() {
  return {g_kernel_launches.load(std::memory_order_relaxed),
          g_gemms.load(std::memory_order_relaxed)};
}

namespace {

// cuBLASLt's workspace: 32 MiB, what NVIDIA recommends for Hopper's split-K and stream-K kernels.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

std::mutex g_mu;
std::vector<std::unique_ptr<DeviceContext>> g_contexts;

std::mutex g_event_mu;
std::vector<cudaEvent_t> g_free_events;

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  ENGINE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) ENGINE_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() { cudaSetDevice(previous_); }

DeviceContext& context(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (device >= 0 && static_cast<size_t>(device) < g_contexts.size() && g_contexts[device])
    return *g_contexts[device];
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  ENGINE_CHECK(device >= 0 && device < count, "[device] cuda:", device, " does not exist (", count,
               " CUDA devices visible)");
  if (g_contexts.size() <= static_cast<size_t>(device)) g_contexts.resize(device + 1);
  auto c = std::make_unique<DeviceContext>();
  DeviceGuard guard(device);
  c->device = device;
  ENGINE_CUDA_CHECK(cudaGetDeviceProperties(&c->props, device));
  ENGINE_CUDA_CHECK(cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking));
  ENGINE_CUDA_CHECK(cudaStreamCreateWithFlags(&c->comm, cudaStreamNonBlocking));
  g_contexts[device] = std::move(c);
  return *g_contexts[device];
}

DeviceContext& cublaslt(int device) {
  DeviceContext& c = context(device);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!c.lt) {
    DeviceGuard guard(device);
    ENGINE_CUBLAS_CHECK(cublasLtCreate(&c.lt));
    ENGINE_CUDA_CHECK(cudaMalloc(&c.lt_workspace, kLtWorkspaceBytes));
    c.lt_workspace_bytes = kLtWorkspaceBytes;
  }
  return c;
}

Event::Event() {
  {
    std::lock_guard<std::mutex> lock(g_event_mu);
    if (!g_free_events.empty()) {
      e_ = g_free_events.back();
      g_free_events.pop_back();
      return;
    }
  }
  ENGINE_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming));
}

Event::~Event() {
  std::lock_guard<std::mutex> lock(g_event_mu);
  g_free_events.push_back(e_);
}

void Event::record(cudaStream_t s) { ENGINE_CUDA_CHECK(cudaEventRecord(e_, s)); }
void Event::wait(cudaStream_t s) const { ENGINE_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }
bool Event::done() const {
  const cudaError_t e = cudaEventQuery(e_);
  if (e == cudaErrorNotReady) return false;
  ENGINE_CUDA_CHECK(e);
  return true;
}

}  // namespace engine::cuda
