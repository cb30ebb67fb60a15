// Counts of the device work the CUDA backend has enqueued since the process started, over all
// devices and threads: kernel launches (every launch_kernel / ENGINE_LAUNCH) and cuBLASLt
// matmuls. Tests and benchmarks diff them around a training step to hold it to its launch budget
// (tests/cuda/models: launches per encoder layer). Plain C++: usable without the CUDA headers.
#pragma once

#include <cstdint>

namespace engine::cuda {

struct WorkCounts {
  int64_t kernels = 0;  // kernel launches
  int64_t gemms = 0;    // cublasLtMatmul calls
};
WorkCounts work_counts();

// Called by launch_kernel: the kernel's name, its blocks and threads per block (all dims).
void count_kernel_launch(const char* name, int64_t blocks, int64_t threads);
void count_gemm();  // called by the GEMM kernel (ops/matmul.cu)

}  // namespace engine::cuda
