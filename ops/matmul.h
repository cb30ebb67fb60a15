// Matrix products: matmul (NumPy-style batched/broadcast), linear (x W^T + b, PyTorch layout),
// and the raw strided-batched GEMM they share with other ops (attention).
#pragma once

#include <cstdint>

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

// What a GEMM applies to its result before storing it (cuBLASLt's epilogues): a bias per column
// of C (bias[j] added to C[:, j], e.g. linear's bias), then optionally GELU in its tanh form
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -- the form cuBLASLt's GELU epilogue computes
// (the erf form, which the gelu op and BERT use, differs by up to ~1e-3).
enum class GemmEpilogue : uint8_t { none, bias, gelu_tanh, bias_gelu_tanh };

// Raw GEMM on existing tensors, outside autograd (for ops that build their own backward):
//   c[i] = epilogue(alpha * op(a[i]) @ op(b[i]) + beta * c[i])
// where op(t) is t^T over the last two dims when the flag is set. a, b and c are 2-D (rows, cols)
// or 3-D (batch, rows, cols); a 2-D operand or a 3-D one with batch 1 is shared by every batch
// item of c. Each operand needs stride 1 in its last dim (row-major) or its second-last dim (a
// transposed view) and a single batch stride; c must not alias a or b. With beta == 0, c is
// not read (it may hold garbage). a, b and c share a dtype, except that bf16 / f16 a and b may
// write an f32 c (on CUDA, without an epilogue: f32 accumulation stored in f32). With a bias
// epilogue, `bias` is a contiguous (n) tensor of c's dtype and device, and c must be row-major.
// Throws "[gemm] ..." for anything else.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          double alpha = 1.0, double beta = 0.0, GemmEpilogue epilogue = GemmEpilogue::none,
          const Tensor& bias = Tensor());

// ---- kernels (one table per launch; backends register implementations) ----------------------

// Strided-batched GEMM in row-major terms (the CUDA backend maps it to column-major cuBLASLt by
// computing C^T = op(B)^T op(A)^T, which swaps the operands and keeps the flags):
//   for i < batch: C[i] (m x n) = alpha * op(A[i]) (m x k) @ op(B[i]) (k x n) + beta * C[i]
// A[i] = a + i * stride_a (in elements); stride_a/stride_b may be 0 (one matrix shared by the
// batch), stride_c may not. lda/ldb/ldc are row-major leading dims of the matrices as stored:
// A is stored (m x k) when !trans_a, (k x m) when trans_a, and its ld is at least its stored
// column count (>= 1). When beta == 0, C is written without being read.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;
  double alpha = 1.0, beta = 0.0;
  // Applied to C[i] = alpha op(A[i]) op(B[i]) + beta C[i]; bias: n elements of `dtype`, added to
  // every row of C (one per column), used by the bias epilogues only.
  GemmEpilogue epilogue = GemmEpilogue::none;
  const void* bias = nullptr;
  DType dtype = DType::f32;  // A's and B's (and C's unless c_f32)
  // C is f32 while A and B are bf16 / f16: a 16-bit product accumulated in f32 into an f32
  // tensor (beta 1: a gradient added into an f32 master's .grad). No epilogue. CUDA only.
  bool c_f32 = false;
  // Which device the pointers live on: a CUDA implementation picks its handle and stream by it
  // (the table itself dispatches on the device type only).
  Device device = Device::cpu();
};

// The performance model's cost of one GEMM call (engine/work_log.h): A, B (once each when shared
// by the batch, stride 0), C written (and read when beta != 0), the bias; 2 m n k FLOPs per batch
// entry.
void add_work_cost(WorkCost& cost, const GemmArgs& g);

// Called as gemm_kernel(device, args).
inline Kernel<void(const GemmArgs& args)> gemm_kernel{"gemm"};

}  // namespace engine
