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

// M = bool: no mask (never read).
template <class T, class M>
__global__ void softmax_forward_rows(const T* x, const T* bias, const M* mask, T* y, int64_t n,
                                     StridedIndexer<2> lead, int64_t bias_step, int64_t mask_step) {
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
    if (br) z += to_acc(br[j * bias_step]);
    return z;
  };
  V mx = neg_inf;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max_nan(mx, logit(j));
  mx = block_max(mx, neg_inf);
  if (mx == neg_inf) {  // nothing kept: zeros, not exp(-inf - -inf) = NaN
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = from_acc<T>(V(0));
    return;
  }
  V sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += dmath::exp(logit(j) - mx);
  const V inv = V(1) / block_sum(sum);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    yr[j] = from_acc<T>(dmath::exp(logit(j) - mx) * inv);
}

template <class T>
__global__ void softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t n) {
  using V = Acc<T>;
  const int64_t r = blockIdx.x;
  const T* yr = y + r * n;
  const T* gr = dy + r * n;
  T* orow = dx + r * n;
  V dot = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += to_acc(gr[j]) * to_acc(yr[j]);
  dot = block_sum(dot);
  // Masked positions have y = 0, hence dx = 0 there without looking at the mask.
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    orow[j] = from_acc<T>(to_acc(yr[j]) * (to_acc(gr[j]) - dot));
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

void softmax_forward(const Tensor& x, const Tensor& bias, const Tensor& mask, const Tensor& y) {
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
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pb = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
    T* py = static_cast<T*>(y.raw_data());
    if (!mask.defined()) {
      ENGINE_LAUNCH((softmax_forward_rows<T, bool>), cfg, px, pb, static_cast<const bool*>(nullptr),
                    py, n, lead, bias_step, mask_step);
      return;
    }
    dispatch_all(mask.dtype(), [&]<class M>() {
      ENGINE_LAUNCH((softmax_forward_rows<T, M>), cfg, px, pb,
                    static_cast<const M*>(mask.raw_data()), py, n, lead, bias_step, mask_step);
    });
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  int64_t n = 0;
  const int64_t rows = row_count(y, n);
  if (rows == 0) return;
  DeviceGuard guard(y.device().index);
  dispatch_floating(y.dtype(), "softmax_backward", [&]<class T>() {
    ENGINE_LAUNCH(softmax_backward_rows<T>, rows_config(rows, n, y),
                  static_cast<const T*>(y.raw_data()), static_cast<const T*>(dy.raw_data()),
                  static_cast<T*>(dx.raw_data()), n);
  });
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
ENGINE_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::CUDA, softmax_backward);
ENGINE_REGISTER_KERNEL(log_softmax_forward_kernel, DeviceType::CUDA, log_softmax_forward);
ENGINE_REGISTER_KERNEL(log_softmax_backward_kernel, DeviceType::CUDA, log_softmax_backward);

}  // namespace engine::cuda
