// CUDA kernels of bucket_lookup, cls_reset and untied_bias (see position_bias.h).
//
// bucket_lookup, forward: grid.y over the channels, a thread per 4 consecutive positions (their
//   indices two 16-byte loads, the values one vector store) when N % 4 == 0, else per position.
// bucket_lookup, backward, deterministic and without atomics, in two launches:
//   - partials: grid (pieces of N, C, groups of 32 buckets); a thread of a piece's 128 takes every
//     128th group of 4 consecutive positions of it when N % 4 == 0 (its indices two 16-byte loads,
//     the gradient's values one vector: 16 bytes in f32) and every 128th position otherwise
//     (coalesced loads either way), and adds each value, in position order, into its own column of
//     a 32 x 128 table in shared memory (bucket - 32 g, row; the lanes on distinct banks); then
//     thread b < 32 adds row b's 128 columns in order into the piece's partial for bucket b;
//   - sums: a warp per (bucket, channel) adds the pieces' partials (lane l: pieces l, l + 32, ...,
//     then warp_sum's fixed tree).
//   At most 512 pieces (per channel and group), each of >= 2048 positions: no thread loops over
//   more than N / 65536 positions (16 at T = 512: 4 steps of 4), and the grid has 16 x C x groups
//   blocks at least.
// cls_reset: a thread per 16-byte vector of a row (per element when U is not a multiple), and a
//   block per channel for the two sums (block_sum: a fixed order).
// untied_bias: a thread per V consecutive elements of a (T, T) row, V = 16 bytes of out's (the
//   gradient's) type (4 in f32, 8 in 16-bit), when V divides T and the (T, T) operands are 16-byte
//   aligned: the forward's add and out, the backward's dout and dadd one 16-byte vector each, the
//   group's position (channel, row, column) found once; P's and dP's V elements scalar (their rows
//   are T + 2 long: no aligned vectors), a warp's coalesced. Otherwise a thread per element (V = 1,
//   the same code). The reset's theta read from P's diagonal by the threads that need it; the
//   backward's two sums are cls_reset_sums', launched first, and written to dP's diagonal by the
//   elementwise launch, whose threads past the (T, T) groups write dP's last two columns and rows
//   (an element each). Each element's arithmetic the same on either path, its rounding spelled
//   out (fma_rn, dmath::mul_rn) so that nvcc and the emulation build agree.
// Out-of-range bucket indices are reported (device_error.cuh: raised at the next host read) and
// looked up as 0 / left out of the sums.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "ops/position_bias.h"

namespace engine::cuda {
namespace {

constexpr int kPartialThreads = 128;  // threads of a backward piece
constexpr int kBucketGroup = 32;      // buckets a partials block sums
constexpr int64_t kMinPiece = 2048;   // positions of a piece, at least
constexpr int64_t kMaxPieces = 512;   // pieces per (channel, group), at most

// Group e's V bucket indices: two 16-byte loads for V = 4 (N % 4 == 0, aligned), else one.
template <int V>
__device__ inline void load_buckets(const int64_t* index, int64_t e, int64_t (&b)[V]) {
  if constexpr (V == 4) {
    const Vec<int64_t, 2> lo = reinterpret_cast<const Vec<int64_t, 2>*>(index)[2 * e];
    const Vec<int64_t, 2> hi = reinterpret_cast<const Vec<int64_t, 2>*>(index)[2 * e + 1];
    b[0] = lo.v[0], b[1] = lo.v[1], b[2] = hi.v[0], b[3] = hi.v[1];
  } else {
    b[0] = index[e];
  }
}

// out (C, N): V consecutive positions a thread (V = 4 needs N % 4 == 0: rows stay aligned).
template <class T, int V>
__global__ void bucket_lookup_fwd(const T* table, const int64_t* index, T* out, int64_t n,
                                  int64_t r, int64_t c, DeviceIndexError* err) {
  const int64_t groups = n / V;
  for (int64_t ch = blockIdx.y; ch < c; ch += gridDim.y) {
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < groups;
         e += int64_t(gridDim.x) * blockDim.x) {
      int64_t b[V];
      load_buckets<V>(index, e, b);
      Vec<T, V> o;
#pragma unroll
      for (int q = 0; q < V; ++q) {
        if (b[q] < 0 || b[q] >= r) {
          report_bad_index(err, IndexCheck::bucket_lookup, V * e + q, b[q], r);
          o.v[q] = from_acc<T>(Acc<T>(0));
        } else {
          o.v[q] = table[b[q] * c + ch];
        }
      }
      reinterpret_cast<Vec<T, V>*>(out + ch * n)[e] = o;
    }
  }
}

// part (R, C, pieces) in the accumulation type; piece = blockIdx.x, channel blockIdx.y, buckets
// [32 blockIdx.z, 32 blockIdx.z + 32). A step of a thread: V consecutive positions (V = 4: their
// indices two 16-byte loads and the values one vector, N % 4 == 0); per_thread steps a thread.
template <class T, int V>
__global__ void bucket_lookup_partials(const T* grad, const int64_t* index, Acc<T>* part, int64_t n,
                                       int64_t r, int64_t c, int64_t per_thread,
                                       DeviceIndexError* err) {
  __shared__ Acc<T> acc[kBucketGroup * kPartialThreads];
  const int t = threadIdx.x;
  const int64_t ch = blockIdx.y, b0 = int64_t(blockIdx.z) * kBucketGroup;
  const int64_t pieces = gridDim.x;
  for (int b = 0; b < kBucketGroup; ++b) acc[b * kPartialThreads + t] = Acc<T>(0);
  const int64_t first = int64_t(blockIdx.x) * per_thread * kPartialThreads, groups = n / V;
  const T* g = grad + ch * n;
  for (int64_t k = 0; k < per_thread; ++k) {
    const int64_t e = first + k * kPartialThreads + t;
    if (e >= groups) break;
    int64_t b[V];
    load_buckets<V>(index, e, b);
    const Vec<T, V> x = reinterpret_cast<const Vec<T, V>*>(g)[e];
#pragma unroll
    for (int q = 0; q < V; ++q) {
      if (b[q] < 0 || b[q] >= r) {
        if (blockIdx.z == 0 && ch == 0)
          report_bad_index(err, IndexCheck::bucket_lookup, V * e + q, b[q], r);
        continue;
      }
      if (b[q] >= b0 && b[q] < b0 + kBucketGroup)
        acc[(b[q] - b0) * kPartialThreads + t] += to_acc(x.v[q]);
    }
  }
  __syncthreads();
  if (t < kBucketGroup && b0 + t < r) {
    Acc<T> s = 0;
    for (int k = 0; k < kPartialThreads; ++k) s += acc[t * kPartialThreads + k];
    part[((b0 + t) * c + ch) * pieces + blockIdx.x] = s;
  }
}

// A warp per (bucket, channel): lane l adds pieces l, l + 32, ... in order, then warp_sum (a
// fixed tree).
template <class T>
__global__ void bucket_lookup_sum(const Acc<T>* part, T* dtable, int64_t rc, int64_t pieces) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; e < rc;
       e += warps) {
    const Acc<T>* pe = part + e * pieces;
    Acc<T> s = 0;
    for (int64_t k = lane; k < pieces; k += kWarpSize) s += pe[k];
    s = warp_sum(s);
    if (lane == 0) dtable[e] = from_acc<T>(s);
  }
}

// out (C, T, U) in vectors of V along a row (V divides U).
template <class T, int V>
__global__ void cls_reset_fwd(const T* v, const T* row, const T* col, T* out, int64_t t, int64_t u,
                              int64_t vectors) {
  const int64_t per_row = u / V;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < vectors;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t rowi = e / per_row, j = e - rowi * per_row;
    const int64_t ch = rowi / t, i = rowi - ch * t;
    Vec<T, V> o;
    if (i == 0) {
      const T x = row ? row[ch] : from_acc<T>(Acc<T>(0));
#pragma unroll
      for (int q = 0; q < V; ++q) o.v[q] = x;
    } else {
      o = reinterpret_cast<const Vec<T, V>*>(v)[e];
      if (j == 0) o.v[0] = col ? col[ch] : from_acc<T>(Acc<T>(0));
    }
    reinterpret_cast<Vec<T, V>*>(out)[e] = o;
  }
}

// A block per channel: drow = the sum of its first row, dcol of the rest of its first column.
template <class T>
__global__ void cls_reset_sums(const T* grad, T* drow, T* dcol, int64_t t, int64_t u) {
  const T* g = grad + int64_t(blockIdx.x) * t * u;
  Acc<T> s = 0;
  for (int64_t j = threadIdx.x; j < u; j += blockDim.x) s += to_acc(g[j]);
  s = block_sum(s);
  if (drow && threadIdx.x == 0) drow[blockIdx.x] = from_acc<T>(s);
  Acc<T> q = 0;
  for (int64_t i = 1 + threadIdx.x; i < t; i += blockDim.x) q += to_acc(g[i * u]);
  q = block_sum(q);
  if (dcol && threadIdx.x == 0) dcol[blockIdx.x] = from_acc<T>(q);
}

// x y + z rounded once.
__device__ inline float fma_rn(float x, float y, float z) { return ::fmaf(x, y, z); }
__device__ inline double fma_rn(double x, double y, double z) { return ::fma(x, y, z); }

// out (C, T, T) = s P + add, the reset's row and column from P's diagonal (position_bias.h). P
// (C, N, N), N = T + 2 with the reset, else T. TP: out's type, or a 16-bit type into f32. A thread
// per V consecutive elements of a row (V divides T; add and out one vector each, P's elements
// scalar). The rounding spelled out, as nvcc compiled the one-element-a-thread kernel before it
// (e70f938): s P + add one FMA; at the reset s theta rounded, then add added.
template <class TP, class TO, int V>
__global__ void untied_bias_fwd(const TP* p, const TO* add, TO* out, int64_t c, int64_t t,
                                int64_t n, Acc<TO> s, bool reset, bool add_at_reset) {
  const int64_t per_row = t / V, groups = c * t * per_row;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < groups;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / per_row, j0 = (e - row * per_row) * V, ch = row / t, i = row - ch * t;
    const TP* pc = p + ch * n * n;
    Vec<TO, V> a{};
    if (add) a = reinterpret_cast<const Vec<TO, V>*>(add)[e];
    Vec<TO, V> o;
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int64_t j = j0 + q;
      Acc<TO> v;
      if (reset && (i == 0 || j == 0)) {
        const Acc<TO> x = to_acc(i == 0 ? pc[t * n + t] : pc[(t + 1) * n + t + 1]);
        v = add && add_at_reset ? dmath::mul_rn(s, x) + Acc<TO>(to_acc(a.v[q])) : s * x;
      } else {
        const Acc<TO> x = to_acc(pc[i * n + j]);
        v = add ? fma_rn(s, x, Acc<TO>(to_acc(a.v[q]))) : s * x;
      }
      o.v[q] = from_acc<TO>(v);
    }
    reinterpret_cast<Vec<TO, V>*>(out)[e] = o;
  }
}

// dP (C, N, N) = s dout off the reset, s rows[c] at (T, T) and s cols[c] at (T + 1, T + 1), 0
// elsewhere; dadd (C, T, T) = dout, 0 at the reset unless add_at_reset. Either may be null. Work
// items: the (T, T) rows' groups of V consecutive elements (V divides T; dout and dadd one vector
// each, dP's elements scalar), then, with dP, its C (N^2 - T^2) elements outside them (a channel's
// rows 0 .. T - 1's last N - T columns, then its rows T .. N - 1), one each.
template <class TP, class TG, int V>
__global__ void untied_bias_bwd(const TG* g, const TG* rows, const TG* cols, TP* dp, TG* da,
                                int64_t c, int64_t t, int64_t n, Acc<TG> s, bool reset,
                                bool add_at_reset) {
  const int64_t per_row = t / V, groups = c * t * per_row, k = n - t, edge = n * n - t * t;
  const int64_t total = groups + (dp ? c * edge : 0);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    if (e >= groups) {
      const int64_t b = e - groups, ch = b / edge;
      int64_t r = b - ch * edge, i, j;
      if (r < t * k) {
        i = r / k, j = t + (r - i * k);
      } else {
        r -= t * k;
        i = t + r / n, j = r - (i - t) * n;
      }
      Acc<TG> v = Acc<TG>(0);
      if (reset && i == j) v = s * to_acc(i == t ? rows[ch] : cols[ch]);
      dp[(ch * n + i) * n + j] = from_acc<TP>(v);
      continue;
    }
    const int64_t row = e / per_row, j0 = (e - row * per_row) * V, ch = row / t, i = row - ch * t;
    const Vec<TG, V> x = reinterpret_cast<const Vec<TG, V>*>(g)[e];
    if (dp) {
      TP* d = dp + (ch * n + i) * n + j0;
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const bool at = reset && (i == 0 || j0 + q == 0);
        d[q] = from_acc<TP>(at ? Acc<TG>(0) : s * to_acc(x.v[q]));
      }
    }
    if (da) {
      Vec<TG, V> y;
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const bool at = reset && (i == 0 || j0 + q == 0);
        y.v[q] = at && !add_at_reset ? from_acc<TG>(Acc<TG>(0)) : x.v[q];
      }
      reinterpret_cast<Vec<TG, V>*>(da)[e] = y;
    }
  }
}

// 16 bytes of T (1 for a wider type).
template <class T>
constexpr int kVec16 = sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T));

unsigned grid_y(int64_t c) { return static_cast<unsigned>(c < 65535 ? c : 65535); }

void bucket_lookup(const Tensor& table, const Tensor& index, const Tensor& out) {
  const int64_t r = table.shape()[0], c = table.shape()[1], n = index.numel();
  if (c == 0 || n == 0) return;
  DeviceGuard guard(table.device().index);
  const cudaStream_t stream = compute_stream(table.device().index);
  DeviceIndexError* err = device_index_error(table.device().index);
  dispatch_device_all(table.dtype(), [&]<class T>() {
    const bool vec = n % 4 == 0 && detail::aligned(dptr<const int64_t>(index), 16) &&
                     detail::aligned(dptr<T>(out), 4 * sizeof(T));
    const int v = vec ? 4 : 1;
    const LaunchConfig cfg{dim3(grid_blocks(n / v, kElementwiseThreads, 65535), grid_y(c)),
                           dim3(kElementwiseThreads), 0, stream};
    auto launch = [&](auto kernel) {
      launch_kernel("bucket_lookup_fwd", kernel, cfg, dptr<const T>(table),
                    dptr<const int64_t>(index), dptr<T>(out), n, r, c, err);
    };
    if (vec)
      launch(bucket_lookup_fwd<T, 4>);
    else
      launch(bucket_lookup_fwd<T, 1>);
  });
}

void bucket_lookup_backward(const Tensor& grad, const Tensor& index, const Tensor& dtable) {
  const int64_t r = dtable.shape()[0], c = dtable.shape()[1], n = index.numel();
  if (r * c == 0) return;
  const Device dev = grad.device();
  DeviceGuard guard(dev.index);
  const cudaStream_t stream = compute_stream(dev.index);
  ENGINE_CHECK(c <= 65535 && (r + kBucketGroup - 1) / kBucketGroup <= 65535, "[bucket_lookup] ", c,
               " channels and ", r,
               " buckets exceed the backward's grid (at most 65535 of each, in groups of 32)");
  int64_t pieces = (n + kMinPiece - 1) / kMinPiece;
  if (pieces > kMaxPieces) pieces = kMaxPieces;
  if (pieces < 1) pieces = 1;
  dispatch_device_floating(grad.dtype(), "bucket_lookup_backward", [&]<class T>() {
    const DType acc = std::is_same_v<Acc<T>, double> ? DType::f64 : DType::f32;
    Tensor part = Tensor::empty({r * c * pieces}, acc, dev);
    const bool vec = n % 4 == 0 && detail::aligned(dptr<const int64_t>(index), 16) &&
                     detail::aligned(dptr<const T>(grad), 4 * sizeof(T));
    const int64_t v = vec ? 4 : 1, step = pieces * kPartialThreads * v;
    const int64_t per_thread = (n + step - 1) / step;  // steps of v positions a thread
    const LaunchConfig pc{
        dim3(unsigned(pieces), unsigned(c), unsigned((r + kBucketGroup - 1) / kBucketGroup)),
        dim3(kPartialThreads), 0, stream};
    auto launch = [&](auto kernel) {
      launch_kernel("bucket_lookup_partials", kernel, pc, dptr<const T>(grad),
                    dptr<const int64_t>(index), dptr<Acc<T>>(part), n, r, c, per_thread,
                    device_index_error(dev.index));
    };
    if (vec)
      launch(bucket_lookup_partials<T, 4>);
    else
      launch(bucket_lookup_partials<T, 1>);
    const LaunchConfig sc{dim3(grid_blocks(r * c * kWarpSize, kElementwiseThreads)),
                          dim3(kElementwiseThreads), 0, stream};
    ENGINE_LAUNCH(bucket_lookup_sum<T>, sc, dptr<const Acc<T>>(part), dptr<T>(dtable), r * c,
                  pieces);
  });
}

void cls_reset(const Tensor& v, const Tensor& row, const Tensor& col, const Tensor& out) {
  const int64_t t = v.shape()[1], u = v.shape()[2], n = v.numel();
  if (n == 0) return;
  DeviceGuard guard(v.device().index);
  const cudaStream_t stream = compute_stream(v.device().index);
  dispatch_device_all(v.dtype(), [&]<class T>() {
    constexpr int kV = sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T));
    const bool vec =
        u % kV == 0 && detail::aligned(dptr<const T>(v), 16) && detail::aligned(dptr<T>(out), 16);
    const int w = vec ? kV : 1;
    const LaunchConfig cfg{dim3(grid_blocks(n / w, kElementwiseThreads)), dim3(kElementwiseThreads),
                           0, stream};
    auto launch = [&](auto kernel) {
      launch_kernel("cls_reset_fwd", kernel, cfg, dptr<const T>(v), dptr<const T>(row),
                    dptr<const T>(col), dptr<T>(out), t, u, n / w);
    };
    if (vec)
      launch(cls_reset_fwd<T, kV>);
    else
      launch(cls_reset_fwd<T, 1>);
  });
}

void cls_reset_sums_launch(const Tensor& grad, const Tensor& drow, const Tensor& dcol) {
  const int64_t c = grad.shape()[0], t = grad.shape()[1], u = grad.shape()[2];
  if (c == 0) return;
  ENGINE_CHECK(c <= 2147483647, "[cls_reset] too many channels: ", c);
  DeviceGuard guard(grad.device().index);
  dispatch_device_floating(grad.dtype(), "cls_reset", [&]<class T>() {
    const LaunchConfig cfg{dim3(unsigned(c)), dim3(kElementwiseThreads), 0,
                           compute_stream(grad.device().index)};
    ENGINE_LAUNCH(cls_reset_sums<T>, cfg, dptr<const T>(grad), dptr<T>(drow), dptr<T>(dcol), t, u);
  });
}

// fn<TP, TO>() with TO the device type of `to` and TP of `tp`: the same, or 16-bit into f32.
template <class F>
void dispatch_untied(DType tp, DType to, F&& fn) {
  dispatch_device_floating(to, "untied_bias", [&]<class TO>() {
    if (tp == to) return fn.template operator()<TO, TO>();
    if constexpr (std::is_same_v<TO, float>)
      dispatch_device_float(tp, "untied_bias",
                            [&]<class TP>() { fn.template operator()<TP, float>(); });
    else
      ENGINE_FAIL("[untied_bias] a ", dtype_name(tp), " product into ", dtype_name(to));
  });
}

void untied_bias(const UntiedBiasForward& a) {
  const int64_t c = a.out.shape()[0], t = a.out.shape()[1], n = a.product.shape()[1];
  if (a.out.numel() == 0) return;
  DeviceGuard guard(a.out.device().index);
  const UntiedBiasOptions& o = a.options;
  dispatch_untied(a.product.dtype(), a.out.dtype(), [&]<class TP, class TO>() {
    constexpr int kV = kVec16<TO>;
    const TO* add = dptr<const TO>(a.add);
    const bool vec =
        t % kV == 0 && detail::aligned(dptr<TO>(a.out), 16) && (!add || detail::aligned(add, 16));
    const int w = vec ? kV : 1;
    const LaunchConfig cfg{dim3(grid_blocks(a.out.numel() / w, kElementwiseThreads)),
                           dim3(kElementwiseThreads), 0, compute_stream(a.out.device().index)};
    auto launch = [&](auto kernel) {
      launch_kernel("untied_bias_fwd", kernel, cfg, dptr<const TP>(a.product), add, dptr<TO>(a.out),
                    c, t, n, static_cast<Acc<TO>>(o.scale), o.reset, o.add_at_reset);
    };
    if (vec)
      launch(untied_bias_fwd<TP, TO, kV>);
    else
      launch(untied_bias_fwd<TP, TO, 1>);
  });
}

void untied_bias_backward(const UntiedBiasBackward& a) {
  const int64_t c = a.grad.shape()[0], t = a.grad.shape()[1], n = t + (a.options.reset ? 2 : 0);
  if (c * n * n == 0) return;
  DeviceGuard guard(a.grad.device().index);
  const UntiedBiasOptions& o = a.options;
  const DType tp = a.dproduct.defined() ? a.dproduct.dtype() : a.grad.dtype();
  dispatch_untied(tp, a.grad.dtype(), [&]<class TP, class TG>() {
    constexpr int kV = kVec16<TG>;
    TP* dp = dptr<TP>(a.dproduct);
    TG* da = dptr<TG>(a.dadd);
    const bool vec = t % kV == 0 && detail::aligned(dptr<const TG>(a.grad), 16) &&
                     (!da || detail::aligned(da, 16));
    const int64_t items = c * t * t / (vec ? kV : 1) + (dp ? c * (n * n - t * t) : 0);
    const LaunchConfig cfg{dim3(grid_blocks(items, kElementwiseThreads)), dim3(kElementwiseThreads),
                           0, compute_stream(a.grad.device().index)};
    auto launch = [&](auto kernel) {
      launch_kernel("untied_bias_bwd", kernel, cfg, dptr<const TG>(a.grad),
                    dptr<const TG>(a.row_sums), dptr<const TG>(a.col_sums), dp, da, c, t, n,
                    static_cast<Acc<TG>>(o.scale), o.reset, o.add_at_reset);
    };
    if (vec)
      launch(untied_bias_bwd<TP, TG, kV>);
    else
      launch(untied_bias_bwd<TP, TG, 1>);
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(untied_bias_kernel, DeviceType::CUDA, untied_bias);
ENGINE_REGISTER_KERNEL(untied_bias_backward_kernel, DeviceType::CUDA, untied_bias_backward);
ENGINE_REGISTER_KERNEL(bucket_lookup_kernel, DeviceType::CUDA, bucket_lookup);
ENGINE_REGISTER_KERNEL(bucket_lookup_backward_kernel, DeviceType::CUDA, bucket_lookup_backward);
ENGINE_REGISTER_KERNEL(cls_reset_kernel, DeviceType::CUDA, cls_reset);
ENGINE_REGISTER_KERNEL(cls_reset_sums_kernel, DeviceType::CUDA, cls_reset_sums_launch);

}  // namespace engine::cuda
