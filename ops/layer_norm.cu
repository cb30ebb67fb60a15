// CUDA kernels of layer_norm (see layer_norm.h).
//
// Forward: rows of up to 1024 a warp each (four rows a block), the row in registers, 4-element
// vectors, mean and variance in two passes over the registers (warp_row_moments); longer rows a
// block each (block_welford). Statistics in f32 (f64 for f64), saved for the backward; y
// rounded once.
// Backward: dropout_add_layer_norm's backward kernel with no dropout and no residual (since
// 2026-12-06; ops/dropout_add_layer_norm.cu): dx per row (dxhat = dy * weight, the row means of
// dxhat and dxhat * xhat, dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))) with dweight
// and dbias summed in the same pass (per-warp accumulators, the blocks' partial rows summed per
// column in order: the same bits on every rerun; not the CPU's order). Until then a second launch
// read x and dy again for the column sums.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "ops/dropout_add_layer_norm.h"
#include "ops/layer_norm.cuh"
#include "ops/layer_norm.h"

namespace engine::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // warps (rows) per block of the warp kernels

// ---- a warp per row ------------------------------------------------------------------------

// S: the statistics type (layer_norm_stats_dtype: float, or double for f64).
template <class T, class S, int E>
__global__ void layer_norm_forward_warp(const T* x, const T* weight, const T* bias, S eps, T* y,
                                        S* mean, S* rstd, int64_t rows, int64_t c, bool vec) {
  constexpr int G = E / 4;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / kWarpSize;
  if (r >= rows) return;  // the whole warp
  const T* xr = x + r * c;
  Raw4<T> v[G];  // the row as loaded (padding 0)
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
#pragma unroll
    zero_raw(v[k]);
    if (j0 < c) load4_raw(xr, j0, c, vec, v[k]);
  }
  S mu, var;
  warp_row_moments<S, G>([&](int k, int q) { return static_cast<S>(raw_at(v[k], q)); }, c, lane, mu,
                         var);
  const S rs = S(1) / dmath::sqrt(var + eps);
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
#pragma unroll
  for (int k = 0; k < G; ++k) opaque(v[k]);  // widened again below, not kept in f32
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    if (j0 >= c) continue;
    Acc<T> wv[4], bv[4];
    if (weight) load4(weight, j0, c, vec, wv);
    if (bias) load4(bias, j0, c, vec, bv);
    T out[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      S h = xhat_at(v[k], q, mu, rs);
      if (weight) h *= static_cast<S>(wv[q]);
      if (bias) h += static_cast<S>(bv[q]);
      out[q] = from_acc<T>(h);
    }
    store4(y + r * c, j0, c, vec, out);
  }
}

// ---- a block per row (rows over 1024) --------------------------------------------------------

template <class T, class S>
__global__ void layer_norm_forward_rows(const T* x, const T* weight, const T* bias, S eps, T* y,
                                        S* mean, S* rstd, int64_t c) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * c;
  T* yr = y + r * c;
  S mu, var;
  if constexpr (std::is_same_v<S, double>) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += xr[j];
    mu = block_sum(s) / static_cast<double>(c);
    double q = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) q += (xr[j] - mu) * (xr[j] - mu);
    var = block_sum(q) / static_cast<double>(c);
  } else {
    WelfordStat w;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) welford_add(w, to_acc(xr[j]));
    w = block_welford(w);
    mu = w.mean;
    var = w.m2 / w.count;
  }
  const S rs = S(1) / dmath::sqrt(var + eps);
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    S h = (static_cast<S>(to_acc(xr[j])) - mu) * rs;
    if (weight) h *= static_cast<S>(to_acc(weight[j]));
    if (bias) h += static_cast<S>(to_acc(bias[j]));
    yr[j] = from_acc<T>(h);
  }
}

LaunchConfig warp_rows(int64_t rows, int device) {
  return LaunchConfig{dim3(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock)),
                      dim3(kRowsPerBlock * kWarpSize), 0, compute_stream(device)};
}

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t c = x.shape().back();
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  if (rows == 0) return;
  ENGINE_CHECK(rows < (int64_t(1) << 31), "[layer_norm] ", rows, " rows exceed one grid dimension");
  const int device = x.device().index;
  DeviceGuard guard(device);
  const int e = warp_row_elems(c);
  dispatch_device_floating(x.dtype(), "layer_norm", [&]<class T>() {
    using S = Stats<T>;
    if (e == 0) {
      const LaunchConfig cfg{dim3(static_cast<unsigned>(rows)), dim3(row_threads(c)), 0,
                             compute_stream(device)};
      ENGINE_LAUNCH((layer_norm_forward_rows<T, S>), cfg, dptr<const T>(x), dptr<const T>(weight),
                    dptr<const T>(bias), static_cast<S>(eps), dptr<T>(y), mean.data<S>(),
                    rstd.data<S>(), c);
      return;
    }
    const bool vec = vec4_rows<T>(x.raw_data(), c) && vec4_rows<T>(y.raw_data(), c) &&
                     (!weight.defined() || vec4_rows<T>(weight.raw_data(), c)) &&
                     (!bias.defined() || vec4_rows<T>(bias.raw_data(), c));
    dispatch_row_elems(e, [&]<int E>() {
      ENGINE_LAUNCH((layer_norm_forward_warp<T, S, E>), warp_rows(rows, device), dptr<const T>(x),
                    dptr<const T>(weight), dptr<const T>(bias), static_cast<S>(eps), dptr<T>(y),
                    mean.data<S>(), rstd.data<S>(), rows, c, vec);
    });
  });
}

// The join's backward kernel, p = 0 and no residual: dx and the parameter sums in one pass.
void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias) {
  DropoutAddNormBackward a;
  a.sum = x;
  a.weight = weight;
  a.mean = mean;
  a.rstd = rstd;
  a.dnormed = dy;
  a.d_residual = dx;
  a.dweight = dweight;
  a.dln_bias = dbias;
  dropout_add_layer_norm_backward_kernel(x.device(), a);
}

}  // namespace

ENGINE_REGISTER_KERNEL(layer_norm_forward_kernel, DeviceType::CUDA, layer_norm_forward);
ENGINE_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::CUDA, layer_norm_backward);

}  // namespace engine::cuda
