// CUDA kernels of layer_norm (see layer_norm.h).
//
// Forward: one block per row; mean and variance in one pass with the shared Welford reduction
// (block_welford; f64 rows in two passes of block_sum), statistics in f32 (f64 for f64) and saved
// for the backward; y rounded once.
// Backward, two kernels:
//   - per row (one block): dxhat = dy * weight, the row means of dxhat and dxhat * xhat through
//     block_sum, dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat));
//   - per column: dweight = sum over rows of dy xhat and dbias = sum of dy, as the CPU does it:
//     rows split into at most 64 chunks fixed by the row count, each chunk summed in row order in
//     double by one thread per column, then the chunks in order. The result does not depend on
//     the launch (reruns give the same bits) and follows the CPU's summation order.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "ops/layer_norm.h"

namespace engine::cuda {
namespace {

constexpr int64_t kMaxChunks = 64;  // as the CPU kernel
constexpr int kColumnThreads = 256;

int row_threads(int64_t c) {
  const int64_t warps = (c + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(kWarpSize * (warps < 8 ? warps : 8));
}

// S: the statistics type (layer_norm_stats_dtype: float, or double for f64).
template <class T, class S>
__global__ void layer_norm_forward_rows(const T* x, const T* weight, const T* bias, S eps, T* y,
                                        S* mean, S* rstd, int64_t c) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * c;
  T* yr = y + r * c;
  S mu, var;
  if constexpr (std::is_same_v<S, double>) {
    // f64: two passes over the block sums (mean, then squared deviations), as the CPU does.
    double s = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += xr[j];
    mu = block_sum(s) / static_cast<double>(c);
    double q = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) q += (xr[j] - mu) * (xr[j] - mu);
    var = block_sum(q) / static_cast<double>(c);
  } else {
    // One pass: Welford per thread, merged across the block (lane-symmetric: every thread gets
    // the same bits).
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

template <class T, class S>
__global__ void layer_norm_backward_rows(const T* x, const T* weight, const S* mean, const S* rstd,
                                         const T* dy, T* dx, int64_t c) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * c;
  const T* gr = dy + r * c;
  T* dr = dx + r * c;
  const S mu = mean[r], rs = rstd[r];
  // dxhat = dy * weight, rounded before it is used (the CPU stores it first; fused into the
  // subtraction below, a one-element row would get a nonzero dx).
  auto dxhat = [&](int64_t j) -> S {
    const S g = static_cast<S>(to_acc(gr[j]));
    return weight ? dmath::mul_rn(g, static_cast<S>(to_acc(weight[j]))) : g;
  };
  S sum_g = 0, sum_gx = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const S d = dxhat(j);
    sum_g += d;
    sum_gx += d * ((static_cast<S>(to_acc(xr[j])) - mu) * rs);
  }
  const S mean_g = block_sum(sum_g) / static_cast<S>(c);
  const S mean_gx = block_sum(sum_gx) / static_cast<S>(c);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const S xhat = (static_cast<S>(to_acc(xr[j])) - mu) * rs;
    dr[j] = from_acc<T>(rs * (dxhat(j) - mean_g - xhat * mean_gx));
  }
}

// part_w / part_b [chunk][column]: each thread sums one column over one chunk of rows, in order.
template <class T, class S>
__global__ void layer_norm_param_partials(const T* x, const S* mean, const S* rstd, const T* dy,
                                          double* part_w, double* part_b, int64_t rows, int64_t c,
                                          int64_t chunks) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t k = blockIdx.y;
  if (j >= c) return;
  const int64_t r0 = rows * k / chunks, r1 = rows * (k + 1) / chunks;
  double acc_w = 0, acc_b = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const S g = static_cast<S>(to_acc(dy[r * c + j]));
    if (part_w)
      acc_w +=
          static_cast<double>(g * ((static_cast<S>(to_acc(x[r * c + j])) - mean[r]) * rstd[r]));
    acc_b += static_cast<double>(g);
  }
  if (part_w) part_w[k * c + j] = acc_w;
  if (part_b) part_b[k * c + j] = acc_b;
}

template <class T>
using Stats = std::conditional_t<std::is_same_v<T, double>, double, float>;

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t c = x.shape().back();
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  if (rows == 0) return;
  ENGINE_CHECK(rows < (int64_t(1) << 31), "[layer_norm] ", rows, " rows exceed one grid dimension");
  DeviceGuard guard(x.device().index);
  const LaunchConfig cfg{dim3(static_cast<unsigned>(rows)), dim3(row_threads(c)), 0,
                         compute_stream(x.device().index)};
  dispatch_floating(x.dtype(), "layer_norm", [&]<class T>() {
    using S = Stats<T>;
    ENGINE_LAUNCH((layer_norm_forward_rows<T, S>), cfg, static_cast<const T*>(x.raw_data()),
                  weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr,
                  bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr,
                  static_cast<S>(eps), static_cast<T*>(y.raw_data()), mean.data<S>(),
                  rstd.data<S>(), c);
  });
}

void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias) {
  const int64_t c = x.shape().back();
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  const int index = x.device().index;
  DeviceGuard guard(index);
  const cudaStream_t stream = compute_stream(index);
  const bool want_w = dweight.defined(), want_b = dbias.defined();
  if (rows == 0) {  // sums over no rows
    if (want_w) dweight.fill_(0.0);
    if (want_b) dbias.fill_(0.0);
    return;
  }
  ENGINE_CHECK(rows < (int64_t(1) << 31), "[layer_norm_backward] ", rows,
               " rows exceed one grid dimension");
  const int64_t chunks = rows < kMaxChunks ? rows : kMaxChunks;
  Tensor part = want_w || want_b ? Tensor::empty({2, chunks, c}, DType::f64, x.device()) : Tensor();
  dispatch_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
    using S = Stats<T>;
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pg = static_cast<const T*>(dy.raw_data());
    if (dx.defined())
      ENGINE_LAUNCH(
          (layer_norm_backward_rows<T, S>),
          (LaunchConfig{dim3(static_cast<unsigned>(rows)), dim3(row_threads(c)), 0, stream}), px,
          weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr, mean.data<S>(),
          rstd.data<S>(), pg, static_cast<T*>(dx.raw_data()), c);
    if (!want_w && !want_b) return;
    double* pw = want_w ? part.data<double>() : nullptr;
    double* pb = want_b ? part.data<double>() + chunks * c : nullptr;
    const unsigned col_blocks = static_cast<unsigned>(grid_blocks(c, kColumnThreads));
    ENGINE_LAUNCH((layer_norm_param_partials<T, S>),
                  (LaunchConfig{dim3(col_blocks, static_cast<unsigned>(chunks)),
                                dim3(kColumnThreads), 0, stream}),
                  px, mean.data<S>(), rstd.data<S>(), pg, pw, pb, rows, c, chunks);
    const LaunchConfig fin{dim3(col_blocks), dim3(kColumnThreads), 0, stream};
    if (want_w)
      ENGINE_LAUNCH(sum_chunks_in_order<T>, fin, static_cast<const double*>(pw),
                    static_cast<T*>(dweight.raw_data()), c, chunks);
    if (want_b)
      ENGINE_LAUNCH(sum_chunks_in_order<T>, fin, static_cast<const double*>(pb),
                    static_cast<T*>(dbias.raw_data()), c, chunks);
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(layer_norm_forward_kernel, DeviceType::CUDA, layer_norm_forward);
ENGINE_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::CUDA, layer_norm_backward);

}  // namespace engine::cuda
