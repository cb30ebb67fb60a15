// ENGINE_HD: a function compiled for the host and, under nvcc (or the emulator's build of the .cu
// files), for the device too, so CPU and CUDA kernels share one definition of their arithmetic.
#pragma once

#if defined(__CUDACC__)
#define ENGINE_HD __host__ __device__ __forceinline__
#else
#define ENGINE_HD inline
#endif
