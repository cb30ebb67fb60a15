// CUDA kernels of softmax and log_softmax (see softmax.h): one block per row, the row's max and
// sum through the shared block reductions, statistics in f32 (f64 for f64), one rounding of each
// output. The block's threads stride over the row, so a row of any length (1 or 5000) takes one
// block; the block has as many whole warps as the row needs, up to 256.
//
// softmax(x + bias) with a mask: bias and mask are views of x's shape (stride 0 on broadcast
// dims, e.g. TUPE's (1, H, T, T) positional term or a (B, 1, 1, T) key mask), reached through an
// indexer over the leading dims and a step along the last one. Masked positions get exactly 0; a
// row with no kept position is all zeros, as on the CPU. The logits are recomputed in each pass
// rather than stored in y, so bf16 / f16 rows keep f32 logits, and y may alias x (each thread
// reads and writes only its own elements, after the reductions).
//
// The same kernels are the attention op's fused step: scale * scores + positional bias + key
// mask + softmax + dropout in one pass (the probabilities and their dropped copy written once
// each), and backward dropout + softmax backward in one. The Philox word of element i is drawn
// where the element is, so the mask is the CPU's bit for bit.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/strided.cuh"
#include "engine/error.h"
#include "ops/dropout.h"
#include "ops/softmax.h"

namespace engine::cuda {
namespace {

// Whole warps covering the row, at most 256 threads.
int threads_for(int64_t n) {
  const int64_t warps = (n + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(kWarpSize * (warps < 8 ? (warps < 1 ? 1 : warps) : 8));
}

LaunchConfig rows_config(int64_t rows, int64_t n, const Tensor& t) {
  ENGINE_CHECK(rows < (int64_t(1) << 31), "[softmax] ", rows, " rows exceed one grid dimension");
  return LaunchConfig{dim3(static_cast<unsigned>(rows)), dim3(threads_for(n)), 0,
                      compute_stream(t.device().index)};
}

// The key mask, any dtype, read through its bytes: nonzero keeps; floats are tested without their
// sign bit (+-0 masks), as on the CPU.
struct MaskRef {
  const unsigned char* p = nullptr;
  int size = 0;       // bytes per element
  uint64_t bits = 0;  // the bits that decide (all but a float's sign)
  __device__ bool kept(int64_t i) const {
    uint64_t v = 0;
    switch (size) {
      case 1:
        v = p[i];
        break;
      case 2:
        v = reinterpret_cast<const uint16_t*>(p)[i];
        break;
      case 4:
        v = reinterpret_cast<const uint32_t*>(p)[i];
        break;
      default:
        v = reinterpret_cast<const uint64_t*>(p)[i];
        break;
    }
    return (v & bits) != 0;
  }
  // Elements i .. i + 3 as one vector load (i a multiple of 4 from a 4-element-aligned base).
  __device__ void kept4(int64_t i, bool (&keep)[4]) const {
    uint64_t v[4];
    switch (size) {
      case 1:
        load_vec4(reinterpret_cast<const uint8_t*>(p) + i, v);
        break;
      case 2:
        load_vec4(reinterpret_cast<const uint16_t*>(p) + i, v);
        break;
      case 4:
        load_vec4(reinterpret_cast<const uint32_t*>(p) + i, v);
        break;
      default:
        load_vec4(reinterpret_cast<const uint64_t*>(p) + i, v);
        break;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) keep[q] = (v[q] & bits) != 0;
  }
  template <class U>
  __device__ static void load_vec4(const U* q, uint64_t (&v)[4]) {
    const Vec<U, 4> x = *reinterpret_cast<const Vec<U, 4>*>(q);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = x.v[k];
  }
};

MaskRef mask_ref(const Tensor& mask) {
  MaskRef m;
  if (!mask.defined()) return m;
  m.p = static_cast<const unsigned char*>(mask.raw_data());
  m.size = static_cast<int>(dtype_size(mask.dtype()));
  const uint64_t all = m.size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * m.size)) - 1;
  m.bits = is_floating(mask.dtype()) ? all >> 1 : all;  // drop the sign bit of a float
  return m;
}

// Dropout on the probabilities (the attention form): element i of the Philox stream is the flat
// index into y; kept values are y (already rounded to T) * keep_scale, as dropout_kernel does.
struct RowDropout {
  PhiloxState state;
  uint32_t threshold = 0;
  double keep_scale = 1;  // 1 / (1 - p)
};

// The rows of a (..., n) tensor, with the bias's and the mask's offsets per row.
struct RowLayout {
  int64_t rows = 0, n = 0;
  StridedIndexer<2> lead;  // row -> bias, mask offsets
  int64_t bias_step = 0, mask_step = 0;
  // Whether the warp kernel reads four bias / mask elements as one vector (step 1, every row's
  // offset a multiple of 4 from an aligned base): the bias and the key mask were per-element
  // loads, 8 bytes of i64 mask each, that left the forward at a third of the backward's bandwidth.
  bool bias_vec = false, mask_vec = false;
};

// ---- a warp per row (n <= 32 E): the row in registers, E elements a lane ---------------------
// Lane l holds groups g = l + 32 k (k < E / 4) of four consecutive elements 4g .. 4g + 3: a
// warp reads 4 x 32 consecutive elements at a time, and with n % 4 == 0 a group is half a Philox
// block of the dropout stream (attention's rule: one draw for four elements) and one 4-element
// vector load.

// The keep bits of elements i0 .. i0 + 3 of the site, attention's rule (ops/dropout.h: one
// Philox block, half of it, when i0 is a multiple of 4).
__device__ inline void keep4(const RowDropout& d, uint64_t i0, bool (&keep)[4]) {
  attention_keep_run<4>(d.state, i0, d.threshold, keep);
}

constexpr int kRowsPerBlock = 4;  // warps (rows) per block of the warp kernels

// z = scale * x + bias (the product rounded on its own, in f32 for bf16 / f16 x, as the CPU's
// separate scaling pass rounds it), -inf where the mask drops; y = softmax(z); dropped (when
// non-null) = dropout(y).
template <class T, int E>
__global__ void softmax_forward_warp(const T* x, const T* bias, MaskRef mask, T* y, RowLayout L,
                                     Acc<T> scale, T* dropped, RowDropout drop, bool vec) {
  using V = Acc<T>;
  constexpr int G = E / 4;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / kWarpSize;
  if (r >= L.rows) return;  // the whole warp
  const int64_t n = L.n;
  int64_t off[2];
  L.lead.offsets(r, off);
  const T* xr = x + r * n;
  const T* br = bias ? bias + off[0] : nullptr;
  const V neg_inf = -INFINITY;
  V z[G][4];
  V mx = neg_inf;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    if (j0 >= n) {
#pragma unroll
      for (int q = 0; q < 4; ++q) z[k][q] = neg_inf;
      continue;
    }
    load4(xr, j0, n, vec, z[k]);
    bool keep[4] = {true, true, true, true};
    if (mask.p && L.mask_vec) {
      mask.kept4(off[1] + j0, keep);
    } else if (mask.p) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        keep[q] = j0 + q < n && mask.kept(off[1] + (j0 + q) * L.mask_step);
    }
    V b[4] = {V(0), V(0), V(0), V(0)};
    if (br && L.bias_vec) {
      load4(br, j0, n, true, b);
    } else if (br) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (j0 + q < n) b[q] = to_acc(br[(j0 + q) * L.bias_step]);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (j0 + q >= n || !keep[q]) {
        z[k][q] = neg_inf;
        continue;
      }
      if (scale != V(1)) z[k][q] = dmath::mul_rn(scale, z[k][q]);
      if (br) z[k][q] += b[q];
      mx = max_nan(mx, z[k][q]);
    }
  }
  mx = warp_max(mx);
  V sum = 0;
  if (mx != neg_inf) {
#pragma unroll
    for (int k = 0; k < G; ++k)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        z[k][q] = dmath::exp(z[k][q] - mx);  // exp(-inf) = 0 for dropped and padding
        sum += z[k][q];
      }
  }
  sum = warp_sum(sum);
  // Nothing kept: zeros, not exp(-inf - -inf) = NaN.
  const V inv = mx == neg_inf ? V(0) : V(1) / sum;
  const V keep_scale = static_cast<V>(drop.keep_scale);
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    if (j0 >= n) continue;
    T out[4], dout[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) out[q] = from_acc<T>(mx == neg_inf ? V(0) : z[k][q] * inv);
    store4(y + r * n, j0, n, vec, out);
    if (dropped) {
      bool keep[4];
      keep4(drop, static_cast<uint64_t>(r * n + j0), keep);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        dout[q] = keep[q] ? from_acc<T>(to_acc(out[q]) * keep_scale) : from_acc<T>(V(0));
      store4(dropped + r * n, j0, n, vec, dout);
    }
  }
}

// dx = y * (g - sum(g * y)) with g = dy, or g = dropout(dy) (rounded to T, as the CPU's separate
// dropout pass stores it) when `dropout` is set. dx may be dy (in place).
// kept (optional): the forward's dropped probabilities; the keep bit is kept != 0 then (exact
// where y > 0, and y == 0 adds nothing), no Philox draw.
template <class T, int E>
__global__ void softmax_backward_warp(const T* y, const T* dy, T* dx, int64_t rows, int64_t n,
                                      bool dropout, RowDropout drop, const T* kept, bool vec) {
  using V = Acc<T>;
  constexpr int G = E / 4;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / kWarpSize;
  if (r >= rows) return;
  const V keep_scale = static_cast<V>(drop.keep_scale);
  V yv[G][4], g[G][4];
  V dot = 0;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    if (j0 >= n) {
#pragma unroll
      for (int q = 0; q < 4; ++q) yv[k][q] = g[k][q] = V(0);
      continue;
    }
    load4(y + r * n, j0, n, vec, yv[k]);
    load4(dy + r * n, j0, n, vec, g[k]);
    if (dropout) {
      bool keep[4];
      if (kept) {
        V kv[4];
        load4(kept + r * n, j0, n, vec, kv);
#pragma unroll
        for (int q = 0; q < 4; ++q) keep[q] = kv[q] != V(0);
      } else {
        keep4(drop, static_cast<uint64_t>(r * n + j0), keep);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q)
        g[k][q] = keep[q] ? to_acc(from_acc<T>(g[k][q] * keep_scale)) : V(0);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) dot += g[k][q] * yv[k][q];
  }
  dot = warp_sum(dot);
  // Masked positions have y = 0, hence dx = 0 there without looking at the mask.
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    if (j0 >= n) continue;
    T out[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) out[q] = from_acc<T>(yv[k][q] * (g[k][q] - dot));
    store4(dx + r * n, j0, n, vec, out);
  }
}

// ---- a block per row (n > 1024): the block strides over the row ------------------------------

template <class T>
__global__ void softmax_forward_rows(const T* x, const T* bias, MaskRef mask, T* y, RowLayout L,
                                     Acc<T> scale, T* dropped, RowDropout drop) {
  using V = Acc<T>;
  const int64_t r = blockIdx.x, n = L.n;
  int64_t off[2];
  L.lead.offsets(r, off);
  const T* xr = x + r * n;
  const T* br = bias ? bias + off[0] : nullptr;
  T* yr = y + r * n;
  const V neg_inf = -INFINITY;
  auto logit = [&](int64_t j) -> V {
    if (mask.p && !mask.kept(off[1] + j * L.mask_step)) return neg_inf;
    V z = to_acc(xr[j]);
    if (scale != V(1)) z = dmath::mul_rn(scale, z);
    if (br) z += to_acc(br[j * L.bias_step]);
    return z;
  };
  V mx = neg_inf;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max_nan(mx, logit(j));
  mx = block_max(mx, neg_inf);
  if (mx == neg_inf) {  // nothing kept: zeros, not exp(-inf - -inf) = NaN
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      yr[j] = from_acc<T>(V(0));
      if (dropped) dropped[r * n + j] = from_acc<T>(V(0));
    }
    return;
  }
  V sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += dmath::exp(logit(j) - mx);
  const V inv = V(1) / block_sum(sum);
  const V keep_scale = static_cast<V>(drop.keep_scale);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const T yj = from_acc<T>(dmath::exp(logit(j) - mx) * inv);
    yr[j] = yj;
    if (dropped) {
      const uint64_t i = static_cast<uint64_t>(r * n + j);
      dropped[i] = attention_keep(drop.state, i, drop.threshold)
                       ? from_acc<T>(to_acc(yj) * keep_scale)
                       : from_acc<T>(V(0));
    }
  }
}

template <class T>
__global__ void softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t n, bool dropout,
                                      RowDropout drop, const T* kept) {
  using V = Acc<T>;
  const int64_t r = blockIdx.x;
  const T* yr = y + r * n;
  const T* gr = dy + r * n;
  T* orow = dx + r * n;
  const V keep_scale = static_cast<V>(drop.keep_scale);
  auto grad = [&](int64_t j) -> V {
    if (!dropout) return to_acc(gr[j]);
    const uint64_t i = static_cast<uint64_t>(r * n + j);
    const bool keep =
        kept ? to_acc(kept[i]) != V(0) : attention_keep(drop.state, i, drop.threshold);
    return keep ? to_acc(from_acc<T>(to_acc(gr[j]) * keep_scale)) : V(0);
  };
  V dot = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += grad(j) * to_acc(yr[j]);
  dot = block_sum(dot);
  // The reads of row r happen before its writes only in a thread's own elements: in place is safe.
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    orow[j] = from_acc<T>(to_acc(yr[j]) * (grad(j) - dot));
}

LaunchConfig warp_rows_config(int64_t rows, const Tensor& t) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  ENGINE_CHECK(blocks < (int64_t(1) << 31), "[softmax] ", rows, " rows exceed the grid");
  return LaunchConfig{dim3(static_cast<unsigned>(blocks)), dim3(kRowsPerBlock * kWarpSize), 0,
                      compute_stream(t.device().index)};
}

template <class T>
__global__ void log_softmax_forward_rows(const T* x, T* y, int64_t n) {
  using V = Acc<T>;
  const int64_t r = blockIdx.x;
  const T* xr = x + r * n;
  T* yr = y + r * n;
  V mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max_nan(mx, to_acc(xr[j]));
  mx = block_max(mx, V(-INFINITY));
  V sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += dmath::exp(to_acc(xr[j]) - mx);
  const V lse = mx + dmath::log(block_sum(sum));
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = from_acc<T>(to_acc(xr[j]) - lse);
}

template <class T>
__global__ void log_softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t n) {
  using V = Acc<T>;
  const int64_t r = blockIdx.x;
  const T* yr = y + r * n;
  const T* gr = dy + r * n;
  T* orow = dx + r * n;
  V sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += to_acc(gr[j]);
  sum = block_sum(sum);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    orow[j] = from_acc<T>(to_acc(gr[j]) - dmath::exp(to_acc(yr[j])) * sum);
}

// Rows and the row length of a contiguous (..., n) tensor; 0 rows when there is nothing to do.
int64_t row_count(const Tensor& t, int64_t& n) {
  n = t.dim() == 0 ? 1 : t.shape().back();
  return n == 0 ? 0 : t.numel() / n;
}

RowDropout row_dropout(double p, PhiloxState state) {
  RowDropout d;
  d.state = state;
  d.threshold = attention_dropout_threshold(p);  // attention's rule (ops/dropout.h)
  d.keep_scale = 1.0 / (1.0 - p);
  return d;
}

// softmax(scale * x + bias, mask) -> y, and dropout(y) -> dropped when it is defined.
void launch_softmax_forward(const Tensor& x, double scale, const Tensor& bias, const Tensor& mask,
                            const Tensor& y, const Tensor& dropped, RowDropout drop) {
  RowLayout L;
  L.rows = row_count(x, L.n);
  if (L.rows == 0) return;
  DeviceGuard guard(x.device().index);
  // The leading dims of x's shape with the bias's and the mask's strides over them.
  const Shape& shape = x.shape();
  const Shape lead_shape(shape.begin(), shape.end() - 1);
  std::vector<int64_t> bias_lead(lead_shape.size(), 0), mask_lead(lead_shape.size(), 0);
  if (bias.defined()) {
    bias_lead.assign(bias.strides().begin(), bias.strides().end() - 1);
    L.bias_step = bias.strides().back();
  }
  if (mask.defined()) {
    mask_lead.assign(mask.strides().begin(), mask.strides().end() - 1);
    L.mask_step = mask.strides().back();
  }
  const std::vector<int64_t>* st[2] = {&bias_lead, &mask_lead};
  L.lead = make_indexer<2>(lead_shape, st);
  const MaskRef m = mask_ref(mask);
  // Vector reads of the bias and the mask: step 1, row offsets multiples of 4, aligned bases.
  auto rows_of_4 = [&](const Tensor& t, const std::vector<int64_t>& lead, int64_t step) {
    if (!t.defined() || step != 1 || L.n % 4 != 0) return false;
    for (const int64_t s : lead)
      if (s % 4 != 0) return false;
    return reinterpret_cast<uintptr_t>(t.raw_data()) % (4 * dtype_size(t.dtype())) == 0;
  };
  L.bias_vec = rows_of_4(bias, bias_lead, L.bias_step);
  L.mask_vec = rows_of_4(mask, mask_lead, L.mask_step);
  const int e = warp_row_elems(L.n);
  dispatch_device_floating(x.dtype(), "softmax", [&]<class T>() {
    const Acc<T> s = static_cast<Acc<T>>(scale);
    if (e == 0) {
      ENGINE_LAUNCH(softmax_forward_rows<T>, rows_config(L.rows, L.n, x), dptr<const T>(x),
                    dptr<const T>(bias), m, dptr<T>(y), L, s, dptr<T>(dropped), drop);
      return;
    }
    const bool v = vec4_rows<T>(x.raw_data(), L.n) && vec4_rows<T>(y.raw_data(), L.n) &&
                   (!dropped.defined() || vec4_rows<T>(dropped.raw_data(), L.n));
    const LaunchConfig cfg = warp_rows_config(L.rows, x);
    dispatch_row_elems(e, [&]<int E>() {
      ENGINE_LAUNCH((softmax_forward_warp<T, E>), cfg, dptr<const T>(x), dptr<const T>(bias), m,
                    dptr<T>(y), L, s, dptr<T>(dropped), drop, v);
    });
  });
}

void launch_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool dropout,
                             RowDropout drop, const Tensor& kept = Tensor()) {
  int64_t n = 0;
  const int64_t rows = row_count(y, n);
  if (rows == 0) return;
  DeviceGuard guard(y.device().index);
  const int e = warp_row_elems(n);
  dispatch_device_floating(y.dtype(), "softmax_backward", [&]<class T>() {
    if (e == 0) {
      ENGINE_LAUNCH(softmax_backward_rows<T>, rows_config(rows, n, y), dptr<const T>(y),
                    dptr<const T>(dy), dptr<T>(dx), n, dropout, drop, dptr<const T>(kept));
      return;
    }
    const bool v = vec4_rows<T>(y.raw_data(), n) && vec4_rows<T>(dy.raw_data(), n) &&
                   vec4_rows<T>(dx.raw_data(), n) &&
                   (!kept.defined() || vec4_rows<T>(kept.raw_data(), n));
    const LaunchConfig cfg = warp_rows_config(rows, y);
    dispatch_row_elems(e, [&]<int E>() {
      ENGINE_LAUNCH((softmax_backward_warp<T, E>), cfg, dptr<const T>(y), dptr<const T>(dy),
                    dptr<T>(dx), rows, n, dropout, drop, dptr<const T>(kept), v);
    });
  });
}

void softmax_forward(const Tensor& x, const Tensor& bias, const Tensor& mask, const Tensor& y) {
  launch_softmax_forward(x, 1.0, bias, mask, y, Tensor(), RowDropout{});
}

void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  launch_softmax_backward(y, dy, dx, false, RowDropout{});
}

void attention_softmax_forward(const Tensor& x, double scale, const Tensor& bias,
                               const Tensor& mask, double p, PhiloxState state, const Tensor& probs,
                               const Tensor& dropped) {
  launch_softmax_forward(x, scale, bias, mask, probs, dropped, row_dropout(p, state));
}

void attention_softmax_backward(const Tensor& probs, const Tensor& dpd, double p, PhiloxState state,
                                const Tensor& ds, const Tensor& dropped) {
  launch_softmax_backward(probs, dpd, ds, p > 0, row_dropout(p, state), dropped);
}

void log_softmax_forward(const Tensor& x, const Tensor& y) {
  int64_t n = 0;
  const int64_t rows = row_count(x, n);
  if (rows == 0) return;
  DeviceGuard guard(x.device().index);
  dispatch_device_floating(x.dtype(), "log_softmax", [&]<class T>() {
    ENGINE_LAUNCH(log_softmax_forward_rows<T>, rows_config(rows, n, x),
                  static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), n);
  });
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  int64_t n = 0;
  const int64_t rows = row_count(y, n);
  if (rows == 0) return;
  DeviceGuard guard(y.device().index);
  dispatch_device_floating(y.dtype(), "log_softmax_backward", [&]<class T>() {
    ENGINE_LAUNCH(log_softmax_backward_rows<T>, rows_config(rows, n, y),
                  static_cast<const T*>(y.raw_data()), static_cast<const T*>(dy.raw_data()),
                  static_cast<T*>(dx.raw_data()), n);
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(softmax_forward_kernel, DeviceType::CUDA, softmax_forward);
ENGINE_REGISTER_KERNEL(attention_softmax_forward_kernel, DeviceType::CUDA,
                       attention_softmax_forward);
ENGINE_REGISTER_KERNEL(attention_softmax_backward_kernel, DeviceType::CUDA,
                       attention_softmax_backward);
ENGINE_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::CUDA, softmax_backward);
ENGINE_REGISTER_KERNEL(log_softmax_forward_kernel, DeviceType::CUDA, log_softmax_forward);
ENGINE_REGISTER_KERNEL(log_softmax_backward_kernel, DeviceType::CUDA, log_softmax_backward);

}  // namespace engine::cuda
