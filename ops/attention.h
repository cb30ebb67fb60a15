// Scaled dot-product attention as one op for the models: scores, an additive bias shared over
// the batch (TUPE's positional term, T5 buckets), a key padding mask, softmax, dropout on the
// probabilities and the mixing of values, with a hand-written backward.
#pragma once

#include <optional>

#include "engine/rng.h"
#include "engine/tensor.h"

namespace engine {

// When the attention op takes its fused kernels: `always` (the default) wherever they fit;
// `without_dropout` only when no dropout is drawn; `never`: the unfused kernels, the reference
// the fused ones are checked against.
enum class FusedAttention { never, without_dropout, always };
// The process's default: set_default_fused_attention's last value, else the environment variable
// ENGINE_FUSED_ATTENTION (never, without_dropout, always; another value is an error naming it),
// else always.
FusedAttention default_fused_attention();
void set_default_fused_attention(FusedAttention mode);

struct AttentionOptions {
  // Multiplies q k^T; 0 means 1/sqrt(d_head). TUPE uses 1/sqrt(2 d_head).
  double scale = 0.0;
  // Optional additive logits, broadcastable to (B, H, Tq, Tk): typically (1, H, Tq, Tk), computed
  // once per forward and shared by the batch (never expanded in memory). Its gradient is summed
  // over the broadcast dims. In q's dtype (after autocast) or f32: the fused kernels read an f32
  // bias as it is and return its gradient in f32, added in place into the gradient the other
  // layers sharing it have already summed (no cast or add a layer); the unfused path casts it.
  Tensor bias;
  // Optional (B, Tk), any dtype: nonzero = attend to that key, zero = padding.
  Tensor key_mask;
  // Dropout on the attention probabilities (only when training and p > 0).
  double dropout_p = 0.0;
  bool training = false;
  Generator* generator = nullptr;  // default_generator() when null
  // Whether the fused kernels (ops/flash_attention.h: no (B, H, Tq, Tk) tensor in memory) run
  // where they fit (a device, bf16 / f16, a head width of 32, 64 or 128, a bias shared by the
  // batch); unset: default_fused_attention().
  std::optional<FusedAttention> fused;
};

// q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv)
//   out = dropout(softmax(scale * q k^T + bias, key_mask)) v
// the dropout under attention's rule (ops/dropout.h: ceil(B H Tq Tk / 8) blocks of the generator,
// the same mask on every path and backend). A query row whose keys are all masked outputs zeros.
// Unfused, it saves q, k, v and the probabilities (and on a device the dropped probabilities);
// fused, q, k, v, the output and one log-sum-exp per query row, and the backward makes the
// probabilities and the dropout mask again.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionOptions& options = {});

// Shaw et al.'s clipped relative positions inside attention (the learned_rpe / sin_rpe presets):
// key j of query i falls in bucket c(i, j) = clamp(j - i, -clip, clip) + clip of R = 2 clip + 1,
// each with a relative vector a_r (the rows of `table`, (R, D)), and
//   logits_ij = scale (q_i . (k_j + a_c(i,j))) + bias_ij          (the key term)
//   out_i     = sum_j P_d,ij (v_j + a_c(i,j))                      (the value term)
// with P_d = dropout(softmax(logits)). Differentiable in q, k, v, the bias and the table. On a
// device in bf16 / f16 the fused kernels run it (no (B, H, Tq, Tk) or (Tq, Tk, D) tensor; q A^T
// and the probabilities' sums per bucket made inside them; R <= kFlashMaxRelBuckets,
// ops/flash_attention.h); elsewhere the composed ops (q A^T through relative_gather, softmax,
// attention_dropout, relative_scatter: the reference), with the same dropout mask.
struct RelativeTerms {
  int64_t clip = 0;                 // >= 1
  Tensor table;                     // (2 clip + 1, D), D = q's and v's head width
  bool keys = true, values = true;  // which terms (Shaw: both)
  // Optional: the (Tq, Tk) i64 bucket map c(i, j) and relative_index_inverse(index, R), which the
  // composed path reads (a model keeps them as constants of a length); made here when absent.
  Tensor index, inverse;
};
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                 const RelativeTerms& relative);

}  // namespace engine
