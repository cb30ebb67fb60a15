// When a CPU kernel's loop is worth splitting over the OpenMP threads. Measured with
// `bench_ops --only parallel_threshold` (2 cores, docs/benchmarks.md): an empty parallel region
// costs as much as a few thousand elements of a loop, and a memory-bound f32 loop (y = a x + y)
// gains from 2 threads from ~32K elements on (1.4x at 32K, 1.8x at 64K, 1.9-2.5x from 128K while
// the data fits the caches).
// Loops of heavier elements (exp, erf, a Philox block) cross over earlier; kernels that know
// theirs say so beside their own constant.
#pragma once

#include <cstdint>

namespace engine::cpu {

inline constexpr int64_t kParallelMinElems = 32768;

}  // namespace engine::cpu
