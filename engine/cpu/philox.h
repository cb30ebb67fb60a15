// Philox4x32-10 words in bulk on the CPU: the counter-based stream of engine/rng.h drawn 16 blocks
// at a time in vector registers, for the kernels that consume one word per element (dropout,
// categorical sampling). Bit for bit the words philox_word(state, i) gives
// (tests/test_dropout.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "engine/rng.h"

namespace engine::cpu::philox {

constexpr int64_t kParallelBlocks = 8192;

// Philox4x32-10 (engine/rng.h's philox4x32_10) for kLanes consecutive counters at once, in vector
// registers where the build has AVX-512 or AVX2 (32x32->64-bit multiplies of the even and the odd
// lanes, vpmuludq): bit for bit philox_block(seed, counter + j) for lane j (tests/test_dropout.cpp
// checks it against philox_word), ~10x faster than one block at a time.
constexpr int kLanes = 16;
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
using VecU = __m512i;  // 16 lanes
inline VecU vload(const uint32_t* p) { return _mm512_loadu_si512(p); }
inline void vstore(uint32_t* p, VecU v) { _mm512_storeu_si512(p, v); }
inline VecU vset1(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
inline VecU vxor(VecU a, VecU b) { return _mm512_xor_si512(a, b); }
// hi and lo 32 bits of m * c per lane.
inline void vmul_hilo(VecU c, VecU m, VecU& hi, VecU& lo) {
  const VecU even = _mm512_mul_epu32(c, m);                        // lanes 0, 2, ...: 64-bit
  const VecU odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);  // lanes 1, 3, ...
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}
#else
using VecU = __m256i;  // 8 lanes
inline VecU vload(const uint32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const VecU*>(p));
}
inline void vstore(uint32_t* p, VecU v) { _mm256_storeu_si256(reinterpret_cast<VecU*>(p), v); }
inline VecU vset1(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
inline VecU vxor(VecU a, VecU b) { return _mm256_xor_si256(a, b); }
inline void vmul_hilo(VecU c, VecU m, VecU& hi, VecU& lo) {
  const VecU even = _mm256_mul_epu32(c, m);
  const VecU odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
#endif
constexpr int kVecLanes = static_cast<int>(sizeof(VecU) / sizeof(uint32_t));

// The ten rounds on one vector of blocks: c0..c3 hold word k of each lane's block.
inline void philox_rounds(uint64_t seed, VecU& c0, VecU& c1, VecU& c2, VecU& c3) {
  const VecU m0 = vset1(kM0), m1 = vset1(kM1);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += kW0;
      k1 += kW1;
    }
    VecU hi0, lo0, hi1, lo1;
    vmul_hilo(c0, m0, hi0, lo0);
    vmul_hilo(c2, m1, hi1, lo1);
    c0 = vxor(vxor(hi1, c1), vset1(k0));
    c1 = lo1;
    c2 = vxor(vxor(hi0, c3), vset1(k1));
    c3 = lo0;
  }
}

// Lane j's counter (counter + j), split into its low and high words.
inline void counter_words(uint64_t counter, uint32_t lo[kLanes], uint32_t hi[kLanes]) {
  for (int j = 0; j < kLanes; ++j) {
    const uint64_t c = counter + static_cast<uint64_t>(j);
    lo[j] = static_cast<uint32_t>(c);
    hi[j] = static_cast<uint32_t>(c >> 32);
  }
}

inline void philox_lanes(uint64_t seed, uint64_t counter, uint32_t out[4][kLanes]) {
  alignas(64) uint32_t lo[kLanes], hi[kLanes];
  counter_words(counter, lo, hi);
  for (int v = 0; v < kLanes; v += kVecLanes) {
    VecU c0 = vload(lo + v), c1 = vload(hi + v), c2 = vset1(0), c3 = vset1(0);
    philox_rounds(seed, c0, c1, c2, c3);
    vstore(out[0] + v, c0);
    vstore(out[1] + v, c1);
    vstore(out[2] + v, c2);
    vstore(out[3] + v, c3);
  }
}
#else
inline void philox_lanes(uint64_t seed, uint64_t counter, uint32_t out[4][kLanes]) {
  for (int j = 0; j < kLanes; ++j) {
    uint32_t w[4];
    philox_block(seed, counter + static_cast<uint64_t>(j), w);
    for (int k = 0; k < 4; ++k) out[k][j] = w[k];
  }
}
#endif

// The words of kLanes blocks in stream order: words[4 j + k] = word k of block counter + j. With
// AVX-512 the four word vectors are transposed in registers (unpacks and 128-bit shuffles); a
// scalar transpose through memory was half of for_each_words' time on the 2026-11-26 VM (6.2
// cycles a word on one thread, 10% of the tiny model's step). AVX2: the same in 8-block halves.
inline void philox_words(uint64_t seed, uint64_t counter, uint32_t words[4 * kLanes]) {
#if defined(__AVX512F__)
  static_assert(kVecLanes == kLanes);
  alignas(64) uint32_t lo[kLanes], hi[kLanes];
  counter_words(counter, lo, hi);
  VecU c0 = vload(lo), c1 = vload(hi), c2 = vset1(0), c3 = vset1(0);
  philox_rounds(seed, c0, c1, c2, c3);
  // In each 128-bit lane L (blocks L, L + 4, L + 8, L + 12 of the vector's 16):
  const VecU a = _mm512_unpacklo_epi32(c0, c1), b = _mm512_unpackhi_epi32(c0, c1);
  const VecU c = _mm512_unpacklo_epi32(c2, c3), d = _mm512_unpackhi_epi32(c2, c3);
  const VecU e = _mm512_unpacklo_epi64(a, c);  // blocks 0, 4, 8, 12 (one per 128-bit lane)
  const VecU f = _mm512_unpackhi_epi64(a, c);  // 1, 5, 9, 13
  const VecU g = _mm512_unpacklo_epi64(b, d);  // 2, 6, 10, 14
  const VecU h = _mm512_unpackhi_epi64(b, d);  // 3, 7, 11, 15
  const VecU t0 = _mm512_shuffle_i32x4(e, f, 0x44), t1 = _mm512_shuffle_i32x4(g, h, 0x44);
  const VecU t2 = _mm512_shuffle_i32x4(e, f, 0xEE), t3 = _mm512_shuffle_i32x4(g, h, 0xEE);
  vstore(words, _mm512_shuffle_i32x4(t0, t1, 0x88));       // blocks 0-3
  vstore(words + 16, _mm512_shuffle_i32x4(t0, t1, 0xDD));  // 4-7
  vstore(words + 32, _mm512_shuffle_i32x4(t2, t3, 0x88));  // 8-11
  vstore(words + 48, _mm512_shuffle_i32x4(t2, t3, 0xDD));  // 12-15
#elif defined(__AVX2__)
  // Two vectors of 8 blocks; in each, per 128-bit lane L (blocks L and L + 4 of the 8) the same
  // unpacks, then the 128-bit halves paired.
  static_assert(kVecLanes * 2 == kLanes);
  alignas(64) uint32_t lo[kLanes], hi[kLanes];
  counter_words(counter, lo, hi);
  for (int v = 0; v < 2; ++v) {
    VecU c0 = vload(lo + 8 * v), c1 = vload(hi + 8 * v), c2 = vset1(0), c3 = vset1(0);
    philox_rounds(seed, c0, c1, c2, c3);
    const VecU a = _mm256_unpacklo_epi32(c0, c1), b = _mm256_unpackhi_epi32(c0, c1);
    const VecU c = _mm256_unpacklo_epi32(c2, c3), d = _mm256_unpackhi_epi32(c2, c3);
    const VecU e = _mm256_unpacklo_epi64(a, c);  // blocks 0, 4 (one per 128-bit lane)
    const VecU f = _mm256_unpackhi_epi64(a, c);  // 1, 5
    const VecU g = _mm256_unpacklo_epi64(b, d);  // 2, 6
    const VecU h = _mm256_unpackhi_epi64(b, d);  // 3, 7
    uint32_t* out = words + 32 * v;
    vstore(out, _mm256_permute2x128_si256(e, f, 0x20));       // blocks 0, 1
    vstore(out + 8, _mm256_permute2x128_si256(g, h, 0x20));   // 2, 3
    vstore(out + 16, _mm256_permute2x128_si256(e, f, 0x31));  // 4, 5
    vstore(out + 24, _mm256_permute2x128_si256(g, h, 0x31));  // 6, 7
  }
#else
  uint32_t w[4][kLanes];
  philox_lanes(seed, counter, w);
  for (int j = 0; j < kLanes; ++j)
    for (int k = 0; k < 4; ++k) words[4 * j + k] = w[k][j];
#endif
}

// Calls f(base, words, count) over i < n in runs of up to 4 kLanes elements: words[k] is the
// Philox word of element base + k (word i % 4 of block offset + i / 4), the blocks drawn kLanes at
// a time. f's loop over k is a plain loop the compiler vectorises.
template <class F>
void for_each_words(int64_t n, PhiloxState s, F&& f) {
  const int64_t blocks = (n + 3) / 4;
  const int64_t groups = (blocks + kLanes - 1) / kLanes;
#pragma omp parallel for schedule(static) if (blocks > kParallelBlocks)
  for (int64_t g = 0; g < groups; ++g) {
    alignas(64) uint32_t words[4 * kLanes];
    philox_words(s.seed, s.offset + static_cast<uint64_t>(g * kLanes), words);
    const int64_t base = g * kLanes * 4;
    f(base, words, std::min<int64_t>(kLanes * 4, n - base));
  }
}

}  // namespace engine::cpu::philox
