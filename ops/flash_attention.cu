// CUDA kernels of the fused attention (flash_attention.h) on tensor cores through the WMMA API
// (engine/cuda/wmma.cuh: m16n16k16, 16-bit multiplicands, f32 accumulators), for bf16 / f16 and
// head widths D = 32, 64, 128. Blocks of 4 warps; a warp owns 16 rows of its block's 64; key and
// value tiles of 64 rows are staged in shared memory by the whole block (16-byte loads) and read
// by every warp. Elementwise work on a product (scale, bias, mask, softmax, dropout) goes through
// a per-warp tile in shared memory, whose (row, column) every lane knows: the kernels never
// assume a fragment layout.
//
//   forward      grid (Tq / 64, B H): each warp's 16 query rows against every key tile, online
//                softmax (running max and sum per row, the output rows rescaled in shared memory;
//                each lane 8 consecutive keys of a row, their keep bits from one Philox block:
//                attention's rule, ops/dropout.h, half the draws of a block per 4 keys),
//                O += P_d V on tensor cores; writes out, the rows' log-sum-exp and, with dropout,
//                the keep bits (a byte per 4 keys), which the backward reads instead of drawing.
//   backward_q   grid (Tq / 64, H, B), first: each warp's 16 queries: D_i = rowsum(dout_i *
//                out_i) (f32, written for the next two), then dQ += dS K. (A launch of its own
//                before 2026-12-06: 24 launches and ~0.6 ms of reads at BERT-Large s512.)
//   backward_kv  grid (Tk / 64, B H): each warp's 16 keys against every query tile: S^T and
//                dP_d^T made again, dV += P_d^T dO and dK += dS^T Q in registers (fragments).
//   backward_q_bias (where dbias is wanted, D <= 64, no relative positions, Tk <= 512, a device
//                that runs clusters: sm_90) replaces backward_q and backward_bias, first: the
//                bias kernel's grid in clusters of its Tk / 64 blocks (a cluster one (query
//                tile, head, group)); per batch entry S and dP_d made once for both dbias (as
//                below) and dQ's share of the block's key tile, dS K, which the cluster adds in
//                rank order through distributed shared memory (engine/cuda/cluster.cuh); D_i
//                made by every block, written by key tile 0's. 6 product-units where q and bias
//                made 10. (2026-12-06; the H200 has not run it.)
//   backward_bias (only for dbias) grid (Tk / 64, Tq / 64, H G): each warp's 16 queries against
//                the block's 64 keys, S and dP_d made again for every batch entry of its group in
//                order and dS summed in registers (each lane its own elements of the tile), the
//                sum written once. G groups of the batch only where the tiles alone are too few
//                blocks to fill the GPU (G = 1 at BERT-Large s512: 1024 blocks; 6 at BERT-Base
//                s128: 48 tiles); then each group's (H, Tq, Tk) f32 partial is written once and
//   bias_sum     adds them in group order. No atomics. (A partial read and written once per batch
//                entry, as before 2026-12-06, moved 8 bytes per element of the scores.)
// Shaw's relative positions (a table A of R <= 129 vectors; flash_attention.h): the forward and
// backward_q make q A^T (and backward_q dout A^T) for their warps' rows before the key tiles, A
// staged 64 rows at a time where a key tile goes, and keep the rows in shared memory; the forward
// keeps the probabilities' bucket sums W beside O (rescaled with it) and adds W A after the key
// tiles as 64 more keys; backward_q writes q A^T and dout A^T for the kv and bias kernels (which
// gather them), drel and W for the caller, and adds drel A to dQ after its key tiles.
// The same bits on every run. The probabilities are rounded to the 16-bit type before their
// products (as every flash kernel does), so results match the unfused path within that rounding.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/cuda/cluster.cuh"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/wmma.cuh"
#include "engine/error.h"
#include "ops/dropout.h"
#include "ops/flash_attention.h"

namespace engine::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTile = 64;  // rows of a block (its warps' 16 each), and of a staged key tile
constexpr int64_t kTargetBlocks = 2 * 132;  // backward_bias: about two blocks for each of an
                                            // H200's SMs (a constant: the same groups, the same
                                            // bits, on every device)
constexpr int kLdT = 16 + 4;                // floats: a per-warp 16 x 16 product tile
constexpr int kLdH = 16 + 8;                // 16-bit elements: a per-warp 16 x 16 operand tile

// A (B, H, T, D) operand's layout: element (b, h, t, d) at b sb + h sh + t st + d (the head
// width contiguous; flash_attention_layout_fits). The heads' split and merge are views: q, k and
// v straight from the projection's (B, T, 3, H, D) output, out written as (B, T, H, D).
struct Rows {
  int64_t sb, sh, st;
};

__device__ inline int64_t at(const Rows& l, int64_t b, int64_t h) { return b * l.sb + h * l.sh; }

template <class T>
struct Args {
  Rows lq, lk, lv, lo, ldo, ldq, ldk, ldv;  // q, k, v, out (o), dout, dq, dk, dv
  const T *q, *k, *v, *bias, *out, *dout;
  const float *bias32, *mask, *lse;  // bias32: an f32 bias (then bias is null)
  const uint8_t* bits;               // the forward's keep bits (backward, with dropout)
  T *o, *dq, *dk, *dv;
  float *lse_out, *rowdot;  // rowdot: flash_backward_q writes it, kv / bias read it
  uint8_t* bits_out;        // the keep bits (forward, with dropout)
  // Relative positions (rel_table null: none; R = nrel = 2 rel_clip + 1): the vectors A (R, D);
  // q A^T and dout A^T as (B H Tq, R) rows, which flash_backward_q writes for the kv and bias
  // kernels (null: that term absent); drel and W out (layouts ldrel, lw; null: not written).
  const T* rel_table;
  T *qa, *doa, *drel_out, *w_out;
  Rows ldrel, lw;
  int64_t rel_clip, nrel;
  bool rel_keys, rel_values;
  int64_t batch, heads, tq, tk, groups4;  // groups4: bytes of keep bits a row, ceil(Tk / 4)
  int64_t bias_sh, bias_si, bias_sj;
  float scale, keep_scale;
  uint32_t threshold;
  bool drop;
  PhiloxState state;
};

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T, class L>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, L>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ inline float warp_sum(float v) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Key j's relative bucket for query i: clamp(j - i, -rel_clip, rel_clip) + rel_clip.
template <class T>
__device__ inline int64_t rel_bucket(const Args<T>& a, int64_t i, int64_t j) {
  const int64_t d = j - i;
  return (d < -a.rel_clip ? -a.rel_clip : (d > a.rel_clip ? a.rel_clip : d)) + a.rel_clip;
}

// The bias term of element (h, i, j) inside the problem (0 without a bias or outside).
template <class T>
__device__ inline float bias_at(const Args<T>& a, int64_t h, int64_t i, int64_t j) {
  if (i >= a.tq || j >= a.tk) return 0.0f;
  if (a.bias) return to_acc(a.bias[h * a.bias_sh + i * a.bias_si + j * a.bias_sj]);
  if (a.bias32) return a.bias32[h * a.bias_sh + i * a.bias_si + j * a.bias_sj];
  return 0.0f;
}

// Element (bh, i, j)'s entry of a (B H Tq, R) relative table (q A^T or dout A^T, as
// flash_backward_q wrote it): the one of the key's bucket, 0 outside the problem or without one.
template <class T>
__device__ inline float rel_entry(const Args<T>& a, const T* table, int64_t bh, int64_t i,
                                  int64_t j) {
  if (table == nullptr || i >= a.tq || j >= a.tk) return 0.0f;
  return to_acc(table[(bh * a.tq + i) * a.nrel + rel_bucket(a, i, j)]);
}

// The logit of element (b, h, i, j) from its product s = q_i . k_j (with the relative key term,
// if any, added), with the bias term given (bias_at's): -inf outside the problem or for a masked
// key.
template <class T>
__device__ inline float logit_with(const Args<T>& a, int64_t b, int64_t i, int64_t j, float s,
                                   float bias) {
  if (i >= a.tq || j >= a.tk) return -INFINITY;
  if (a.mask && a.mask[b * a.tk + j] == 0.0f) return -INFINITY;
  float x = s * a.scale;
  if (a.bias || a.bias32) x += bias;
  return x;
}

template <class T>
__device__ inline float logit(const Args<T>& a, int64_t b, int64_t h, int64_t i, int64_t j,
                              float s) {
  return logit_with(a, b, i, j, s, bias_at(a, h, i, j));
}

// The dropout factor of element (bh, i, j) in the backward: from the forward's keep bits.
template <class T>
__device__ inline float keep_factor(const Args<T>& a, int64_t bh, int64_t i, int64_t j) {
  if (!a.drop) return 1.0f;
  const uint32_t byte = a.bits[(bh * a.tq + i) * a.groups4 + j / 4];
  return ((byte >> (j % 4)) & 1u) != 0 ? a.keep_scale : 0.0f;
}

// Max and sum over the 8 lanes of an octet (each octet its own row).
__device__ inline float octet_max(float v) {
  for (int o = 4; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
__device__ inline float octet_sum(float v) {
  for (int o = 4; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Rows [r0, r0 + n) of a (total, D) matrix whose rows are `lds` elements apart into a shared tile
// of `ld` elements a row, 16 bytes at a time, zeros past `total`; threads t, t + nt, ...
template <class T, int D, class P>
__device__ inline void stage_rows(P dst, int ld, const T* src, int64_t lds, int64_t r0,
                                  int64_t total, int n, int t, int nt) {
  constexpr int kVecs = D * sizeof(T) / 16;
  for (int e = t; e < n * kVecs; e += nt) {
    const int r = e / kVecs, c = e % kVecs;
    uint4 v = uint4{0u, 0u, 0u, 0u};
    if (r0 + r < total) v = reinterpret_cast<const uint4*>(src + (r0 + r) * lds)[c];
    dst[r * (ld * int(sizeof(T)) / 16) + c] = v;
  }
}

// Rows [r0, r0 + 64) of two (total, D) matrices (rows lds1 and lds2 elements apart) into the
// block's shared tiles at byte offsets o1 and o2 (every thread of the block takes part).
template <class T, int D, class B>
__device__ inline void stage_block_pair(B smem, size_t o1, const T* src1, int64_t lds1, size_t o2,
                                        const T* src2, int64_t lds2, int ld, int64_t r0,
                                        int64_t total) {
  stage_rows<T, D>(smem_region<uint4>(smem, o1), ld, src1, lds1, r0, total, kTile, threadIdx.x,
                   kThreads);
  stage_rows<T, D>(smem_region<uint4>(smem, o2), ld, src2, lds2, r0, total, kTile, threadIdx.x,
                   kThreads);
}

// Rows [r0, r0 + 16) of two (total, D) matrices into one warp's shared tiles at byte offsets o1
// and o2 (the warp's lanes take part).
template <class T, int D, class B>
__device__ inline void stage_warp_pair(B smem, size_t o1, const T* src1, int64_t lds1, size_t o2,
                                       const T* src2, int64_t lds2, int ld, int64_t r0,
                                       int64_t total, int lane) {
  stage_rows<T, D>(smem_region<uint4>(smem, o1), ld, src1, lds1, r0, total, 16, lane, kWarpSize);
  stage_rows<T, D>(smem_region<uint4>(smem, o2), ld, src2, lds2, r0, total, 16, lane, kWarpSize);
}

// A 16 x 16 float accumulator out through a per-warp tile: rows [r0, r0 + 16) x columns
// [c0, c0 + 16) of a (rows, D) 16-bit matrix whose rows are `lds` elements apart, rows past
// `rows` skipped.
template <class T, class P>
__device__ inline void store_tile(const FragC& f, P tile, T* dst, int64_t lds, int64_t r0,
                                  int64_t rows, int c0, int lane) {
  wmma::store_matrix_sync(raw_ptr(tile), f, kLdT, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 256; e += kWarpSize) {
    const int r = e / 16, c = e % 16;
    if (r0 + r < rows) dst[(r0 + r) * lds + c0 + c] = from_acc<T>(float(tile[r * kLdT + c]));
  }
  __syncwarp();
}

// s = a1 r1^T and t = a2 r2^T (16 x 16 each), r1 and r2 16 staged rows of `ld` elements read
// transposed, into the warp's float tiles.
template <class T, int ND, class P>
__device__ inline void products_t(const FragA<T> (&a1)[ND], const T* r1, const FragA<T> (&a2)[ND],
                                  const T* r2, int ld, P s_tile, P t_tile) {
  FragC s, t;
  wmma::fill_fragment(s, 0.0f);
  wmma::fill_fragment(t, 0.0f);
  for (int kk = 0; kk < ND; ++kk) {
    FragB<T, wmma::col_major> fb;
    wmma::load_matrix_sync(fb, r1 + kk * 16, ld);
    wmma::mma_sync(s, a1[kk], fb, s);
    wmma::load_matrix_sync(fb, r2 + kk * 16, ld);
    wmma::mma_sync(t, a2[kk], fb, t);
  }
  wmma::store_matrix_sync(raw_ptr(s_tile), s, kLdT, wmma::mem_row_major);
  wmma::store_matrix_sync(raw_ptr(t_tile), t, kLdT, wmma::mem_row_major);
  __syncwarp();
}

// s = a1 r^T (16 x 16), r 16 staged rows of `ld` elements read transposed, into a float tile of
// `ldt` floats a row. The same products, in the same order, as products_t's.
template <class T, int ND, class P>
__device__ inline void product_t(const FragA<T> (&a1)[ND], const T* r, int ld, P tile, int ldt) {
  FragC s;
  wmma::fill_fragment(s, 0.0f);
  for (int kk = 0; kk < ND; ++kk) {
    FragB<T, wmma::col_major> fb;
    wmma::load_matrix_sync(fb, r + kk * 16, ld);
    wmma::mma_sync(s, a1[kk], fb, s);
  }
  wmma::store_matrix_sync(tile, s, ldt, wmma::mem_row_major);
}

// O += P V for a warp's 16 rows: P (16 x 64, `ldp` a row) and V (64 x D, `ldv`) staged, O
// (16 x D, `ldo` floats a row) in shared memory.
template <class T, int ND, class PO, class PP, class PV>
__device__ inline void mix_rows(PO o, int ldo, PP p, int ldp, PV v, int ldv) {
  for (int nd = 0; nd < ND; ++nd) {
    FragC acc;
    wmma::load_matrix_sync(acc, o + nd * 16, ldo, wmma::mem_row_major);
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragA<T> fp;
      FragB<T, wmma::row_major> fv;
      wmma::load_matrix_sync(fp, p + kk * 16, ldp);
      wmma::load_matrix_sync(fv, v + kk * 16 * ldv + nd * 16, ldv);
      wmma::mma_sync(acc, fp, fv, acc);
    }
    wmma::store_matrix_sync(o + nd * 16, acc, ldo, wmma::mem_row_major);
  }
}

// acc += X R for a warp: X (16 x 16) staged in its 16-bit operand tile (kLdH a row), R 16 staged
// rows of `ld` elements (dQ += dS K_sub; dQ += drel A_sub).
template <class T, int ND, class PX, class PR>
__device__ inline void add_product(FragC (&acc)[ND], PX x, PR rows, int ld) {
  FragA<T> fx;
  wmma::load_matrix_sync(fx, x, kLdH);
  for (int nd = 0; nd < ND; ++nd) {
    FragB<T, wmma::row_major> fb;
    wmma::load_matrix_sync(fb, rows + nd * 16, ld);
    wmma::mma_sync(acc[nd], fx, fb, acc[nd]);
  }
}

// A warp's relative rows in shared memory (R entries a row, rounded up to 16 bytes): 16-bit rows
// (q A^T, dout A^T) and f32 rows (the forward's bucket sums W).
__host__ __device__ inline int rel_ldh(int64_t nrel) { return int((nrel + 7) / 8 * 8); }
__host__ __device__ inline int rel_ldf(int64_t nrel) { return int((nrel + 3) / 4 * 4); }

// The relative vectors [c0, c0 + 64) (rows past R zeros) into the block's tile at byte offset o
// (every thread of the block takes part).
template <class T, int D, class B>
__device__ inline void stage_rel(B smem, size_t o, const Args<T>& a, int64_t c0, int ld) {
  stage_rows<T, D>(smem_region<uint4>(smem, o), ld, a.rel_table, D, c0, a.nrel, kTile, threadIdx.x,
                   kThreads);
}

// body(r0) for each tile of the relative vectors [r0, r0 + 64), staged at byte offset o in the
// block's shared memory (every thread takes part; the body runs on the active warps).
template <class T, int D, class B, class F>
__device__ inline void over_rel_tiles(B smem, size_t o, const Args<T>& a, int ld, bool active,
                                      F&& body) {
  for (int64_t r0 = 0; r0 < a.nrel; r0 += kTile) {
    __syncthreads();
    stage_rel<T, D>(smem, o, a, r0, ld);
    __syncthreads();
    if (active) body(r0);
  }
}

// The forward's shared memory: K and V tiles, then per warp its S (f32), P_d (16-bit) and O (f32)
// tiles and either its staged Q rows (read once into fragments) or, with relative positions,
// in their place and past them, its rows of q A^T (16-bit) and of W (f32).
template <int D, class T>
__host__ __device__ inline size_t forward_warp_bytes(int64_t nrel) {
  const size_t q_rows = 16 * (D + 8) * sizeof(T),
               rel = nrel > 0 ? 16 * (rel_ldh(nrel) * sizeof(T) + rel_ldf(nrel) * 4) : 0;
  return 16 * (kTile + 4) * 4 + 16 * (kTile + 8) * sizeof(T) + 16 * (D + 4) * 4 +
         (q_rows > rel ? q_rows : rel);
}
template <int D, class T>
size_t forward_smem(int64_t nrel) {
  return 2 * kTile * (D + 8) * sizeof(T) + kWarps * forward_warp_bytes<D, T>(nrel);
}

template <class T, int ND>
__global__ void __launch_bounds__(kThreads) flash_forward(Args<T> a) {
  constexpr int D = ND * 16, LDK = D + 8, LDS = kTile + 4, LDP = kTile + 8, LDO = D + 4;
  ENGINE_DYNAMIC_SHARED(unsigned char, smem);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads;
  const int64_t i0 = int64_t(blockIdx.x) * kTile + warp * 16;
  const bool active = i0 < a.tq;  // warp-uniform
  const bool rel = a.rel_table != nullptr;
  const int ldh = rel_ldh(a.nrel), ldf = rel_ldf(a.nrel);
  const size_t o_k = 0, o_v = o_k + kTile * LDK * sizeof(T);
  const size_t o_s =
      o_v + kTile * LDK * sizeof(T) + warp * forward_warp_bytes<D, T>(rel ? a.nrel : 0);
  const size_t o_p = o_s + 16 * LDS * 4, o_o = o_p + 16 * LDP * sizeof(T), o_q = o_o + 16 * LDO * 4,
               o_w = o_q + 16 * ldh * sizeof(T);
  const auto sK = smem_region<T>(smem, o_k), sV = smem_region<T>(smem, o_v),
             sQ = smem_region<T>(smem, o_q), sP = smem_region<T>(smem, o_p);
  const auto sS = smem_region<float>(smem, o_s), sO = smem_region<float>(smem, o_o);
  // Relative positions: the rows of q A^T (over sQ, once its rows are in fragments) and of W
  // (rescaled with O's).
  const auto sQA = smem_region<T>(smem, o_q);
  const auto sW = smem_region<float>(smem, o_w);
  const T* q = a.q + at(a.lq, b, h);
  const T* k = a.k + at(a.lk, b, h);
  const T* v = a.v + at(a.lv, b, h);

  // The online softmax takes four rows at a time: lanes 8 g .. 8 g + 7 row 4 k + g, each lane 8
  // consecutive keys (one Philox block: attention's rule, ops/dropout.h); m[k], l[k]: the running
  // max and sum of this lane's row of quad k.
  const int quad = lane / 8, ql = lane % 8, c0 = 8 * ql;
  FragA<T> fq[ND];
  float m[4], l[4];
  if (active) {
    stage_rows<T, D>(smem_region<uint4>(smem, o_q), LDK, q, a.lq.st, i0, a.tq, 16, lane, kWarpSize);
    __syncwarp();
    for (int kk = 0; kk < ND; ++kk) wmma::load_matrix_sync(fq[kk], raw_ptr(sQ) + kk * 16, LDK);
    __syncwarp();  // sQ is read: its space is q A^T's
    for (int e = lane; e < 16 * LDO; e += kWarpSize) sO[e] = 0.0f;
    if (a.rel_values)
      for (int e = lane; e < 16 * ldf; e += kWarpSize) sW[e] = 0.0f;
    for (int k = 0; k < 4; ++k) {
      m[k] = -INFINITY;
      l[k] = 0.0f;
    }
  }
  if (a.rel_keys) {
    // q A^T for the warp's 16 rows, rounded to 16 bits (as flash_backward_q makes it): the
    // vectors 64 at a time in the key tile's place, products as S's.
    over_rel_tiles<T, D>(smem, o_k, a, LDK, active, [&](int64_t r0) {
      for (int n = 0; n < kTile / 16 && r0 + n * 16 < a.nrel; ++n)
        product_t<T, ND>(fq, raw_ptr(sK) + n * 16 * LDK, LDK, raw_ptr(sS) + n * 16, LDS);
      __syncwarp();
      for (int e = lane; e < 16 * kTile; e += kWarpSize) {
        const int r = e / kTile, c = e % kTile;
        if (r0 + c < a.nrel) sQA[r * ldh + r0 + c] = from_acc<T>(float(sS[r * LDS + c]));
      }
      __syncwarp();
    });
  }
  for (int64_t j0 = 0; j0 < a.tk; j0 += kTile) {
    __syncthreads();  // every warp is done with the previous tile
    stage_block_pair<T, D>(smem, o_k, k, a.lk.st, o_v, v, a.lv.st, LDK, j0, a.tk);
    __syncthreads();
    if (!active) continue;
    // S = Q K^T (16 x 64): K^T is the staged K read column-major.
    for (int n = 0; n < kTile / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < ND; ++kk) {
        FragB<T, wmma::col_major> fk;
        wmma::load_matrix_sync(fk, raw_ptr(sK) + n * 16 * LDK + kk * 16, LDK);
        wmma::mma_sync(acc, fq[kk], fk, acc);
      }
      wmma::store_matrix_sync(raw_ptr(sS) + n * 16, acc, LDS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax; P_d into sP, the keep bits out (two bytes of 4 keys), O's rows rescaled.
    // Unrolled, so that m, l, x, pr and keep stay in registers (a runtime index puts an array in
    // local memory: ptxas gave this kernel an 80-byte stack frame).
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int r = 4 * k + quad;
      const int64_t i = i0 + r, j = j0 + c0;
      float x[8], pr[8];
      float xm = -INFINITY;
      for (int t = 0; t < 8; ++t) {
        float s = float(sS[r * LDS + c0 + t]);
        if (a.rel_keys) s += to_acc(static_cast<T>(sQA[r * ldh + rel_bucket(a, i, j + t)]));
        x[t] = logit(a, b, h, i, j + t, s);
        xm = fmaxf(xm, x[t]);
      }
      const float m_new = fmaxf(m[k], octet_max(xm));
      const float ref = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = expf(m[k] - ref);
      float ps = 0.0f;
      for (int t = 0; t < 8; ++t) {
        pr[t] = expf(x[t] - ref);
        ps += pr[t];
      }
      l[k] = l[k] * corr + octet_sum(ps);
      m[k] = m_new;
      bool keep[8] = {true, true, true, true, true, true, true, true};
      if (a.drop && i < a.tq && j < a.tk) {
        attention_keep_run<8>(a.state, static_cast<uint64_t>((bh * a.tq + i) * a.tk + j),
                              a.threshold, keep);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          if (j + 4 * g >= a.tk) continue;
          uint32_t byte = 0;
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            keep[4 * g + t] = keep[4 * g + t] && j + 4 * g + t < a.tk;
            byte |= uint32_t(keep[4 * g + t]) << t;
          }
          a.bits_out[(bh * a.tq + i) * a.groups4 + j / 4 + g] = static_cast<uint8_t>(byte);
        }
      }
      for (int t = 0; t < 8; ++t)
        sP[r * LDP + c0 + t] = from_acc<T>(keep[t] ? pr[t] * a.keep_scale : 0.0f);
      for (int d = ql; d < D; d += 8) sO[r * LDO + d] *= corr;
      if (a.rel_values) {
        // W's row rescaled like O's, then this tile's P_d added per bucket: an interior bucket
        // holds one key of the row (this lane's alone), the end buckets the tails (the octet's
        // partial sums added in a fixed order by its first lane).
        for (int e = ql; e < a.nrel; e += 8) sW[r * ldf + e] *= corr;
        __syncwarp();
        float tail_lo = 0.0f, tail_hi = 0.0f;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          if (i >= a.tq || j + t >= a.tk) continue;
          const float u = keep[t] ? pr[t] * a.keep_scale : 0.0f;
          const int64_t c = rel_bucket(a, i, j + t);
          if (c == 0)
            tail_lo += u;
          else if (c == a.nrel - 1)
            tail_hi += u;
          else
            sW[r * ldf + c] += u;
        }
        tail_lo = octet_sum(tail_lo);
        tail_hi = octet_sum(tail_hi);
        if (ql == 0) {
          sW[r * ldf] += tail_lo;
          sW[r * ldf + a.nrel - 1] += tail_hi;
        }
        __syncwarp();
      }
    }
    __syncwarp();
    mix_rows<T, ND>(raw_ptr(sO), LDO, raw_ptr(sP), LDP, raw_ptr(sV), LDK);  // O += P_d V
    __syncwarp();
  }
  if (a.rel_values) {
    // The value term: O += W A, the vectors 64 at a time in the value tile's place and W's
    // columns (rounded to 16 bits, as P_d is) in P_d's.
    over_rel_tiles<T, D>(smem, o_v, a, LDK, active, [&](int64_t r0) {
      for (int e = lane; e < 16 * kTile; e += kWarpSize) {
        const int r = e / kTile, c = e % kTile;
        sP[r * LDP + c] = from_acc<T>(r0 + c < a.nrel ? float(sW[r * ldf + r0 + c]) : 0.0f);
      }
      __syncwarp();
      mix_rows<T, ND>(raw_ptr(sO), LDO, raw_ptr(sP), LDP, raw_ptr(sV), LDK);
      __syncwarp();
    });
  }
  if (!active) return;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = 4 * k + quad;
    const int64_t i = i0 + r;
    if (i >= a.tq) continue;
    const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
    for (int d = ql; d < D; d += 8)
      a.o[at(a.lo, b, h) + i * a.lo.st + d] = from_acc<T>(float(sO[r * LDO + d]) * inv);
    if (ql == 0) a.lse_out[bh * a.tq + i] = l[k] > 0.0f ? m[k] + logf(l[k]) : INFINITY;
  }
}

// dS of the element at (i, j) of a recomputed tile: P (dP_d kf - D_i), with P_d = P kf.
struct Grad {
  float pd, ds;
};
template <class T>
__device__ inline Grad element_grad_with(const Args<T>& a, int64_t b, int64_t bh, int64_t i,
                                         int64_t j, float s, float dpd, float lse_i, float rowdot_i,
                                         float bias) {
  const float x = logit_with(a, b, i, j, s, bias);
  const float p = (x == -INFINITY || lse_i == INFINITY) ? 0.0f : expf(x - lse_i);
  const float kf = p != 0.0f ? keep_factor(a, bh, i, j) : 0.0f;
  return {p * kf, p * (dpd * kf - rowdot_i)};
}

template <class T>
__device__ inline Grad element_grad(const Args<T>& a, int64_t b, int64_t h, int64_t bh, int64_t i,
                                    int64_t j, float s, float dpd, float lse_i, float rowdot_i) {
  return element_grad_with(a, b, bh, i, j, s, dpd, lse_i, rowdot_i, bias_at(a, h, i, j));
}

// D_i = rowsum(dout * out) of a warp's 16 rows from i0 into sD (lane c adds columns c, c + 32,
// ..., then warp_sum; dout from the warp's staged tile), and into a.rowdot where `write`.
template <class T, int D, class PO, class PD>
__device__ inline void warp_rowdots(const Args<T>& a, int64_t b, int64_t h, int64_t i0, PO sdO,
                                    PD sD, int lane, bool write) {
  const int64_t bh = b * a.heads + h;
  for (int r = 0; r < 16; ++r) {
    const int64_t i = i0 + r;
    float s = 0.0f;
    if (i < a.tq) {
      const T* o = a.out + at(a.lo, b, h) + i * a.lo.st;
      for (int c = lane; c < D; c += kWarpSize)
        s += to_acc(o[c]) * to_acc(static_cast<T>(sdO[r * (D + 8) + c]));
    }
    s = warp_sum(s);
    if (lane == 0) {
      sD[r] = i < a.tq ? s : 0.0f;
      if (i < a.tq && write) a.rowdot[bh * a.tq + i] = s;
    }
  }
}

// A warp's share of a dbias tile (H, Tq, Tk): its 16 queries from i0 against the block's keys from
// j0, the lane's elements e = lane + 32 t of 16-key sub-tile n (query e / 16, key e % 16). Its
// sums start at 0 and its bias terms are read once (the same for every batch entry; 0 for an
// inactive warp); written (or added to what dbias holds) once at the end.
template <int kSubs, int kPer>
struct DbiasTile {
  float acc[kSubs][kPer], bias[kSubs][kPer];

  template <class T>
  __device__ void start(const Args<T>& a, int64_t h, int64_t i0, int64_t j0, int lane,
                        bool active) {
#pragma unroll
    for (int n = 0; n < kSubs; ++n)
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const int e = lane + kWarpSize * t;
        acc[n][t] = 0.0f;
        bias[n][t] = active ? bias_at(a, h, i0 + e / 16, j0 + n * 16 + e % 16) : 0.0f;
      }
  }
  // One batch entry b, for an active warp: for each 16-key sub-tile n of the block's staged keys
  // (`ld` elements a row), S = Q_w K_n^T and dP_d = dO_w V_n^T made again (16 queries x 16 keys,
  // into the warp's f32 tiles sS and sT), each of the lane's elements' dS added into its sum and
  // handed to each(r, c, ds) (query r, key c of the sub-tile), then after(n) once the warp is
  // done with the tiles (before the next products overwrite them).
  template <class T, int ND, class PK, class PF, class Each, class After>
  __device__ void entry(const Args<T>& a, const FragA<T> (&fq)[ND], const FragA<T> (&fdo)[ND],
                        PK sK, PK sV, int ld, PF sS, PF sT, PF sL, PF sD, int64_t b, int64_t h,
                        int64_t i0, int64_t j0, int lane, Each&& each, After&& after) {
    const int64_t bh = b * a.heads + h;
#pragma unroll
    for (int n = 0; n < kSubs; ++n) {
      if (j0 + n * 16 >= a.tk) break;
      products_t<T, ND>(fq, raw_ptr(sK) + n * 16 * ld, fdo, raw_ptr(sV) + n * 16 * ld, ld, sS, sT);
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const int e = lane + kWarpSize * t, r = e / 16, c = e % 16;
        const int64_t i = i0 + r, j = j0 + n * 16 + c;
        const float ds = element_grad_with(a, b, bh, i, j,
                                           float(sS[r * kLdT + c]) + rel_entry(a, a.qa, bh, i, j),
                                           float(sT[r * kLdT + c]) + rel_entry(a, a.doa, bh, i, j),
                                           float(sL[r]), float(sD[r]), bias[n][t])
                             .ds;
        acc[n][t] += ds;
        each(r, c, ds);
      }
      __syncwarp();
      after(n);
    }
  }
  template <class T>
  __device__ void write(const Args<T>& a, float* dbias, int64_t h, int64_t i0, int64_t j0, int lane,
                        bool accumulate) const {
#pragma unroll
    for (int n = 0; n < kSubs; ++n)
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const int e = lane + kWarpSize * t, r = e / 16, c = e % 16;
        const int64_t i = i0 + r, j = j0 + n * 16 + c;
        if (i >= a.tq || j >= a.tk) continue;
        float* dst = dbias + (h * a.tq + i) * a.tk + j;
        *dst = accumulate ? *dst + acc[n][t] : acc[n][t];
      }
  }
};

template <int D, class T>
constexpr size_t kv_smem() {
  constexpr size_t ldk = D + 8;
  return 2 * kTile * ldk * sizeof(T) + 2 * kTile * 4 +
         kWarps * (2 * 16 * ldk * sizeof(T) + 2 * 16 * kLdT * 4 + 2 * 16 * kLdH * sizeof(T));
}

template <class T, int ND>
__global__ void __launch_bounds__(kThreads) flash_backward_kv(Args<T> a) {
  constexpr int D = ND * 16, LDK = D + 8;
  ENGINE_DYNAMIC_SHARED(unsigned char, smem);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads;
  const int64_t j0 = int64_t(blockIdx.x) * kTile + warp * 16;
  const bool active = j0 < a.tk;
  const size_t o_q = 0, o_do = o_q + kTile * LDK * sizeof(T), o_l = o_do + kTile * LDK * sizeof(T),
               o_d = o_l + kTile * 4;
  const size_t o_k =
      o_d + kTile * 4 +
      warp * (2 * 16 * LDK * sizeof(T) + 2 * 16 * kLdT * 4 + 2 * 16 * kLdH * sizeof(T));
  const size_t o_v = o_k + 16 * LDK * sizeof(T), o_s = o_v + 16 * LDK * sizeof(T),
               o_t = o_s + 16 * kLdT * 4, o_p = o_t + 16 * kLdT * 4,
               o_ds = o_p + 16 * kLdH * sizeof(T);
  const auto sQ = smem_region<T>(smem, o_q), sdO = smem_region<T>(smem, o_do),
             sK = smem_region<T>(smem, o_k), sV = smem_region<T>(smem, o_v),
             sP = smem_region<T>(smem, o_p), sdS = smem_region<T>(smem, o_ds);
  const auto sL = smem_region<float>(smem, o_l), sD = smem_region<float>(smem, o_d),
             sS = smem_region<float>(smem, o_s), sT = smem_region<float>(smem, o_t);

  FragA<T> fk[ND], fv[ND];
  FragC dk[ND], dv[ND];
  if (active) {
    stage_warp_pair<T, D>(smem, o_k, a.k + at(a.lk, b, h), a.lk.st, o_v, a.v + at(a.lv, b, h),
                          a.lv.st, LDK, j0, a.tk, lane);
    __syncwarp();
    for (int kk = 0; kk < ND; ++kk) {
      wmma::load_matrix_sync(fk[kk], raw_ptr(sK) + kk * 16, LDK);
      wmma::load_matrix_sync(fv[kk], raw_ptr(sV) + kk * 16, LDK);
      wmma::fill_fragment(dk[kk], 0.0f);
      wmma::fill_fragment(dv[kk], 0.0f);
    }
  }
  for (int64_t i0 = 0; i0 < a.tq; i0 += kTile) {
    __syncthreads();
    stage_block_pair<T, D>(smem, o_q, a.q + at(a.lq, b, h), a.lq.st, o_do, a.dout + at(a.ldo, b, h),
                           a.ldo.st, LDK, i0, a.tq);
    for (int e = threadIdx.x; e < kTile; e += kThreads) {
      const bool in = i0 + e < a.tq;
      sL[e] = in ? a.lse[bh * a.tq + i0 + e] : INFINITY;
      sD[e] = in ? a.rowdot[bh * a.tq + i0 + e] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    for (int sub = 0; sub < kTile / 16 && i0 + sub * 16 < a.tq; ++sub) {
      // S^T = K_w Q_sub^T and dP_d^T = V_w dO_sub^T (16 keys x 16 queries).
      products_t<T, ND>(fk, raw_ptr(sQ) + sub * 16 * LDK, fv, raw_ptr(sdO) + sub * 16 * LDK, LDK,
                        sS, sT);
      for (int e = lane; e < 256; e += kWarpSize) {
        // key r, query c: a half-warp's lanes take 16 consecutive keys of one query, so the
        // bias, mask and keep-bit loads of a row are contiguous (lanes along the queries read 16
        // rows Tk apart); the shared tiles' strided reads cost a few bank conflicts instead
        const int r = e % 16, c = e / 16;
        const int qi = sub * 16 + c;
        const int64_t i = i0 + qi, j = j0 + r;
        const Grad g = element_grad(
            a, b, h, bh, i, j, float(sS[r * kLdT + c]) + rel_entry(a, a.qa, bh, i, j),
            float(sT[r * kLdT + c]) + rel_entry(a, a.doa, bh, i, j), float(sL[qi]), float(sD[qi]));
        sP[r * kLdH + c] = from_acc<T>(g.pd);
        sdS[r * kLdH + c] = from_acc<T>(g.ds);
      }
      __syncwarp();
      // dV += P_d^T dO_sub, dK += dS^T Q_sub.
      FragA<T> fp, fds;
      wmma::load_matrix_sync(fp, raw_ptr(sP), kLdH);
      wmma::load_matrix_sync(fds, raw_ptr(sdS), kLdH);
      for (int nd = 0; nd < ND; ++nd) {
        FragB<T, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, raw_ptr(sdO) + sub * 16 * LDK + nd * 16, LDK);
        wmma::mma_sync(dv[nd], fp, fb, dv[nd]);
        wmma::load_matrix_sync(fb, raw_ptr(sQ) + sub * 16 * LDK + nd * 16, LDK);
        wmma::mma_sync(dk[nd], fds, fb, dk[nd]);
      }
      __syncwarp();
    }
  }
  if (!active) return;
  for (int nd = 0; nd < ND; ++nd) {
    for (int e = 0; e < dk[nd].num_elements; ++e) dk[nd].x[e] *= a.scale;
    store_tile<T>(dk[nd], sS, a.dk + at(a.ldk, b, h), a.ldk.st, j0, a.tk, nd * 16, lane);
    store_tile<T>(dv[nd], sS, a.dv + at(a.ldv, b, h), a.ldv.st, j0, a.tk, nd * 16, lane);
  }
}

template <int D, class T>
constexpr size_t q_smem() {
  constexpr size_t ldk = D + 8;
  return 2 * kTile * ldk * sizeof(T) +
         kWarps * (2 * 16 * ldk * sizeof(T) + 2 * 16 * kLdT * 4 + 16 * kLdH * sizeof(T) + 2 * 64);
}
// ... with relative positions: per warp its rows of q A^T and dout A^T (16-bit) past the rest.
template <int D, class T>
size_t q_smem(int64_t nrel) {
  return q_smem<D, T>() + (nrel > 0 ? kWarps * 2 * 16 * rel_ldh(nrel) * sizeof(T) : 0);
}

// The relative tables' row of element (b, h, i) in a Rows layout (the last dim contiguous).
__device__ inline int64_t rel_row(const Rows& l, int64_t b, int64_t h, int64_t i) {
  return at(l, b, h) + i * l.st;
}

template <class T, int ND>
__global__ void __launch_bounds__(kThreads) flash_backward_q(Args<T> a) {
  constexpr int D = ND * 16, LDK = D + 8;
  ENGINE_DYNAMIC_SHARED(unsigned char, smem);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t h = blockIdx.y, b = blockIdx.z, bh = b * a.heads + h;
  const int64_t i0 = int64_t(blockIdx.x) * kTile + warp * 16;
  const bool active = i0 < a.tq;
  const size_t o_k = 0, o_v = o_k + kTile * LDK * sizeof(T);
  const size_t o_q =
      o_v + kTile * LDK * sizeof(T) +
      warp * (2 * 16 * LDK * sizeof(T) + 2 * 16 * kLdT * 4 + 16 * kLdH * sizeof(T) + 2 * 64);
  const size_t o_do = o_q + 16 * LDK * sizeof(T), o_s = o_do + 16 * LDK * sizeof(T),
               o_t = o_s + 16 * kLdT * 4, o_ds = o_t + 16 * kLdT * 4,
               o_l = o_ds + 16 * kLdH * sizeof(T), o_d = o_l + 64;
  const auto sK = smem_region<T>(smem, o_k), sV = smem_region<T>(smem, o_v),
             sQ = smem_region<T>(smem, o_q), sdO = smem_region<T>(smem, o_do),
             sdS = smem_region<T>(smem, o_ds);
  const auto sS = smem_region<float>(smem, o_s), sT = smem_region<float>(smem, o_t),
             sL = smem_region<float>(smem, o_l), sD = smem_region<float>(smem, o_d);
  // Relative positions: the warp's rows of q A^T and dout A^T past the fixed regions; the end
  // buckets' sums of dS and P_d kept per lane (its 8 rows) until the end.
  const bool rel = a.rel_table != nullptr;
  const int ldh = rel_ldh(a.nrel);
  const size_t o_qa = q_smem<D, T>() + warp * 2 * 16 * ldh * sizeof(T);
  const auto sQA = smem_region<T>(smem, o_qa),
             sdOA = smem_region<T>(smem, o_qa + 16 * ldh * sizeof(T));
  float ds_lo[8], ds_hi[8], w_lo[8], w_hi[8];
#pragma unroll
  for (int t = 0; t < 8; ++t) ds_lo[t] = ds_hi[t] = w_lo[t] = w_hi[t] = 0.0f;
  FragA<T> fq[ND], fdo[ND];
  FragC dq[ND];
  if (active) {
    stage_warp_pair<T, D>(smem, o_q, a.q + at(a.lq, b, h), a.lq.st, o_do, a.dout + at(a.ldo, b, h),
                          a.ldo.st, LDK, i0, a.tq, lane);
    if (lane < 16) sL[lane] = i0 + lane < a.tq ? a.lse[bh * a.tq + i0 + lane] : INFINITY;
    // D_i: kept for this warp's dS and written for flash_backward_kv and _bias, launched after
    // this kernel (each (b, h, i) belongs to one warp of the grid). With the relative value
    // term, out holds it: the same sums.
    __syncwarp();
    warp_rowdots<T, D>(a, b, h, i0, sdO, sD, lane, true);
    __syncwarp();
    for (int kk = 0; kk < ND; ++kk) {
      wmma::load_matrix_sync(fq[kk], raw_ptr(sQ) + kk * 16, LDK);
      wmma::load_matrix_sync(fdo[kk], raw_ptr(sdO) + kk * 16, LDK);
      wmma::fill_fragment(dq[kk], 0.0f);
    }
  }
  if (rel) {
    // q A^T and dout A^T for the warp's 16 rows, 16-bit (the forward's q A^T, the same products
    // in the same order), the vectors 64 at a time in the key tile's place; kept here and
    // written for flash_backward_kv and _bias.
    over_rel_tiles<T, D>(smem, o_k, a, LDK, active, [&](int64_t r0) {
      for (int n = 0; n < kTile / 16 && r0 + n * 16 < a.nrel; ++n) {
        products_t<T, ND>(fq, raw_ptr(sK) + n * 16 * LDK, fdo, raw_ptr(sK) + n * 16 * LDK, LDK, sS,
                          sT);
        for (int e = lane; e < 256; e += kWarpSize) {
          const int r = e / 16, c = int(r0) + n * 16 + e % 16;
          const int64_t i = i0 + r;
          if (c >= a.nrel) continue;
          const T qa = from_acc<T>(float(sS[r * kLdT + e % 16])),
                  doa = from_acc<T>(float(sT[r * kLdT + e % 16]));
          sQA[r * ldh + c] = qa;
          sdOA[r * ldh + c] = doa;
          if (i < a.tq) {
            if (a.qa) a.qa[(bh * a.tq + i) * a.nrel + c] = qa;
            if (a.doa) a.doa[(bh * a.tq + i) * a.nrel + c] = doa;
          }
        }
        __syncwarp();
      }
    });
  }
  for (int64_t j0 = 0; j0 < a.tk; j0 += kTile) {
    __syncthreads();
    stage_block_pair<T, D>(smem, o_k, a.k + at(a.lk, b, h), a.lk.st, o_v, a.v + at(a.lv, b, h),
                           a.lv.st, LDK, j0, a.tk);
    __syncthreads();
    if (!active) continue;
    for (int sub = 0; sub < kTile / 16 && j0 + sub * 16 < a.tk; ++sub) {
      // S = Q_w K_sub^T and dP_d = dO_w V_sub^T (16 queries x 16 keys).
      products_t<T, ND>(fq, raw_ptr(sK) + sub * 16 * LDK, fdo, raw_ptr(sV) + sub * 16 * LDK, LDK,
                        sS, sT);
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const int e = lane + kWarpSize * t, r = e / 16, c = e % 16;  // query r, key c
        const int64_t i = i0 + r, j = j0 + sub * 16 + c;
        float s = float(sS[r * kLdT + c]), dpd = float(sT[r * kLdT + c]);
        const int64_t bk = rel ? rel_bucket(a, i, j) : 0;
        if (a.rel_keys) s += to_acc(static_cast<T>(sQA[r * ldh + bk]));
        if (a.rel_values) dpd += to_acc(static_cast<T>(sdOA[r * ldh + bk]));
        const Grad gr = element_grad(a, b, h, bh, i, j, s, dpd, float(sL[r]), float(sD[r]));
        sdS[r * kLdH + c] = from_acc<T>(gr.ds);
        if (rel && i < a.tq && j < a.tk) {
          // An interior bucket holds one key of the row: its dS and P_d stored; the tails summed.
          if (bk == 0) {
            ds_lo[t] += gr.ds;
            w_lo[t] += gr.pd;
          } else if (bk == a.nrel - 1) {
            ds_hi[t] += gr.ds;
            w_hi[t] += gr.pd;
          } else {
            if (a.drel_out)
              a.drel_out[rel_row(a.ldrel, b, h, i) + bk] = from_acc<T>(gr.ds * a.scale);
            if (a.w_out) a.w_out[rel_row(a.lw, b, h, i) + bk] = from_acc<T>(gr.pd);
          }
        }
      }
      __syncwarp();
      add_product<T, ND>(dq, raw_ptr(sdS), raw_ptr(sK) + sub * 16 * LDK, LDK);  // dQ += dS K_sub
      __syncwarp();
    }
  }
  if (active)
    for (int nd = 0; nd < ND; ++nd)
      for (int e = 0; e < dq[nd].num_elements; ++e) dq[nd].x[e] *= a.scale;
  if (rel && active) {
    // The tails: each row's 16 lanes' sums added in a fixed tree (xor within the half-warp) and
    // written by its first lane; an interior bucket no key of the row falls in (j outside
    // [0, Tk)) written as 0.
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      float dlo = ds_lo[t], dhi = ds_hi[t], wlo = w_lo[t], whi = w_hi[t];
      for (int o = 8; o > 0; o /= 2) {
        dlo += __shfl_xor_sync(kFullMask, dlo, o);
        dhi += __shfl_xor_sync(kFullMask, dhi, o);
        wlo += __shfl_xor_sync(kFullMask, wlo, o);
        whi += __shfl_xor_sync(kFullMask, whi, o);
      }
      const int64_t i = i0 + (lane + kWarpSize * t) / 16;
      if (lane % 16 == 0 && i < a.tq) {
        if (a.drel_out) {
          a.drel_out[rel_row(a.ldrel, b, h, i)] = from_acc<T>(dlo * a.scale);
          a.drel_out[rel_row(a.ldrel, b, h, i) + a.nrel - 1] = from_acc<T>(dhi * a.scale);
        }
        if (a.w_out) {
          a.w_out[rel_row(a.lw, b, h, i)] = from_acc<T>(wlo);
          a.w_out[rel_row(a.lw, b, h, i) + a.nrel - 1] = from_acc<T>(whi);
        }
      }
    }
    for (int64_t e = lane; e < 16 * (a.nrel - 2); e += kWarpSize) {
      const int64_t i = i0 + e / (a.nrel - 2), bk = 1 + e % (a.nrel - 2), j = i + bk - a.rel_clip;
      if (i >= a.tq || (j >= 0 && j < a.tk)) continue;
      if (a.drel_out) a.drel_out[rel_row(a.ldrel, b, h, i) + bk] = from_acc<T>(0.0f);
      if (a.w_out) a.w_out[rel_row(a.lw, b, h, i) + bk] = from_acc<T>(0.0f);
    }
    __syncwarp();  // the warp's drel rows written before they are read back
  }
  if (a.rel_keys) {
    // The key term's share of dq: drel A (drel already scaled, as 16-bit values), the vectors 64
    // at a time in the key tile's place, drel's columns 16 at a time in dS's.
    over_rel_tiles<T, D>(smem, o_k, a, LDK, active, [&](int64_t r0) {
      for (int n = 0; n < kTile / 16 && r0 + n * 16 < a.nrel; ++n) {
        for (int e = lane; e < 256; e += kWarpSize) {
          const int r = e / 16, c = int(r0) + n * 16 + e % 16;
          const int64_t i = i0 + r;
          sdS[r * kLdH + e % 16] = i < a.tq && c < a.nrel
                                       ? static_cast<T>(a.drel_out[rel_row(a.ldrel, b, h, i) + c])
                                       : from_acc<T>(0.0f);
        }
        __syncwarp();
        add_product<T, ND>(dq, raw_ptr(sdS), raw_ptr(sK) + n * 16 * LDK, LDK);
        __syncwarp();
      }
    });
  }
  if (!active) return;
  for (int nd = 0; nd < ND; ++nd)
    store_tile<T>(dq[nd], sS, a.dq + at(a.ldq, b, h), a.ldq.st, i0, a.tq, nd * 16, lane);
}

template <int D, class T>
constexpr size_t bias_smem() {
  constexpr size_t ldk = D + 8;
  return 2 * kTile * ldk * sizeof(T) +
         kWarps * (2 * 16 * ldk * sizeof(T) + 2 * 16 * kLdT * 4 + 2 * 64);
}

// What flash_backward_bias and flash_backward_q_bias share: the block's tile (key tile
// blockIdx.x, query tile blockIdx.y, head and batch group blockIdx.z), a warp's 16 queries, the
// group's entries, and bias_smem's layout: the block's K and V tiles, then per warp its Q and dO
// rows (16-bit), its S and dP_d tiles (f32), and its rows' log-sum-exps and D_i.
template <int D, class T>
struct BiasBlock {
  static constexpr int LDK = D + 8;
  int warp, lane;
  int64_t j0, h, g, b_first, b_end, q0, i0;
  bool active;
  size_t o_k, o_v, o_q, o_do, o_s, o_t, o_l, o_d;

  __device__ BiasBlock(const Args<T>& a, int64_t per_group)
      : warp(threadIdx.x / kWarpSize), lane(threadIdx.x % kWarpSize) {
    j0 = int64_t(blockIdx.x) * kTile;
    h = blockIdx.z % a.heads;
    g = blockIdx.z / a.heads;
    b_first = g * per_group;
    b_end = b_first + per_group < a.batch ? b_first + per_group : a.batch;
    q0 = int64_t(blockIdx.y) * kTile;
    i0 = q0 + warp * 16;
    active = i0 < a.tq;
    o_k = 0;
    o_v = o_k + kTile * LDK * sizeof(T);
    o_q = o_v + kTile * LDK * sizeof(T) +
          warp * (2 * 16 * LDK * sizeof(T) + 2 * 16 * kLdT * 4 + 2 * 64);
    o_do = o_q + 16 * LDK * sizeof(T);
    o_s = o_do + 16 * LDK * sizeof(T);
    o_t = o_s + 16 * kLdT * 4;
    o_l = o_t + 16 * kLdT * 4;
    o_d = o_l + 64;
  }
  // Batch entry b's K and V tiles (the whole block) and the warp's Q and dO rows and their
  // log-sum-exps (active warps), after a barrier (every warp done with the previous entry's).
  template <class B>
  __device__ void stage(B smem, const Args<T>& a, int64_t b) const {
    __syncthreads();
    stage_block_pair<T, D>(smem, o_k, a.k + at(a.lk, b, h), a.lk.st, o_v, a.v + at(a.lv, b, h),
                           a.lv.st, LDK, j0, a.tk);
    if (!active) return;
    stage_warp_pair<T, D>(smem, o_q, a.q + at(a.lq, b, h), a.lq.st, o_do, a.dout + at(a.ldo, b, h),
                          a.ldo.st, LDK, i0, a.tq, lane);
    const auto sL = smem_region<float>(smem, o_l);
    const int64_t bh = b * a.heads + h;
    if (lane < 16) sL[lane] = i0 + lane < a.tq ? a.lse[bh * a.tq + i0 + lane] : INFINITY;
  }
};

// dbias over the block's tile of (h, 64 queries, 64 keys), a warp 16 queries: for every batch
// entry of group g (entries [g per_group, (g + 1) per_group)) in order, S = Q_w K^T and
// dP_d = dO_w V^T made again and dS added into the lane's own elements (registers: element
// e = lane + 32 t of 16-key sub-tile n, query e / 16, key e % 16); written once at the end into
// out + g H Tq Tk (accumulate: added to what it holds).
template <class T, int ND>
__global__ void __launch_bounds__(kThreads)
    flash_backward_bias(Args<T> a, float* out, int64_t per_group, bool accumulate) {
  constexpr int D = ND * 16, LDK = D + 8, kSubs = kTile / 16, kPer = 256 / kWarpSize;
  ENGINE_DYNAMIC_SHARED(unsigned char, smem);
  const BiasBlock<D, T> k(a, per_group);
  const int lane = k.lane;
  const int64_t j0 = k.j0, h = k.h, i0 = k.i0;
  const bool active = k.active;
  float* dbias = out + k.g * a.heads * a.tq * a.tk;
  const auto sK = smem_region<T>(smem, k.o_k), sV = smem_region<T>(smem, k.o_v),
             sQ = smem_region<T>(smem, k.o_q), sdO = smem_region<T>(smem, k.o_do);
  const auto sS = smem_region<float>(smem, k.o_s), sT = smem_region<float>(smem, k.o_t),
             sL = smem_region<float>(smem, k.o_l), sD = smem_region<float>(smem, k.o_d);
  // The lane's sums, and its elements' bias terms (the same for every entry: read once).
  DbiasTile<kSubs, kPer> tile;
  tile.start(a, h, i0, j0, lane, active);
  for (int64_t b = k.b_first; b < k.b_end; ++b) {
    const int64_t bh = b * a.heads + h;
    k.stage(smem, a, b);
    if (active && lane < 16) sD[lane] = i0 + lane < a.tq ? a.rowdot[bh * a.tq + i0 + lane] : 0.0f;
    __syncthreads();
    if (!active) continue;
    FragA<T> fq[ND], fdo[ND];
    for (int kk = 0; kk < ND; ++kk) {
      wmma::load_matrix_sync(fq[kk], raw_ptr(sQ) + kk * 16, LDK);
      wmma::load_matrix_sync(fdo[kk], raw_ptr(sdO) + kk * 16, LDK);
    }
    tile.entry(
        a, fq, fdo, sK, sV, LDK, sS, sT, sL, sD, b, h, i0, j0, lane, [](int, int, float) {},
        [](int) {});
  }
  if (!active) return;
  tile.write(a, dbias, h, i0, j0, lane, accumulate);
}

// dbias[e] = the groups' partials part[g n + e] added in group order (accumulate: added to
// what dbias[e] holds).
__global__ void flash_bias_sum(const float* part, float* dbias, int64_t n, int64_t groups,
                               bool accumulate) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    float s = 0.0f;
    for (int64_t g = 0; g < groups; ++g) s += part[g * n + e];
    dbias[e] = accumulate ? dbias[e] + s : s;
  }
}

// The fused dQ and dbias kernel's shared memory: flash_backward_bias's, then per warp its dS tile
// (16-bit), then the block's two f32 tiles of dQ shares (64 rows of D + 4 floats), one per
// parity of the batch entry.
constexpr int kMaxCluster = 8;  // blocks of a cluster (the portable size): Tk <= 512
template <int D>
constexpr int ldq() {
  return D + 4;
}
template <int D, class T>
constexpr size_t q_bias_smem() {
  return bias_smem<D, T>() + kWarps * 16 * kLdH * sizeof(T) + 2 * kTile * ldq<D>() * 4;
}

// dQ and dbias in one pass, where dbias is wanted (flash_backward_q and flash_backward_bias in
// one kernel: S and dP_d made once for both): grid (Tk / 64, Tq / 64, H G) as
// flash_backward_bias's, in clusters of the Tk / 64 blocks along x, so that a cluster holds one
// (query tile, head, group) and each of its blocks one key tile. A warp 16 queries. For each
// batch entry of the group, in order:
//   - D_i for the warp's rows (every block of the cluster makes it; the key tile 0's writes it
//     for flash_backward_kv, launched after), S and dP_d made again, dS added into the lane's
//     dbias elements (as flash_backward_bias) and dQ_share = dS K_tile in fragments;
//   - the shares into the block's f32 tile of this entry's parity; cluster.sync; block r adds
//     rows [r R, (r + 1) R) of the C blocks' tiles in rank order (R = 64 / C rounded up; their
//     shared memory read through the cluster) and writes them, scaled, as dq's rows.
// The next entry writes the other tile, so one barrier an entry suffices: a block writes a tile
// again only after the barrier every block reached once done reading it. A last barrier keeps
// each block until the others have read its tiles. dQ's sum over the key tiles is a fixed order
// (within a tile along its keys, then the tiles in rank order): the same bits on every run,
// though not flash_backward_q's order.
template <class T, int ND>
__global__ void __launch_bounds__(kThreads)
    flash_backward_q_bias(Args<T> a, float* out, int64_t per_group, bool accumulate) {
#if ENGINE_CLUSTERS
  constexpr int D = ND * 16, LDK = D + 8, LDQ = ldq<D>(), kSubs = kTile / 16,
                kPer = 256 / kWarpSize;
  ENGINE_DYNAMIC_SHARED(unsigned char, smem);
  const cg::cluster_group cluster = cg::this_cluster();
  const BiasBlock<D, T> k(a, per_group);
  const int warp = k.warp, lane = k.lane;
  const int64_t j0 = k.j0, h = k.h, q0 = k.q0, i0 = k.i0;
  const bool active = k.active;
  float* dbias = out + k.g * a.heads * a.tq * a.tk;
  const size_t o_ds = bias_smem<D, T>() + warp * 16 * kLdH * sizeof(T),
               o_part = bias_smem<D, T>() + kWarps * 16 * kLdH * sizeof(T);
  const auto sK = smem_region<T>(smem, k.o_k), sV = smem_region<T>(smem, k.o_v),
             sQ = smem_region<T>(smem, k.o_q), sdO = smem_region<T>(smem, k.o_do),
             sdS = smem_region<T>(smem, o_ds);
  const auto sS = smem_region<float>(smem, k.o_s), sT = smem_region<float>(smem, k.o_t),
             sL = smem_region<float>(smem, k.o_l), sD = smem_region<float>(smem, k.o_d);
  // The lane's dbias sums, and its elements' bias terms (the same for every entry: read once).
  DbiasTile<kSubs, kPer> tile;
  tile.start(a, h, i0, j0, lane, active);
  // This block's rows of the reduction.
  const int nblocks = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int rows = (kTile + nblocks - 1) / nblocks, r_first = rank * rows,
            r_end = r_first + rows < kTile ? r_first + rows : kTile;
  for (int64_t b = k.b_first; b < k.b_end; ++b) {
    const auto part = smem_region<float>(smem, o_part + ((b - k.b_first) % 2) * kTile * LDQ * 4);
    k.stage(smem, a, b);
    if (active) {
      __syncwarp();
      warp_rowdots<T, D>(a, b, h, i0, sdO, sD, lane, blockIdx.x == 0);
    }
    __syncthreads();
    if (active) {
      FragA<T> fq[ND], fdo[ND];
      FragC dq[ND];
      for (int kk = 0; kk < ND; ++kk) {
        wmma::load_matrix_sync(fq[kk], raw_ptr(sQ) + kk * 16, LDK);
        wmma::load_matrix_sync(fdo[kk], raw_ptr(sdO) + kk * 16, LDK);
        wmma::fill_fragment(dq[kk], 0.0f);
      }
      // dQ += dS K_n after each sub-tile (dS rounded to 16 bits in the warp's operand tile).
      tile.entry(
          a, fq, fdo, sK, sV, LDK, sS, sT, sL, sD, b, h, i0, j0, lane,
          [&](int r, int c, float ds) { sdS[r * kLdH + c] = from_acc<T>(ds); },
          [&](int n) {
            add_product<T, ND>(dq, raw_ptr(sdS), raw_ptr(sK) + n * 16 * LDK, LDK);
            __syncwarp();
          });
      for (int nd = 0; nd < ND; ++nd)
        wmma::store_matrix_sync(raw_ptr(part) + warp * 16 * LDQ + nd * 16, dq[nd], LDQ,
                                wmma::mem_row_major);
    }
    cluster.sync();  // every block's shares of this entry written
    // This block's rows of dq: the C shares added in rank order, 4 columns a thread.
    T* dq_rows = a.dq + at(a.ldq, b, h);
    for (int e = threadIdx.x; e < (r_end - r_first) * (D / 4); e += kThreads) {
      const int r = r_first + e / (D / 4), c = (e % (D / 4)) * 4;
      const int64_t i = q0 + r;
      if (i >= a.tq) continue;
      float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int k = 0; k < nblocks; ++k) {
        const float4 v =
            cluster.map_shared_rank(smem_region<float4>(part, 0), k)[(r * LDQ + c) / 4];
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      const T out[4] = {from_acc<T>(s.x * a.scale), from_acc<T>(s.y * a.scale),
                        from_acc<T>(s.z * a.scale), from_acc<T>(s.w * a.scale)};
      store4(dq_rows + i * a.ldq.st, c, D, true, out);  // 8 bytes (rows on 16-byte boundaries)
    }
  }
  cluster.sync();  // the other blocks are done reading this block's tiles
  if (!active) return;
  tile.write(a, dbias, h, i0, j0, lane, accumulate);
#else
  __trap();  // clusters need sm_90 (the host launches this kernel only where they run)
#endif
}

// An operand's layout, checked against the kernels' contract (flash_attention_layout_fits).
Rows rows_of(const Tensor& t, const char* op, const char* name) {
  ENGINE_CHECK(flash_attention_layout_fits(t), "[", op, "] ", name, " ", describe(t),
               " needs its head width contiguous and its other strides and first element on "
               "16-byte boundaries (flash_attention_layout_fits)");
  return Rows{t.stride(0), t.stride(1), t.stride(2)};
}

template <class T>
Args<T> make_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                  const Tensor& key_mask, double scale, double p, PhiloxState state,
                  const char* op) {
  Args<T> a{};
  a.lq = rows_of(q, op, "q");
  a.lk = rows_of(k, op, "k");
  a.lv = rows_of(v, op, "v");
  a.q = dptr<const T>(q);
  a.k = dptr<const T>(k);
  a.v = dptr<const T>(v);
  ENGINE_CHECK(!bias.defined() || bias.dtype() == q.dtype() || bias.dtype() == DType::f32, "[", op,
               "] bias ", describe(bias), " must be in q's dtype (", dtype_name(q.dtype()),
               ") or f32");
  if (bias.defined() && bias.dtype() == DType::f32)
    a.bias32 = bias.data<float>();
  else
    a.bias = dptr<const T>(bias);
  a.mask = key_mask.defined() ? key_mask.data<float>() : nullptr;
  a.batch = q.size(0);
  a.heads = q.size(1);
  a.tq = q.size(2);
  a.tk = k.size(2);
  a.groups4 = (a.tk + 3) / 4;
  if (bias.defined()) {
    a.bias_sh = bias.stride(0);
    a.bias_si = bias.stride(1);
    a.bias_sj = bias.stride(2);
  }
  a.scale = static_cast<float>(scale);
  a.drop = p > 0;
  a.keep_scale = static_cast<float>(1.0 / (1.0 - p));
  a.threshold = attention_dropout_threshold(p);  // attention's rule (ops/dropout.h)
  a.state = state;
  return a;
}

// Kernels over 48 KiB of dynamic shared memory must say so before their launch.
template <class K>
void allow_smem(K* kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    ENGINE_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
}

template <class F>
void dispatch_width(int64_t d, const char* op, F&& f) {
  switch (d) {
    case 32:
      return f.template operator()<2>();
    case 64:
      return f.template operator()<4>();
    case 128:
      return f.template operator()<8>();
    default:
      ENGINE_FAIL("[", op, "] the CUDA kernel takes head widths 32, 64 and 128, got ", d);
  }
}

template <class F>
void dispatch_half(DType t, const char* op, F&& f) {
  if (t == DType::bf16) return f.template operator()<__nv_bfloat16>();
  if (t == DType::f16) return f.template operator()<__half>();
  ENGINE_FAIL("[", op, "] the CUDA kernel takes bf16 or f16, got ", dtype_name(t));
}

// The relative positions into the arguments (no table: none).
template <class T>
void set_relative(Args<T>& a, const Tensor& table, int64_t clip, bool keys, bool values) {
  a.rel_table = table.defined() ? dptr<const T>(table) : nullptr;
  a.rel_clip = table.defined() ? clip : 0;
  a.nrel = table.defined() ? 2 * clip + 1 : 0;
  a.rel_keys = table.defined() && keys;
  a.rel_values = table.defined() && values;
}

// A relative table's layout (B, H, Tq, R), its last dim contiguous.
Rows rel_rows(const Tensor& t) { return Rows{t.stride(0), t.stride(1), t.stride(2)}; }

unsigned tiles(int64_t n) { return static_cast<unsigned>((n + kTile - 1) / kTile); }

void forward(const FlashAttentionForward& t) {
  DeviceGuard guard(t.q.device().index);
  const cudaStream_t stream = compute_stream(t.q.device().index);
  dispatch_half(t.q.dtype(), "flash_attention", [&]<class T>() {
    Args<T> a =
        make_args<T>(t.q, t.k, t.v, t.bias, t.key_mask, t.scale, t.p, t.state, "flash_attention");
    a.lo = rows_of(t.out, "flash_attention", "out");
    a.o = dptr<T>(t.out);
    a.lse_out = t.lse.data<float>();
    ENGINE_CHECK(t.mask_bits.defined() == a.drop,
                 "[flash_attention] mask_bits must be given exactly when p > 0");
    a.bits_out = a.drop ? t.mask_bits.data<uint8_t>() : nullptr;
    check_flash_relative(t.q, t.v, t.rel_table, t.rel_clip, t.rel_keys, t.rel_values, nullptr,
                         nullptr, "flash_attention");
    set_relative(a, t.rel_table, t.rel_clip, t.rel_keys, t.rel_values);
    if (a.tq == 0 || a.batch * a.heads == 0) return;
    dispatch_width(t.q.size(3), "flash_attention", [&]<int ND>() {
      const size_t smem = forward_smem<ND * 16, T>(a.nrel);
      allow_smem(flash_forward<T, ND>, smem);
      const LaunchConfig cfg{dim3(tiles(a.tq), static_cast<unsigned>(a.batch * a.heads)),
                             dim3(kThreads), smem, stream};
      ENGINE_LAUNCH((flash_forward<T, ND>), cfg, a);
    });
  });
}

void backward(const FlashAttentionBackward& t) {
  DeviceGuard guard(t.q.device().index);
  const cudaStream_t stream = compute_stream(t.q.device().index);
  dispatch_half(t.q.dtype(), "flash_attention_backward", [&]<class T>() {
    const char* op = "flash_attention_backward";
    Args<T> a = make_args<T>(t.q, t.k, t.v, t.bias, t.key_mask, t.scale, t.p, t.state, op);
    a.lo = rows_of(t.out, op, "out");
    a.ldo = rows_of(t.dout, op, "dout");
    a.ldq = rows_of(t.dq, op, "dq");
    a.ldk = rows_of(t.dk, op, "dk");
    a.ldv = rows_of(t.dv, op, "dv");
    const int64_t bh = a.batch * a.heads, d = t.q.size(3);
    if (bh == 0) {
      if (t.dbias.defined() && !t.accumulate_dbias) t.dbias.fill_(0.0);  // a sum over no entries
      return;
    }
    a.out = dptr<const T>(t.out);
    a.dout = dptr<const T>(t.dout);
    a.lse = t.lse.data<float>();
    ENGINE_CHECK(t.mask_bits.defined() == a.drop,
                 "[flash_attention_backward] mask_bits must be given exactly when p > 0");
    a.bits = a.drop ? t.mask_bits.data<uint8_t>() : nullptr;
    check_flash_relative(t.q, t.v, t.rel_table, t.rel_clip, t.rel_keys, t.rel_values, &t.drel,
                         &t.rel_weights, op);
    set_relative(a, t.rel_table, t.rel_clip, t.rel_keys, t.rel_values);
    // Relative positions: q A^T and dout A^T for the kv and bias kernels (flash_backward_q writes
    // them), and drel where the caller wants none (the dq kernel reads its rows back).
    Tensor qa, doa, drel = t.drel;
    const Device dev = t.q.device();
    if (a.rel_keys) {
      qa = Tensor::empty(Shape{bh * a.tq * a.nrel}, t.q.dtype(), dev);
      a.qa = dptr<T>(qa);
      if (!drel.defined())
        drel = Tensor::empty(Shape{a.batch, a.heads, a.tq, a.nrel}, t.q.dtype(), dev);
      a.drel_out = dptr<T>(drel);
      a.ldrel = rel_rows(drel);
    }
    if (a.rel_values) {
      doa = Tensor::empty(Shape{bh * a.tq * a.nrel}, t.q.dtype(), dev);
      a.doa = dptr<T>(doa);
    }
    if (t.rel_weights.defined()) {
      a.w_out = dptr<T>(t.rel_weights);
      a.lw = rel_rows(t.rel_weights);
    }
    a.dq = dptr<T>(t.dq);
    a.dk = dptr<T>(t.dk);
    a.dv = dptr<T>(t.dv);
    // D_i = rowsum(dout * out): flash_backward_q's, which runs first.
    Tensor rowdot = Tensor::empty(Shape{bh * a.tq}, DType::f32, t.q.device());
    a.rowdot = rowdot.data<float>();
    // dbias: groups of the batch where the tiles alone are fewer blocks than kTargetBlocks (each
    // group's entries summed in order into its own partial, the partials then added in group
    // order by flash_bias_sum); one group writes dbias directly.
    const bool want_dbias = t.dbias.defined() && a.tq > 0 && a.tk > 0;
    int64_t groups = 1, per_group = a.batch;
    Tensor part;
    if (want_dbias) {
      const int64_t tile_blocks = int64_t(tiles(a.tk)) * tiles(a.tq) * a.heads;
      groups =
          t.batch_groups > 0 ? t.batch_groups : (kTargetBlocks + tile_blocks - 1) / tile_blocks;
      groups = groups < 1 ? 1 : (groups > a.batch ? a.batch : groups);
      per_group = (a.batch + groups - 1) / groups;
      groups = (a.batch + per_group - 1) / per_group;  // none empty
      if (groups > 1)
        part = Tensor::empty(Shape{groups * a.heads * a.tq * a.tk}, DType::f32, t.q.device());
    }
    float* bias_out =
        groups > 1 ? part.data<float>() : (want_dbias ? t.dbias.data<float>() : nullptr);
    const bool bias_accumulate = groups > 1 ? false : t.accumulate_dbias;
    const dim3 bias_grid(tiles(a.tk), tiles(a.tq), static_cast<unsigned>(a.heads * groups));
    dispatch_width(d, "flash_attention_backward", [&]<int ND>() {
      // dQ and dbias in one kernel (flash_backward_q_bias, clusters of the key tiles) where
      // dbias is wanted, the head width is 64 or less, there are no relative positions, the key
      // tiles fit a cluster, the device runs clusters and the caller lets it (t.clusters);
      // otherwise flash_backward_q before the kv kernel and flash_backward_bias after it.
      bool fused = false;
      if constexpr (ND <= 4) {  // (wider heads: the kernel would spill)
        fused = want_dbias && t.clusters && a.rel_table == nullptr && tiles(a.tk) <= kMaxCluster &&
                clusters_run(flash_backward_q_bias<T, ND>, t.q.device().index);
        if (fused) {
          constexpr size_t smem = q_bias_smem<ND * 16, T>();
          allow_smem(flash_backward_q_bias<T, ND>, smem);
          const LaunchConfig cfg{bias_grid, dim3(kThreads), smem, stream, dim3(tiles(a.tk))};
          ENGINE_LAUNCH((flash_backward_q_bias<T, ND>), cfg, a, bias_out, per_group,
                        bias_accumulate);
        }
      }
      if (!fused && a.tq > 0) {
        const size_t smem = q_smem<ND * 16, T>(a.nrel);
        allow_smem(flash_backward_q<T, ND>, smem);
        const LaunchConfig cfg{
            dim3(tiles(a.tq), static_cast<unsigned>(a.heads), static_cast<unsigned>(a.batch)),
            dim3(kThreads), smem, stream};
        ENGINE_LAUNCH((flash_backward_q<T, ND>), cfg, a);
      }
      if (a.tk > 0) {
        constexpr size_t smem = kv_smem<ND * 16, T>();
        allow_smem(flash_backward_kv<T, ND>, smem);
        const LaunchConfig cfg{dim3(tiles(a.tk), static_cast<unsigned>(bh)), dim3(kThreads), smem,
                               stream};
        ENGINE_LAUNCH((flash_backward_kv<T, ND>), cfg, a);
      }
      if (want_dbias && !fused) {
        constexpr size_t smem = bias_smem<ND * 16, T>();
        allow_smem(flash_backward_bias<T, ND>, smem);
        const LaunchConfig cfg{bias_grid, dim3(kThreads), smem, stream};
        ENGINE_LAUNCH((flash_backward_bias<T, ND>), cfg, a, bias_out, per_group, bias_accumulate);
      }
    });
    if (want_dbias && groups > 1) {
      const int64_t n = a.heads * a.tq * a.tk;
      const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
      const LaunchConfig sum_cfg{dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream};
      ENGINE_LAUNCH(flash_bias_sum, sum_cfg, part.data<float>(), t.dbias.data<float>(), n, groups,
                    t.accumulate_dbias);
    }
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(flash_attention_forward_kernel, DeviceType::CUDA, forward);
ENGINE_REGISTER_KERNEL(flash_attention_backward_kernel, DeviceType::CUDA, backward);

}  // namespace engine::cuda
