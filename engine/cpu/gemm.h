// The CPU GEMM engine behind gemm_kernel (ops/matmul.h): which library multiplies (f32: oneDNN,
// else OpenBLAS, else Eigen, as the build found them; f64: OpenBLAS, else Eigen; ENGINE_CPU_GEMM
// forces one), how a product or a batch is shared out over the OpenMP threads, the AVX-512
// small-GEMM kernel for attention's batches of small products, and the epilogues. Internal to
// libengine: the knobs below are for tests and benchmarks; apps print describe_cpu_compute()
// (engine/threads.h).
#pragma once

#include <cstdint>
#include <string>

namespace engine {

struct GemmArgs;  // engine/gemm_args.h

// The library behind the CPU GEMMs: "oneDNN (f64: OpenBLAS)" (built with both; the default),
// "OpenBLAS" or "Eigen" -- the fastest the build found, or the one ENGINE_CPU_GEMM=onednn|openblas|
// eigen names in the environment.
const char* cpu_gemm_library();

// True when the CPU's f32 batches of small products (attention's) run on the AVX-512 small-GEMM
// kernel (engine/cpu/small_gemm.h) rather than the library: an AVX-512 build, ENGINE_CPU_GEMM
// unset, not turned off below.
bool cpu_small_gemm_active();
// Turns that kernel off (the library multiplies those batches too) or back on, for the whole
// process: for comparisons (bench_ops times both in alternating rounds). Not while GEMMs run.
void set_cpu_small_gemm(bool on);
// Whether that kernel takes an f32 batch of `batch` products C (m x n) = A (m x k) op(B), op(B)
// = B^T when trans_b (as stored, row-major): the others go to the library.
bool cpu_small_gemm_takes(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_b);

// cpu_gemm_library(), plus "; batches of small products: the AVX-512 small-GEMM kernel" while
// that kernel is active.
std::string describe_cpu_gemms();

namespace cpu {

// gemm_kernel's CPU implementation (registered by ops/matmul.cpp): f32 and f64, no c_f32.
void gemm(const GemmArgs& g);

}  // namespace cpu
}  // namespace engine
