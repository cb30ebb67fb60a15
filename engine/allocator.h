// Allocators: where storage bytes come from. One interface for every device; each keeps
// live/peak byte counters so benchmarks and tests can report memory. The CPU allocator hands out
// 64-byte aligned blocks (cache lines, AVX-512 loads); the CUDA caching allocator sits behind the
// same interface.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/device.h"

namespace engine {

struct AllocatorStats {
  int64_t live_bytes = 0;      // bytes handed out and not yet returned
  int64_t peak_bytes = 0;      // maximum of live_bytes since the last reset_peak()
  int64_t num_allocs = 0;      // allocations served since start
  int64_t reserved_bytes = 0;  // bytes held from the system (>= live for caching allocators)
  int64_t driver_allocs = 0;   // allocations asked of the system (cudaMalloc) since start
  int64_t driver_frees = 0;    // blocks given back to the system (cache flushes, out of memory)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns nullptr for nbytes == 0. Throws engine::Error when memory cannot be had.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual Device device() const = 0;
};

inline constexpr size_t kCpuAlignment = 64;

// The process-wide CPU allocator.
Allocator& cpu_allocator();

// The allocator of a device (throws if that device's backend is not built in).
Allocator& allocator_for(Device d);

}  // namespace engine
