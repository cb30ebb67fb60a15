// What the SIMT emulator costs (docs/cuda.md quotes these): nanoseconds per CUDA thread
// launched, per __syncthreads per thread, per warp shuffle per thread, and the wall time of a
// row-wise LayerNorm-shaped kernel (256 rows x 768, one block of 256 threads per row, two block
// reductions). Prints one line per figure; run as build-emu/bin/bench_emulator.
#include <chrono>
#include <cstdio>
#include <vector>

#include "engine/cuda/launch.h"

using engine::cuda::LaunchConfig;

namespace {

__global__ void empty_kernel(int* out) {
  if (threadIdx.x == 1u << 30) *out = 1;  // never: keeps the kernel from being empty
}

__global__ void barriers(int* out, int k) {
  int a = threadIdx.x;
  for (int i = 0; i < k; ++i) {
    __syncthreads();
    a += i;
  }
  if (a == -1) *out = a;
}

__global__ void shuffles(int* out, int k) {
  int a = threadIdx.x;
  for (int i = 0; i < k; ++i) a += __shfl_xor_sync(0xffffffffu, a, 1 + (i & 15));
  if (a == -1) *out = a;
}

__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0;
  for (int w = 0; w < blockDim.x / 32; ++w) t += scratch[w];
  __syncthreads();
  return t;
}

__global__ void layer_norm_rows(const float* x, float* y, int cols) {
  __shared__ float scratch[32];
  const float* row = x + blockIdx.x * size_t(cols);
  float s = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += row[c];
  const float mean = block_sum(s, scratch) / cols;
  float q = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) q += (row[c] - mean) * (row[c] - mean);
  const float rstd = 1.0f / sqrtf(block_sum(q, scratch) / cols + 1e-5f);
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    y[blockIdx.x * size_t(cols) + c] = (row[c] - mean) * rstd;
}

double seconds(auto&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  cudaDeviceSynchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main() {
  int* out = nullptr;
  cudaMalloc(&out, 4);
  const unsigned blocks = 512, threads = 256;
  const double n = double(blocks) * threads;
  const double t_launch = seconds([&] {
    ENGINE_LAUNCH(empty_kernel, (LaunchConfig{dim3(blocks), dim3(threads)}), out);
  });
  std::printf("thread launched:      %6.1f ns per CUDA thread (%u blocks x %u threads)\n",
              t_launch / n * 1e9, blocks, threads);
  const int k = 64;
  const double t_bar = seconds([&] {
    ENGINE_LAUNCH(barriers, (LaunchConfig{dim3(blocks), dim3(threads)}), out, k);
  });
  std::printf("__syncthreads:        %6.1f ns per thread per barrier\n",
              (t_bar - t_launch) / (n * k) * 1e9);
  const double t_shfl = seconds([&] {
    ENGINE_LAUNCH(shuffles, (LaunchConfig{dim3(blocks), dim3(threads)}), out, k);
  });
  std::printf("__shfl_xor_sync:      %6.1f ns per thread per shuffle\n",
              (t_shfl - t_launch) / (n * k) * 1e9);
  const int rows = 256, cols = 768;
  float *x = nullptr, *y = nullptr;
  cudaMalloc(&x, rows * cols * 4);
  cudaMalloc(&y, rows * cols * 4);
  cudaMemset(x, 0, rows * cols * 4);
  const double t_ln = seconds([&] {
    ENGINE_LAUNCH(layer_norm_rows, (LaunchConfig{dim3(rows), dim3(256)}), x, y, cols);
  });
  std::printf("layer norm 256x768:   %6.2f ms (one block of 256 threads per row)\n", t_ln * 1e3);
  const emu::Stats s = emu::stats();
  std::printf("emulated: %lu launches, %lu blocks, %lu threads, %lu barriers, %lu warp ops\n",
              (unsigned long)s.launches, (unsigned long)s.blocks, (unsigned long)s.threads,
              (unsigned long)s.barriers, (unsigned long)s.warp_ops);
  return 0;
}
