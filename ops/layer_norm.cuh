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
// group k: elements 4 (l + 32 k) + q; padding beyond c 0), element (k, q) as S from at(k, q), in S:
// two passes over the registers (the mean, then the squared deviations), each summed by warp_sum's
// butterfly, so every lane gets the same bits. (Until 2026-12-06 float rows took Welford's update
// per element, a division each: 32 a lane at C = 1024, and the merges' too, in kernels that should
// be memory-bound; the H200 measured the warp-per-row LayerNorm at 1.4 TB/s, half GELU's rate.)
template <class S, int G, class At>
__device__ inline void warp_row_moments(At&& at, int64_t c, int lane, S& mu, S& var) {
  S s = 0;
#pragma unroll
  for (int k = 0; k < G; ++k)
#pragma unroll
    for (int q = 0; q < 4; ++q) s += at(k, q);  // padding is 0
  mu = warp_sum(s) / static_cast<S>(c);
  S sq = 0;
#pragma unroll
  for (int k = 0; k < G; ++k)
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (4 * (lane + int64_t(kWarpSize) * k) + q < c) {
        const S dv = at(k, q) - mu;
        sq += dv * dv;
      }
  var = warp_sum(sq) / static_cast<S>(c);
}

// A row's group of 4 elements as loaded, kept in T (load4's layout; elements past n zero): a
// 16-bit row then holds half the registers of its widened values where ptxas keeps them packed
// (layer_norm_forward_warp: 114 registers a thread with the row widened, 72 kept in bf16).
template <class T>
__device__ inline void load4_raw(const T* p, int64_t j, int64_t n, bool vec, Vec<T, 4>& out) {
  if (vec) {
    out = *reinterpret_cast<const Vec<T, 4>*>(p + j);
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) out.v[q] = j + q < n ? p[j + q] : from_acc<T>(Acc<T>(0));
}

// The first half of a LayerNorm input gradient for a row the warp holds (load4's layout): loads
// the row's normalised input x and its gradient dy (rows of c, `vec`: 4-element vectors), forms
// dxhat = dy * weight (weight may be null: 1), rounded before use (the CPU stores it first; fused
// into the subtraction, a one-element row would get a nonzero dx), and xhat = (x - mu) rs, and
// returns the row means of dxhat and dxhat * xhat; padding counts as dy = 0. each(k, q, dy, xhat)
// sees every element (its parameter-gradient terms). The input gradient is then
// rs (d - mean_g - xh mean_gx).
template <class T, class S, int G, class F>
__device__ inline void warp_row_dxhat(const T* x, const T* dy, const T* weight, S mu, S rs,
                                      int64_t c, int lane, bool vec, S (&d)[G][4], S (&xh)[G][4],
                                      S& mean_g, S& mean_gx, F&& each) {
  S sum_g = 0, sum_gx = 0;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    Acc<T> xv[4] = {}, gv[4] = {}, wv[4] = {};
    if (j0 < c) {
      load4(x, j0, c, vec, xv);
      load4(dy, j0, c, vec, gv);
      if (weight) load4(weight, j0, c, vec, wv);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const S g = static_cast<S>(gv[q]);
      d[k][q] = weight ? dmath::mul_rn(g, static_cast<S>(wv[q])) : g;
      xh[k][q] = (static_cast<S>(xv[q]) - mu) * rs;
      sum_g += d[k][q];
      sum_gx += d[k][q] * xh[k][q];
      each(k, q, g, xh[k][q]);
    }
  }
  mean_g = warp_sum(sum_g) / static_cast<S>(c);
  mean_gx = warp_sum(sum_gx) / static_cast<S>(c);
}

}  // namespace engine::cuda
