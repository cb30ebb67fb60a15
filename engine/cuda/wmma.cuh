// The warp matrix functions (tensor cores through CUDA's WMMA API) for the engine's kernels:
// nvcuda::wmma from <mma.h> under nvcc, the emulator's implementation of the same names in the
// emulation build (emu/wmma.h: the m16n16k16 shape, 16-bit multiplicands, float accumulators;
// fragment layouts of its own, warp-uniformity and alignment checked). Kernels write
// `wmma::fragment<...>`, `wmma::mma_sync(...)` and work in both builds.
#pragma once

#if defined(ENGINE_CUDA_EMULATION)
#include "emu/wmma.h"
#else
#include <mma.h>
#endif

namespace engine::cuda {
namespace wmma = nvcuda::wmma;

// Dynamic shared memory (ENGINE_DYNAMIC_SHARED) carved into regions for the warp matrix
// functions: smem_region<U>(base, bytes) is the region at that byte offset as U* under nvcc and
// as the emulator's checked pointer in emulation; raw_ptr(p) is the plain pointer that
// load_matrix_sync / store_matrix_sync take (the emulator's wmma checks those accesses itself).
#if defined(ENGINE_CUDA_EMULATION)
template <class U, class B>
inline ::emu::SharedPtr<U> smem_region(const ::emu::SharedPtr<B>& base, size_t bytes) {
  return ::emu::SharedPtr<U>(
      reinterpret_cast<U*>(reinterpret_cast<unsigned char*>(base.get()) + bytes));
}
template <class U>
inline U* raw_ptr(const ::emu::SharedPtr<U>& p) {
  return p.get();
}
#else
template <class U, class B>
__device__ inline U* smem_region(B* base, size_t bytes) {
  return reinterpret_cast<U*>(reinterpret_cast<unsigned char*>(base) + bytes);
}
template <class U>
__device__ inline U* raw_ptr(U* p) {
  return p;
}
#endif
}  // namespace engine::cuda
