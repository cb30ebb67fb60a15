// The CUDA caching allocator: device memory by size class, reused once the streams that used a
// block have passed it, so a training loop makes no cudaMalloc after its first step.
//
// - Size classes: requests round up to 512 bytes below 1 MiB, and to quarter powers of two above
//   (1, 1.25, 1.5, 1.75 x 2^k), wasting at most a quarter; a freed block waits in its class's
//   free list for the next request of that class.
// - Stream order: a block belongs to the device's compute stream, where the engine queues all its
//   work, so a block freed by the host may be handed out again at once: whatever uses it next is
//   queued after whatever used it before. A block also used on another stream (record_stream: a
//   collective on the communication stream) is reused only after an event recorded on that
//   stream at free time has completed.
// - Graph capture: private pools that keep a captured graph's blocks out of circulation
//   (begin_pool below).
// - Out of memory: the cache is returned to the driver and the request retried once; failing
//   that, one error names the device, the request and the allocator's figures.
// Included by .cu files only (the engine reaches it through allocator_for(Device::cuda(i))).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/allocator.h"

namespace engine::cuda {

class CachingAllocator : public Allocator {
 public:
  // `ptr` (from this allocator) is used by work queued on `stream` too: its reuse waits for it.
  virtual void record_stream(void* ptr, cudaStream_t stream) = 0;
  // Returns every cached block that is free to the driver (cudaFree).
  virtual void empty_cache() = 0;
  // Graph capture (engine/graph.h). From begin_pool() to end_pool(), requests are served into a
  // new private pool (from its own free blocks, then the cache's, then the driver), and every
  // block freed meanwhile joins that pool, wherever it came from: a captured graph may touch any
  // of them when it replays, so none is handed out outside the pool until release_pool(id)
  // returns the pool's free blocks to the cache (its live ones go there when freed). One pool is
  // open at a time; begin_pool returns its id.
  virtual uint64_t begin_pool() = 0;
  virtual void end_pool() = 0;
  virtual void release_pool(uint64_t id) = 0;
  // The size a request of `nbytes` is served with.
  static size_t size_class(size_t nbytes);
};

CachingAllocator& caching_allocator(int device);

}  // namespace engine::cuda
