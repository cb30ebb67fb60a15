// A kernel per bug class the sanitizer builds must catch, and its corrected twin:
//   sanitizer_probe race | race_fixed   threads of a block exchange values through shared memory
//                                       without / with the __syncthreads between write and read
//                                       (ThreadSanitizer: data race);
//   sanitizer_probe oob | oob_fixed     a kernel reads one element past a cudaMalloc'd buffer
//                                       (AddressSanitizer: use-after-poison);
//   sanitizer_probe cluster_race |      the blocks of a cluster rewrite their shared memory and
//                   cluster_race_fixed  read each other's without / with the cluster.sync
//                                       between (ThreadSanitizer: data race).
// CTest runs them in build-emu-tsan / build-emu-asan and expects the report for the buggy
// twin and none for the fixed one (tests/CMakeLists.txt).
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/cuda/cluster.cuh"
#include "engine/cuda/launch.h"

using engine::cuda::LaunchConfig;
namespace cg = cooperative_groups;

namespace {

constexpr int kThreads = 64;

__global__ void neighbour_exchange(const float* x, float* y, bool barrier) {
  __shared__ float s[kThreads];
  s[threadIdx.x] = x[threadIdx.x];
  if (barrier) __syncthreads();
  y[threadIdx.x] = s[(threadIdx.x + 1) % kThreads];
}

// A cluster of two blocks: both rows written and synchronised, then rewritten and the other
// block's row read, with or without the barrier between; a last barrier before exit.
__global__ void cluster_exchange(float* y, bool barrier) {
  ENGINE_DYNAMIC_SHARED(float, s);
  const cg::cluster_group cluster = cg::this_cluster();
  const int other = int(cluster.block_rank() ^ 1u);
  s[threadIdx.x] = 0.0f;
  cluster.sync();
  s[threadIdx.x] = float(threadIdx.x + blockIdx.x);
  if (barrier) cluster.sync();
  y[blockIdx.x * blockDim.x + threadIdx.x] = cluster.map_shared_rank(s, other)[threadIdx.x];
  cluster.sync();
}

__global__ void shifted_copy(const float* x, float* y, int n, int shift) {
  const int i = threadIdx.x;
  if (i < n) y[i] = x[i + shift];
}

int check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "sanitizer_probe: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  const bool race = !std::strcmp(mode, "race"), race_fixed = !std::strcmp(mode, "race_fixed");
  const bool oob = !std::strcmp(mode, "oob"), oob_fixed = !std::strcmp(mode, "oob_fixed");
  const bool cluster_race = !std::strcmp(mode, "cluster_race"),
             cluster_fixed = !std::strcmp(mode, "cluster_race_fixed");
  if (!race && !race_fixed && !oob && !oob_fixed && !cluster_race && !cluster_fixed) {
    std::fprintf(stderr,
                 "usage: sanitizer_probe race|race_fixed|oob|oob_fixed|cluster_race|"
                 "cluster_race_fixed\n");
    return 2;
  }
  const int n = 100;  // 400 bytes: cudaMalloc's 256-byte rounding leaves a poisoned tail
  float *x = nullptr, *y = nullptr;
  if (check(cudaMalloc(&x, n * sizeof(float)), "cudaMalloc") ||
      check(cudaMalloc(&y, n * sizeof(float)), "cudaMalloc"))
    return 1;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i);
  if (check(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy"))
    return 1;
  const LaunchConfig cfg{dim3(1), dim3(kThreads), 0, nullptr};
  if (race || race_fixed) {
    ENGINE_LAUNCH(neighbour_exchange, cfg, x, y, race_fixed);
  } else if (cluster_race || cluster_fixed) {
    const LaunchConfig pair{dim3(2), dim3(32), 32 * sizeof(float), nullptr, dim3(2)};
    ENGINE_LAUNCH(cluster_exchange, pair, y, cluster_fixed);  // 64 of y's 100 floats
  } else {
    const LaunchConfig all{dim3(1), dim3(128), 0, nullptr};
    ENGINE_LAUNCH(shifted_copy, all, x, y, n, oob ? 1 : 0);  // oob: thread 99 reads x[100]
  }
  if (check(cudaDeviceSynchronize(), "kernel")) return 1;
  if (check(cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy"))
    return 1;
  std::printf("sanitizer_probe %s: y[0] = %g\n", mode, h[0]);
  cudaFree(x);
  cudaFree(y);
  return 0;
}
