// Device helpers shared by the kernels that normalise a row held in a warp's registers
// (layer_norm.cu, dropout_add_layer_norm.cu).
#pragma once

#include <cstdint>
#include <cstring>
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

// A row's group of 4 elements as loaded (load4's layout; elements past n zero), kept as 32-bit
// words: a 16-bit row two elements a register, half the registers of its widened values (ptxas
// gives a 16-bit value a register of its own, so a Vec<bf16, 4> kept as is saves nothing). A
// kernel that reads the row in two passes marks it `opaque` between them, so that the second pass
// widens it again (raw_at) instead of the compiler keeping the first pass's f32 values alive
// across the reduction.
template <class T>
struct Raw4 {
  uint32_t w[sizeof(T)];  // 4 sizeof(T) bytes
};

template <class T>
__device__ inline void load4_raw(const T* p, int64_t j, int64_t n, bool vec, Raw4<T>& out) {
  Vec<T, 4> v;
  if (vec) {
    v = *reinterpret_cast<const Vec<T, 4>*>(p + j);
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) v.v[q] = j + q < n ? p[j + q] : from_acc<T>(Acc<T>(0));
  }
  memcpy(out.w, &v, sizeof(v));
}

// A group of zeros.
template <class T>
__device__ inline void zero_raw(Raw4<T>& r) {
#pragma unroll
  for (int i = 0; i < int(sizeof(T)); ++i) r.w[i] = 0u;  // +0 in every floating type
}

// Element q of a held group, widened (to_acc).
template <class T>
__device__ inline Acc<T> raw_at(const Raw4<T>& r, int q) {
  T e;
  if constexpr (sizeof(T) == 2) {
    const uint16_t b = static_cast<uint16_t>(q % 2 != 0 ? r.w[q / 2] >> 16 : r.w[q / 2] & 0xffffu);
    memcpy(static_cast<void*>(&e), &b, sizeof(b));
  } else {
    memcpy(static_cast<void*>(&e), &r.w[q * int(sizeof(T)) / 4], sizeof(T));
  }
  return to_acc(e);
}

// Tells the compiler nothing about a held group's words past this point (an empty asm that
// "changes" each one), so values it made from them before are made again after, not kept in
// registers. No instruction; on the host and in emulation nothing at all.
// Only 16-bit rows: a 32-bit row's words are its widened values already (marking them cost the
// f32 LayerNorm backward 19 registers).
template <class T>
__device__ inline void opaque(Raw4<T>& r) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < int(sizeof(T)); ++i) asm volatile("" : "+r"(r.w[i]));
  }
#else
  (void)r;
#endif
}

// Element q of a held group normalised: xhat = (x - mu) rs.
template <class S, class T>
__device__ inline S xhat_at(const Raw4<T>& x, int q, S mu, S rs) {
  return (static_cast<S>(raw_at(x, q)) - mu) * rs;
}

// Element q's dxhat = dy * weight, rounded before use (the CPU stores it first; fused into the
// subtraction, a one-element row would get a nonzero dx), or dy without a weight.
template <class S, class T, class W>
__device__ inline S dxhat_at(const Raw4<T>& dy, int q, bool has_weight, W w) {
  const S g = static_cast<S>(raw_at(dy, q));
  return has_weight ? dmath::mul_rn(g, static_cast<S>(w)) : g;
}

// The input gradient of an element from its dxhat and xhat and its row's means (warp_row_dxhat).
template <class S>
__device__ inline S layer_norm_dx(S dxhat, S xhat, S rs, S mean_g, S mean_gx) {
  return rs * (dxhat - mean_g - xhat * mean_gx);
}

// The first half of a LayerNorm input gradient for a row the warp holds (load4's layout): loads
// the row's normalised input x and its gradient dy (rows of c, `vec`: 4-element vectors) into xr
// and gr as loaded (load4_raw) and returns the row means of dxhat (dxhat_at) and dxhat * xhat
// (xhat_at); padding counts as dy = 0. xr and gr come back `opaque`: the second pass
// makes dxhat and xhat again from them (the same expressions, the same bits) instead of the
// compiler holding 2 x 32 f32 values a lane across the reductions (the bf16 LayerNorm backward at
// C = 1024: 92 registers that way, 58 now). The input gradient is then
// rs (dxhat - mean_g - xhat mean_gx).
// `on_dy(k, gr[k])` runs on each group of dy as loaded, before any use (layer_norm_dropout's
// backward applies dropout's mask there; a no-op otherwise).
template <class T, class S, int G, class OnDy>
__device__ inline void warp_row_dxhat(const T* x, const T* dy, const T* weight, S mu, S rs,
                                      int64_t c, int lane, bool vec, Raw4<T> (&xr)[G],
                                      Raw4<T> (&gr)[G], S& mean_g, S& mean_gx, OnDy&& on_dy) {
  S sum_g = 0, sum_gx = 0;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t j0 = 4 * (lane + int64_t(kWarpSize) * k);
    Acc<T> wv[4] = {};
    zero_raw(xr[k]);
    zero_raw(gr[k]);
    if (j0 < c) {
      load4_raw(x, j0, c, vec, xr[k]);
      load4_raw(dy, j0, c, vec, gr[k]);
      if (weight) load4(weight, j0, c, vec, wv);
      on_dy(k, gr[k]);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const S d = dxhat_at<S>(gr[k], q, weight != nullptr, wv[q]);
      const S xh = xhat_at(xr[k], q, mu, rs);
      sum_g += d;
      sum_gx += d * xh;
    }
  }
  mean_g = warp_sum(sum_g) / static_cast<S>(c);
  mean_gx = warp_sum(sum_gx) / static_cast<S>(c);
#pragma unroll
  for (int k = 0; k < G; ++k) {
    opaque(xr[k]);
    opaque(gr[k]);
  }
}

}  // namespace engine::cuda
