// The SIMT emulator's device-side interface: what a CUDA kernel sees when the emulation build
// compiles it with g++ (threadIdx and friends, barriers, warp intrinsics, dynamic shared memory,
// atomics), and the host-side launch. Included through emu/cuda_compat.h, never by name.
//
// A launch runs every block on a small pool of worker threads; inside a block each CUDA thread
// is a stackful fiber (Boost.Context). A fiber runs until it reaches a barrier (__syncthreads,
// a warp intrinsic) or returns; the block's scheduler then resumes the others, in forward, reverse
// or random order (EMU_SCHEDULE=forward|reverse|random, EMU_SEED), and releases a barrier once
// every thread it names has arrived. Misuse is a fault naming the kernel, block and thread:
// a __syncthreads some threads skip or reach at another call site, a deadlock, a warp mask that
// does not match the arriving lanes, a shuffle from a lane outside the mask, dynamic shared
// memory read before any thread wrote it or accessed past the launch's size.
#pragma once

#include <vector_types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

namespace emu {

struct Site {
  const char* file;
  int line;
};

// Per fiber / per block values, switched by the scheduler.
extern thread_local uint3 t_thread_idx;
extern thread_local uint3 t_block_idx;
extern thread_local dim3 t_block_dim;
extern thread_local dim3 t_grid_dim;

// Raises a fault naming the running kernel, block and thread; does not return (the block is
// abandoned and the launch reports the fault).
[[noreturn]] void device_fault(const std::string& what);

void syncthreads(Site site);

// Thread block clusters (sm_90; emu/cluster.h gives cooperative_groups' cluster_group over these):
// the blocks of a cluster run at the same time, each on a thread of its own, so a cluster barrier
// and a block's reads of another's dynamic shared memory behave as on the GPU. cluster_sync is
// the barrier of every thread of every block of the cluster (a block that exits, or a thread that
// exits, while the others wait is a fault, as a divergent __syncthreads is); cluster_map_shared
// is the address of the same byte of dynamic shared memory in block `rank` of the cluster (the
// emulator maps dynamic shared memory only; an address outside it, or a rank outside the
// cluster, is a fault). A launch without a cluster is a cluster of one block.
void cluster_sync(Site site);
unsigned cluster_block_rank();
dim3 cluster_dim();
dim3 cluster_block_index();
void* cluster_map_shared(const void* p, unsigned rank);
int syncthreads_reduce(Site site, int kind, int predicate);  // kind: 0 count, 1 and, 2 or
void syncwarp(Site site, unsigned mask);

enum class WarpOp : int { shfl, shfl_up, shfl_down, shfl_xor, ballot, any, all, sync };
// The primitive every warp intrinsic uses: this lane offers `in` (n <= 16 bytes) and receives,
// in `out`, the value of the lane `op`/`arg`/`width` select (ballot/any/all: the vote bits).
void warp_exchange(Site site, WarpOp op, unsigned mask, const void* in, size_t n, int arg,
                   int width, void* out);

template <class T>
T shfl_generic(Site site, WarpOp op, unsigned mask, T var, int arg, int width) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>, "shuffle of a large type");
  T out;
  warp_exchange(site, op, mask, &var, sizeof(T), arg, width, &out);
  return out;
}

// Dynamic shared memory of the running block, checked element by element: every access through
// a SharedPtr is bounds-checked against the launch's size and a read of bytes no thread has
// written yet is a fault. In a cluster the same holds for another block's memory (reached through
// cluster_map_shared), and an access to a block that has exited is a fault. Converting to a raw
// pointer drops the checks (the canary after the region still catches writes past it when the block
// ends).
void* dynamic_shared_base();
size_t dynamic_shared_bytes();
void shared_check(const void* p, size_t n, bool write);

template <class T>
class SharedRef {
 public:
  explicit SharedRef(T* p) : p_(p) {}
  operator T() const {
    shared_check(p_, sizeof(T), false);
    return *p_;
  }
  SharedRef& operator=(const T& v) {
    shared_check(p_, sizeof(T), true);
    *p_ = v;
    return *this;
  }
  SharedRef& operator=(const SharedRef& o) { return *this = static_cast<T>(o); }
  SharedRef& operator+=(const T& v) { return *this = static_cast<T>(*this) + v; }
  SharedRef& operator-=(const T& v) { return *this = static_cast<T>(*this) - v; }
  SharedRef& operator*=(const T& v) { return *this = static_cast<T>(*this) * v; }
  T* operator&() const { return p_; }

 private:
  T* p_;
};

template <class T>
class SharedPtr {
 public:
  SharedPtr() = default;
  explicit SharedPtr(T* p) : p_(p) {}
  template <class U>
  explicit SharedPtr(const SharedPtr<U>& o) : p_(reinterpret_cast<T*>(o.get())) {}
  SharedRef<T> operator[](int64_t i) const { return SharedRef<T>(p_ + i); }
  SharedRef<T> operator*() const { return SharedRef<T>(p_); }
  SharedPtr operator+(int64_t i) const { return SharedPtr(p_ + i); }
  SharedPtr operator-(int64_t i) const { return SharedPtr(p_ - i); }
  operator T*() const { return p_; }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

// Host side: queues `body` to run for every thread of the grid on `stream` (called by the
// engine's launch helper). A configuration the real launch would refuse (no threads, more than
// 1024 per block, a grid or block dimension past its limit, more dynamic shared memory than 48 KiB
// or the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize) returns the real error code
// (cudaErrorInvalidConfiguration / cudaErrorInvalidValue) and sets cudaGetLastError, as the real
// launch does. `cluster`: the blocks of a thread block cluster in each dimension (1 x 1 x 1: none);
// at most 8 blocks (the portable size) dividing the grid in every dimension, otherwise
// cudaErrorInvalidClusterSize.
struct LaunchShape {
  dim3 grid, block;
  size_t shared_bytes;
  dim3 cluster = dim3(1, 1, 1);
};
int launch(const char* kernel, const void* fn, const LaunchShape& shape, void* stream,
           std::function<void()> body);

// Schedule of the fibers of a block (EMU_SCHEDULE at start-up; tests may switch it).
enum class Schedule { forward, reverse, random };
void set_schedule(Schedule s, uint64_t seed = 1);
Schedule schedule();

// Counters for the emulator's cost measurements.
struct Stats {
  uint64_t threads = 0, blocks = 0, barriers = 0, warp_ops = 0, launches = 0;
};
Stats stats();

}  // namespace emu
