// The aligned CPU allocator with live/peak counters and a cache of large blocks.
#include "engine/allocator.h"

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>

#include "engine/backend.h"
#include "engine/error.h"

namespace engine {
namespace {

// Blocks of at least kCacheMin bytes are kept when freed and handed out again for the same
// rounded size: a training step allocates the same activations, gradients and temporaries every
// step, and fresh pages of a new mmap'ed block cost a page fault each (8% of a tiny-model CPU step
// before this cache). Smaller blocks come from malloc's own arenas. The cache holds at most
// kCacheMax bytes (the largest blocks go first beyond that) and is emptied when the system runs
// out of memory, before giving up.
constexpr size_t kCacheMin = size_t(1) << 20;
constexpr size_t kCacheGranule = size_t(1) << 16;
constexpr size_t kCacheMax = size_t(2) << 30;

class CpuAllocator final : public Allocator {
 public:
  ~CpuAllocator() override { release_cache(0); }
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = block_size(nbytes);
    void* p = nullptr;
    if (rounded >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find(rounded);
      if (it != cache_.end()) {
        p = it->second;
        cache_.erase(it);
        cached_ -= rounded;
      }
    }
    if (!p) {
      // aligned_alloc wants a size that is a multiple of the alignment.
      p = std::aligned_alloc(kCpuAlignment, rounded);
      if (!p && release_cache(0) > 0) p = std::aligned_alloc(kCpuAlignment, rounded);
      ENGINE_CHECK(p != nullptr, "[alloc] out of CPU memory: could not allocate ", nbytes,
                   " bytes (", live_.load(), " bytes live, peak ", peak_.load(), ")");
      ++system_allocs_;
    }
    int64_t live = live_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    ++allocs_;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    live_.fetch_sub(static_cast<int64_t>(nbytes));
    const size_t rounded = block_size(nbytes);
    if (rounded >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mutex_);
      cache_.emplace(rounded, ptr);
      cached_ += rounded;
      if (cached_ > kCacheMax) trim_locked(kCacheMax);
      return;
    }
    std::free(ptr);
    ++system_frees_;
  }
  AllocatorStats stats() const override {
    AllocatorStats s;
    s.live_bytes = live_.load();
    s.peak_bytes = peak_.load();
    s.num_allocs = allocs_.load();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      s.reserved_bytes = s.live_bytes + static_cast<int64_t>(cached_);
    }
    s.driver_allocs = system_allocs_.load();
    s.driver_frees = system_frees_.load();
    return s;
  }
  void reset_peak() override { peak_.store(live_.load()); }
  Device device() const override { return Device::cpu(); }

 private:
  static size_t block_size(size_t nbytes) {
    const size_t a = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    return a >= kCacheMin ? (a + kCacheGranule - 1) / kCacheGranule * kCacheGranule : a;
  }
  // Frees cached blocks, largest first, until at most `keep` bytes stay cached; -> bytes freed.
  size_t release_cache(size_t keep) {
    std::lock_guard<std::mutex> lock(mutex_);
    return trim_locked(keep);
  }
  size_t trim_locked(size_t keep) {
    size_t freed = 0;
    while (cached_ > keep && !cache_.empty()) {
      auto it = std::prev(cache_.end());
      std::free(it->second);
      cached_ -= it->first;
      freed += it->first;
      cache_.erase(it);
      ++system_frees_;
    }
    return freed;
  }

  std::atomic<int64_t> live_{0}, peak_{0}, allocs_{0}, system_allocs_{0}, system_frees_{0};
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> cache_;  // rounded size -> free block
  size_t cached_ = 0;
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
