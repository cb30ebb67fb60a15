// Device helpers shared by the kernels that normalise a row held in a warp's registers
// (layer_norm.cu, dropout_add_layer_norm.cu).
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/cuda/kernels.cuh"

namespace engine::cuda {

// The statistics type of a row of T (layer_norm_stats_dtype): double for double, else float.
template <class T>
using Stats = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Threads of a block that normalises one row of c > 1024 elements: up to 8 warps.
inline int row_threads(int64_t c) {
  const int64_t warps = (c + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(kWarpSize * (warps < 8 ? warps : 8));
}

// Mean and biased variance of a row of c elements that a warp holds in load4's layout (lane l,
// group k: elements 4 (l + 32 k) + q; padding beyond c loaded as 0). S = double: two passes
// (mean, then squared deviations), as the CPU computes them; float: Welford per lane and the
// warp's lane-symmetric merge (every lane gets the same bits).
template <class S, int G, class A>
__device__ inline void warp_row_moments(const A (&v)[G][4], int64_t c, int lane, S& mu, S& var) {
  if constexpr (std::is_same_v<S, double>) {
    double s = 0;
#pragma unroll
    for (int k = 0; k < G; ++k)
#pragma unroll
      for (int q = 0; q < 4; ++q) s += v[k][q];  // padding is 0
    mu = warp_sum(s) / static_cast<double>(c);
    double sq = 0;
#pragma unroll
    for (int k = 0; k < G; ++k)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (4 * (lane + int64_t(kWarpSize) * k) + q < c) sq += (v[k][q] - mu) * (v[k][q] - mu);
    var = warp_sum(sq) / static_cast<double>(c);
  } else {
    WelfordStat w;
#pragma unroll
    for (int k = 0; k < G; ++k)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (4 * (lane + int64_t(kWarpSize) * k) + q < c) welford_add(w, v[k][q]);
    w = warp_welford(w);
    mu = w.mean;
    var = w.m2 / w.count;
  }
}

}  // namespace engine::cuda
