// Per-column sums over rows in a fixed order, for kernels whose parameter gradients are column
// sums (layer_norm's weight and bias, bias_gelu's bias): each chunk of rows writes its sums into a
// row of `part` (chunks x n, double), then this adds the chunks in order. The chunk boundaries
// depend only on the row count, so the result is the same at any thread count. `part` comes from
// thread_scratch (engine/cpu/scratch.h).
#pragma once

#include <cstdint>
#include <vector>

namespace engine::cpu {

// out[j] = sum over k = 0 .. chunks-1, in that order, of part[k * n + j] (from 0, in double), then
// rounded to T. The loop over columns is the inner one: it vectorises, where a loop over the
// chunks per column is a chain of dependent scalar adds (over a third of layer_norm's backward at
// 256 rows x 768; docs/benchmarks.md, "Figures behind the code").
template <class T>
void sum_chunks_in_order(const double* part, int64_t chunks, int64_t n, T* out) {
  std::vector<double> sum(static_cast<size_t>(n), 0.0);
  for (int64_t k = 0; k < chunks; ++k) {
    const double* p = part + k * n;
    for (int64_t j = 0; j < n; ++j) sum[static_cast<size_t>(j)] += p[j];
  }
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(sum[static_cast<size_t>(j)]);
}

}  // namespace engine::cpu
