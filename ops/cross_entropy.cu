// CUDA kernels of the fused softmax cross-entropy (see cross_entropy.h).
//
// Forward: one block per row computes the row's max and sum of exp through the block
// reductions (f32 for f32 / bf16 / f16 logits, f64 for f64), writes the logsumexp and the row's
// loss (0 for an ignored row); then a single block sums the row losses in f64 and counts the
// rows not ignored, in a fixed order (the same result on every run), and writes count and the
// sum or mean. No (N, C) softmax is ever stored. Backward: one block per row writes
// (exp(x - lse) - onehot) * w, reading the weight from grad_out and count on the device, so no
// value comes back to the host. A target outside [0, C) that is not ignore_index is reported
// (device_error.cuh: raised at the next host read) and its row contributes nothing.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "ops/cross_entropy.h"

namespace engine::cuda {
namespace {

// Whole warps covering the row, at most 256 threads.
int row_threads(int64_t c) {
  const int64_t warps = (c + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(kWarpSize * (warps < 8 ? (warps < 1 ? 1 : warps) : 8));
}

template <class T, class I>
__global__ void cross_entropy_rows(const T* logits, const I* targets, int64_t c,
                                   int64_t ignore_index, Acc<T>* lse, Acc<T>* row_loss, T* out,
                                   DeviceIndexError* err) {
  using V = Acc<T>;
  const int64_t i = blockIdx.x;
  const T* x = logits + i * c;
  V mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) mx = max_nan(mx, to_acc(x[j]));
  mx = block_max(mx, V(-INFINITY));
  V sum = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += dmath::exp(to_acc(x[j]) - mx);
  sum = block_sum(sum);
  if (threadIdx.x != 0) return;
  const V l = mx + dmath::log(sum);
  lse[i] = l;
  const int64_t t = static_cast<int64_t>(targets[i]);
  V loss = 0;
  if (t != ignore_index) {
    if (t < 0 || t >= c)
      report_bad_index(err, IndexCheck::class_target, i, t, c);  // the row's loss stays 0
    else
      loss = l - to_acc(x[t]);
  }
  row_loss[i] = loss;
  if (out) out[i] = from_acc<T>(loss);  // Reduction::none
}

// One block: out[0] = the sum (or mean over kept rows) of row_loss, count[0] = kept rows.
template <class T, class I>
__global__ void cross_entropy_total(const Acc<T>* row_loss, const I* targets, int64_t n,
                                    int64_t ignore_index, bool mean, int64_t* count, T* out) {
  double sum = 0;
  long long kept = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sum += static_cast<double>(row_loss[i]);
    kept += static_cast<int64_t>(targets[i]) != ignore_index;
  }
  sum = block_sum(sum);
  kept = block_sum(kept);
  if (threadIdx.x != 0) return;
  *count = kept;
  if (out) {
    // Mean over no rows is 0 (a batch of padding), as on the CPU.
    if (mean) sum = kept > 0 ? sum / static_cast<double>(kept) : 0.0;
    *out = from_acc<T>(static_cast<Acc<T>>(sum));
  }
}

template <class T, class I>
__global__ void cross_entropy_backward_rows(const T* logits, const I* targets, const Acc<T>* lse,
                                            const int64_t* count, const T* grad_out,
                                            int64_t ignore_index, int reduction, int64_t c, T* grad,
                                            DeviceIndexError* err) {
  using V = Acc<T>;
  const int64_t i = blockIdx.x;
  const T* x = logits + i * c;
  T* g = grad + i * c;
  const int64_t t = static_cast<int64_t>(targets[i]);
  if (t == ignore_index || t < 0 || t >= c) {  // a bad target: reported, its gradient 0
    if (t != ignore_index && threadIdx.x == 0)
      report_bad_index(err, IndexCheck::class_target, i, t, c);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) g[j] = from_acc<T>(V(0));
    return;
  }
  V w = 0;  // the CPU's weight: grad_out[i], grad_out[0], or grad_out[0] / count in T
  if (reduction == static_cast<int>(Reduction::none)) {
    w = to_acc(grad_out[i]);
  } else if (reduction == static_cast<int>(Reduction::sum)) {
    w = to_acc(grad_out[0]);
  } else if (*count > 0) {
    w = to_acc(from_acc<T>(to_acc(grad_out[0]) / static_cast<V>(*count)));
  }
  const V l = lse[i];
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    V v = dmath::mul_rn(dmath::exp(to_acc(x[j]) - l), w);  // rounded, then (j == t) minus w
    if (j == t) v -= w;
    g[j] = from_acc<T>(v);
  }
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           Reduction reduction, const Tensor& lse, const Tensor& count,
                           const Tensor& out) {
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  const Device dev = logits.device();
  DeviceGuard guard(dev.index);
  const cudaStream_t stream = compute_stream(dev.index);
  cuda::dispatch_device_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
    dispatch_index(targets.dtype(), "cross_entropy", [&]<class I>() {
      using V = Acc<T>;
      Tensor row_loss = Tensor::empty({n > 0 ? n : 1}, lse.dtype(), dev);
      if (n > 0) {
        ENGINE_CHECK(n < (int64_t(1) << 31), "[cross_entropy] ", n, " rows exceed one grid");
        const LaunchConfig rows{dim3(static_cast<unsigned>(n)), dim3(row_threads(c)), 0, stream};
        ENGINE_LAUNCH((cross_entropy_rows<T, I>), rows, dptr<const T>(logits),
                      dptr<const I>(targets), c, ignore_index, dptr<V>(lse), dptr<V>(row_loss),
                      reduction == Reduction::none ? dptr<T>(out) : nullptr,
                      device_index_error(dev.index));
      }
      const LaunchConfig one{dim3(1), dim3(1024), 0, stream};
      ENGINE_LAUNCH((cross_entropy_total<T, I>), one, dptr<const V>(row_loss),
                    dptr<const I>(targets), n, ignore_index, reduction == Reduction::mean,
                    dptr<int64_t>(count), reduction == Reduction::none ? nullptr : dptr<T>(out));
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& count, const Tensor& grad_out, int64_t ignore_index,
                            Reduction reduction, const Tensor& grad_logits) {
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  if (n == 0 || c == 0) return;
  ENGINE_CHECK(n < (int64_t(1) << 31), "[cross_entropy_backward] ", n, " rows exceed one grid");
  const Device dev = logits.device();
  DeviceGuard guard(dev.index);
  const LaunchConfig rows{dim3(static_cast<unsigned>(n)), dim3(row_threads(c)), 0,
                          compute_stream(dev.index)};
  cuda::dispatch_device_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
    dispatch_index(targets.dtype(), "cross_entropy_backward", [&]<class I>() {
      using V = Acc<T>;
      ENGINE_LAUNCH((cross_entropy_backward_rows<T, I>), rows, dptr<const T>(logits),
                    dptr<const I>(targets), dptr<const V>(lse), dptr<const int64_t>(count),
                    dptr<const T>(grad_out), ignore_index, static_cast<int>(reduction), c,
                    dptr<T>(grad_logits), device_index_error(dev.index));
    });
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(cross_entropy_forward_kernel, DeviceType::CUDA, cross_entropy_forward);
ENGINE_REGISTER_KERNEL(cross_entropy_backward_kernel, DeviceType::CUDA, cross_entropy_backward);

}  // namespace engine::cuda
