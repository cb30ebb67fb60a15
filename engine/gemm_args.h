// One strided-batched GEMM as the backends' GEMM kernels take it (gemm_kernel, ops/matmul.h): a
// description of the product, not an op, so the CPU GEMM engine (engine/cpu/gemm.h) and the CUDA
// backend read it without naming an op.
#pragma once

#include <cstdint>

#include "engine/device.h"
#include "engine/dtype.h"

namespace engine {

// What a GEMM applies to its result before storing it (cuBLASLt's epilogues): a bias per column
// of C (bias[j] added to C[:, j], e.g. linear's bias), then optionally GELU in its tanh form
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -- the form cuBLASLt's GELU epilogue computes
// (the erf form, which the gelu op and BERT use, differs by up to ~1e-3).
// bias_grad: besides the product, the sums over k of op(A)'s rows (m values, one per row of C:
// a linear's bias gradient, op(A) = dY^T) written in f32 to `bias` (cuBLASLt's bias-gradient
// epilogue); only with trans_a and an unbatched product. A backend without it leaves
// bias_grad_done false and the caller sums them itself.
enum class GemmEpilogue : uint8_t { none, bias, gelu_tanh, bias_gelu_tanh, bias_grad };

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
  // every row of C (one per column), used by the bias epilogues only; with bias_grad, m f32
  // elements written, and *bias_grad_done set to true by a backend that wrote them.
  GemmEpilogue epilogue = GemmEpilogue::none;
  const void* bias = nullptr;
  bool* bias_grad_done = nullptr;
  DType dtype = DType::f32;  // A's and B's (and C's unless c_f32)
  // C is f32 while A and B are bf16 / f16: a 16-bit product accumulated in f32 into an f32
  // tensor (beta 1: a gradient added into an f32 master's .grad). No epilogue but bias_grad.
  // CUDA only.
  bool c_f32 = false;
  // Which device the pointers live on: a CUDA implementation picks its handle and stream by it
  // (the table itself dispatches on the device type only).
  Device device = Device::cpu();
};

}  // namespace engine
