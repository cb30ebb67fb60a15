// The AVX-512 small GEMM (see small_gemm.h).
//
// Tile: MR rows x NV <= 4 vectors of 16 columns, 24 accumulators (6 x 4, 8 x 3, 12 x 2); per k
// step NV loads of a B row, MR broadcasts of A's elements and MR x NV FMAs, so the two FMA ports
// bound it (12 cycles a step for a full tile against 10-14 loads). Tiles walk 64-column strips of
// C, all rows of a strip before the next, so the strip of B (k x 64 floats, 32 KB at k = 128) stays
// in L1 while every row block reads it. A transposed B (stored n x k) is packed first into a k x n
// panel.
#include "engine/cpu/small_gemm.h"

#include "engine/error.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>
#endif

namespace engine::cpu {

#if defined(__AVX512F__)
namespace {

constexpr int kMaxVectors = 4;  // NV: 64 columns
constexpr int kMaxRows = 12;    // MR, for the narrowest strips
// The tile's rows for a strip of NV vectors: 24 accumulators (6 x 4, 8 x 3, 12 x 2 or 1), so
// that a narrow strip (the tiny model's 32-wide heads) has as many FMAs per B load as a wide one.
constexpr int rows_for(int vectors) { return vectors >= 4 ? 6 : vectors == 3 ? 8 : 12; }

// One MR x (16 NV) tile of C over the whole k. A's element (r, p) is at a[r * a_row + p * a_k]
// (TA: a_row = 1, a_k = lda; else a_row = lda, a_k = 1); B's row p at b + p * ldb. `tail` masks
// the last vector's columns (loads and stores), so a strip narrower than 16 NV columns is fine.
// Every loop over r and v is unrolled: GCC keeps the accumulators in registers only when no
// access to them is left with a variable index (else it stores all 24 every k step).
template <int MR, int NV, bool TA, bool TAIL>
void tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, __mmask16 tail,
          float alpha, float beta, float* c, int64_t ldc) {
  __m512 acc[MR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 12
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  const float* arow[MR];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) arow[r] = TA ? a + r : a + r * lda;
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    __m512 bv[NV];
#pragma GCC unroll 12
    for (int v = 0; v + 1 < NV; ++v) bv[v] = _mm512_loadu_ps(bp + 16 * v);
    bv[NV - 1] = TAIL ? _mm512_maskz_loadu_ps(tail, bp + 16 * (NV - 1))
                      : _mm512_loadu_ps(bp + 16 * (NV - 1));
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(TA ? arow[r][p * lda] : arow[r][p]);
#pragma GCC unroll 12
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
#pragma GCC unroll 12
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v + 1 < NV ? __mmask16(0xFFFF) : tail;
      __m512 out = _mm512_mul_ps(va, acc[r][v]);
      if (TAIL && v + 1 == NV) {
        if (beta != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cr + 16 * v), out);
        _mm512_mask_storeu_ps(cr + 16 * v, m, out);
      } else {
        if (beta != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr + 16 * v), out);
        _mm512_storeu_ps(cr + 16 * v, out);
      }
    }
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, __mmask16, float,
                        float, float*, int64_t);

// The tiles for every vector count (1 .. 4) and row count (1 .. rows_for(vectors)), with and
// without a partial last vector: indexed [tail][vectors - 1][rows - 1].
template <bool TA, bool TAIL, int NV, int MR = 1>
void fill_strip(TileFn* t) {
  t[MR - 1] = &tile<MR, NV, TA, TAIL>;
  if constexpr (MR < rows_for(NV)) fill_strip<TA, TAIL, NV, MR + 1>(t);
}

template <bool TA>
struct Tiles {
  TileFn fn[2][kMaxVectors][kMaxRows] = {};
  template <bool TAIL>
  void fill(TileFn (&t)[kMaxVectors][kMaxRows]) {
    fill_strip<TA, TAIL, 1>(t[0]);
    fill_strip<TA, TAIL, 2>(t[1]);
    fill_strip<TA, TAIL, 3>(t[2]);
    fill_strip<TA, TAIL, 4>(t[3]);
  }
  Tiles() {
    fill<false>(fn[0]);
    fill<true>(fn[1]);
  }
  TileFn at(bool tail, int64_t vectors, int64_t rows) const {
    return fn[tail ? 1 : 0][vectors - 1][rows - 1];
  }
};

// rows[0..16) (16 floats each) -> their transpose: out[c] holds column c of the 16 rows.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4 g + c]: column 4 L + c of rows 4 g .. 4 g + 3 in each 128-bit lane L.
  for (int g = 0; g < 4; ++g) {
    const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]),
                  t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  // v[c] (c < 4): columns c and c + 8 of rows 0-7; v[4 + c]: columns 4 + c and 12 + c. w: rows
  // 8-15.
  __m512 v[8], w[8];
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
    v[4 + c] = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
    w[c] = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    w[4 + c] = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
  }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_f32x4(v[c], w[c], 0x88);
    r[c + 8] = _mm512_shuffle_f32x4(v[c], w[c], 0xdd);
  }
}

// panel[p * ldp + j] = b[j * ldb + p] for j < n, p < k: whole 16 x 16 blocks in registers, the
// edges element by element.
void pack_transposed(int64_t n, int64_t k, const float* b, int64_t ldb, float* panel, int64_t ldp) {
  const int64_t n16 = n / 16 * 16, k16 = k / 16 * 16;
  for (int64_t j0 = 0; j0 < n16; j0 += 16) {
    for (int64_t p0 = 0; p0 < k16; p0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(b + (j0 + i) * ldb + p0);
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(panel + (p0 + i) * ldp + j0, r[i]);
    }
    for (int64_t p = k16; p < k; ++p)
      for (int64_t j = j0; j < j0 + 16; ++j) panel[p * ldp + j] = b[j * ldb + p];
  }
  for (int64_t j = n16; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) panel[p * ldp + j] = b[j * ldb + p];
}

template <bool TA>
void run_tiles(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  static const Tiles<TA> tiles;
  for (int64_t j0 = 0; j0 < n; j0 += 16 * kMaxVectors) {
    const int64_t cols = std::min<int64_t>(16 * kMaxVectors, n - j0);
    const int64_t vectors = (cols + 15) / 16;
    const int64_t last = cols - 16 * (vectors - 1);  // 1 .. 16 columns in the last vector
    const __mmask16 tail = static_cast<__mmask16>((1u << last) - 1u);
    const int64_t max_rows = rows_for(static_cast<int>(vectors));
    for (int64_t i0 = 0; i0 < m; i0 += max_rows) {
      const int64_t rows = std::min<int64_t>(max_rows, m - i0);
      const float* ai = TA ? a + i0 : a + i0 * lda;
      tiles.at(last < 16, vectors, rows)(k, ai, lda, b + j0, ldb, tail, alpha, beta,
                                         c + i0 * ldc + j0, ldc);
    }
  }
}

// A 64-byte aligned k x n panel for a transposed B, one per thread (grown, never shrunk). Aligned
// rows matter: a 16-float load that crosses a cache line costs two (measured: q k^T at half speed
// from a malloc-aligned panel).
float* panel_for(int64_t k, int64_t ldp) {
  thread_local std::vector<float> store;
  const size_t need = static_cast<size_t>(k * ldp) + 16;
  if (store.size() < need) store.resize(need);
  const uintptr_t base = reinterpret_cast<uintptr_t>(store.data());
  return store.data() + ((64 - base % 64) % 64) / sizeof(float);
}

}  // namespace

bool small_gemm_available() { return true; }

void small_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                    int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c,
                    int64_t batch) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum: C = beta C (not read when beta == 0)
    for (int64_t e = 0; e < batch; ++e)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          float& x = c[e * stride_c + i * ldc + j];
          x = beta == 0.0f ? 0.0f : beta * x;
        }
    return;
  }
  const int64_t ldp = (n + 15) / 16 * 16;
  float* panel = trans_b ? panel_for(k, ldp) : nullptr;
  for (int64_t e = 0; e < batch; ++e) {
    const float* ae = a + e * stride_a;
    float* ce = c + e * stride_c;
    // op(B)'s rows: B's own, or the panel's (packed once when the batch shares B).
    if (trans_b && (e == 0 || stride_b != 0))
      pack_transposed(n, k, b + e * stride_b, ldb, panel, ldp);
    const float* be = trans_b ? panel : b + e * stride_b;
    const int64_t ldbe = trans_b ? ldp : ldb;
    if (trans_a)
      run_tiles<true>(m, n, k, alpha, ae, lda, be, ldbe, beta, ce, ldc);
    else
      run_tiles<false>(m, n, k, alpha, ae, lda, be, ldbe, beta, ce, ldc);
  }
}

#else  // no AVX-512: the library GEMM runs instead

bool small_gemm_available() { return false; }

void small_gemm_f32(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, int64_t,
                    const float*, int64_t, int64_t, float, float*, int64_t, int64_t, int64_t) {
  ENGINE_FAIL("[gemm] the small GEMM kernel needs an AVX-512 build (small_gemm_available())");
}

#endif

}  // namespace engine::cpu
