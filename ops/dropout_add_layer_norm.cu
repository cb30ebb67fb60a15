// CUDA kernels of dropout_add_layer_norm (see dropout_add_layer_norm.h).
//
// Rows of up to 1024 (every BERT width) a warp each, the row held as loaded (Raw4: a 16-bit row
// two elements a register) in 4-element groups (load4's layout), each group's keep bits from one
// Philox block (dropout_keep4: the CPU's and dropout's mask), drawn one group at a time into a
// word of bits before the row's passes (keep_mask):
//   forward   reads x, residual (and the bias), writes sum once (rounded to T; the statistics and
//             normed come from the rounded sum, which is what the backward reads) and normed;
//   backward  reads sum and dnormed (and dsum), writes d_residual and dx, and adds each row's
//             dweight / dln_bias / dbias terms (those wanted) into its warp's accumulators in
//             shared memory; a warp takes R consecutive rows (R from the row count alone, ~4096
//             warps in all), a block's W warps are added in order into one partial row per block,
//             and a second launch (column_sums) adds the blocks' partials per column in order. No
//             atomics: the same bits on every run (not the CPU's: its chunks are others).
// Registers (ptxas, sm_90, bf16 at C = 1024; tools/gpu/kernel_resources.py): forward 56 under its
// launch bounds of 8 blocks an SM (36 warps; 72 before, unbounded), backward 94 under its bounds
// of 5 (20 warps; 151 before: 13), no spills. Unbounded, the backward's unrolled second pass holds
// 126-150 (its shared-memory sums' loads hoisted ahead; 80 without the sums), and 6 blocks spill.
// Its shared memory (8 KiB a warp for two sums at C = 1024, 12 KiB for three) allows 6 blocks, or
// 4 with dbias (the model's linears carry their biases on a device under autocast:
// Linear::forward_for_join).
// Rows over 1024: a block per row each way, and the parameter gradients through column_sums over
// (sum, dnormed, dx).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/reduce.cuh"
#include "engine/error.h"
#include "ops/dropout.h"
#include "ops/dropout_add_layer_norm.h"
#include "ops/layer_norm.cuh"

namespace engine::cuda {
namespace {

constexpr int kForwardWarps = 4;        // rows (warps) per block of the forward
constexpr int64_t kTargetWarps = 4096;  // backward: ~31 warps for each of an H200's 132 SMs

// The dropout a launch applies (dropout_rule's, in the compute type): kept elements times scale.
template <class T>
struct Drop {
  Acc<T> scale;
  uint32_t threshold;
  bool draws;  // keep bits from the stream; otherwise every element kept iff scale != 0
  PhiloxState state;
};

template <class T>
Drop<T> make_drop(double p, PhiloxState state) {
  const DropoutRule rule = dropout_rule(p);
  return {static_cast<Acc<T>>(rule.scale), rule.threshold, rule.draws, state};
}

// Device-side copies of the launch arguments.
template <class T, class S>
struct Fwd {
  const T *x, *bias, *residual, *weight, *ln_bias;
  T *sum, *normed;
  S *mean, *rstd;
  S eps;
  Drop<T> drop;
  bool drop_normed;  // layer_norm_dropout: x normalised, then the output dropped
};

template <class T, class S>
struct Bwd {
  const T *sum, *weight, *dnormed, *dsum;
  const S *mean, *rstd;
  T *d_residual, *dx;
  Drop<T> drop;
  bool want_w, want_lb, want_b;  // which parameter gradients to sum
  bool drop_normed;              // layer_norm_dropout: dnormed through the mask first
};

// Keep bits of row elements j0 .. j0 + 3 (stream index i0 = r * c + j0).
template <class T>
__device__ inline void keep_group(const Drop<T>& d, uint64_t i0, bool (&keep)[4]) {
  if (d.draws) {
    dropout_keep4(d.state, i0, d.threshold, keep);
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) keep[q] = d.scale != Acc<T>(0);
  }
}

// The keep bits of a warp-held row's groups (bit 4 k + q: element (k, q) of load4's layout), drawn
// one group at a time (a loop the compiler does not unroll: one Philox block in flight in a thread,
// not eight beside the row) into one word, before the row's passes.
template <class T, int G>
__device__ inline uint32_t keep_mask(const Drop<T>& d, int64_t r, int64_t c, int lane) {
  static_assert(4 * G <= 32, "a row group's bits fit one word");
  uint32_t mask = 0;
#pragma unroll 1
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    if (j0 >= c) break;
    bool keep[4];
    keep_group(d, static_cast<uint64_t>(r * c + j0), keep);
#pragma unroll
    for (int q = 0; q < 4; ++q) mask |= uint32_t(keep[q]) << (4 * k + q);
  }
  return mask;
}

// Keep bit of the one stream element i (the block-per-row kernels).
template <class T>
__device__ inline bool keep_one(const Drop<T>& d, uint64_t i) {
  return d.draws ? dropout_keep(philox_word(d.state, i), d.threshold) : d.scale != Acc<T>(0);
}

// dropout's value of v under keep: v scale rounded to T, or 0 (dropout's kernel, either way).
template <class T>
__device__ inline T dropped(bool keep, Acc<T> v, Acc<T> scale) {
  return keep ? from_acc<T>(v * scale) : from_acc<T>(Acc<T>(0));
}

// A held group through dropout (bit q of bits: element q's keep), in place.
template <class T>
__device__ inline void drop_raw(Raw4<T>& r, uint32_t bits, Acc<T> scale) {
  Vec<T, 4> v;
#pragma unroll
  for (int q = 0; q < 4; ++q) v.v[q] = dropped<T>((bits >> q) & 1u, raw_at(r, q), scale);
  memcpy(r.w, &v, sizeof(v));
}

// ---- a warp per row ------------------------------------------------------------------------

// DN: drop_normed (layer_norm_dropout), a template argument so that the residual join's code
// stays as it was (two more registers as a runtime flag: 32 warps an SM instead of 36).
template <class T, class S, int E, bool DN>
__global__ void __launch_bounds__(kForwardWarps* kWarpSize, sizeof(T) == 2 ? 8 : 1)
    dropout_add_layer_norm_warp(Fwd<T, S> a, int64_t rows, int64_t c, bool vec) {
  constexpr int G = E / 4;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = blockIdx.x * int64_t(kForwardWarps) + threadIdx.x / kWarpSize;
  if (r >= rows) return;  // the whole warp
  const uint32_t kept = keep_mask<T, G>(a.drop, r, c, lane);
  Raw4<T> z[G];  // the row's rounded sum, as stored (padding 0)
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    zero_raw(z[k]);
    if (j0 >= c) continue;
    if constexpr (DN) {  // x itself is normalised
      load4_raw(a.x + r * c, j0, c, vec, z[k]);
      continue;
    }
    Acc<T> xv[4], rv[4], bv[4] = {};
    load4(a.x + r * c, j0, c, vec, xv);
    load4(a.residual + r * c, j0, c, vec, rv);
    if (a.bias) load4(a.bias, j0, c, vec, bv);
    T zq[4];
    Vec<T, 4> held;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const bool keep = (kept >> (4 * k + q)) & 1u;
      zq[q] = from_acc<T>(rv[q] + (keep ? (xv[q] + bv[q]) * a.drop.scale : Acc<T>(0)));
      held.v[q] = j0 + q < c ? zq[q] : from_acc<T>(Acc<T>(0));
    }
    memcpy(z[k].w, &held, sizeof(held));
    store4(a.sum + r * c, j0, c, vec, zq);
  }
  S mu, var;
  warp_row_moments<S, G>([&](int k, int q) { return static_cast<S>(raw_at(z[k], q)); }, c, lane, mu,
                         var);
  const S rs = S(1) / dmath::sqrt(var + a.eps);
  if (lane == 0) {
    a.mean[r] = mu;
    a.rstd[r] = rs;
  }
#pragma unroll
  for (int k = 0; k < G; ++k) opaque(z[k]);  // widened again below, not kept in f32
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    if (j0 >= c) continue;
    Acc<T> wv[4], bv[4];
    if (a.weight) load4(a.weight, j0, c, vec, wv);
    if (a.ln_bias) load4(a.ln_bias, j0, c, vec, bv);
    T out[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      S h = xhat_at(z[k], q, mu, rs);
      if (a.weight) h *= static_cast<S>(wv[q]);
      if (a.ln_bias) h += static_cast<S>(bv[q]);
      out[q] = from_acc<T>(h);
      if constexpr (DN)  // layer_norm's rounding, then dropout's
        out[q] = dropped<T>((kept >> (4 * k + q)) & 1u, to_acc(out[q]), a.drop.scale);
    }
    store4(a.normed + r * c, j0, c, vec, out);
  }
}

// Shared-memory accumulator index of slot n (the wanted outputs' in order: dweight, dln_bias,
// dbias), lane group k, element q: the lanes of a warp touch consecutive words.
template <int G>
__device__ inline int acc_index(int n, int k, int q, int lane) {
  return ((n * G + k) * 4 + q) * kWarpSize + lane;
}

// The accumulator slots a warp keeps: one per wanted parameter gradient (E x 32 words each).
template <class T, class S>
__host__ __device__ inline int acc_slots(const Bwd<T, S>& a) {
  return int(a.want_w) + int(a.want_lb) + int(a.want_b);
}

// W warps a block, each rows [w R, (w + 1) R); part: 3 x blocks x c partial sums (block order;
// an output not wanted is not written). Each warp's slots in shared memory (acc_slots x E x 32
// words: 8 KiB at c = 1024 for the LayerNorm's two, 12 KiB with dbias: 24 and 16 warps an SM);
// the row held as loaded (warp_row_dxhat), dxhat and xhat made again in the second pass, which
// also adds the parameter-gradient terms (the first pass only sums). Launch bounds for 16-bit rows:
// 20 warps an SM (5 blocks of 4: 94 registers; 6 blocks spill; see the file's header).
template <class T, class S, int E, int W, bool DN>
__global__ void __launch_bounds__(W* kWarpSize, sizeof(T) == 2 ? 20 / W : 1)
    dropout_add_layer_norm_backward_warp(Bwd<T, S> a, int64_t rows, int64_t c,
                                         int64_t rows_per_warp, bool vec, S* part) {
  constexpr int G = E / 4;
  const int slots = acc_slots(a), per_warp = slots * G * 4 * kWarpSize;
  const int slot_lb = int(a.want_w), slot_b = slot_lb + int(a.want_lb);
  ENGINE_DYNAMIC_SHARED(S, sh);  // W x per_warp
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const auto acc = sh + warp * per_warp;                           // a checked pointer in emulation
  for (int i = lane; i < per_warp; i += kWarpSize) acc[i] = S(0);  // this warp's own words
  const int64_t r0 = (blockIdx.x * int64_t(W) + warp) * rows_per_warp;
  const int64_t r1 = r0 + rows_per_warp < rows ? r0 + rows_per_warp : rows;
  const bool want_dz = a.d_residual || a.dx || a.want_b;
  for (int64_t r = r0; r < r1; ++r) {
    const S mu = a.mean[r], rs = a.rstd[r];
    const uint32_t kept = want_dz || DN ? keep_mask<T, G>(a.drop, r, c, lane) : 0u;
    Raw4<T> xr[G], gr[G];  // the row's sum and dnormed, as loaded (drop_normed: then dropped)
    S mean_g, mean_gx;
    warp_row_dxhat<T, S, G>(a.sum + r * c, a.dnormed + r * c, a.weight, mu, rs, c, lane, vec, xr,
                            gr, mean_g, mean_gx, [&](int k, Raw4<T>& g) {
                              if constexpr (DN) drop_raw(g, kept >> (4 * k), a.drop.scale);
                            });
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
      if (j0 >= c) continue;
      Acc<T> sv[4] = {}, wv[4] = {};
      if (a.weight) load4(a.weight, j0, c, vec, wv);
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // padding: dy 0, nothing added
        const S g = static_cast<S>(raw_at(gr[k], q));
        const S xh = xhat_at(xr[k], q, mu, rs);
        if (a.want_w) acc[acc_index<G>(0, k, q, lane)] += g * xh;
        if (a.want_lb) acc[acc_index<G>(slot_lb, k, q, lane)] += g;
      }
      if (!want_dz) continue;
      if (a.dsum) load4(a.dsum + r * c, j0, c, vec, sv);
      T dz[4], dxv[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const S d = dxhat_at<S>(gr[k], q, a.weight != nullptr, wv[q]);
        const S xh = xhat_at(xr[k], q, mu, rs);
        // Rounded where the unfused path rounds: layer_norm's dx, the sum with dsum, dropout's.
        dz[q] = from_acc<T>(layer_norm_dx(d, xh, rs, mean_g, mean_gx));
        if (a.dsum) dz[q] = from_acc<T>(to_acc(dz[q]) + sv[q]);
        dxv[q] = (kept >> (4 * k + q)) & 1u ? from_acc<T>(to_acc(dz[q]) * a.drop.scale)
                                            : from_acc<T>(Acc<T>(0));
        if (a.want_b && j0 + q < c)
          acc[acc_index<G>(slot_b, k, q, lane)] += static_cast<S>(to_acc(dxv[q]));
      }
      if (a.d_residual) store4(a.d_residual + r * c, j0, c, vec, dz);
      if (a.dx) store4(a.dx + r * c, j0, c, vec, dxv);
    }
  }
  __syncthreads();
  // The block's partial row per output: its warps in order.
  for (int kk = 0, n = 0; kk < 3; ++kk) {
    if (!(kk == 0 ? a.want_w : kk == 1 ? a.want_lb : a.want_b)) continue;
    for (int64_t col = threadIdx.x; col < c; col += blockDim.x) {
      const int g = static_cast<int>(col / 4), q = static_cast<int>(col % 4);
      const int i = acc_index<G>(n, g / kWarpSize, q, g % kWarpSize);
      S s = sh[i];
      for (int w = 1; w < W; ++w) s += sh[w * per_warp + i];
      part[(kk * int64_t(gridDim.x) + blockIdx.x) * c + col] = s;
    }
    ++n;
  }
}

// ---- a block per row (rows over 1024) ------------------------------------------------------

template <class T, class S>
__global__ void dropout_add_layer_norm_rows(Fwd<T, S> a, int64_t c) {
  const int64_t r = blockIdx.x;
  WelfordStat w;
  double s = 0;
  // drop_normed: x itself is normalised (no sum written); its elements read again below
  const T* zrow = a.drop_normed ? a.x + r * c : a.sum + r * c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    T z;
    if (a.drop_normed) {
      z = a.x[r * c + j];
    } else {
      const bool keep = keep_one(a.drop, static_cast<uint64_t>(r * c + j));
      const Acc<T> b = a.bias ? to_acc(a.bias[j]) : Acc<T>(0);
      z = from_acc<T>(to_acc(a.residual[r * c + j]) +
                      (keep ? (to_acc(a.x[r * c + j]) + b) * a.drop.scale : Acc<T>(0)));
      a.sum[r * c + j] = z;
    }
    if constexpr (std::is_same_v<S, double>)
      s += to_acc(z);
    else
      welford_add(w, to_acc(z));
  }
  // The thread reads back only the sum elements it wrote.
  S mu, var;
  if constexpr (std::is_same_v<S, double>) {
    mu = block_sum(s) / static_cast<double>(c);
    double q = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const double z = to_acc(zrow[j]);
      q += (z - mu) * (z - mu);
    }
    var = block_sum(q) / static_cast<double>(c);
  } else {
    w = block_welford(w);
    mu = w.mean;
    var = w.m2 / w.count;
  }
  const S rs = S(1) / dmath::sqrt(var + a.eps);
  if (threadIdx.x == 0) {
    a.mean[r] = mu;
    a.rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    S h = (static_cast<S>(to_acc(zrow[j])) - mu) * rs;
    if (a.weight) h *= static_cast<S>(to_acc(a.weight[j]));
    if (a.ln_bias) h += static_cast<S>(to_acc(a.ln_bias[j]));
    T y = from_acc<T>(h);
    if (a.drop_normed)
      y = dropped<T>(keep_one(a.drop, static_cast<uint64_t>(r * c + j)), to_acc(y), a.drop.scale);
    a.normed[r * c + j] = y;
  }
}

// Element i of dnormed as the LayerNorm's gradient sees it: drop_normed, through dropout's mask.
template <class T, class S>
__device__ inline Acc<T> dnormed_at(const Bwd<T, S>& a, int64_t i) {
  const Acc<T> g = to_acc(a.dnormed[i]);
  if (!a.drop_normed) return g;
  return to_acc(dropped<T>(keep_one(a.drop, static_cast<uint64_t>(i)), g, a.drop.scale));
}

// d_residual and dx of one row (dx always written: the caller passes scratch when only dbias
// wants it).
template <class T, class S>
__global__ void dropout_add_layer_norm_backward_rows(Bwd<T, S> a, int64_t c) {
  const int64_t r = blockIdx.x;
  const S mu = a.mean[r], rs = a.rstd[r];
  auto dxhat = [&](int64_t j) -> S {
    const S g = static_cast<S>(dnormed_at(a, r * c + j));
    return a.weight ? dmath::mul_rn(g, static_cast<S>(to_acc(a.weight[j]))) : g;
  };
  auto xhat = [&](int64_t j) -> S { return (static_cast<S>(to_acc(a.sum[r * c + j])) - mu) * rs; };
  S sum_g = 0, sum_gx = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    sum_g += dxhat(j);
    sum_gx += dxhat(j) * xhat(j);
  }
  const S mean_g = block_sum(sum_g) / static_cast<S>(c);
  const S mean_gx = block_sum(sum_gx) / static_cast<S>(c);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    T dz = from_acc<T>(rs * (dxhat(j) - mean_g - xhat(j) * mean_gx));
    if (a.dsum) dz = from_acc<T>(to_acc(dz) + to_acc(a.dsum[r * c + j]));
    const bool keep = keep_one(a.drop, static_cast<uint64_t>(r * c + j));
    if (a.d_residual) a.d_residual[r * c + j] = dz;
    a.dx[r * c + j] = keep ? from_acc<T>(to_acc(dz) * a.drop.scale) : from_acc<T>(Acc<T>(0));
  }
}

// ---- the parameter gradients' column sums ---------------------------------------------------

// The blocks' partial rows (backward_warp), summed per column in block order.
template <class T, class S>
struct PartSums {
  using Acc = S;
  const S* part;
  int64_t chunks, c;
  ParamGrad<T> dweight, dln_bias, dbias;
  __device__ const ParamGrad<T>& out(int k) const {
    return k == 0 ? dweight : k == 1 ? dln_bias : dbias;
  }
  __device__ void load(int64_t r, int64_t col, S (&v)[3][1]) const {
#pragma unroll
    for (int k = 0; k < 3; ++k) v[k][0] = out(k) ? part[(k * chunks + r) * c + col] : S(0);
  }
  __device__ void store(int k, int64_t col, const S (&s)[1]) const { store_one(k, col, s[0]); }
  __device__ void store_one(int k, int64_t col, S s) const { out(k).put(col, s); }
};

// Rows over 1024: the sums straight from (sum, dnormed, dx).
template <class T, class S>
struct RowSums {
  using Acc = S;
  Bwd<T, S> a;  // sum, dnormed (through the mask when drop_normed), mean and rstd
  const T* dx;
  int64_t c;
  ParamGrad<T> dweight, dln_bias, dbias;
  __device__ void load(int64_t r, int64_t col, S (&v)[3][1]) const {
    const T* sum = a.sum;
    const S *mean = a.mean, *rstd = a.rstd;
    const S g = static_cast<S>(dnormed_at(a, r * c + col));
    v[0][0] = g * ((static_cast<S>(to_acc(sum[r * c + col])) - mean[r]) * rstd[r]);
    v[1][0] = g;
    v[2][0] = dbias ? static_cast<S>(to_acc(dx[r * c + col])) : S(0);
  }
  __device__ void store(int k, int64_t col, const S (&s)[1]) const { store_one(k, col, s[0]); }
  __device__ void store_one(int k, int64_t col, S s) const {
    (k == 0 ? dweight : k == 1 ? dln_bias : dbias).put(col, s);
  }
};

// ---- launches --------------------------------------------------------------------------------

void forward(const DropoutAddNormForward& t) {
  const int64_t c = t.x.shape().back();
  const int64_t rows = c == 0 ? 0 : t.x.numel() / c;
  if (rows == 0) return;
  ENGINE_CHECK(rows < (int64_t(1) << 31), "[dropout_add_layer_norm] ", rows,
               " rows exceed one grid dimension");
  const int device = t.x.device().index;
  DeviceGuard guard(device);
  const int e = warp_row_elems(c);
  dispatch_device_floating(t.x.dtype(), "dropout_add_layer_norm", [&]<class T>() {
    using S = Stats<T>;
    Fwd<T, S> a{dptr<const T>(t.x),      dptr<const T>(t.bias),      dptr<const T>(t.residual),
                dptr<const T>(t.weight), dptr<const T>(t.ln_bias),   dptr<T>(t.sum),
                dptr<T>(t.normed),       t.mean.data<S>(),           t.rstd.data<S>(),
                static_cast<S>(t.eps),   make_drop<T>(t.p, t.state), t.drop_normed};
    const cudaStream_t stream = compute_stream(device);
    if (e == 0) {
      const LaunchConfig cfg{dim3(static_cast<unsigned>(rows)), dim3(row_threads(c)), 0, stream};
      ENGINE_LAUNCH((dropout_add_layer_norm_rows<T, S>), cfg, a, c);
      return;
    }
    bool vec = true;
    for (const Tensor* p : {&t.x, &t.residual, &t.sum, &t.normed, &t.bias, &t.weight, &t.ln_bias})
      if (p->defined()) vec = vec && vec4_rows<T>(p->raw_data(), c);
    const LaunchConfig cfg{dim3(static_cast<unsigned>((rows + kForwardWarps - 1) / kForwardWarps)),
                           dim3(kForwardWarps * kWarpSize), 0, stream};
    dispatch_row_elems(e, [&]<int E>() {
      if (t.drop_normed)
        ENGINE_LAUNCH((dropout_add_layer_norm_warp<T, S, E, true>), cfg, a, rows, c, vec);
      else
        ENGINE_LAUNCH((dropout_add_layer_norm_warp<T, S, E, false>), cfg, a, rows, c, vec);
    });
  });
}

void backward(const DropoutAddNormBackward& t) {
  const int64_t c = t.sum.shape().back();
  const int64_t rows = c == 0 ? 0 : t.sum.numel() / c;
  const int device = t.sum.device().index;
  DeviceGuard guard(device);
  if (rows == 0) {  // sums over no rows: zeros written, nothing added
    const std::pair<const Tensor*, bool> gs[] = {
        {&t.dbias, t.write_dbias}, {&t.dweight, t.write_dweight}, {&t.dln_bias, t.write_dln_bias}};
    for (const auto& [g, write] : gs)
      if (g->defined() && (g->dtype() == t.sum.dtype() || write)) g->fill_(0.0);
    return;
  }
  ENGINE_CHECK(rows < (int64_t(1) << 31), "[dropout_add_layer_norm_backward] ", rows,
               " rows exceed one grid dimension");
  const int e = warp_row_elems(c);
  dispatch_device_floating(t.sum.dtype(), "dropout_add_layer_norm_backward", [&]<class T>() {
    using S = Stats<T>;
    Bwd<T, S> a{dptr<const T>(t.sum),  dptr<const T>(t.weight), dptr<const T>(t.dnormed),
                dptr<const T>(t.dsum), t.mean.data<S>(),        t.rstd.data<S>(),
                dptr<T>(t.d_residual), dptr<T>(t.dx),           make_drop<T>(t.p, t.state),
                t.dweight.defined(),   t.dln_bias.defined(),    t.dbias.defined(),
                t.drop_normed};
    const cudaStream_t stream = compute_stream(device);
    const bool any_sums = a.want_w || a.want_lb || a.want_b;
    if (e == 0) {
      const bool want_dz = t.d_residual.defined() || t.dx.defined() || a.want_b;
      Tensor dx = t.dx.defined() || !want_dz
                      ? t.dx
                      : Tensor::empty(t.sum.shape(), t.sum.dtype(), t.sum.device());
      a.dx = dptr<T>(dx);
      if (want_dz) {
        const LaunchConfig cfg{dim3(static_cast<unsigned>(rows)), dim3(row_threads(c)), 0, stream};
        ENGINE_LAUNCH((dropout_add_layer_norm_backward_rows<T, S>), cfg, a, c);
      }
      if (!any_sums) return;
      const DType dt = t.sum.dtype();
      const RowSums<T, S> f{
          a,
          dptr<const T>(dx),
          c,
          param_grad<T>(t.dweight, dt, "dropout_add_layer_norm_backward", t.write_dweight),
          param_grad<T>(t.dln_bias, dt, "dropout_add_layer_norm_backward", t.write_dln_bias),
          param_grad<T>(t.dbias, dt, "dropout_add_layer_norm_backward", t.write_dbias)};
      column_sums<1, 3>("dropout_add_layer_norm_params", rows, c, f, device);
      return;
    }
    bool vec = true;
    for (const Tensor* p : {&t.sum, &t.dnormed, &t.dsum, &t.d_residual, &t.dx, &t.weight})
      if (p->defined()) vec = vec && vec4_rows<T>(p->raw_data(), c);
    constexpr int W = sizeof(S) == 8 ? 2 : 4;  // shared accumulators <= 48 KiB at c = 1024
    const int64_t rows_per_warp = (rows + kTargetWarps - 1) / kTargetWarps;
    const int64_t blocks = (rows + W * rows_per_warp - 1) / (W * rows_per_warp);
    Tensor part = Tensor::empty({any_sums ? 3 * blocks * c : 1},
                                sizeof(S) == 8 ? DType::f64 : DType::f32, t.sum.device());
    dispatch_row_elems(e, [&]<int E>() {
      const size_t smem = size_t(W) * acc_slots(a) * E * kWarpSize * sizeof(S);
      const LaunchConfig cfg{dim3(static_cast<unsigned>(blocks)), dim3(W * kWarpSize), smem,
                             stream};
      if (t.drop_normed)
        ENGINE_LAUNCH((dropout_add_layer_norm_backward_warp<T, S, E, W, true>), cfg, a, rows, c,
                      rows_per_warp, vec, part.data<S>());
      else
        ENGINE_LAUNCH((dropout_add_layer_norm_backward_warp<T, S, E, W, false>), cfg, a, rows, c,
                      rows_per_warp, vec, part.data<S>());
    });
    if (!any_sums) return;
    const DType dt = t.sum.dtype();
    const PartSums<T, S> f{
        part.data<S>(),
        blocks,
        c,
        param_grad<T>(t.dweight, dt, "dropout_add_layer_norm_backward", t.write_dweight),
        param_grad<T>(t.dln_bias, dt, "dropout_add_layer_norm_backward", t.write_dln_bias),
        param_grad<T>(t.dbias, dt, "dropout_add_layer_norm_backward", t.write_dbias)};
    column_sums<1, 3>("dropout_add_layer_norm_params", blocks, c, f, device, false);
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(dropout_add_layer_norm_kernel, DeviceType::CUDA, forward);
ENGINE_REGISTER_KERNEL(dropout_add_layer_norm_backward_kernel, DeviceType::CUDA, backward);

}  // namespace engine::cuda
