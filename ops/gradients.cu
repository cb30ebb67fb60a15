// CUDA kernels of the gradient-slab ops (see gradients.h), in 16-byte vectors. The statistics are
// reduced in two
// fixed-shape passes (a grid of kBlocks blocks writes one partial per block, one block adds the
// partials), both with block_sum's fixed shuffle order, so a rerun gives the same bits whatever
// the GPU.
#include <cuda_runtime.h>

#include <algorithm>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "ops/gradients.h"

namespace engine::cuda {
namespace {

constexpr int kThreads = 256;  // whole warps (block_sum)
constexpr int kBlocks = 1024;  // partials; also the threads of the final pass

// Each thread takes 16-byte vectors i, i + stride, ... (V elements each, V = 16 / sizeof(T); the
// slab's base is aligned) and the tail of n % V elements goes to the first threads, one each.
template <class T>
__global__ void unscale_check_vec(T* x, int64_t n, T factor, bool unscale,
                                  const double* factor_device, double* sums, double* bad) {
  constexpr int V = 16 / sizeof(T);
  if (factor_device != nullptr) {  // a graph's per-step scale, read where the kernel runs
    const double f = *factor_device;
    factor = static_cast<T>(f);
    unscale = f != 1.0;
  }
  double acc = 0, nonfinite = 0;
  auto one = [&](T& slot) {
    T v = slot;
    if (unscale) {
      v = v * factor;
      slot = v;
    }
    const double d = static_cast<double>(v);
    acc += d * d;
    nonfinite += isfinite(d) ? 0.0 : 1.0;
  };
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < n / V; i += stride) {
    Vec<T, V> v = reinterpret_cast<Vec<T, V>*>(x)[i];
#pragma unroll
    for (int j = 0; j < V; ++j) one(v.v[j]);
    if (unscale) reinterpret_cast<Vec<T, V>*>(x)[i] = v;
  }
  if (first < n % V) one(x[n / V * V + first]);
  acc = block_sum(acc);
  nonfinite = block_sum(nonfinite);
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = acc;
    bad[blockIdx.x] = nonfinite;
  }
}

// One block of kBlocks threads over the first `blocks` partials (the rest count as 0, as the
// partials of blocks with no elements would): stats = (sum of sums, sum of bad).
__global__ void unscale_check_finish(const double* sums, const double* bad, int blocks,
                                     double* stats) {
  const bool mine = int(threadIdx.x) < blocks;
  const double total = block_sum(mine ? sums[threadIdx.x] : 0.0);
  const double total_bad = block_sum(mine ? bad[threadIdx.x] : 0.0);
  if (threadIdx.x == 0) {
    stats[0] = total;
    stats[1] = total_bad;
  }
}

// The slabs hold f32 or f64 master gradients.
void check_slab(const Tensor& x, const char* op) {
  ENGINE_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64, "[", op,
               "] the CUDA kernel takes f32 or f64 gradient slabs, got ", dtype_name(x.dtype()));
}

template <class T>
__global__ void scale_kernel_impl(T* x, int64_t n, T factor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = x[i] * factor;
}

void unscale_check(const Tensor& x, double inv_scale, const Tensor& inv_scale_device,
                   const Tensor& stats) {
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = compute_stream(x.device().index);
  check_slab(x, "unscale_and_check_");
  // A slab of n elements takes min(kBlocks, ceil(n / kThreads)) blocks: each element lands in
  // the same block and thread as in a full grid (a grid-stride loop's first pass), and the blocks
  // left out would have written 0 partials, so the bits are those of the full grid, which a
  // small slab (a test's, a tiny model's) would launch mostly empty.
  ENGINE_CHECK(reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0,
               "[unscale_and_check_] the gradient slab must be 16-byte aligned");
  const int64_t vecs = x.numel() / (16 / static_cast<int64_t>(dtype_size(x.dtype())));
  const int blocks = int(std::clamp<int64_t>((vecs + kThreads - 1) / kThreads, 1, kBlocks));
  Tensor partials = Tensor::empty({2, kBlocks}, DType::f64, x.device());
  double* sums = partials.data<double>();
  dispatch_device_floating(x.dtype(), "unscale_and_check_", [&]<class T>() {
    ENGINE_LAUNCH(unscale_check_vec<T>, (LaunchConfig{dim3(blocks), dim3(kThreads), 0, stream}),
                  static_cast<T*>(x.raw_data()), x.numel(), static_cast<T>(inv_scale),
                  inv_scale != 1.0,
                  inv_scale_device.defined() ? inv_scale_device.data<double>() : nullptr, sums,
                  sums + kBlocks);
  });
  ENGINE_LAUNCH(unscale_check_finish, (LaunchConfig{dim3(1), dim3(kBlocks), 0, stream}), sums,
                sums + kBlocks, blocks, stats.data<double>());
}

void scale(const Tensor& x, double factor) {
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = compute_stream(x.device().index);
  check_slab(x, "scale_");
  const int blocks = grid_blocks(n, kThreads, 4096);
  dispatch_device_floating(x.dtype(), "scale_", [&]<class T>() {
    ENGINE_LAUNCH(scale_kernel_impl<T>, (LaunchConfig{dim3(blocks), dim3(kThreads), 0, stream}),
                  static_cast<T*>(x.raw_data()), n, static_cast<T>(factor));
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(unscale_check_kernel, DeviceType::CUDA, unscale_check);
ENGINE_REGISTER_KERNEL(scale_kernel, DeviceType::CUDA, scale);

}  // namespace engine::cuda
