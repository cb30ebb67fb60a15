// Matrix products: matmul (NumPy-style batched/broadcast), linear (x W^T + b, PyTorch layout),
// and the raw strided-batched GEMM they share with other ops (attention).
#pragma once

#include <cstdint>

#include "engine/gemm_args.h"
#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

// a (..., M, K) @ b (..., K, N) -> (..., M, N), batch dims broadcast NumPy-style (2-D @ 3-D,
// (2, 1, M, K) @ (1, 4, K, N), ...). 1-D operands follow NumPy: a (K) is treated as (1, K) and
// b (K) as (K, 1), and the added dim is dropped from the result. Transposed views (last two dims
// swapped) are passed to the GEMM as they are, not copied.
Tensor matmul(const Tensor& a, const Tensor& b);

// x (..., in), weight (out, in), bias (out) or undefined -> (..., out) = x weight^T + bias.
// The leading dims of x are folded into one GEMM, forward and backward.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// Raw GEMM on existing tensors, outside autograd (for ops that build their own backward):
//   c[i] = epilogue(alpha * op(a[i]) @ op(b[i]) + beta * c[i])
// where op(t) is t^T over the last two dims when the flag is set. a, b and c are 2-D (rows, cols)
// or 3-D (batch, rows, cols); a 2-D operand or a 3-D one with batch 1 is shared by every batch
// item of c. Each operand needs stride 1 in its last dim (row-major) or its second-last dim (a
// transposed view) and a single batch stride; c must not alias a or b. With beta == 0, c is
// not read (it may hold garbage). a, b and c share a dtype, except that bf16 / f16 a and b may
// write an f32 c (on CUDA, without an epilogue but bias_grad: f32 accumulation stored in f32).
// With a bias epilogue, `bias` is a contiguous (n) tensor of c's dtype and device, and c must be
// row-major. With bias_grad (a linear's weight and bias gradients at once: a = dY read
// transposed, 2-D and contiguous), `bias` is a contiguous (m) f32 tensor on c's device into
// which the sums of op(a)'s rows (dY's column sums) are added (written, with bias_grad_add
// false: its values are not read): from the GEMM's epilogue where cuBLASLt has one for the
// problem, by column_sums_add otherwise (and on the CPU).
// Throws "[gemm] ..." for anything else.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          double alpha = 1.0, double beta = 0.0, GemmEpilogue epilogue = GemmEpilogue::none,
          const Tensor& bias = Tensor(), bool bias_grad_add = true);

// ---- kernels (one table per launch; backends register implementations) ----------------------

// GemmArgs, the description of one strided-batched GEMM, is engine/gemm_args.h.

// The performance model's cost of one GEMM call (engine/work_log.h): A, B (once each when shared
// by the batch, stride 0), C written (and read when beta != 0), the bias; 2 m n k FLOPs per batch
// entry.
void add_work_cost(WorkCost& cost, const GemmArgs& g);

// Called as gemm_kernel(device, args).
inline Kernel<void(const GemmArgs& args)> gemm_kernel{"gemm"};

}  // namespace engine
