// The CUDA backend's graph capture (graph.h).
#include "engine/cuda/graph.h"

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "engine/cuda/allocator.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/error.h"

namespace engine::cuda {
namespace {

struct Capture {
  bool open = false;
  uint64_t pool = 0;  // the caching allocator's pool of this capture
};

std::mutex g_mu;
std::vector<Capture> g_captures;  // by device

Capture& capture_of(int device) {  // under g_mu
  if (g_captures.size() <= static_cast<size_t>(device)) g_captures.resize(device + 1);
  return g_captures[device];
}

class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(int device, uint64_t pool, cudaGraph_t graph, cudaGraphExec_t exec, int64_t nodes)
      : device_(device), pool_(pool), graph_(graph), exec_(exec), nodes_(nodes) {}
  ~CudaGraph() override {
    DeviceGuard guard(device_);
    // Launches still queued run to their end; the pool's blocks go back to the cache, where
    // stream order keeps their next users behind those launches.
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    cudaGetLastError();
    caching_allocator(device_).release_pool(pool_);
  }
  void replay() override {
    DeviceGuard guard(device_);
    ENGINE_CHECK(!capturing(device_), "[graph] replay() on cuda:", device_,
                 " while a capture is open there (replay it after the capture ends)");
    ENGINE_CUDA_CHECK(cudaGraphLaunch(exec_, compute_stream(device_)));
  }
  int64_t launches() const override { return nodes_; }

 private:
  int device_;
  uint64_t pool_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  int64_t nodes_;
};

}  // namespace

bool capturing(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<size_t>(device) < g_captures.size() && g_captures[device].open;
}

void begin_capture(int device) {
  DeviceGuard guard(device);
  const cudaStream_t stream = compute_stream(device);
  cublaslt(device);  // its handle and workspace exist before the capture, outside the pool
  std::lock_guard<std::mutex> lock(g_mu);
  Capture& c = capture_of(device);
  ENGINE_CHECK(!c.open, "[graph] cuda:", device,
               " is capturing already: one capture at a time per device");
  CachingAllocator& alloc = caching_allocator(device);
  const uint64_t pool = alloc.begin_pool();
  const cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    cudaGetLastError();
    alloc.end_pool();
    alloc.release_pool(pool);
    ENGINE_FAIL("[graph] cannot begin a capture on cuda:", device, ": ", cudaGetErrorString(e));
  }
  c.open = true;
  c.pool = pool;
}

std::unique_ptr<Backend::Graph> end_capture(int device, bool keep) {
  DeviceGuard guard(device);
  uint64_t pool = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Capture& c = capture_of(device);
    if (!c.open) {
      ENGINE_CHECK(!keep, "[graph] no capture is open on cuda:", device);
      return nullptr;
    }
    c.open = false;
    pool = c.pool;
  }
  CachingAllocator& alloc = caching_allocator(device);
  alloc.end_pool();
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(compute_stream(device), &graph);
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0;
  cudaError_t ie = cudaSuccess;
  if (e == cudaSuccess && keep) {
    ie = cudaGraphGetNodes(graph, nullptr, &nodes);
    if (ie == cudaSuccess) ie = cudaGraphInstantiate(&exec, graph, 0);
  }
  if (e != cudaSuccess || !keep || ie != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    alloc.release_pool(pool);
    ENGINE_CHECK(!keep || e == cudaSuccess, "[graph] the capture on cuda:", device,
                 " failed: ", cudaGetErrorString(e),
                 " (the captured work made a call a capture forbids: a host synchronisation, "
                 "cudaFree, work on the legacy stream)");
    ENGINE_CHECK(!keep, "[graph] cannot instantiate the graph captured on cuda:", device, ": ",
                 cudaGetErrorString(ie));
    return nullptr;
  }
  return std::make_unique<CudaGraph>(device, pool, graph, exec, static_cast<int64_t>(nodes));
}

}  // namespace engine::cuda
