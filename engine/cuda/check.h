// Check macros for CUDA runtime and cuBLAS calls: failures throw engine::Error naming the call,
// the error string and file:line.
#pragma once

#include <cuda_runtime.h>

#include "engine/error.h"

#define ENGINE_CUDA_CHECK(call)                                                           \
  do {                                                                                    \
    cudaError_t engine_err_ = (call);                                                     \
    if (engine_err_ != cudaSuccess)                                                       \
      ENGINE_FAIL("[cuda] ", #call, " failed: ", cudaGetErrorString(engine_err_), " at ", \
                  __FILE__, ":", __LINE__);                                               \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define ENGINE_CUDA_CHECK_LAUNCH() ENGINE_CUDA_CHECK(cudaGetLastError())

// cuBLAS / cuBLASLt calls (include <cublasLt.h> first).
#define ENGINE_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                            \
    cublasStatus_t engine_st_ = (call);                                                           \
    if (engine_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ENGINE_FAIL("[cublas] ", #call, " failed with status ", static_cast<int>(engine_st_), " (", \
                  cublasLtGetStatusName(engine_st_), ") at ", __FILE__, ":", __LINE__);           \
  } while (0)
