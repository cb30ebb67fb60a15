// Per-device contexts (see context.h).
#include "engine/cuda/context.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/work_counts.h"
#include "engine/error.h"
#include "engine/work_log.h"

namespace engine::cuda {
namespace {
std::atomic<int64_t> g_kernel_launches{0}, g_gemms{0};
}  // namespace

void count_kernel_launch(const char* name, int64_t blocks, int64_t threads) {
  g_kernel_launches.fetch_add(1, std::memory_order_relaxed);
  note_work_launch(name, false, blocks, threads);
}
void count_gemm() {
  g_gemms.fetch_add(1, std::memory_order_relaxed);
  note_work_launch("cublasLtMatmul", true, 0, 0);
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

// Per device: the mapped host record of the first bad index (device_error.cuh) and its device
// address.
std::mutex g_error_mu;
std::vector<std::pair<DeviceIndexError*, DeviceIndexError*>> g_index_errors;

}  // namespace

DeviceIndexError* device_index_error(int device) {
  std::lock_guard<std::mutex> lock(g_error_mu);
  if (g_index_errors.size() <= static_cast<size_t>(device))
    g_index_errors.resize(static_cast<size_t>(device) + 1, {nullptr, nullptr});
  auto& e = g_index_errors[static_cast<size_t>(device)];
  if (!e.first) {
    DeviceGuard guard(device);
    void* host = nullptr;
    ENGINE_CUDA_CHECK(cudaHostAlloc(&host, sizeof(DeviceIndexError), cudaHostAllocMapped));
    void* dev = nullptr;
    ENGINE_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
    e.first = new (host) DeviceIndexError();
    e.second = static_cast<DeviceIndexError*>(dev);
  }
  return e.second;
}

void raise_device_index_error(int device) {
  DeviceIndexError* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_error_mu);
    if (static_cast<size_t>(device) < g_index_errors.size())
      e = g_index_errors[static_cast<size_t>(device)].first;
  }
  if (!e) return;
  const int32_t check = reinterpret_cast<volatile int32_t*>(&e->check)[0];
  if (check == 0) return;
  const DeviceIndexError r = *e;
  *e = DeviceIndexError();
  const char* where = "";
  switch (static_cast<IndexCheck>(check)) {
    case IndexCheck::embedding_id:
      ENGINE_FAIL("[embedding] id ", r.value, " at position ", r.position,
                  " of the (flattened) ids is out of range for a table of ", r.bound,
                  " rows (expected 0 <= id < ", r.bound, "; found on cuda:", device,
                  " by the embedding / index_select kernel)");
    case IndexCheck::relative_bucket:
      ENGINE_FAIL("[relative_gather] bucket ", r.value, " at position ", r.position,
                  " of the (flattened) relative index is out of range for ", r.bound,
                  " buckets (expected 0 <= bucket < ", r.bound, "; found on cuda:", device, ")");
    case IndexCheck::bucket_lookup:
      ENGINE_FAIL("[bucket_lookup] index value ", r.value, " at flat position ", r.position,
                  " is out of range for a table of ", r.bound, " buckets (expected 0 <= index < ",
                  r.bound, "; found on cuda:", device, ")");
    case IndexCheck::class_target:
      ENGINE_FAIL("[cross_entropy] target ", r.value, " of row ", r.position,
                  " is out of range for ", r.bound, " classes (expected 0 <= target < ", r.bound,
                  " or the ignore index; found on cuda:", device, ")");
    case IndexCheck::write_position:
      ENGINE_FAIL("[sampling] position ", r.value, " at ", r.position, " is out of range for ",
                  r.bound, " elements (expected 0 <= position < ", r.bound,
                  "; found on cuda:", device, ")");
    default:
      where = "an unknown kernel";
  }
  ENGINE_FAIL("[cuda] a bad index (", r.value, " at ", r.position, ", bound ", r.bound,
              ") was recorded by ", where, " on cuda:", device);
}

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
