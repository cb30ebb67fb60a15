// A register-tiled f32 GEMM for the small products of a batch (attention's q k^T, P v and their
// gradients: 128 x 128 x 64 per head at BERT's T = 128). A library GEMM packs both operands for
// every such call, which costs as much as a tenth of the product; this kernel reads op(B)'s rows
// where they are stored (row-major B) and packs only a transposed B (k^T, v^T: 16 x 16 register
// transposes into a per-thread panel), then runs 6-row x 64-column tiles of accumulators over the
// whole k with A's elements broadcast from where they are stored (either layout). Each element
// of C is one thread's fixed-order sum over k: results do not change from run to run.
// AVX-512 builds only (small_gemm_available() says so); elsewhere the library GEMM runs.
#pragma once

#include <cstdint>

namespace engine::cpu {

// True when this build has the kernel (compiled with AVX-512F).
bool small_gemm_available();

// For e < batch: C_e (m x n) = alpha op(A_e) (m x k) op(B_e) (k x n) + beta C_e, row-major with
// the GEMM table's conventions (engine's GemmArgs): A_e = a + e stride_a is stored (m x k) with
// leading dim lda, or (k x m) when trans_a; B_e = b + e stride_b (k x n) with ldb, or (n x k) when
// trans_b; C_e = c + e stride_c (m x n) with ldc >= n. A stride of 0 shares that operand. beta ==
// 0: C is written without being read. k == 0 gives beta C. The matrices run in order on the
// calling thread (a shared transposed B is packed once). Only where small_gemm_available().
void small_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                    int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c,
                    int64_t batch);

}  // namespace engine::cpu
