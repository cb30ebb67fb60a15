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

// Nonzero keeps; 16-bit floats are tested on their bits (+-0 masks), as on the CPU.
template <class M>
__device__ inline bool kept(M v) {
  if constexpr (std::is_same_v<M, __nv_bfloat16> || std::is_same_v<M, __half>) {
    uint16_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits & 0x7FFFu) != 0;
  } else {
    return v != M(0);
  }
}

// Dropout on the probabilities (the attention form): element i of the Philox stream is the flat
// index into y; kept values are y (already rounded to T) * keep_scale, as dropout_kernel does.
struct RowDropout {
  PhiloxState state;
  uint32_t threshold = 0;
  double keep_scale = 1;  // 1 / (1 - p)
};

// M = bool: no mask (never read). z = scale * x + bias, the product rounded on its own (in f32
// for bf16 / f16 x), as the CPU's separate scaling pass rounds it; dropped (when non-null) =
// dropout(y).
template <class T, class M>
__global__ void softmax_forward_rows(const T* x, const T* bias, const M* mask, T* y, int64_t n,
                                     StridedIndexer<2> lead, int64_t bias_step, int64_t mask_step,
                                     Acc<T> scale, T* dropped, RowDropout drop) {
  using V = Acc<T>;
  const int64_t r = blockIdx.x;
  int64_t off[2];
  lead.offsets(r, off);
  const T* xr = x + r * n;
  const T* br = bias ? bias + off[0] : nullptr;
  const M* mr = mask ? mask + off[1] : nullptr;
  T* yr = y + r * n;
  const V neg_inf = -INFINITY;
  auto logit = [&](int64_t j) -> V {
    if (mr && !kept(mr[j * mask_step])) return neg_inf;
    V z = to_acc(xr[j]);
    if (scale != V(1)) z = dmath::mul_rn(scale, z);
    if (br) z += to_acc(br[j * bias_step]);
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
      dropped[i] = dropout_keep(philox_word(drop.state, i), drop.threshold)
                       ? from_acc<T>(to_acc(yj) * keep_scale)
                       : from_acc<T>(V(0));
    }
  }
}

// dx = y * (g - sum(g * y)) with g = dy, or g = dropout(dy) (rounded to T, as the CPU's separate
// dropout pass stores it) when `dropout` is set.
template <class T>
__global__ void softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t n, bool dropout,
                                      RowDropout drop) {
  using V = Acc<T>;
  const int64_t r = blockIdx.x;
  const T* yr = y + r * n;
  const T* gr = dy + r * n;
  T* orow = dx + r * n;
  const V keep_scale = static_cast<V>(drop.keep_scale);
  auto grad = [&](int64_t j) -> V {
    if (!dropout) return to_acc(gr[j]);
    const uint64_t i = static_cast<uint64_t>(r * n + j);
    return dropout_keep(philox_word(drop.state, i), drop.threshold)
               ? to_acc(from_acc<T>(to_acc(gr[j]) * keep_scale))
               : V(0);
  };
  V dot = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += grad(j) * to_acc(yr[j]);
  dot = block_sum(dot);
  // Masked positions have y = 0, hence dx = 0 there without looking at the mask.
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    orow[j] = from_acc<T>(to_acc(yr[j]) * (grad(j) - dot));
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
  d.threshold = dropout_threshold(p);
  d.keep_scale = 1.0 / (1.0 - p);
  return d;
}

// softmax(scale * x + bias, mask) -> y, and dropout(y) -> dropped when it is defined.
void launch_softmax_forward(const Tensor& x, double scale, const Tensor& bias, const Tensor& mask,
                            const Tensor& y, const Tensor& dropped, RowDropout drop) {
  int64_t n = 0;
  const int64_t rows = row_count(x, n);
  if (rows == 0) return;
  DeviceGuard guard(x.device().index);
  // The leading dims of x's shape with the bias's and the mask's strides over them.
  const Shape& shape = x.shape();
  const Shape lead_shape(shape.begin(), shape.end() - 1);
  std::vector<int64_t> bias_lead(lead_shape.size(), 0), mask_lead(lead_shape.size(), 0);
  int64_t bias_step = 0, mask_step = 0;
  if (bias.defined()) {
    bias_lead.assign(bias.strides().begin(), bias.strides().end() - 1);
    bias_step = bias.strides().back();
  }
  if (mask.defined()) {
    mask_lead.assign(mask.strides().begin(), mask.strides().end() - 1);
    mask_step = mask.strides().back();
  }
  const std::vector<int64_t>* st[2] = {&bias_lead, &mask_lead};
  const StridedIndexer<2> lead = make_indexer<2>(lead_shape, st);
  const LaunchConfig cfg = rows_config(rows, n, x);
  dispatch_floating(x.dtype(), "softmax", [&]<class T>() {
    const Acc<T> s = static_cast<Acc<T>>(scale);
    if (!mask.defined()) {
      ENGINE_LAUNCH((softmax_forward_rows<T, bool>), cfg, dptr<const T>(x), dptr<const T>(bias),
                    static_cast<const bool*>(nullptr), dptr<T>(y), n, lead, bias_step, mask_step, s,
                    dptr<T>(dropped), drop);
      return;
    }
    dispatch_all(mask.dtype(), [&]<class M>() {
      ENGINE_LAUNCH((softmax_forward_rows<T, M>), cfg, dptr<const T>(x), dptr<const T>(bias),
                    dptr<const M>(mask), dptr<T>(y), n, lead, bias_step, mask_step, s,
                    dptr<T>(dropped), drop);
    });
  });
}

void launch_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool dropout,
                             RowDropout drop) {
  int64_t n = 0;
  const int64_t rows = row_count(y, n);
  if (rows == 0) return;
  DeviceGuard guard(y.device().index);
  dispatch_floating(y.dtype(), "softmax_backward", [&]<class T>() {
    ENGINE_LAUNCH(softmax_backward_rows<T>, rows_config(rows, n, y), dptr<const T>(y),
                  dptr<const T>(dy), dptr<T>(dx), n, dropout, drop);
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
                                const Tensor& ds) {
  launch_softmax_backward(probs, dpd, ds, p > 0, row_dropout(p, state));
}

void log_softmax_forward(const Tensor& x, const Tensor& y) {
  int64_t n = 0;
  const int64_t rows = row_count(x, n);
  if (rows == 0) return;
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "log_softmax", [&]<class T>() {
    ENGINE_LAUNCH(log_softmax_forward_rows<T>, rows_config(rows, n, x),
                  static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), n);
  });
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  int64_t n = 0;
  const int64_t rows = row_count(y, n);
  if (rows == 0) return;
  DeviceGuard guard(y.device().index);
  dispatch_floating(y.dtype(), "log_softmax_backward", [&]<class T>() {
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
