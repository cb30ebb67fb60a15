// Sampling for ELECTRA's generator: one class per row drawn from softmax(logits / temperature)
// by the Gumbel-max trick on the counter-based stream (so CPU and CUDA draw the same classes and
// a resumed run draws what the uninterrupted one would), and the discriminator's input built from
// the draws. Neither op is differentiable: their results are token ids.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/kernel.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace engine {

// logits (N, C) floating -> (N) i64: argmax_c (logits[i, c] / temperature + g_ic) in f32, the first
// such c on ties, with Gumbel noise g_ic = gumbel_from_word(word i * C + c of the stream), which
// reserves N * C words of `gen`. That argmax is a draw from softmax(logits_i / temperature).
// temperature > 0; C >= 1.
Tensor sample_categorical(const Tensor& logits, double temperature, Generator& gen);

// ELECTRA's discriminator input. ids (B, T) i64; attention_mask (B, T) i64 (1 = token) or
// undefined (every position a token); positions (M) i64, distinct flat indices b * T + t;
// values, original (M) i64. Returns ids with values[k] written at positions[k], and labels
// (B, T) i64: 1 at a position whose written value differs from original[k] (replaced), 0 at
// every other token, -100 at padding.
struct ReplacedTokens {
  Tensor ids, labels;
};
ReplacedTokens replace_tokens(const Tensor& ids, const Tensor& attention_mask,
                              const Tensor& positions, const Tensor& values,
                              const Tensor& original);

// -log(-log(u)) with u = ((w >> 8) + 1/2) / 2^24, strictly inside (0, 1): identical on every
// device that rounds logf the same way (the emulator; a GPU's logf may differ in the last bit).
ENGINE_HD float gumbel_from_word(uint32_t w) {
  const float u = (static_cast<float>(w >> 8) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(-logf(u));
}

// ---- kernels (one table per launch; backends register implementations) ----------------------

// out (N) i64 = the argmax above, logits (N, C) contiguous, words from `state` (word i * C + c).
inline Kernel<void(const Tensor& logits, double temperature, PhiloxState state, const Tensor& out)>
    sample_categorical_kernel{"sample_categorical"};
// out_ids, out_labels (B, T) i64 as replace_tokens describes; attention_mask may be undefined;
// all contiguous; positions in [0, B * T) (a device kernel must not write out of bounds).
inline Kernel<void(const Tensor& ids, const Tensor& attention_mask, const Tensor& positions,
                   const Tensor& values, const Tensor& original, const Tensor& out_ids,
                   const Tensor& out_labels)>
    replace_tokens_kernel{"replace_tokens"};

}  // namespace engine
