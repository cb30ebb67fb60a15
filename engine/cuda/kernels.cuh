// The helpers every CUDA kernel of the engine shares, written once (docs/cuda.md):
//
//   - dtype dispatch on the host: dispatch_device_float (f32 / bf16 / f16, the compute dtypes),
//     dispatch_device_floating (+ f64), dispatch_device_all (every DType), each naming the op when
//     it refuses;
//   - element conversion: Acc<T> (the accumulation type: float for bf16 / f16, T otherwise),
//     to_acc(x) and from_acc<T>(v), usable on host and device; dmath:: erf, tanh, sin, cos,
//     exp, log, sqrt and mul_rn (a product never fused into an FMA) for float and double;
//   - a vectorised grid-stride elementwise launcher over contiguous operands:
//       launch_elementwise("gelu", n, stream, GeluOp{}, y, x);   // y[i] = op(x[i])
//     (16-byte vector loads and stores when every pointer is aligned, a scalar tail);
//   - warp and block reductions: warp_sum / warp_max, block_sum / block_max (every thread of a
//     block calls them and gets the result), and Welford mean / variance (WelfordStat,
//     welford_add, welford_merge, warp_welford, block_welford).
//
// Block reductions assume blockDim.x is a multiple of 32 (whole warps: the shuffles use the full
// mask) and at most 1024; they may be called repeatedly in one kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/cuda/launch.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace engine::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// A tensor's device data as T* (T may be __nv_bfloat16 / __half, which Tensor::data<T> does not
// name); nullptr for an undefined tensor. The dispatch that chose T has checked the dtype.
template <class T>
inline T* dptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// ---- element types ----------------------------------------------------------------------------

template <class T>
struct AccT {
  using type = T;
};
template <>
struct AccT<__nv_bfloat16> {
  using type = float;
};
template <>
struct AccT<__half> {
  using type = float;
};
template <class T>
using Acc = typename AccT<T>::type;

template <class T>
__host__ __device__ inline Acc<T> to_acc(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else
    return x;
}

template <class T, class V>
__host__ __device__ inline T from_acc(V v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// ---- host-side dtype dispatch: f.template operator()<T>() with T the device element type ------

namespace detail {
template <bool kWithF64, class F>
void dispatch_floating_impl(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::bf16:
      return f.template operator()<__nv_bfloat16>();
    case DType::f16:
      return f.template operator()<__half>();
    case DType::f64:
      if constexpr (kWithF64) return f.template operator()<double>();
      [[fallthrough]];
    default:
      ENGINE_FAIL("[", op, "] the CUDA kernel takes f32, ", kWithF64 ? "f64, " : "",
                  "bf16 or f16, got ", dtype_name(t));
  }
}
}  // namespace detail

template <class F>
void dispatch_device_float(DType t, const char* op, F&& f) {
  detail::dispatch_floating_impl<false>(t, op, static_cast<F&&>(f));
}

template <class F>
void dispatch_device_floating(DType t, const char* op, F&& f) {
  detail::dispatch_floating_impl<true>(t, op, static_cast<F&&>(f));
}

template <class F>
void dispatch_device_all(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::bf16:
      return f.template operator()<__nv_bfloat16>();
    case DType::f16:
      return f.template operator()<__half>();
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::i64:
      return f.template operator()<int64_t>();
    case DType::u8:
      return f.template operator()<uint8_t>();
  }
}

// ---- device math in the compute type (float or double), named apart from the engine's tensor
// ops (engine::sin, engine::tanh, ... would hide the global functions inside namespace engine) ---

namespace dmath {
__device__ inline float erf(float x) { return ::erff(x); }
__device__ inline double erf(double x) { return ::erf(x); }
__device__ inline float tanh(float x) { return ::tanhf(x); }
__device__ inline double tanh(double x) { return ::tanh(x); }
__device__ inline float sin(float x) { return ::sinf(x); }
__device__ inline double sin(double x) { return ::sin(x); }
__device__ inline float cos(float x) { return ::cosf(x); }
__device__ inline double cos(double x) { return ::cos(x); }
__device__ inline float exp(float x) { return ::expf(x); }
__device__ inline double exp(double x) { return ::exp(x); }
__device__ inline float log(float x) { return ::logf(x); }
__device__ inline double log(double x) { return ::log(x); }
__device__ inline float sqrt(float x) { return ::sqrtf(x); }
__device__ inline double sqrt(double x) { return ::sqrt(x); }
// A product rounded on its own, never fused with a following add into an FMA (where a kernel
// must match a CPU computation that stores the product first).
__device__ inline float mul_rn(float x, float y) { return __fmul_rn(x, y); }
__device__ inline double mul_rn(double x, double y) { return __dmul_rn(x, y); }
}  // namespace dmath

// ---- grid sizing ------------------------------------------------------------------------------

inline constexpr int kElementwiseThreads = 256;
// Enough blocks to cover `work` items at `threads` per block, capped so that a grid-stride loop
// takes over for huge tensors (and grid.x stays far below its limit).
inline int grid_blocks(int64_t work, int threads, int64_t cap = 65535 * 32) {
  int64_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<int>(b < cap ? b : cap);
}

// ---- vectorised elementwise -------------------------------------------------------------------

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

namespace detail {

template <class Op, class Out, int V, class... Vs>
__device__ inline void apply_vec(const Op& op, Vec<Out, V>& out, const Vs&... in) {
#pragma unroll
  for (int j = 0; j < V; ++j) out.v[j] = from_acc<Out>(op(to_acc(in.v[j])...));
}

template <int V, class Op, class Out, class... In>
__global__ void elementwise_kernel(int64_t n, Op op, Out* out, const In*... in) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t n_vec = n / V;
  for (int64_t i = first; i < n_vec; i += stride) {
    Vec<Out, V> o;
    apply_vec(op, o, reinterpret_cast<const Vec<In, V>*>(in)[i]...);
    reinterpret_cast<Vec<Out, V>*>(out)[i] = o;
  }
  for (int64_t i = n_vec * V + first; i < n; i += stride)
    out[i] = from_acc<Out>(op(to_acc(in[i])...));
}

template <class... Ts>
constexpr int max_size() {
  size_t m = 1;
  ((m = sizeof(Ts) > m ? sizeof(Ts) : m), ...);
  return static_cast<int>(m);
}

inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace detail

// out[i] = op(in[i]...) for i < n over contiguous operands, computed in the accumulation types
// (op gets to_acc of each input; its result is rounded to Out). op is a functor with a
// __device__ operator() (no lambdas: nvcc would need --extended-lambda). Vector width: 16 bytes
// of the widest operand when every pointer is 16-byte aligned, else one element per thread.
template <class Op, class Out, class... In>
void launch_elementwise(const char* name, int64_t n, cudaStream_t stream, Op op, Out* out,
                        const In*... in) {
  if (n <= 0) return;
  constexpr int V = 16 / detail::max_size<Out, In...>();
  const bool vec = V > 1 && detail::aligned(out, 16) && (detail::aligned(in, 16) && ...);
  const int threads = kElementwiseThreads;
  if (vec) {
    const LaunchConfig cfg{dim3(grid_blocks(n / V > 0 ? n / V : 1, threads)), dim3(threads), 0,
                           stream};
    launch_kernel(name, detail::elementwise_kernel<V, Op, Out, In...>, cfg, n, op, out, in...);
  } else {
    const LaunchConfig cfg{dim3(grid_blocks(n, threads)), dim3(threads), 0, stream};
    launch_kernel(name, detail::elementwise_kernel<1, Op, Out, In...>, cfg, n, op, out, in...);
  }
}

// ---- rows in registers, four elements at a time ---------------------------------------------
// Kernels that hold a row in registers (a warp per row: softmax, layer_norm) give lane l the
// groups g = l + 32 k of four consecutive elements 4g .. 4g + 3, so a warp reads 4 x 32
// consecutive elements at a time. load4 / store4 move one group: one 4-element vector when
// `vec` (row length a multiple of 4, 4-element-aligned base), else element by element with
// j + q >= n left out (loaded as 0).
template <class T>
__device__ inline void load4(const T* p, int64_t j, int64_t n, bool vec, Acc<T> (&v)[4]) {
  if (vec) {
    const Vec<T, 4> x = *reinterpret_cast<const Vec<T, 4>*>(p + j);
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = to_acc(x.v[q]);
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) v[q] = j + q < n ? to_acc(p[j + q]) : Acc<T>(0);
}

template <class T>
__device__ inline void store4(T* p, int64_t j, int64_t n, bool vec, const T (&v)[4]) {
  if (vec) {
    Vec<T, 4> x;
#pragma unroll
    for (int q = 0; q < 4; ++q) x.v[q] = v[q];
    *reinterpret_cast<Vec<T, 4>*>(p + j) = x;
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q)
    if (j + q < n) p[j + q] = v[q];
}

// Whether rows of n elements starting at p can move as 4-element vectors.
template <class T>
inline bool vec4_rows(const void* p, int64_t n) {
  return n % 4 == 0 && reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// The elements per lane (a multiple of 4) of a warp holding a row of n, or 0 above 32 x 32.
inline int warp_row_elems(int64_t n) {
  for (int e : {4, 8, 16, 32})
    if (n <= int64_t(kWarpSize) * e) return e;
  return 0;
}

// f.template operator()<E>() with E = e (4, 8, 16 or 32): a warp-row kernel's instantiation.
template <class F>
void dispatch_row_elems(int e, F&& f) {
  switch (e) {
    case 4:
      return f.template operator()<4>();
    case 8:
      return f.template operator()<8>();
    case 16:
      return f.template operator()<16>();
    default:
      return f.template operator()<32>();
  }
}

// ---- warp and block reductions ----------------------------------------------------------------

template <class T>
__device__ inline T warp_sum(T v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// NaN-propagating maximum (a NaN row must not become a finite softmax).
template <class T>
__device__ inline T max_nan(T a, T b) {
  return (a != a || a > b) ? a : b;
}

template <class T>
__device__ inline T warp_max(T v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) v = max_nan(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

namespace detail {
// Reduces v over the block with the warp reduction R and identity `init`; every thread gets
// the result. The leading barrier lets a kernel call it again with the same scratch.
template <class T, class R>
__device__ inline T block_reduce(T v, T init, R warp_reduce) {
  __shared__ T partial[kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = warp_reduce(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : init;
  return warp_reduce(v);
}
template <class T>
struct WarpSum {
  __device__ T operator()(T v) const { return warp_sum(v); }
};
template <class T>
struct WarpMax {
  __device__ T operator()(T v) const { return warp_max(v); }
};
}  // namespace detail

template <class T>
__device__ inline T block_sum(T v) {
  return detail::block_reduce(v, T(0), detail::WarpSum<T>{});
}

template <class T>
__device__ inline T block_max(T v, T lowest) {
  return detail::block_reduce(v, lowest, detail::WarpMax<T>{});
}

// Welford's running mean and sum of squared deviations (m2); variance = m2 / count. Counts are
// floats so that merging needs no conversions (exact up to 2^24 elements per row).
struct WelfordStat {
  float mean = 0.f, m2 = 0.f, count = 0.f;
};

__device__ inline void welford_add(WelfordStat& s, float x) {
  s.count += 1.f;
  const float d = x - s.mean;
  s.mean += d / s.count;
  s.m2 += d * (x - s.mean);
}

__host__ __device__ inline WelfordStat welford_merge(const WelfordStat& a, const WelfordStat& b) {
  const float n = a.count + b.count;
  if (n == 0.f) return a;
  const float d = b.mean - a.mean;
  const float wb = b.count / n;
  return WelfordStat{a.mean + d * wb, a.m2 + b.m2 + d * d * a.count * wb, n};
}

__device__ inline WelfordStat warp_welford(WelfordStat s) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    WelfordStat other{__shfl_xor_sync(kFullMask, s.mean, o), __shfl_xor_sync(kFullMask, s.m2, o),
                      __shfl_xor_sync(kFullMask, s.count, o)};
    // Both partners merge (lower lane, upper lane): every lane ends with the same bits.
    s = (threadIdx.x & o) ? welford_merge(other, s) : welford_merge(s, other);
  }
  return s;
}

__device__ inline WelfordStat block_welford(WelfordStat s) {
  __shared__ float partial[3][kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  s = warp_welford(s);
  __syncthreads();
  if (lane == 0) {
    partial[0][warp] = s.mean;
    partial[1][warp] = s.m2;
    partial[2][warp] = s.count;
  }
  __syncthreads();
  s = lane < n_warps ? WelfordStat{partial[0][lane], partial[1][lane], partial[2][lane]}
                     : WelfordStat{};
  return warp_welford(s);
}

}  // namespace engine::cuda
