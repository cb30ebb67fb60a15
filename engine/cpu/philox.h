// Philox4x32-10 words in bulk on the CPU: the counter-based stream of engine/rng.h drawn 64 blocks
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

// Philox4x32-10 (engine/rng.h's philox4x32_10) for many consecutive counters at once, in vector
// registers where the build has AVX-512 or AVX2 (32x32->64-bit multiplies of the even and the odd
// lanes, vpmuludq): bit for bit philox_block(seed, counter + j) for lane j (tests/test_dropout.cpp
// checks it against philox_word), ~10x faster than one block at a time.
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
// Blocks drawn per philox_words call (4 words each).
constexpr int kGroupBlocks = 64;

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
// Vectors of blocks taken through the ten rounds together. Each round is a chain of dependent
// operations (a multiply, its halves, the xors) that one vector alone leaves the core waiting on;
// four interleaved keep the multipliers busy. Dropout over 4M floats, one thread of the AVX-512
// EPYC (Zen 5), ns a word: one 16-block vector at a time 1.01-1.17, two 0.74-0.84, four 0.59-0.61;
// the AVX2 build on the same machine: one 1.70, two 1.55, four 1.45, eight 1.49 (its 16
// registers spill).
constexpr int kInterleave = 4;
static_assert(kGroupBlocks % (kVecLanes * kInterleave) == 0);

// The ten rounds on N vectors of blocks: c0..c3[v] hold word k of each lane's block.
template <int N>
inline void philox_rounds(uint64_t seed, VecU* c0, VecU* c1, VecU* c2, VecU* c3) {
  const VecU m0 = vset1(kM0), m1 = vset1(kM1);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += kW0;
      k1 += kW1;
    }
    const VecU vk0 = vset1(k0), vk1 = vset1(k1);
    for (int v = 0; v < N; ++v) {
      VecU hi0, lo0, hi1, lo1;
      vmul_hilo(c0[v], m0, hi0, lo0);
      vmul_hilo(c2[v], m1, hi1, lo1);
      c0[v] = vxor(vxor(hi1, c1[v]), vk0);
      c1[v] = lo1;
      c2[v] = vxor(vxor(hi0, c3[v]), vk1);
      c3[v] = lo0;
    }
  }
}

// The 4 kVecLanes words of one vector of blocks in stream order: out[4 j + k] = word k of lane j's
// block, the word vectors transposed in registers (unpacks and 128-bit shuffles; a scalar
// transpose through memory was half of for_each_words' time on the 2026-11-26 VM).
inline void store_stream_order(VecU c0, VecU c1, VecU c2, VecU c3, uint32_t* out) {
#if defined(__AVX512F__)
  // In each 128-bit lane L (blocks L, L + 4, L + 8, L + 12 of the vector's 16):
  const VecU a = _mm512_unpacklo_epi32(c0, c1), b = _mm512_unpackhi_epi32(c0, c1);
  const VecU c = _mm512_unpacklo_epi32(c2, c3), d = _mm512_unpackhi_epi32(c2, c3);
  const VecU e = _mm512_unpacklo_epi64(a, c);  // blocks 0, 4, 8, 12 (one per 128-bit lane)
  const VecU f = _mm512_unpackhi_epi64(a, c);  // 1, 5, 9, 13
  const VecU g = _mm512_unpacklo_epi64(b, d);  // 2, 6, 10, 14
  const VecU h = _mm512_unpackhi_epi64(b, d);  // 3, 7, 11, 15
  const VecU t0 = _mm512_shuffle_i32x4(e, f, 0x44), t1 = _mm512_shuffle_i32x4(g, h, 0x44);
  const VecU t2 = _mm512_shuffle_i32x4(e, f, 0xEE), t3 = _mm512_shuffle_i32x4(g, h, 0xEE);
  vstore(out, _mm512_shuffle_i32x4(t0, t1, 0x88));       // blocks 0-3
  vstore(out + 16, _mm512_shuffle_i32x4(t0, t1, 0xDD));  // 4-7
  vstore(out + 32, _mm512_shuffle_i32x4(t2, t3, 0x88));  // 8-11
  vstore(out + 48, _mm512_shuffle_i32x4(t2, t3, 0xDD));  // 12-15
#else
  // Per 128-bit lane L (blocks L and L + 4 of the 8) the same unpacks, then the halves paired.
  const VecU a = _mm256_unpacklo_epi32(c0, c1), b = _mm256_unpackhi_epi32(c0, c1);
  const VecU c = _mm256_unpacklo_epi32(c2, c3), d = _mm256_unpackhi_epi32(c2, c3);
  const VecU e = _mm256_unpacklo_epi64(a, c);               // blocks 0, 4 (one per 128-bit lane)
  const VecU f = _mm256_unpackhi_epi64(a, c);               // 1, 5
  const VecU g = _mm256_unpacklo_epi64(b, d);               // 2, 6
  const VecU h = _mm256_unpackhi_epi64(b, d);               // 3, 7
  vstore(out, _mm256_permute2x128_si256(e, f, 0x20));       // blocks 0, 1
  vstore(out + 8, _mm256_permute2x128_si256(g, h, 0x20));   // 2, 3
  vstore(out + 16, _mm256_permute2x128_si256(e, f, 0x31));  // 4, 5
  vstore(out + 24, _mm256_permute2x128_si256(g, h, 0x31));  // 6, 7
#endif
}

// The words of kGroupBlocks blocks in stream order: words[4 j + k] = word k of block counter + j.
inline void philox_words(uint64_t seed, uint64_t counter, uint32_t words[4 * kGroupBlocks]) {
  constexpr int kStep = kVecLanes * kInterleave;
  for (int g0 = 0; g0 < kGroupBlocks; g0 += kStep) {
    VecU c0[kInterleave], c1[kInterleave], c2[kInterleave], c3[kInterleave];
    for (int v = 0; v < kInterleave; ++v) {
      // Lane j's counter, split into its low and high words.
      alignas(64) uint32_t lo[kVecLanes], hi[kVecLanes];
      const uint64_t first = counter + static_cast<uint64_t>(g0 + v * kVecLanes);
      for (int j = 0; j < kVecLanes; ++j) {
        const uint64_t c = first + static_cast<uint64_t>(j);
        lo[j] = static_cast<uint32_t>(c);
        hi[j] = static_cast<uint32_t>(c >> 32);
      }
      c0[v] = vload(lo);
      c1[v] = vload(hi);
      c2[v] = c3[v] = vset1(0);
    }
    philox_rounds<kInterleave>(seed, c0, c1, c2, c3);
    for (int v = 0; v < kInterleave; ++v)
      store_stream_order(c0[v], c1[v], c2[v], c3[v], words + 4 * (g0 + v * kVecLanes));
  }
}
#else
inline void philox_words(uint64_t seed, uint64_t counter, uint32_t words[4 * kGroupBlocks]) {
  for (int j = 0; j < kGroupBlocks; ++j)
    philox_block(seed, counter + static_cast<uint64_t>(j), words + 4 * j);
}
#endif

// Calls f(base, words, count) over i < n in runs of up to 4 kGroupBlocks elements: words[k] is
// the Philox word of element base + k (word i % 4 of block offset + i / 4), the blocks drawn
// kGroupBlocks at a time. f's loop over k is a plain loop the compiler vectorises.
template <class F>
void for_each_words(int64_t n, PhiloxState s, F&& f) {
  check_host_state(s, "philox");
  const int64_t blocks = (n + 3) / 4;
  const int64_t groups = (blocks + kGroupBlocks - 1) / kGroupBlocks;
#pragma omp parallel for schedule(static) if (blocks > kParallelBlocks)
  for (int64_t g = 0; g < groups; ++g) {
    alignas(64) uint32_t words[4 * kGroupBlocks];
    philox_words(s.seed, s.offset + static_cast<uint64_t>(g * kGroupBlocks), words);
    const int64_t base = g * kGroupBlocks * 4;
    f(base, words, std::min<int64_t>(kGroupBlocks * 4, n - base));
  }
}

// The words of stream elements i0 .. i0 + n - 1 (a row of a kernel that walks rows, not the
// whole stream): drawn kGroupBlocks blocks at a time into `buf`, which must hold
// stream_words_size(n) words; returns a pointer to element i0's word inside it.
inline int64_t stream_words_size(int64_t n) {
  const int64_t blocks = (n + 3) / 4 + 1;  // + 1: i0 need not start a block
  return (blocks + kGroupBlocks - 1) / kGroupBlocks * kGroupBlocks * 4;
}
inline const uint32_t* stream_words(PhiloxState s, int64_t i0, int64_t n, uint32_t* buf) {
  check_host_state(s, "philox");
  const int64_t first = i0 / 4, skip = i0 % 4;
  const int64_t blocks = (skip + n + 3) / 4;
  for (int64_t b = 0; b < blocks; b += kGroupBlocks)
    philox_words(s.seed, s.offset + static_cast<uint64_t>(first + b), buf + 4 * b);
  return buf + skip;
}

}  // namespace engine::cpu::philox
