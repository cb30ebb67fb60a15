// Fused softmax cross-entropy over class logits with ignored targets (masked positions).
#pragma once

#include <cstdint>

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

enum class Reduction : uint8_t { none, sum, mean };

// logits (N, C), targets (N) i32/i64 -> loss_i = logsumexp(logits_i) - logits_i[targets_i],
// 0 for rows whose target == ignore_index. mean: sum / (rows not ignored), 0 when every row is
// ignored; sum: () ; none: the per-row losses (N). Targets outside [0, C) other than
// ignore_index are an error.
//
// Fused: the forward keeps only the per-row logsumexp (N), never the (N, C) softmax; the
// backward recomputes softmax from the logits: dlogits_i = (softmax_i - onehot_i) * dloss_i.
// Under autocast the loss is f32; 16-bit logits on a device are read as they are (no (N, C) f32
// copy), with the bits of casting them first; their gradient comes back in their dtype.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean);

// ---- kernels (one table per launch; backends register implementations) ----------------------

// logits (N, C) f32/f64 (bf16/f16 on devices that compute them), targets (N) i32/i64, every
// target in [0, C) or == ignore_index (checked on the host for CPU tensors; a device kernel
// must not read out of bounds). Writes lse (N, f32 for half logits, else the logits dtype),
// count () i64 = rows not ignored, and out: (N) per-row losses for none, () sum or mean (0
// when count == 0) otherwise, in the logits dtype, or in f32 for bf16 / f16 logits (autocast's
// loss in f32: the bits of converting the logits to f32 first). All contiguous.
inline Kernel<void(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                   Reduction reduction, const Tensor& lse, const Tensor& count, const Tensor& out)>
    cross_entropy_forward_kernel{"cross_entropy"};
// grad_logits (N, C) = (exp(logits - lse) - onehot(targets)) * w_i with w_i = grad_out[i]
// (none), grad_out (sum) or grad_out / count (mean); zero rows where targets == ignore_index.
// grad_out has out's shape and dtype, grad_logits the logits'; all contiguous.
inline Kernel<void(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                   const Tensor& count, const Tensor& grad_out, int64_t ignore_index,
                   Reduction reduction, const Tensor& grad_logits)>
    cross_entropy_backward_kernel{"cross_entropy_backward"};

}  // namespace engine
