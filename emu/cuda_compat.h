// Force-included (g++ -include) into every .cu file of the emulation build: makes CUDA C++
// compile as host C++ over the SIMT emulator. The CUDA toolkit's own headers give the types
// (vector types, __half, __nv_bfloat16 with host arithmetic, the runtime API declarations, which
// emu/runtime.cpp implements); this header gives what nvcc builds in: execution-space keywords,
// threadIdx / blockIdx / blockDim / gridDim / warpSize, barriers, warp intrinsics, atomics and the
// device math functions kernels use. Kernels are ordinary CUDA; nothing here is a second dialect.
#pragma once

// Standard headers first: the CUDA headers expect them.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

// Execution spaces are plain functions; __shared__ variables are one per block (a block runs on
// one worker thread at a time, its fibers share the thread's storage).
#define __host__
#define __device__
#define __global__
#define __shared__ static thread_local
#define __constant__ static
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <vector_types.h>

#include "emu/simt.h"

#define ENGINE_CUDA_EMULATION 1

#define threadIdx (::emu::t_thread_idx)
#define blockIdx (::emu::t_block_idx)
#define blockDim (::emu::t_block_dim)
#define gridDim (::emu::t_grid_dim)
inline constexpr int warpSize = 32;

#define __syncthreads() ::emu::syncthreads(::emu::Site{__FILE__, __LINE__})
#define __syncthreads_count(p) ::emu::syncthreads_reduce(::emu::Site{__FILE__, __LINE__}, 0, (p))
#define __syncthreads_and(p) ::emu::syncthreads_reduce(::emu::Site{__FILE__, __LINE__}, 1, (p))
#define __syncthreads_or(p) ::emu::syncthreads_reduce(::emu::Site{__FILE__, __LINE__}, 2, (p))
#define __syncwarp(...) ::emu::syncwarp(::emu::Site{__FILE__, __LINE__}, ##__VA_ARGS__ + 0u)
// A device-side abort (a kernel's own bounds check): the launch faults, the error is sticky.
#define __trap() \
  ::emu::device_fault(std::string("__trap() at ") + __FILE__ + ":" + std::to_string(__LINE__))

namespace emu::intrinsics {
inline constexpr unsigned kFull = 0xffffffffu;
template <class T>
T shfl(Site s, unsigned mask, T v, int src, int width = 32) {
  return shfl_generic(s, WarpOp::shfl, mask, v, src, width);
}
template <class T>
T shfl_up(Site s, unsigned mask, T v, unsigned delta, int width = 32) {
  return shfl_generic(s, WarpOp::shfl_up, mask, v, static_cast<int>(delta), width);
}
template <class T>
T shfl_down(Site s, unsigned mask, T v, unsigned delta, int width = 32) {
  return shfl_generic(s, WarpOp::shfl_down, mask, v, static_cast<int>(delta), width);
}
template <class T>
T shfl_xor(Site s, unsigned mask, T v, int lane_mask, int width = 32) {
  return shfl_generic(s, WarpOp::shfl_xor, mask, v, lane_mask, width);
}
inline unsigned vote(Site s, WarpOp op, unsigned mask, int pred) {
  int p = pred != 0;
  unsigned out = 0;
  warp_exchange(s, op, mask, &p, sizeof p, 0, 32, &out);
  return out;
}
}  // namespace emu::intrinsics

#define __shfl_sync(...) ::emu::intrinsics::shfl(::emu::Site{__FILE__, __LINE__}, __VA_ARGS__)
#define __shfl_up_sync(...) ::emu::intrinsics::shfl_up(::emu::Site{__FILE__, __LINE__}, __VA_ARGS__)
#define __shfl_down_sync(...) \
  ::emu::intrinsics::shfl_down(::emu::Site{__FILE__, __LINE__}, __VA_ARGS__)
#define __shfl_xor_sync(...) \
  ::emu::intrinsics::shfl_xor(::emu::Site{__FILE__, __LINE__}, __VA_ARGS__)
#define __ballot_sync(mask, p) \
  ::emu::intrinsics::vote(::emu::Site{__FILE__, __LINE__}, ::emu::WarpOp::ballot, (mask), (p))
#define __any_sync(mask, p) \
  (::emu::intrinsics::vote(::emu::Site{__FILE__, __LINE__}, ::emu::WarpOp::any, (mask), (p)) != 0)
#define __all_sync(mask, p) \
  (::emu::intrinsics::vote(::emu::Site{__FILE__, __LINE__}, ::emu::WarpOp::all, (mask), (p)) != 0)

// Memory fences order nothing extra here: blocks share memory only through atomics.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() {}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// Device atomics are relaxed read-modify-writes on global or shared memory.
template <class T>
inline T atomicAdd(T* p, T v) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    std::atomic_ref<unsigned short> a(*reinterpret_cast<unsigned short*>(p));
    unsigned short old = a.load(std::memory_order_relaxed), next;
    do {
      T o;
      std::memcpy(&o, &old, 2);
      T n = T(static_cast<float>(o) + static_cast<float>(v));
      std::memcpy(&next, &n, 2);
    } while (!a.compare_exchange_weak(old, next, std::memory_order_relaxed));
    T o;
    std::memcpy(&o, &old, 2);
    return o;
  } else {
    return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed);
  }
}
template <class T>
inline T atomicSub(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_sub(v, std::memory_order_relaxed);
}
template <class T>
inline T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v, std::memory_order_relaxed);
}
template <class T>
inline T atomicCAS(T* p, T compare, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(compare, v, std::memory_order_relaxed);
  return compare;
}
template <class T>
inline T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load(std::memory_order_relaxed);
  while (old < v && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load(std::memory_order_relaxed);
  while (v < old && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}

// Device math that is not in <cmath> under these names.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
// Round-to-nearest products the compiler may not fuse into an FMA (as nvcc guarantees for these
// intrinsics): the empty asm makes the rounded product opaque to contraction.
inline float __fmul_rn(float x, float y) {
  float r = x * y;
  __asm__("" : "+x"(r));
  return r;
}
inline double __dmul_rn(double x, double y) {
  double r = x * y;
  __asm__("" : "+x"(r));
  return r;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
// CUDA's device math overloads every function for float at global scope, as <cmath>'s std:: does.
using std::abs;
using std::ceil;
using std::erf;
using std::exp;
using std::fabs;
using std::floor;
using std::isfinite;
using std::isinf;
using std::isnan;
using std::log;
using std::max;
using std::min;
using std::pow;
using std::sqrt;
using std::tanh;

// Dynamic shared memory: kernels write ENGINE_DYNAMIC_SHARED(float, buf) (engine/cuda/launch.h);
// here `buf` is a checked pointer into the block's region.
#define EMU_DYNAMIC_SHARED(T, name) \
  ::emu::SharedPtr<T> name(static_cast<T*>(::emu::dynamic_shared_base()))
