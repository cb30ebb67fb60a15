// The CUDA GEMM: every matmul, linear and attention product of the engine goes through cuBLASLt
// (tensor cores; no hand-written GEMM). GemmArgs is row-major; cuBLASLt is column-major, so the
// product is computed as C^T (n x m) = op(B)^T (n x k) @ op(A)^T (k x m): a row-major matrix read
// column-major is its transpose, which swaps the operands and keeps the transpose flags. A
// column-major bias of C^T runs along its rows, i.e. one value per row-major column: linear's bias.
//
// Inputs f32 / bf16 / f16 accumulate in f32 (CUBLAS_COMPUTE_32F, f32 alpha / beta); f64 in f64.
// bf16 / f16 inputs may store into an f32 C (GemmArgs::c_f32: a gradient added into the f32
// master's .grad with beta 1, no 16-bit copy of it and no separate add).
// The descriptors are built per call (a few microseconds of host time, against a kernel that
// moves at least the operands) and the algorithm is cuBLASLt's first heuristic choice for them.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/work_counts.h"
#include "engine/error.h"
#include "ops/matmul.h"

namespace engine::cuda {
namespace {

struct LtTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

LtTypes lt_types(DType t) {
  switch (t) {
    case DType::f32:
      return {CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case DType::bf16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    default:
      ENGINE_FAIL("[gemm] the CUDA GEMM takes f32, f64, bf16 or f16, got ", dtype_name(t));
  }
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::gelu_tanh:
      return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::bias_gelu_tanh:
      return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::bias_grad:
      // cuBLASLt's B is our A (see the top of the file): the sums over k of its op, one per
      // column of its column-major D, i.e. one per row of our C
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  ENGINE_FAIL("[gemm] unknown epilogue ", static_cast<int>(e));
}

// Owns the four descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// A column-major layout of rows x cols with leading dim ld, batch_count matrices `stride` apart.
cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                              int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  ENGINE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    ENGINE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof count));
    ENGINE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

// The largest power of two (up to 16) dividing the address: the alignment cuBLASLt may assume.
uint32_t alignment(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 16;
  while (a > 1 && u % a) a /= 2;
  return a;
}

void gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  ENGINE_CHECK(g.m < (int64_t(1) << 31) && g.n < (int64_t(1) << 31) && g.k < (int64_t(1) << 31) &&
                   g.batch < (int64_t(1) << 31),
               "[gemm] dims beyond cuBLASLt's 32-bit range: ", g.m, "x", g.n, "x", g.k, ", batch ",
               g.batch);
  const LtTypes t = lt_types(g.dtype);
  const int device = g.device.index;
  DeviceGuard guard(device);
  DeviceContext& ctx = cublaslt(device);
  const cudaStream_t stream = ctx.compute;
  const size_t elem = dtype_size(g.dtype);
  ENGINE_CHECK(!g.c_f32 || g.dtype == DType::bf16 || g.dtype == DType::f16,
               "[gemm] an f32 result takes bf16 or f16 operands, got ", dtype_name(g.dtype));

  Descriptors d;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, t.compute, t.scale));
  // cuBLASLt's A is our B, its B our A (see the top of the file); the flags carry over.
  const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ENGINE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  ENGINE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  // The bias gradient's elements are C's type (cuBLASLt's contract): f32 sums need an f32 C;
  // otherwise the product runs without the epilogue and the sums are left to the caller
  // (bias_grad_done stays false).
  const bool bias_grad =
      g.epilogue == GemmEpilogue::bias_grad && (g.c_f32 || g.dtype == DType::f32) && g.batch == 1;
  const GemmEpilogue e =
      g.epilogue == GemmEpilogue::bias_grad && !bias_grad ? GemmEpilogue::none : g.epilogue;
  const cublasLtEpilogue_t epi = lt_epilogue(e);
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    ENGINE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (e == GemmEpilogue::bias || e == GemmEpilogue::bias_gelu_tanh ||
        e == GemmEpilogue::bias_grad) {
      ENGINE_CHECK(g.bias, "[gemm] a bias epilogue without a bias pointer");
      ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &g.bias, sizeof g.bias));
      // A bias in the operands' type; a bias gradient in C's (f32 here).
      const cudaDataType_t bias_type = e == GemmEpilogue::bias_grad ? CUDA_R_32F : t.data;
      ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                         &bias_type, sizeof bias_type));
    }
  }
  // Column-major shapes: op(A_lt) is n x k, op(B_lt) is k x m, C is n x m.
  d.a = g.trans_b ? layout(t.data, g.k, g.n, g.ldb, g.batch, g.stride_b)
                  : layout(t.data, g.n, g.k, g.ldb, g.batch, g.stride_b);
  d.b = g.trans_a ? layout(t.data, g.m, g.k, g.lda, g.batch, g.stride_a)
                  : layout(t.data, g.k, g.m, g.lda, g.batch, g.stride_a);
  // C (and D, the same matrix) in f32 for a 16-bit product accumulated into an f32 tensor.
  d.c = layout(g.c_f32 ? CUDA_R_32F : t.data, g.n, g.m, g.ldc, g.batch, g.stride_c);

  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  ENGINE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &ctx.lt_workspace_bytes, sizeof ctx.lt_workspace_bytes));
  const uint32_t align_a = alignment(g.b), align_b = alignment(g.a), align_c = alignment(g.c);
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c));

  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  // The bias-gradient epilogue dropped: the product alone, the sums left to the caller.
  auto drop_bias_grad = [&] {
    const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
    ENGINE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof none));
    const void* no_bias = nullptr;
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &no_bias, sizeof no_bias));
    found = 0;
  };
  bool fused = bias_grad;
  if (fused) {
    // No algorithm with the epilogue for this problem (cuBLASLt answers NOT_SUPPORTED or none).
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.op, d.a, d.b, d.c, d.c,
                                                             d.pref, 1, &heuristic, &found);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      drop_bias_grad();
      fused = false;
    }
  }
  auto choose = [&] {
    if (found == 0)
      ENGINE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.op, d.a, d.b, d.c, d.c, d.pref,
                                                         1, &heuristic, &found));
    ENGINE_CHECK(found > 0, "[gemm] cuBLASLt has no algorithm for ", g.m, "x", g.n, "x", g.k,
                 " (batch ", g.batch, ", ", dtype_name(g.dtype), ", lda ", g.lda, ", ldb ", g.ldb,
                 ", ldc ", g.ldc, ", ", elem, "-byte elements)");
  };
  choose();

  const double alpha64 = g.alpha, beta64 = g.beta;
  const float alpha32 = static_cast<float>(g.alpha), beta32 = static_cast<float>(g.beta);
  const bool f64 = t.scale == CUDA_R_64F;
  // With beta == 0, C is not read (cuBLASLt's contract, as GemmArgs'): D = C in place.
  auto run = [&] {
    return cublasLtMatmul(ctx.lt, d.op, f64 ? static_cast<const void*>(&alpha64) : &alpha32, g.b,
                          d.a, g.a, d.b, f64 ? static_cast<const void*>(&beta64) : &beta32, g.c,
                          d.c, g.c, d.c, &heuristic.algo, ctx.lt_workspace, ctx.lt_workspace_bytes,
                          stream);
  };
  count_gemm();
  cublasStatus_t st = run();
  if (fused && st == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The heuristic offered an algorithm the call then refused (nothing was enqueued): the
    // product alone.
    drop_bias_grad();
    fused = false;
    choose();
    st = run();
  }
  ENGINE_CUBLAS_CHECK(st);
  if (fused && g.bias_grad_done) *g.bias_grad_done = true;
}

}  // namespace

ENGINE_REGISTER_KERNEL(gemm_kernel, DeviceType::CUDA, gemm);

}  // namespace engine::cuda
