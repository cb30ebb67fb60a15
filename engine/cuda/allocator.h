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
// - Out of memory: the cache is returned to the driver and the request retried once; failing
//   that, one error names the device, the request and the allocator's figures.
// Included by .cu files only (the engine reaches it through allocator_for(Device::cuda(i))).
#pragma once

#include <cuda_runtime.h>

#include "engine/allocator.h"

namespace engine::cuda {

class CachingAllocator : public Allocator {
 public:
  // `ptr` (from this allocator) is used by work queued on `stream` too: its reuse waits for it.
  virtual void record_stream(void* ptr, cudaStream_t stream) = 0;
  // Returns every cached block that is free to the driver (cudaFree).
  virtual void empty_cache() = 0;
  // The size a request of `nbytes` is served with.
  static size_t size_class(size_t nbytes);
};

CachingAllocator& caching_allocator(int device);

}  // namespace engine::cuda
