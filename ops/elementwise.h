// Elementwise ops: add/sub/mul/div with NumPy broadcasting, scalar scale/shift, GELU (erf form),
// tanh, and sin/cos (for sinusoidal position encodings with learnable frequencies). Operators
// +, -, *, / map onto them.
#pragma once

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);                // alpha * x
Tensor affine(const Tensor& x, double alpha, double beta);  // alpha * x + beta
Tensor gelu(const Tensor& x);  // x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
// gelu(x + bias), bias (n) added along x's last dim (..., n): a linear layer's bias and the GELU
// after it (BERT's FFN, the MLM head's transform) as one op -- linear(x, w) without its bias, then
// this. Forward reads x once and writes y; backward reads x and dy once, writes dx and sums the
// bias gradient in the same pass (rows in fixed chunks: the same bits at any thread count).
// Separately, the bias epilogue, gelu, gelu's backward and the bias's sum_to pass over the (rows,
// n) activations 9 times; fused 6 (the GEMM's write included). (Where the bias's gradient comes
// from the weight gradient's GEMM -- gemm's bias_grad epilogue, a device under 16-bit autocast --
// linear with its bias and gelu make 6 too, with no column sums: the model takes that there.)
Tensor bias_gelu(const Tensor& x, const Tensor& bias);
Tensor tanh(const Tensor& x);
// Inside namespace engine these hide std::sin/std::cos for unqualified calls: kernels and other
// scalar code here must write std::sin, std::cos.
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return scale(x, -1.0); }
inline Tensor operator*(const Tensor& x, double s) { return scale(x, s); }
inline Tensor operator*(double s, const Tensor& x) { return scale(x, s); }
inline Tensor operator/(const Tensor& x, double s) { return scale(x, 1.0 / s); }
inline Tensor operator+(const Tensor& x, double s) { return affine(x, 1.0, s); }
inline Tensor operator-(const Tensor& x, double s) { return affine(x, 1.0, -s); }

// ---- kernels (one table per launch; backends register implementations) ----------------------
enum class BinaryOp : uint8_t { add, sub, mul, div };
enum class UnaryOp : uint8_t { gelu, tanh, sin, cos };
// The op's name ("add", "gelu", ...) for error messages, shared by the backends' kernels.
const char* binary_name(BinaryOp op);
const char* unary_name(UnaryOp op);

// out = a (op) b; a and b are already expanded to out's shape (stride-0 broadcast views).
inline Kernel<void(BinaryOp, const Tensor& a, const Tensor& b, const Tensor& out)> binary_kernel{
    "binary"};
// out = alpha * x + beta
inline Kernel<void(const Tensor& x, double alpha, double beta, const Tensor& out)> affine_kernel{
    "affine"};
inline Kernel<void(UnaryOp, const Tensor& x, const Tensor& y)> unary_kernel{"unary"};
// grad_x = grad_y * f'(.) where `saved` is y for tanh (1 - y^2 needs only the output) and x for
// the others.
inline Kernel<void(UnaryOp, const Tensor& saved, const Tensor& grad_y, const Tensor& grad_x)>
    unary_backward_kernel{"unary_backward"};
// y = gelu(x + bias); x and y contiguous (rows, n) of one dtype, bias contiguous (n).
inline Kernel<void(const Tensor& x, const Tensor& bias, const Tensor& y)> bias_gelu_kernel{
    "bias_gelu"};
// dx = dy * gelu'(x + bias), and grad_bias = the sum of dx over the rows when defined. The CPU:
// the rows split into min(rows, kBiasGeluChunks) chunks fixed by the row count, each chunk's dx
// (before rounding to a half type) summed in row order from 0 in the compute type (f32; f64 for
// f64), then the chunk sums in order in double. CUDA: column_sums' fixed order (the same bits on
// every run, within the compute type's rounding of the CPU's). All contiguous. For a bf16 / f16
// problem grad_bias may be f32 (the f32 .grad behind autocast's cast of the bias): the sums are
// added into it in f32 (devices; the CPU kernels compute in f32 only).
inline constexpr int64_t kBiasGeluChunks = 64;
inline Kernel<void(const Tensor& x, const Tensor& bias, const Tensor& grad_y, const Tensor& grad_x,
                   const Tensor& grad_bias)>
    bias_gelu_backward_kernel{"bias_gelu_backward"};

}  // namespace engine
