// CUDA kernels of categorical sampling and token replacement (see sampling.h).
//
// sample_categorical: one block per row; each thread scores its columns (logit / temperature +
// the Gumbel noise of word i * C + c, the CPU's layout) keeping the first best, then the block
// combines (score, column) pairs preferring the higher score and, on a tie, the lower column:
// the CPU's "first argmax", so both draw the same classes. replace_tokens: one pass copying the
// ids and writing the labels of tokens (0) and padding (-100), then one writing the values and
// their replaced bits at the positions (a position out of range is reported, device_error.cuh).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "ops/sampling.h"

namespace engine::cuda {
namespace {

constexpr int kSampleThreads = 256;

// (score, column): b wins over a when higher, or equal at a lower column.
__device__ inline void better_of(float& score, int& col, float other_score, int other_col) {
  if (other_score > score || (other_score == score && other_col < col)) {
    score = other_score;
    col = other_col;
  }
}

template <class T>
__global__ void sample_rows(const T* logits, int64_t c, float temperature, PhiloxState s,
                            int64_t* out) {
  __shared__ float warp_score[kSampleThreads / kWarpSize];
  __shared__ int warp_col[kSampleThreads / kWarpSize];
  const int64_t i = blockIdx.x;
  const T* x = logits + i * c;
  float best = -INFINITY;
  int col = static_cast<int>(c);  // no column yet (loses every comparison with a real one)
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float v = static_cast<float>(to_acc(x[j])) / temperature +
                    gumbel_from_word(philox_word(s, static_cast<uint64_t>(i * c + j)));
    if (v > best) best = v, col = static_cast<int>(j);  // j grows: the first best is kept
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other = __shfl_down_sync(kFullMask, best, offset);
    const int other_col = __shfl_down_sync(kFullMask, col, offset);
    better_of(best, col, other, other_col);
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) warp_score[warp] = best, warp_col[warp] = col;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < static_cast<int>(blockDim.x / kWarpSize); ++w)
    better_of(best, col, warp_score[w], warp_col[w]);
  out[i] = col < c ? col : 0;  // no score above -inf (all -inf or NaN): column 0, as on the CPU
}

__global__ void copy_ids(int64_t n, const int64_t* ids, const int64_t* mask, int64_t* out_ids,
                         int64_t* out_labels) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += stride) {
    out_ids[e] = ids[e];
    out_labels[e] = mask && mask[e] == 0 ? -100 : 0;
  }
}

__global__ void write_values(int64_t m, int64_t n, const int64_t* positions, const int64_t* values,
                             const int64_t* original, int64_t* out_ids, int64_t* out_labels,
                             DeviceIndexError* err) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < m; k += stride) {
    const int64_t p = positions[k];
    if (p < 0 || p >= n) {
      report_bad_index(err, IndexCheck::write_position, k, p, n);
      continue;
    }
    out_ids[p] = values[k];
    out_labels[p] = values[k] != original[k];
  }
}

void sample_categorical(const Tensor& logits, double temperature, PhiloxState s,
                        const Tensor& out) {
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  ENGINE_CHECK(n < (int64_t(1) << 31) && c < (int64_t(1) << 31), "[sample_categorical] ",
               describe(logits), " exceeds one grid");
  const Device dev = logits.device();
  DeviceGuard guard(dev.index);
  const LaunchConfig rows{dim3(static_cast<unsigned>(n)), dim3(kSampleThreads), 0,
                          compute_stream(dev.index)};
  cuda::dispatch_device_floating(logits.dtype(), "sample_categorical", [&]<class T>() {
    ENGINE_LAUNCH(sample_rows<T>, rows, dptr<const T>(logits), c, static_cast<float>(temperature),
                  s, dptr<int64_t>(out));
  });
}

void replace_tokens(const Tensor& ids, const Tensor& mask, const Tensor& positions,
                    const Tensor& values, const Tensor& original, const Tensor& out_ids,
                    const Tensor& out_labels) {
  const int64_t n = ids.numel(), m = positions.numel();
  if (n == 0) return;
  const Device dev = ids.device();
  DeviceGuard guard(dev.index);
  const cudaStream_t stream = compute_stream(dev.index);
  const int threads = kElementwiseThreads;
  const LaunchConfig all{dim3(grid_blocks(n, threads)), dim3(threads), 0, stream};
  ENGINE_LAUNCH(copy_ids, all, n, dptr<const int64_t>(ids),
                mask.defined() ? dptr<const int64_t>(mask) : nullptr, dptr<int64_t>(out_ids),
                dptr<int64_t>(out_labels));
  if (m == 0) return;
  const LaunchConfig some{dim3(grid_blocks(m, threads)), dim3(threads), 0, stream};
  ENGINE_LAUNCH(write_values, some, m, n, dptr<const int64_t>(positions),
                dptr<const int64_t>(values), dptr<const int64_t>(original), dptr<int64_t>(out_ids),
                dptr<int64_t>(out_labels), device_index_error(dev.index));
}

}  // namespace

ENGINE_REGISTER_KERNEL(sample_categorical_kernel, DeviceType::CUDA, sample_categorical);
ENGINE_REGISTER_KERNEL(replace_tokens_kernel, DeviceType::CUDA, replace_tokens);

}  // namespace engine::cuda
