// CUDA kernels of the gradient-slab ops (see gradients.h). The statistics are reduced in two
// fixed-shape passes (a grid of kBlocks blocks writes one partial per block, one block adds the
// partials in a fixed tree order), so a rerun gives the same bits whatever the GPU.
#include <cuda_runtime.h>

#include <algorithm>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "ops/gradients.h"

namespace engine::cuda {
namespace {

constexpr int kThreads = 256;  // a power of two: the shared-memory trees below halve it
constexpr int kBlocks = 1024;  // partials; also the threads of the final pass

// Sums a[0 .. blockDim.x) into a[0] and b[..] into b[0] (blockDim.x a power of two) in a fixed
// tree order; every thread of the block calls it after writing its own a and b entries.
__device__ void tree_sum_pair(double* a, double* b) {
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      a[threadIdx.x] += a[threadIdx.x + half];
      b[threadIdx.x] += b[threadIdx.x + half];
    }
    __syncthreads();
  }
}

template <class T>
__global__ void unscale_check_partials(T* x, int64_t n, T factor, bool unscale, double* sums,
                                       double* bad) {
  __shared__ double s_sum[kThreads];
  __shared__ double s_bad[kThreads];
  double acc = 0, nonfinite = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    T v = x[i];
    if (unscale) {
      v = v * factor;
      x[i] = v;
    }
    const double d = static_cast<double>(v);
    acc += d * d;
    nonfinite += isfinite(d) ? 0.0 : 1.0;
  }
  s_sum[threadIdx.x] = acc;
  s_bad[threadIdx.x] = nonfinite;
  tree_sum_pair(s_sum, s_bad);
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = s_sum[0];
    bad[blockIdx.x] = s_bad[0];
  }
}

// One block of kBlocks threads: stats = (sum of sums, sum of bad).
__global__ void unscale_check_finish(const double* sums, const double* bad, double* stats) {
  __shared__ double s_sum[kBlocks];
  __shared__ double s_bad[kBlocks];
  s_sum[threadIdx.x] = sums[threadIdx.x];
  s_bad[threadIdx.x] = bad[threadIdx.x];
  tree_sum_pair(s_sum, s_bad);
  if (threadIdx.x == 0) {
    stats[0] = s_sum[0];
    stats[1] = s_bad[0];
  }
}

template <class T>
__global__ void scale_kernel_impl(T* x, int64_t n, T factor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = x[i] * factor;
}

template <class F>
void dispatch_f32_f64(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    default:
      ENGINE_FAIL("[", op, "] the CUDA kernel takes f32 or f64 gradient slabs, got ",
                  dtype_name(t));
  }
}

void unscale_check(const Tensor& x, double inv_scale, const Tensor& stats) {
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = compute_stream(x.device().index);
  Tensor partials = Tensor::empty({2, kBlocks}, DType::f64, x.device());
  double* sums = partials.data<double>();
  dispatch_f32_f64(x.dtype(), "unscale_and_check_", [&]<class T>() {
    ENGINE_LAUNCH(unscale_check_partials<T>,
                  (LaunchConfig{dim3(kBlocks), dim3(kThreads), 0, stream}),
                  static_cast<T*>(x.raw_data()), x.numel(), static_cast<T>(inv_scale),
                  inv_scale != 1.0, sums, sums + kBlocks);
  });
  ENGINE_LAUNCH(unscale_check_finish, (LaunchConfig{dim3(1), dim3(kBlocks), 0, stream}), sums,
                sums + kBlocks, stats.data<double>());
}

void scale(const Tensor& x, double factor) {
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = compute_stream(x.device().index);
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  dispatch_f32_f64(x.dtype(), "scale_", [&]<class T>() {
    ENGINE_LAUNCH(scale_kernel_impl<T>, (LaunchConfig{dim3(blocks), dim3(kThreads), 0, stream}),
                  static_cast<T*>(x.raw_data()), n, static_cast<T>(factor));
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(unscale_check_kernel, DeviceType::CUDA, unscale_check);
ENGINE_REGISTER_KERNEL(scale_kernel, DeviceType::CUDA, scale);

}  // namespace engine::cuda
