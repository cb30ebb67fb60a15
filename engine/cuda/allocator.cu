// The CUDA caching allocator (see allocator.h).
#include "engine/cuda/allocator.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/error.h"

namespace engine::cuda {
namespace {

struct BlockInfo {
  size_t size = 0;                          // its size class
  std::vector<cudaStream_t> other_streams;  // streams besides compute that used it
  uint64_t pool = 0;                        // the capture pool it belongs to (0: none)
};

using FreeLists = std::map<size_t, std::vector<void*>>;  // size class -> free blocks

void* take(FreeLists& lists, size_t size) {
  auto it = lists.find(size);
  if (it == lists.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  return p;
}

// A freed block still in use by another stream: free once `events` have all completed.
struct Pending {
  void* ptr;
  size_t size;
  std::vector<cudaEvent_t> events;
};

class DeviceCachingAllocator final : public CachingAllocator {
 public:
  explicit DeviceCachingAllocator(int index) : index_(index) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    collect_pending();
    void* p = open_pool_ ? take(pools_[open_pool_], size) : nullptr;
    if (!p) p = take(free_, size);
    if (!p) p = driver_alloc(size, nbytes);
    blocks_[p] = BlockInfo{size, {}, open_pool_};
    live_ += static_cast<int64_t>(size);
    peak_ = std::max(peak_, live_);
    ++allocs_;
    return p;
  }

  void deallocate(void* p, size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    if (it == blocks_.end()) return;  // not ours: nothing sensible to do in a destructor path
    BlockInfo info = std::move(it->second);
    blocks_.erase(it);
    live_ -= static_cast<int64_t>(info.size);
    // A capture pool's block, or any block freed while a pool is open (the graph being captured
    // may use it): kept in the pool. Its other streams' work is captured too (or already queued
    // before the graph's replays), so it needs no event.
    const uint64_t pool = info.pool ? info.pool : open_pool_;
    if (pool && pools_.count(pool)) {
      pools_[pool][info.size].push_back(p);
      return;
    }
    if (info.other_streams.empty()) {
      free_[info.size].push_back(p);
      return;
    }
    Pending pending{p, info.size, {}};
    DeviceGuard guard(index_);
    for (cudaStream_t s : info.other_streams) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventRecord(e, s) != cudaSuccess) {
        // Cannot order it: keep the block out of circulation rather than risk a reuse race.
        cudaGetLastError();
        if (e) cudaEventDestroy(e);
        return;
      }
      pending.events.push_back(e);
    }
    pending_.push_back(std::move(pending));
  }

  void record_stream(void* p, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    ENGINE_CHECK(it != blocks_.end(), "[alloc] record_stream: ", p,
                 " is not a live block of the cuda:", index_, " allocator");
    if (stream == context(index_).compute) return;
    auto& v = it->second.other_streams;
    if (std::find(v.begin(), v.end(), stream) == v.end()) v.push_back(stream);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached();
  }

  uint64_t begin_pool() override {
    std::lock_guard<std::mutex> lock(mu_);
    ENGINE_CHECK(!open_pool_, "[alloc] cuda:", index_, ": a capture pool is open already (pool ",
                 open_pool_, "): one graph capture at a time");
    open_pool_ = ++pool_ids_;
    pools_[open_pool_];
    return open_pool_;
  }
  void end_pool() override {
    std::lock_guard<std::mutex> lock(mu_);
    open_pool_ = 0;
  }
  void release_pool(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pools_.find(id);
    if (it == pools_.end()) return;
    for (auto& [size, ptrs] : it->second) {
      auto& to = free_[size];
      to.insert(to.end(), ptrs.begin(), ptrs.end());
    }
    pools_.erase(it);
    for (auto& [p, info] : blocks_)
      if (info.pool == id) info.pool = 0;
    if (open_pool_ == id) open_pool_ = 0;
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    AllocatorStats s;
    s.live_bytes = live_;
    s.peak_bytes = peak_;
    s.num_allocs = allocs_;
    s.reserved_bytes = reserved_;
    s.driver_allocs = driver_allocs_;
    s.driver_frees = driver_frees_;
    return s;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = live_;
  }
  Device device() const override { return Device::cuda(index_); }

 private:
  void* driver_alloc(size_t size, size_t requested) {
    DeviceGuard guard(index_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached();  // give the cache back and try once more
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total = 0;
      cudaMemGetInfo(&free_b, &total);
      ENGINE_FAIL("[alloc] out of memory on cuda:", index_, ": could not allocate ", requested,
                  " bytes (", size, " with rounding): ", live_, " bytes in use (peak ", peak_,
                  "), ", reserved_, " reserved by the engine, the device reports ", free_b, " of ",
                  total, " bytes free: ", cudaGetErrorString(err));
    }
    reserved_ += static_cast<int64_t>(size);
    ++driver_allocs_;
    return p;
  }

  // Moves pending blocks whose streams have passed them to the free lists.
  void collect_pending() {
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      bool done = true;
      for (cudaEvent_t e : p.events) {
        const cudaError_t q = cudaEventQuery(e);
        if (q == cudaErrorNotReady || q == cudaErrorCapturedEvent) {
          if (q == cudaErrorCapturedEvent) cudaGetLastError();  // recorded inside a capture
          done = false;
          break;
        }
        if (q != cudaSuccess) cudaGetLastError();
      }
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t e : p.events) cudaEventDestroy(e);
      free_[p.size].push_back(p.ptr);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  void release_cached() {
    DeviceGuard guard(index_);
    cudaDeviceSynchronize();  // pending blocks' streams finish; cudaFree would wait anyway
    cudaGetLastError();
    collect_pending();
    for (auto& [size, ptrs] : free_) {
      for (void* p : ptrs) {
        cudaFree(p);
        reserved_ -= static_cast<int64_t>(size);
        ++driver_frees_;
      }
      ptrs.clear();
    }
  }

  int index_;
  mutable std::mutex mu_;
  FreeLists free_;                               // the cache
  std::unordered_map<void*, BlockInfo> blocks_;  // live blocks
  std::map<uint64_t, FreeLists> pools_;          // capture pools' free blocks
  uint64_t open_pool_ = 0, pool_ids_ = 0;
  std::vector<Pending> pending_;
  int64_t live_ = 0, peak_ = 0, allocs_ = 0, reserved_ = 0, driver_allocs_ = 0, driver_frees_ = 0;
};

std::mutex g_mu;
std::vector<std::unique_ptr<DeviceCachingAllocator>> g_allocators;

}  // namespace

size_t CachingAllocator::size_class(size_t n) {
  constexpr size_t kSmall = size_t(1) << 20;
  if (n < kSmall) return (n + 511) / 512 * 512;
  size_t pow2 = kSmall;
  while (pow2 * 2 <= n) pow2 *= 2;
  const size_t quarter = pow2 / 4;
  return (n + quarter - 1) / quarter * quarter;
}

CachingAllocator& caching_allocator(int device) {
  context(device);  // validates the index, creates the streams
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_allocators.size() <= static_cast<size_t>(device)) g_allocators.resize(device + 1);
  if (!g_allocators[device])
    g_allocators[device] = std::make_unique<DeviceCachingAllocator>(device);
  return *g_allocators[device];
}

}  // namespace engine::cuda
