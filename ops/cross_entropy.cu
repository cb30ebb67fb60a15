// CUDA kernels of the fused softmax cross-entropy (see cross_entropy.h).
//
// Forward: one block per row, one pass over it in 8-element vectors (16-byte loads of 16-bit
// logits), computes the row's max and sum
// of exp (each thread's running pair, merged through the block reductions; f32 for f32 / bf16 /
// f16 logits, f64 for f64), writes the logsumexp and the row's loss (0 for an ignored row); then a
// single block sums the row losses in f64 and counts the rows not ignored, in a fixed order (the
// same result on every run), and writes count and the sum or mean. No (N, C) softmax is ever
// stored. Backward: elementwise over (N, C), 16-byte vectors along the classes where the row length
// allows, each writing (exp(x - lse) - onehot) * w with the row's weight read from grad_out and
// count on the device, so no value comes back to the host. 16-bit logits with an f32 loss
// (autocast's loss in f32) are read as they are: their conversion to f32 is exact and the
// arithmetic the f32 kernels', so loss and gradient have the bits of casting the logits to f32
// first, without that (N, C) copy each way. A target outside [0, C) that is not ignore_index is
// reported (device_error.cuh: raised at the next host read) and its row contributes nothing.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/strided.cuh"
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

// T: the logits; O: the loss (T, or f32 for 16-bit logits). One pass over the row in W-element
// vectors (8 where the row allows, else 1): each thread keeps a running maximum and the
// sum of exp(x - max) of its elements (rescaled when the maximum grows; NaN and infinities
// propagate as in the two-pass form), then block_max and block_sum (fixed orders) merge them.
template <class T, class O, class I, int W>
__global__ void cross_entropy_rows(const T* logits, const I* targets, int64_t c,
                                   int64_t ignore_index, Acc<T>* lse, Acc<T>* row_loss, O* out,
                                   DeviceIndexError* err) {
  using V = Acc<T>;
  const int64_t i = blockIdx.x;
  const T* x = logits + i * c;
  V m = -INFINITY, s = 0;
  for (int64_t k = threadIdx.x; k < c / W; k += blockDim.x) {
    const Vec<T, W> v = reinterpret_cast<const Vec<T, W>*>(x)[k];
    V lm = to_acc(v.v[0]);
#pragma unroll
    for (int q = 1; q < W; ++q) lm = max_nan(lm, to_acc(v.v[q]));
    if (!(lm <= m)) {  // a larger maximum, or NaN: the sum so far rescaled to it
      s = m == V(-INFINITY) ? V(0) : s * dmath::exp(m - lm);
      m = lm;
    }
    if (m != V(-INFINITY))  // elements of -inf while the maximum is -inf add 0 to any other
#pragma unroll
      for (int q = 0; q < W; ++q) s += dmath::exp(to_acc(v.v[q]) - m);
  }
  const V mx = block_max(m, V(-INFINITY));
  V sum = block_sum(m == V(-INFINITY) ? V(0) : s * dmath::exp(m - mx));
  if (mx == V(-INFINITY)) sum = V(NAN);  // every logit -inf: NaN, as exp(x - max) makes it
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
  if (out) out[i] = from_acc<O>(loss);  // Reduction::none
}

// One block: out[0] = the sum (or mean over kept rows) of row_loss, count[0] = kept rows.
template <class T, class O, class I>
__global__ void cross_entropy_total(const Acc<T>* row_loss, const I* targets, int64_t n,
                                    int64_t ignore_index, bool mean, int64_t* count, O* out) {
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
    *out = from_acc<O>(static_cast<Acc<O>>(sum));
  }
}

// The gradient of V consecutive classes of one row (vector k of the (N, C) tensor; C % V == 0):
// (exp(x - lse) - onehot) * w, rounded as the f32 kernels round it; zeros for an ignored row or a
// bad target (reported once, by the row's first vector). A thread a vector, grid-stride.
template <class T, class O, class I, int V>
__global__ void cross_entropy_backward_vec(const T* logits, const I* targets, const Acc<T>* lse,
                                           const int64_t* count, const O* grad_out,
                                           int64_t ignore_index, int reduction, int64_t c,
                                           int64_t n_vec, FastDiv row_of, bool fast, T* grad,
                                           DeviceIndexError* err) {
  using A = Acc<T>;
  const int64_t per_row = c / V;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n_vec; k += stride) {
    const int64_t i = fast ? int64_t(row_of.div(static_cast<uint32_t>(k))) : k / per_row;
    const int64_t j0 = (k - i * per_row) * V;
    const int64_t t = static_cast<int64_t>(targets[i]);
    Vec<T, V> g;
    if (t == ignore_index || t < 0 || t >= c) {  // a bad target: reported, its gradient 0
      if (t != ignore_index && j0 == 0) report_bad_index(err, IndexCheck::class_target, i, t, c);
#pragma unroll
      for (int e = 0; e < V; ++e) g.v[e] = from_acc<T>(A(0));
    } else {
      // The CPU's weight: grad_out[i], grad_out[0], or grad_out[0] / count in the loss's dtype.
      A w = 0;
      if (reduction == static_cast<int>(Reduction::none)) {
        w = to_acc(grad_out[i]);
      } else if (reduction == static_cast<int>(Reduction::sum)) {
        w = to_acc(grad_out[0]);
      } else if (*count > 0) {
        w = to_acc(from_acc<O>(to_acc(grad_out[0]) / static_cast<Acc<O>>(*count)));
      }
      const A l = lse[i];
      const Vec<T, V> x = reinterpret_cast<const Vec<T, V>*>(logits)[k];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        A v = dmath::mul_rn(dmath::exp(to_acc(x.v[e]) - l), w);  // rounded, then (j == t) minus w
        if (j0 + e == t) v -= w;
        g.v[e] = from_acc<T>(v);
      }
    }
    reinterpret_cast<Vec<T, V>*>(grad)[k] = g;
  }
}

// f<O>() with O the loss's dtype: the logits' own, or f32 for 16-bit logits (checked).
template <class T, class F>
void dispatch_loss(DType logits, DType loss, const char* op, F&& f) {
  if (loss == logits) return f.template operator()<T>();
  if constexpr (sizeof(T) == 2) {
    if (loss == DType::f32) return f.template operator()<float>();
  }
  ENGINE_FAIL("[", op, "] the loss of ", dtype_name(logits), " logits must be ", dtype_name(logits),
              " or f32 (for 16-bit logits), got ", dtype_name(loss));
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           Reduction reduction, const Tensor& lse, const Tensor& count,
                           const Tensor& out) {
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  const Device dev = logits.device();
  DeviceGuard guard(dev.index);
  const cudaStream_t stream = compute_stream(dev.index);
  cuda::dispatch_device_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
    dispatch_loss<T>(logits.dtype(), out.dtype(), "cross_entropy", [&]<class O>() {
      dispatch_index(targets.dtype(), "cross_entropy", [&]<class I>() {
        using V = Acc<T>;
        Tensor row_loss = Tensor::empty({n > 0 ? n : 1}, lse.dtype(), dev);
        if (n > 0) {
          ENGINE_CHECK(n < (int64_t(1) << 31), "[cross_entropy] ", n, " rows exceed one grid");
          // 8 elements a load (16 bytes of bf16 / f16, two vectors of f32): the same split of
          // the row for 16-bit logits and for their f32 cast, so the same bits
          constexpr int kW = 8;
          const bool vec = c % kW == 0 && detail::aligned(dptr<const T>(logits), kW * sizeof(T));
          const LaunchConfig rows{dim3(static_cast<unsigned>(n)),
                                  dim3(row_threads(vec ? c / kW : c)), 0, stream};
          auto launch = [&](auto kernel) {
            launch_kernel("cross_entropy_online", kernel, rows, dptr<const T>(logits),
                          dptr<const I>(targets), c, ignore_index, dptr<V>(lse), dptr<V>(row_loss),
                          reduction == Reduction::none ? dptr<O>(out) : nullptr,
                          device_index_error(dev.index));
          };
          if (vec)
            launch(cross_entropy_rows<T, O, I, kW>);
          else
            launch(cross_entropy_rows<T, O, I, 1>);
        }
        const LaunchConfig one{dim3(1), dim3(1024), 0, stream};
        ENGINE_LAUNCH((cross_entropy_total<T, O, I>), one, dptr<const V>(row_loss),
                      dptr<const I>(targets), n, ignore_index, reduction == Reduction::mean,
                      dptr<int64_t>(count), reduction == Reduction::none ? nullptr : dptr<O>(out));
      });
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& count, const Tensor& grad_out, int64_t ignore_index,
                            Reduction reduction, const Tensor& grad_logits) {
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  if (n == 0 || c == 0) return;
  const Device dev = logits.device();
  DeviceGuard guard(dev.index);
  const cudaStream_t stream = compute_stream(dev.index);
  const char* op = "cross_entropy_backward";
  cuda::dispatch_device_floating(logits.dtype(), op, [&]<class T>() {
    dispatch_loss<T>(logits.dtype(), grad_out.dtype(), op, [&]<class O>() {
      dispatch_index(targets.dtype(), op, [&]<class I>() {
        auto run = [&]<int V>() {
          const int64_t n_vec = n * c / V;
          const bool fast = n_vec < (int64_t{1} << 31);  // FastDiv's range
          const LaunchConfig cfg{dim3(grid_blocks(n_vec, kElementwiseThreads)),
                                 dim3(kElementwiseThreads), 0, stream};
          ENGINE_LAUNCH((cross_entropy_backward_vec<T, O, I, V>), cfg, dptr<const T>(logits),
                        dptr<const I>(targets), dptr<const Acc<T>>(lse), dptr<const int64_t>(count),
                        dptr<const O>(grad_out), ignore_index, static_cast<int>(reduction), c,
                        n_vec, FastDiv(static_cast<uint32_t>(fast ? c / V : 1)), fast,
                        dptr<T>(grad_logits), device_index_error(dev.index));
        };
        constexpr int kV = 16 / sizeof(T);
        if (c % kV == 0 && detail::aligned(logits.raw_data(), 16) &&
            detail::aligned(grad_logits.raw_data(), 16))
          run.template operator()<kV>();
        else
          run.template operator()<1>();
      });
    });
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(cross_entropy_forward_kernel, DeviceType::CUDA, cross_entropy_forward);
ENGINE_REGISTER_KERNEL(cross_entropy_backward_kernel, DeviceType::CUDA, cross_entropy_backward);

}  // namespace engine::cuda
