// The aligned CPU allocator with live/peak counters.
#include "engine/allocator.h"

#include <atomic>
#include <cstdlib>

#include "engine/backend.h"
#include "engine/error.h"

namespace engine {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // aligned_alloc wants a size that is a multiple of the alignment.
    size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    ENGINE_CHECK(p != nullptr, "[alloc] out of CPU memory: could not allocate ", nbytes, " bytes (",
                 live_.load(), " bytes live, peak ", peak_.load(), ")");
    int64_t live = live_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    ++allocs_;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    std::free(ptr);
    live_.fetch_sub(static_cast<int64_t>(nbytes));
  }
  AllocatorStats stats() const override {
    AllocatorStats s;
    s.live_bytes = live_.load();
    s.peak_bytes = peak_.load();
    s.num_allocs = allocs_.load();
    s.reserved_bytes = s.live_bytes;
    s.driver_allocs = s.num_allocs;  // every block comes from the system allocator
    return s;
  }
  void reset_peak() override { peak_.store(live_.load()); }
  Device device() const override { return Device::cpu(); }

 private:
  std::atomic<int64_t> live_{0}, peak_{0}, allocs_{0};
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  return backend(d.type).allocator(d.index);
}

}  // namespace engine
