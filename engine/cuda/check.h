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
