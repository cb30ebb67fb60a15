// Softmax (with an optional additive bias and keep-mask, the attention-score form) and
// log-softmax, both along the last axis.
#pragma once

#include "engine/kernel.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace engine {

// softmax(x + bias) along the last axis, with masked positions excluded.
//   x:    floating, any shape (..., N)                       e.g. scores (B, H, T, T)
//   bias: optional, x's dtype, broadcastable to x             e.g. positional bias (1, H, T, T)
//         (read through a stride-0 view: never materialised per batch)
//   mask: optional, any dtype, broadcastable to x; nonzero keeps a position, zero masks it
//         e.g. key padding mask (B, 1, 1, T)
// Masked positions output 0. A row with no kept position (every position masked, or every kept
// logit -inf) outputs all zeros rather than NaN, so padded query rows stay harmless.
// Gradients flow to x and bias (reduced to bias's shape); the mask gets none.
Tensor softmax(const Tensor& x, const Tensor& bias = Tensor(), const Tensor& mask = Tensor());

// log(softmax(x)) along the last axis, computed as x - max - log(sum(exp(x - max))).
Tensor log_softmax(const Tensor& x);

// ---- raw helpers (no autograd; for fused ops such as attention) -----------------------------
// Checks the arguments like softmax() does, expands bias and mask to x's shape as stride-0 views
// and launches softmax_forward_kernel. x is made contiguous if it is not; y must be a contiguous
// tensor of x's shape, dtype and device, and may be x itself (in place).
void softmax_forward_raw(const Tensor& x, const Tensor& bias, const Tensor& mask, const Tensor& y);
// dx = y * (dy - sum(dy * y)) per row. y contiguous; dy is made contiguous; dx contiguous of y's
// shape and dtype; dx may be dy itself (in place).
void softmax_backward_raw(const Tensor& y, const Tensor& dy, const Tensor& dx);

// The attention form, one kernel each way (the attention op's scores -> probabilities step):
//   probs   = softmax(scale * x + bias, mask)   (scale * x rounded on its own first)
//   dropped = dropout(probs, p, state)          (when dropped is defined; element i of the
//             Philox stream is the flat index into probs, as dropout_kernel draws it)
// Arguments as for softmax_forward_raw; probs (and dropped) contiguous of x's shape; probs may
// be x. The backward takes dpd, the gradient with respect to dropped (or probs when p == 0):
//   ds = probs * (dP - sum(dP * probs)) with dP = dropout(dpd, p, state) (dpd itself at p = 0);
// ds may be dpd (in place). `dropped`: the forward's dropped probabilities when the caller kept
// them, else undefined. A backend may take the mask from them instead of drawing it again: an
// element with probs > 0 was kept iff its dropped value is nonzero (scaled up, never to 0), and
// one with probs == 0 adds nothing either way -- the same dS bit for bit.
void attention_softmax_raw(const Tensor& x, double scale, const Tensor& bias, const Tensor& mask,
                           double p, PhiloxState state, const Tensor& probs, const Tensor& dropped);
void attention_softmax_backward_raw(const Tensor& probs, const Tensor& dpd, double p,
                                    PhiloxState state, const Tensor& ds,
                                    const Tensor& dropped = Tensor());

// ---- kernels (one table per launch; backends register implementations) ----------------------
// y = softmax(x + bias) over the last dim with masked positions set to 0 and rows without a kept
// position set to 0. x, y: contiguous, same shape (..., N) and floating dtype; y may alias x.
// bias: undefined, or a view of x's shape and dtype with any strides (stride 0 on broadcast
// dims). mask: undefined, or a view of x's shape with any strides and any dtype (u8, i32, i64,
// f32, f64, bf16, f16); nonzero keeps.
inline Kernel<void(const Tensor& x, const Tensor& bias, const Tensor& mask, const Tensor& y)>
    softmax_forward_kernel{"softmax"};
// dx = y * (dy - sum(dy * y)) per row; all contiguous, same shape and dtype; dx may alias dy.
inline Kernel<void(const Tensor& y, const Tensor& dy, const Tensor& dx)> softmax_backward_kernel{
    "softmax_backward"};
// y = x - max - log(sum(exp(x - max))) per row; contiguous, same shape and dtype.
inline Kernel<void(const Tensor& x, const Tensor& y)> log_softmax_forward_kernel{"log_softmax"};
// dx = dy - exp(y) * sum(dy) per row; all contiguous, same shape and dtype; dx may alias dy.
inline Kernel<void(const Tensor& y, const Tensor& dy, const Tensor& dx)>
    log_softmax_backward_kernel{"log_softmax_backward"};

// The attention form (see attention_softmax_raw): x, probs, dropped contiguous; bias and mask
// as for softmax_forward_kernel; dropped undefined when there is no dropout (0 <= p < 1).
inline Kernel<void(const Tensor& x, double scale, const Tensor& bias, const Tensor& mask, double p,
                   PhiloxState state, const Tensor& probs, const Tensor& dropped)>
    attention_softmax_forward_kernel{"attention_softmax"};
// ds = probs * (dP - sum(dP * probs)), dP = dropout(dpd) when p > 0; all contiguous; ds may
// alias dpd. dropped: the forward's dropped probabilities or undefined (see
// attention_softmax_backward_raw; the CPU draws the mask again either way).
inline Kernel<void(const Tensor& probs, const Tensor& dpd, double p, PhiloxState state,
                   const Tensor& ds, const Tensor& dropped)>
    attention_softmax_backward_kernel{"attention_softmax_backward"};

}  // namespace engine
