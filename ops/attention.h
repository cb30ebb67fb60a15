// Scaled dot-product attention as one op for the models: scores, an additive bias shared over
// the batch (TUPE's positional term, T5 buckets), a key padding mask, softmax, dropout on the
// probabilities and the mixing of values, with a hand-written backward.
#pragma once

#include "engine/rng.h"
#include "engine/tensor.h"

namespace engine {

struct AttentionOptions {
  // Multiplies q k^T; 0 means 1/sqrt(d_head). TUPE uses 1/sqrt(2 d_head).
  double scale = 0.0;
  // Optional additive logits, broadcastable to (B, H, Tq, Tk): typically (1, H, Tq, Tk), computed
  // once per forward and shared by the batch (never expanded in memory). Its gradient is summed
  // over the broadcast dims.
  Tensor bias;
  // Optional (B, Tk), any dtype: nonzero = attend to that key, zero = padding.
  Tensor key_mask;
  // Dropout on the attention probabilities (only when training and p > 0).
  double dropout_p = 0.0;
  bool training = false;
  Generator* generator = nullptr;  // default_generator() when null
};

// q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv)
//   out = dropout(softmax(scale * q k^T + bias, key_mask)) v
// A query row whose keys are all masked outputs zeros. Saves q, k, v and the probabilities; the
// dropout mask is regenerated from its Philox state in the backward.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionOptions& options = {});

}  // namespace engine
