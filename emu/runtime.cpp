// The CUDA runtime of the emulation build: the functions of cuda_runtime_api.h the engine uses,
// over host memory, with the real API's error codes. Streams are deferred in-order queues (see
// runtime.h); the legacy default stream orders itself against every blocking stream of its
// device; events mark a point in a stream. Device memory is host memory, poisoned with 0xFF (NaN
// in every float type) when allocated, and every pointer a copy or memset is given is checked
// against the live allocations.
#include "emu/runtime.h"
#include "emu/sanitizer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emu/simt.h"

struct CUstream_st {
  int device = 0;
  bool blocking = true;  // orders itself against the legacy stream
  bool legacy = false;
  struct Op {
    std::function<void()> work;
    const char* what;
    std::vector<std::pair<CUstream_st*, uint64_t>> deps;  // (stream, sequence) to finish first
  };
  std::deque<Op> queue;
  uint64_t enqueued = 0, done = 0;
  bool destroyed = false;
  // Stream capture (cudaStreamBeginCapture): while `capture` is set, work is recorded into that
  // graph instead of queued. `capture_origin`: the stream whose capture this one joined through a
  // captured event (itself for the stream that began it).
  CUgraph_st* capture = nullptr;
  CUstream_st* capture_origin = nullptr;
};

// A captured graph: its work in capture order (a valid serialisation of the real graph's
// dependencies: every stream that joined the capture appended to the one list in the order the
// host enqueued it). `invalid`: a prohibited call during the capture; EndCapture fails.
struct CUgraph_st {
  struct Node {
    std::function<void()> work;  // null: an event record or wait (ordering only)
    const char* what;
  };
  std::vector<Node> nodes;
  bool invalid = false;
  uint64_t serial = 0;   // names the capture for the events recorded in it
  bool relaxed = false;  // cudaStreamCaptureModeRelaxed: cudaMalloc allowed during it
};
struct CUgraphExec_st {
  std::vector<CUgraph_st::Node> nodes;
};

struct CUevent_st {
  CUstream_st* stream = nullptr;
  uint64_t seq = 0;  // done when stream->done >= seq
  bool timing = true;
  double time_ms = 0;
  uint64_t captured = 0;  // last recorded inside the capture of this serial (0: outside one)
};

namespace emu {
namespace {

constexpr int kMaxDevices = 8;

int device_count_env() {
  const char* s = std::getenv("EMU_DEVICES");
  int n = s ? std::atoi(s) : 1;
  return std::clamp(n, 0, kMaxDevices);
}

size_t device_memory_cap() {
  const char* s = std::getenv("EMU_DEVICE_MEMORY_MB");
  size_t mb = s ? std::strtoull(s, nullptr, 10) : 16384;
  return mb << 20;
}

// EMU_DRY_RUN=1: device work is queued, ordered and counted but not executed (kernels,
// copies, memsets, cuBLASLt, collectives), and large allocations are not touched, so a full-size
// training step can be walked through for its launch record (bench/record_step.cpp) in seconds
// and without the memory. Every value a dry run computes is meaningless.
bool dry_run() {
  static const bool on = [] {
    const char* s = std::getenv("EMU_DRY_RUN");
    return s && *s && std::string(s) != "0";
  }();
  return on;
}

struct Allocation {
  size_t bytes;
  int device;
};

struct Runtime {
  std::recursive_mutex mu;
  int devices = device_count_env();
  std::map<uintptr_t, Allocation> allocations;
  size_t used[kMaxDevices] = {};
  std::unique_ptr<CUstream_st> legacy[kMaxDevices];
  std::vector<CUstream_st*> streams[kMaxDevices];  // blocking and non-blocking streams created
  cudaError_t sticky = cudaSuccess;
  std::deque<std::string> fault_messages;       // stable c_str()s for cudaGetErrorString
  std::map<const void*, int> max_dynamic_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize
  Runtime() {
    for (int d = 0; d < kMaxDevices; ++d) {
      legacy[d] = std::make_unique<CUstream_st>();
      legacy[d]->device = d;
      legacy[d]->legacy = true;
    }
  }
};

Runtime& rt() {
  static Runtime* r = new Runtime;  // never destroyed: streams may be used from static destructors
  return *r;
}

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

CUstream_st* resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
    return rt().legacy[t_device].get();
  return s;
}

void run_op(CUstream_st* s);

void flush_to(CUstream_st* s, uint64_t seq) {
  while (s->done < seq && !s->queue.empty()) run_op(s);
}

void run_op(CUstream_st* s) {
  Runtime& r = rt();
  CUstream_st::Op op = std::move(s->queue.front());
  s->queue.pop_front();
  for (auto& [other, seq] : op.deps) flush_to(other, seq);
  if (r.sticky == cudaSuccess && op.work && !dry_run()) {
    const int saved = t_device;
    t_device = s->device;
    try {
      op.work();
    } catch (const Fault& f) {
      r.sticky = cudaErrorLaunchFailure;
      r.fault_messages.push_back(f.message);
      std::fprintf(stderr, "%s\n", f.message.c_str());
    }
    t_device = saved;
  }
  ++s->done;
}

// The blocking-stream ordering of the legacy default stream: work on one of them waits for what
// was queued on the others before it.
std::vector<std::pair<CUstream_st*, uint64_t>> implicit_deps(CUstream_st* s) {
  Runtime& r = rt();
  std::vector<std::pair<CUstream_st*, uint64_t>> deps;
  if (s->legacy) {
    for (CUstream_st* o : r.streams[s->device])
      if (o->blocking && o->enqueued > o->done) deps.emplace_back(o, o->enqueued);
  } else if (s->blocking) {
    CUstream_st* l = r.legacy[s->device].get();
    if (l->enqueued > l->done) deps.emplace_back(l, l->enqueued);
  }
  return deps;
}

// A capture is active on device d (on any of its streams); `strict`: one not begun in the relaxed
// mode (the global and thread-local modes are both applied as the global one).
bool capturing_on(int d, bool strict = false) {
  for (CUstream_st* o : rt().streams[d])
    if (o->capture && !(strict && o->capture->relaxed)) return true;
  return false;
}

// A call the real runtime refuses while a capture is active on the device (in the global capture
// mode, the engine's): a synchronising call, cudaFree, work on the legacy stream. It invalidates
// every capture of the device (their EndCapture then fails) and gives the call's error.
cudaError_t refuse_during_capture(int d) {
  for (CUstream_st* o : rt().streams[d])
    if (o->capture) o->capture->invalid = true;
  return cudaErrorStreamCaptureUnsupported;
}

void enqueue(CUstream_st* s, std::function<void()> work, const char* what,
             std::vector<std::pair<CUstream_st*, uint64_t>> extra = {}) {
  if (s->capture) {  // recorded, not run: the graph's launches run it
    s->capture->nodes.push_back(CUgraph_st::Node{std::move(work), what});
    return;
  }
  if (s->legacy && capturing_on(s->device)) {
    // The legacy stream orders itself against the capturing streams: the real runtime fails
    // the call (cudaErrorStreamCaptureImplicit) and the capture; the work is dropped.
    refuse_during_capture(s->device);
    fail(cudaErrorStreamCaptureImplicit);
    return;
  }
  auto deps = implicit_deps(s);
  deps.insert(deps.end(), extra.begin(), extra.end());
  s->queue.push_back(CUstream_st::Op{std::move(work), what, std::move(deps)});
  ++s->enqueued;
}

void flush_device(int d) {
  Runtime& r = rt();
  flush_to(r.legacy[d].get(), r.legacy[d]->enqueued);
  for (CUstream_st* s : r.streams[d]) flush_to(s, s->enqueued);
}

bool valid_stream(CUstream_st* s) {
  if (s->legacy) return true;
  for (int d = 0; d < rt().devices; ++d)
    for (CUstream_st* o : rt().streams[d])
      if (o == s) return true;
  return false;
}

bool is_device_range_locked(const void* p, size_t n) {
  Runtime& r = rt();
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto it = r.allocations.upper_bound(u);
  if (it == r.allocations.begin()) return false;
  --it;
  return u >= it->first && u + n <= it->first + std::max<size_t>(it->second.bytes, 1);
}

// A copy's endpoints must match its kind (device pointers inside live allocations).
cudaError_t check_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return cudaSuccess;
  const bool dd = is_device_range_locked(dst, n), sd = is_device_range_locked(src, n);
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return dd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
      return sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return dd && sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      return cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

}  // namespace

void stream_enqueue(cudaStream_t stream, std::function<void()> work, const char* what) {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  enqueue(resolve(stream), std::move(work), what);
}

void stream_flush(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  CUstream_st* s = resolve(stream);
  flush_to(s, s->enqueued);
}

int stream_device(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  return resolve(stream)->device;
}

bool is_device_range(const void* p, size_t n) {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  return is_device_range_locked(p, n);
}

cudaError_t set_last_error(cudaError_t err) { return fail(err); }
int current_device() { return t_device; }

int max_dynamic_shared(const void* kernel) {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  auto it = rt().max_dynamic_smem.find(kernel);
  return it == rt().max_dynamic_smem.end() ? 48 * 1024 : it->second;
}

}  // namespace emu

using emu::fail;
using emu::rt;

#define EMU_LOCK std::lock_guard<std::recursive_mutex> emu_lock_(rt().mu)

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = rt().devices;
  if (rt().devices == 0) return fail(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= rt().devices) return fail(cudaErrorInvalidDevice);
  emu::t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = emu::t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= rt().devices) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (emulated)");
  p->totalGlobalMem = emu::device_memory_cap();
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = 227 * 1024;
  p->sharedMemPerMultiprocessor = 228 * 1024;
  p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->totalConstMem = 65536;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->maxBlocksPerMultiProcessor = 32;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->memoryBusWidth = 5120;
  p->concurrentKernels = 1;
  p->asyncEngineCount = 3;
  p->unifiedAddressing = 1;
  p->pciBusID = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  cudaDeviceProp p;
  if (cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = p.maxThreadsPerBlock;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = p.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = p.minor;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(p.sharedMemPerBlock);
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrL2CacheSize:
      *value = p.l2CacheSize;
      break;
    case cudaDevAttrMaxGridDimX:
      *value = p.maxGridSize[0];
      break;
    case cudaDevAttrClusterLaunch:  // thread block clusters (emu/simt.h)
      *value = 1;
      break;
    default:
      return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* v) {
  if (!v) return fail(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) { return cudaDriverGetVersion(v); }

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  EMU_LOCK;
  auto& r = rt();
  const int d = emu::t_device;
  // A "potentially unsafe" call during a capture not begun in the relaxed mode.
  if (emu::capturing_on(d, true)) return fail(emu::refuse_during_capture(d));
  if (r.used[d] + size > emu::device_memory_cap()) {
    *ptr = nullptr;
    return fail(cudaErrorMemoryAllocation);
  }
  const size_t bytes = std::max<size_t>((size + 255) / 256 * 256, 256);
  void* p = std::aligned_alloc(256, bytes);
  if (!p) {
    *ptr = nullptr;
    return fail(cudaErrorMemoryAllocation);
  }
  if (!emu::dry_run())
    std::memset(p, 0xFF, bytes);  // uninitialised device memory reads as NaN
  else if (bytes < (size_t(1) << 20))
    std::memset(p, 0, bytes);  // dry run: small blocks read as zeros (large ones are untouched)
  // Under ASan an access past the requested size is reported, though the GPU's rounding would
  // hide it.
  emu::san::poison(static_cast<char*>(p) + size, bytes - size);
  r.allocations[reinterpret_cast<uintptr_t>(p)] = emu::Allocation{size, d};
  r.used[d] += size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  EMU_LOCK;
  auto& r = rt();
  auto it = r.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.allocations.end()) return fail(cudaErrorInvalidValue);
  if (emu::capturing_on(it->second.device))
    return fail(emu::refuse_during_capture(it->second.device));
  // cudaFree synchronises the device: work still queued may use the memory.
  emu::flush_device(it->second.device);
  r.used[it->second.device] -= it->second.bytes;
  emu::san::unpoison(ptr, std::max<size_t>((it->second.bytes + 255) / 256 * 256, 256));
  r.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = std::aligned_alloc(256, std::max<size_t>((size + 255) / 256 * 256, 256));
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  return cudaMallocHost(ptr, size);
}
cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
// Mapped (zero-copy) host memory: kernels run on the host, so the device address is the host's.
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int flags) {
  if (!dev || !host || flags != 0) return fail(cudaErrorInvalidValue);
  *dev = host;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  EMU_LOCK;
  const size_t cap = emu::device_memory_cap();
  if (free_bytes) *free_bytes = cap - rt().used[emu::t_device];
  if (total) *total = cap;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  EMU_LOCK;
  if (cudaError_t e = emu::check_copy(dst, src, n, kind); e != cudaSuccess) return fail(e);
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  // Dry run: what the host reads back is zeros (a defined value), never stale host memory.
  if (n && emu::dry_run() && !emu::is_device_range_locked(dst, n)) std::memset(dst, 0, n);
  if (n)
    emu::enqueue(
        s, [dst, src, n] { std::memmove(dst, src, n); }, "cudaMemcpyAsync");
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  EMU_LOCK;
  if (emu::capturing_on(emu::t_device)) return fail(emu::refuse_during_capture(emu::t_device));
  if (cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, nullptr); e != cudaSuccess) return e;
  emu::flush_device(emu::t_device);
  return rt().sticky == cudaSuccess ? cudaSuccess : fail(rt().sticky);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t stream) {
  EMU_LOCK;
  if (n && !emu::is_device_range_locked(dst, n)) return fail(cudaErrorInvalidValue);
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (n)
    emu::enqueue(
        s, [dst, value, n] { std::memset(dst, value, n); }, "cudaMemset");
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t n) {
  EMU_LOCK;
  if (emu::capturing_on(emu::t_device)) return fail(emu::refuse_during_capture(emu::t_device));
  return cudaMemsetAsync(dst, value, n, nullptr);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (!stream) return fail(cudaErrorInvalidValue);
  EMU_LOCK;
  auto* s = new CUstream_st;
  s->device = emu::t_device;
  s->blocking = !(flags & cudaStreamNonBlocking);
  rt().streams[s->device].push_back(s);
  *stream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  EMU_LOCK;
  if (!stream || stream == cudaStreamLegacy || stream == cudaStreamPerThread ||
      !emu::valid_stream(stream))
    return fail(cudaErrorInvalidResourceHandle);
  if (stream->capture) return fail(emu::refuse_during_capture(stream->device));
  // Work already queued completes (the real call returns at once and lets it finish).
  emu::flush_to(stream, stream->enqueued);
  auto& v = rt().streams[stream->device];
  v.erase(std::find(v.begin(), v.end(), stream));
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  EMU_LOCK;
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) return fail(emu::refuse_during_capture(s->device));
  emu::flush_to(s, s->enqueued);
  return rt().sticky == cudaSuccess ? cudaSuccess : fail(rt().sticky);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::unique_lock<std::recursive_mutex> lock(rt().mu, std::try_to_lock);
  if (!lock.owns_lock()) return cudaErrorNotReady;
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) return fail(emu::refuse_during_capture(s->device));
  emu::flush_to(s, s->enqueued);  // progress: a polling loop must see the work finish
  return rt().sticky == cudaSuccess ? cudaSuccess : fail(rt().sticky);
}

cudaError_t cudaDeviceSynchronize() {
  EMU_LOCK;
  if (emu::capturing_on(emu::t_device)) return fail(emu::refuse_during_capture(emu::t_device));
  emu::flush_device(emu::t_device);
  return rt().sticky == cudaSuccess ? cudaSuccess : fail(rt().sticky);
}

}  // extern "C"

namespace emu {
void clear_sticky_error() {
  EMU_LOCK;
  auto& r = rt();
  const int d = t_device;
  r.legacy[d]->queue.clear();
  r.legacy[d]->done = r.legacy[d]->enqueued;
  for (CUstream_st* s : r.streams[d]) {
    s->queue.clear();
    s->done = s->enqueued;
  }
  r.sticky = cudaSuccess;
  t_last_error = cudaSuccess;
}
}  // namespace emu

extern "C" {

cudaError_t cudaDeviceReset() {
  EMU_LOCK;
  auto& r = rt();
  const int d = emu::t_device;
  emu::clear_sticky_error();
  for (auto it = r.allocations.begin(); it != r.allocations.end();) {
    if (it->second.device == d) {
      r.used[d] -= it->second.bytes;
      emu::san::unpoison(reinterpret_cast<void*>(it->first),
                         std::max<size_t>((it->second.bytes + 255) / 256 * 256, 256));
      std::free(reinterpret_cast<void*>(it->first));
      it = r.allocations.erase(it);
    } else {
      ++it;
    }
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event) return fail(cudaErrorInvalidValue);
  auto* e = new CUevent_st;
  e->timing = !(flags & cudaEventDisableTiming);
  *event = e;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  EMU_LOCK;
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  emu::enqueue(s, nullptr, "cudaEventRecord");
  event->stream = s;
  event->seq = s->enqueued;
  event->captured = s->capture ? s->capture->serial : 0;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  EMU_LOCK;
  if (event->captured) return fail(cudaErrorCapturedEvent);
  if (event->stream) emu::flush_to(event->stream, event->seq);
  return rt().sticky == cudaSuccess ? cudaSuccess : fail(rt().sticky);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::recursive_mutex> lock(rt().mu, std::try_to_lock);
  if (!lock.owns_lock()) return cudaErrorNotReady;
  if (event->captured) return fail(cudaErrorCapturedEvent);
  if (event->stream) emu::flush_to(event->stream, event->seq);
  return rt().sticky == cudaSuccess ? cudaSuccess : fail(rt().sticky);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end) return fail(cudaErrorInvalidValue);
  if (!start->timing || !end->timing) return fail(cudaErrorInvalidResourceHandle);
  *ms = 0.0f;  // no device clock: emulated time is not GPU time
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  EMU_LOCK;
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (event->captured) {
    // An event of a capture: the waiting stream joins that capture (a fork), or orders itself
    // inside it; a stream capturing another graph cannot (the real runtime's merge error).
    CUstream_st* origin = event->stream->capture_origin;
    if (!event->stream->capture || event->stream->capture->serial != event->captured)
      return fail(cudaErrorCapturedEvent);  // that capture has ended
    if (s->capture && s->capture != event->stream->capture) {
      s->capture->invalid = event->stream->capture->invalid = true;
      return fail(cudaErrorStreamCaptureMerge);
    }
    if (!s->capture) {
      s->capture = event->stream->capture;
      s->capture_origin = origin;
    }
    emu::enqueue(s, nullptr, "cudaStreamWaitEvent");
    return cudaSuccess;
  }
  if (s->capture) {
    // Waiting inside a capture on work outside it: the real runtime's isolation error.
    s->capture->invalid = true;
    return fail(cudaErrorStreamCaptureIsolation);
  }
  if (event->stream) emu::enqueue(s, nullptr, "cudaStreamWaitEvent", {{event->stream, event->seq}});
  return cudaSuccess;
}

// ---- stream capture and graphs ----------------------------------------------------------------
// Capture records what the engine enqueues on the stream (kernels, copies, memsets, cuBLASLt
// products, collectives) as the closures the stream would have run, without running them; a
// launch of the instantiated graph enqueues them again, in capture order, on the launch's stream.
// The relaxed mode (the engine's) allows cudaMalloc during a capture; the other two refuse it as
// the global mode does. Every mode refuses what conflicts with a capture: synchronising with a
// capturing stream or the device, cudaFree, a host wait on a captured event.

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  EMU_LOCK;
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s->legacy) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot
  if (s->capture) return fail(cudaErrorIllegalState);
  static uint64_t serial = 0;
  s->capture = new CUgraph_st;
  s->capture->serial = ++serial;
  s->capture->relaxed = mode == cudaStreamCaptureModeRelaxed;
  s->capture_origin = s;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (!graph) return fail(cudaErrorInvalidValue);
  EMU_LOCK;
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (!s->capture) return fail(cudaErrorIllegalState);
  if (s->capture_origin != s) return fail(cudaErrorStreamCaptureUnmatched);
  CUgraph_st* g = s->capture;
  for (int d = 0; d < rt().devices; ++d)
    for (CUstream_st* o : rt().streams[d])
      if (o->capture == g) o->capture = nullptr, o->capture_origin = nullptr;
  if (g->invalid) {
    delete g;
    *graph = nullptr;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = g;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (!status) return fail(cudaErrorInvalidValue);
  EMU_LOCK;
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  *status = !s->capture           ? cudaStreamCaptureStatusNone
            : s->capture->invalid ? cudaStreamCaptureStatusInvalidated
                                  : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

// The node count only (nodes must be null): what the engine reports as launches per graph.
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  if (!graph || !count || nodes) return fail(cudaErrorInvalidValue);
  EMU_LOCK;
  size_t n = 0;
  for (const auto& node : graph->nodes) n += node.work != nullptr;
  *count = n;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!exec || !graph) return fail(cudaErrorInvalidValue);
  EMU_LOCK;
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec) return fail(cudaErrorInvalidValue);
  EMU_LOCK;
  CUstream_st* s = emu::resolve(stream);
  if (!emu::valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  for (const auto& node : exec->nodes) emu::enqueue(s, node.work, node.what);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > 227 * 1024) return fail(cudaErrorInvalidValue);
  EMU_LOCK;
  rt().max_dynamic_smem[func] = value;
  return cudaSuccess;
}

// The emulator builds every kernel for its device, compute capability 9.0
// (cudaGetDeviceProperties).
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  if (!attr || !func) return fail(cudaErrorInvalidValue);
  *attr = cudaFuncAttributes{};
  attr->maxThreadsPerBlock = 1024;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  EMU_LOCK;
  const auto it = rt().max_dynamic_smem.find(func);
  attr->maxDynamicSharedSizeBytes = it != rt().max_dynamic_smem.end() ? it->second : 48 * 1024;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  cudaError_t e = emu::t_last_error;
  emu::t_last_error = cudaSuccess;
  if (e == cudaSuccess && rt().sticky != cudaSuccess) return rt().sticky;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  if (emu::t_last_error == cudaSuccess && rt().sticky != cudaSuccess) return rt().sticky;
  return emu::t_last_error;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidClusterSize:
      return "cudaErrorInvalidClusterSize";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit:
      return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent:
      return "cudaErrorCapturedEvent";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidClusterSize:
      return "invalid cluster size";
    case cudaErrorLaunchFailure: {
      EMU_LOCK;
      auto& m = rt().fault_messages;
      if (m.empty()) return "unspecified launch failure";
      static thread_local std::string text;
      text = "unspecified launch failure: " + m.back();
      return text.c_str();
    }
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    default:
      return "unknown error";
  }
}

}  // extern "C"
