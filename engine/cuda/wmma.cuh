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
}  // namespace engine::cuda
