// Dropout with a counter-based mask: the keep decision for element i is a pure function of
// (seed, offset, i), so the backward regenerates the mask instead of storing it, and CPU and
// CUDA kernels produce the same mask bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/kernel.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace engine {

// Training: y = x * keep / (1 - p), keep drawn with probability 1 - p per element from
// gen.reserve_words(x.numel()) (the generator's offset advances by ceil(numel / 4) blocks).
// Element i is the row-major index of x's logical layout (x is made contiguous first).
// Identity (returns x itself, consumes no random numbers) when !training or p == 0.
// p == 1 in training returns zeros (gradient zero) and consumes no random numbers.
// p < 0, p > 1 or NaN is an error.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());
// dropout under attention's rule (below; ceil(numel / 8) blocks): the attention probabilities'
// dropout where a model forms them itself (the Shaw term's path), as the attention op draws it.
Tensor attention_dropout(const Tensor& x, double p, bool training,
                         Generator& gen = default_generator());

// The 0/1 keep mask dropout would use for a tensor of `shape` with stream state `state`
// (dtype f32, f64 or u8), computed on `device` by dropout_mask_kernel.
Tensor dropout_mask(const Shape& shape, double p, PhiloxState state, DType dtype = DType::f32,
                    Device device = Device::cpu());

// ---- the keep rule, shared by every backend (host and device code) --------------------------
// "keep iff uniform_from_word(w) >= p" as an exact integer test: uniform_from_word(w) is
// (w >> 8) / 2^24, so it is >= p exactly when (w >> 8) >= ceil(p * 2^24) (p * 2^24 is exact in
// double). Kernels compute the threshold once on the host and compare integers on the device.
inline uint32_t dropout_threshold(double p) {
  return static_cast<uint32_t>(std::ceil(p * 16777216.0));
}
ENGINE_HD bool dropout_keep(uint32_t word, uint32_t threshold) { return (word >> 8) >= threshold; }

// The keep bits of stream elements i .. i + 3: one Philox block when i is a multiple of 4 (a
// kernel's 4-element group of a row whose length is a multiple of 4), else a block per element.
ENGINE_HD void dropout_keep4(PhiloxState s, uint64_t i, uint32_t threshold, bool keep[4]) {
  uint32_t w[4];
  if (i % 4 == 0) {
    philox_block(s.seed, philox_offset(s) + i / 4, w);
  } else {
    for (int q = 0; q < 4; ++q) w[q] = philox_word(s, i + static_cast<uint64_t>(q));
  }
  for (int q = 0; q < 4; ++q) keep[q] = dropout_keep(w[q], threshold);
}

// ---- attention's rule: eight decisions a Philox block ----------------------------------------
// The attention probabilities' dropout (every attention path: the CPU's, the unfused CUDA
// softmax, the fused kernels) takes a 16-bit uniform per element, eight from a Philox block, so
// the fused forward, which draws them among its tensor-core products, draws half the blocks:
// element e of the site keeps iff halfword e % 8 of the block at offset + e / 8 (word (e % 8) / 2,
// its low 16 bits for even e) is >= ceil(p * 2^16); kept elements are scaled by 1 / (1 - p) as
// dropout's. A site of n elements takes ceil(n / 8) blocks (attention_dropout_words(n) words of
// the generator). The keep probability is 1 - ceil(p 2^16) / 2^16: p = 0.1 keeps 0.8999939.
inline uint32_t attention_dropout_threshold(double p) {
  return static_cast<uint32_t>(std::ceil(p * 65536.0));
}
inline uint64_t attention_dropout_words(uint64_t n) { return (n + 1) / 2; }
ENGINE_HD uint32_t philox_halfword(const uint32_t (&w)[4], int k) {
  return (w[k / 2] >> (16 * (k % 2))) & 0xFFFFu;
}
// Whether element e of the site that starts at `s` is kept.
ENGINE_HD bool attention_keep(PhiloxState s, uint64_t e, uint32_t threshold) {
  uint32_t w[4];
  philox_block(s.seed, philox_offset(s) + e / 8, w);
  return philox_halfword(w, static_cast<int>(e % 8)) >= threshold;
}
// The keep bits of elements e .. e + N - 1 (N = 4 or 8): one Philox block when e is a multiple
// of N (a kernel's group of a row whose length is a multiple of N), else a block per element.
template <int N>
ENGINE_HD void attention_keep_run(PhiloxState s, uint64_t e, uint32_t threshold, bool (&keep)[N]) {
  static_assert(N == 4 || N == 8, "runs of 4 or 8 elements");
  if (e % N == 0) {
    uint32_t w[4];
    philox_block(s.seed, philox_offset(s) + e / 8, w);
    const int k0 = static_cast<int>(e % 8);
    for (int q = 0; q < N; ++q) keep[q] = philox_halfword(w, k0 + q) >= threshold;
  } else {
    for (int q = 0; q < N; ++q)
      keep[q] = attention_keep(s, e + static_cast<uint64_t>(q), threshold);
  }
}

// ---- kernels (one table per launch; backends register implementations) ----------------------
// y[i] = dropout_keep(philox_word(state, i), dropout_threshold(p)) ? x[i] / (1 - p) : 0.
// x, y contiguous, same shape and floating dtype; 0 <= p < 1. The backward is this same kernel
// applied to dy with the forward's state.
inline Kernel<void(const Tensor& x, const Tensor& y, double p, PhiloxState state)> dropout_kernel{
    "dropout"};
// mask[i] = keep ? 1 : 0; mask contiguous, f32, f64 or u8.
inline Kernel<void(const Tensor& mask, double p, PhiloxState state)> dropout_mask_kernel{
    "dropout_mask"};
// dropout_kernel with attention's rule: y[i] = attention_keep(state, i,
// attention_dropout_threshold(p)) ? x[i] / (1 - p) : 0 (the CPU attention's forward and backward;
// the CUDA attention kernels apply the rule themselves).
inline Kernel<void(const Tensor& x, const Tensor& y, double p, PhiloxState state)>
    attention_dropout_kernel{"attention_dropout"};

}  // namespace engine
