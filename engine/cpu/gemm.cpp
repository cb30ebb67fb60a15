// The CPU GEMM engine (see gemm.h): library choice, thread split, small-GEMM kernel, epilogues.
#include "engine/cpu/gemm.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(ENGINE_WITH_OPENBLAS)
#include <cblas.h>
#endif
#if defined(ENGINE_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#endif

#include "engine/cpu/small_gemm.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/gemm_args.h"

namespace engine {
namespace cpu {
namespace {

// Below this many multiply-adds per matrix a batch is spread across threads one whole matrix
// each: Eigen's own threading of a product this small (attention's (T x d) @ (d x T) at T = 128,
// ~1M multiply-adds) costs more in synchronisation than it gains: on 2 cores raising this
// threshold from 64^3 made the attention forward at B=8, H=12, T=128 several times faster
// (docs/benchmarks.md, "Figures behind the code"). Above it, Eigen threads each product itself.
// Either way every element of C is computed by one thread in a fixed order, so results do not
// change from run to run.
constexpr double kSmallGemmWork = 256.0 * 256.0 * 256.0;
// Less total work than this is not worth starting threads for.
constexpr double kMinParallelWork = 32.0 * 32.0 * 32.0;
// A single product with at least this many multiply-adds is split over the threads by rows or
// columns of C (below it, one thread: the tiny model's smallest products, (307 x 128) x (128 x
// 128), take too little time to pay for a parallel region).
constexpr double kSplitWork = 64.0 * 64.0 * 64.0;
// A product whose A is read transposed (op(A) = A^T, A stored k x m) with at least
// kRowBlockFrom rows of C goes through the library in blocks of kRowBlock rows, in one thread or
// shared out over the threads, so each block's slice of A^T stays in cache and the bits do not
// depend on the thread count with oneDNN (whose bits depend on the rows of the call) or OpenBLAS
// (not with Eigen, which rounds differently inside a parallel region). The tied embeddings'
// gradient dE = dlogits^T H, (30522 x 307) x (307 x 128), ran faster in these blocks than as
// halves on 2 threads and than whole on 1 (bench_ops on the AVX2 EPYC, docs/benchmarks.md, "Figures
// behind the code").
constexpr int64_t kRowBlock = 1024;
constexpr int64_t kRowBlockFrom = 4 * kRowBlock;
// A library product with an epilogue (bias, GELU) whose C is over twice kEpilogueChunkBytes goes
// through the library in chunks of C's columns of about that size, each finished by the epilogue
// right after its product, when op(A) is at most kEpilogueChunkMaxA (the library packs it again
// for every chunk). Whole, the epilogue was a second pass through memory: the tiny model's MLM
// decoder logits with their bias, (331 x 30522) at 1 thread, ran ~5% faster in chunks on the
// AVX-512 EPYC (chunks of 128 KB to 1 MB alike; its L2 is 1 MB a core; docs/benchmarks.md, "Figures
// behind the code").
constexpr int64_t kEpilogueChunkBytes = int64_t(256) << 10;
constexpr int64_t kEpilogueChunkMaxA = int64_t(256) << 10;
// cblas takes int sizes; larger dims (never a model's) go through Eigen (whatever the library).
constexpr int64_t kBlasMaxDim = 2147483647;

// cuBLASLt's GELU epilogue: the tanh form (see GemmEpilogue).
template <class T>
T gelu_tanh(T x) {
  const T k = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
  return static_cast<T>(0.5) * x *
         (static_cast<T>(1) + std::tanh(k * (x + static_cast<T>(0.044715) * x * x * x)));
}

// Which library multiplies. f32: oneDNN (its JIT AVX-512 sgemm, OpenMP build, libdnnl-dev) when
// libengine was built with it -- 72-81% of the cores' measured FMA peak on BERT's linear layers'
// products and 57-70% on attention's against OpenBLAS's 64-75% and 47% (docs/benchmarks.md) --
// else OpenBLAS (OpenMP build, libopenblas-openmp-dev), else Eigen. oneDNN has no f64 GEMM: f64
// goes to OpenBLAS, else Eigen. ENGINE_CPU_GEMM=onednn|openblas|eigen picks one (for comparisons).
// Each computes every element of C in one thread in a fixed order: results do not change from run
// to run at a given thread count.
enum class GemmLib { onednn, openblas, eigen };

#if defined(ENGINE_WITH_ONEDNN)
constexpr bool kHaveOnednn = true;
#else
constexpr bool kHaveOnednn = false;
#endif
#if defined(ENGINE_WITH_OPENBLAS)
constexpr bool kHaveOpenblas = true;
#else
constexpr bool kHaveOpenblas = false;
#endif

// True when ENGINE_CPU_GEMM names a library: then it multiplies everything, the batches of small
// products included (for comparisons); unset, those go to the small-GEMM kernel where it exists.
// set_cpu_small_gemm(false) turns the kernel off at run time (benchmarks' paired comparisons).
std::atomic<bool> g_small_gemm_on{true};

bool gemm_lib_forced() {
  static const bool forced = [] {
    const char* e = std::getenv("ENGINE_CPU_GEMM");
    return e && *e;
  }();
  return forced;
}

// The batched small products (attention's, one matrix per thread: see kSmallGemmWork) go to the
// register-tiled AVX-512 kernel (engine/cpu/small_gemm.h) in f32, unless a library is forced: it
// packs only a transposed B, where a library packs both operands for every matrix (QK^T at
// 128 x 128 x 64 per head: 57-69% of the FMA peak through oneDNN's sgemm, docs/benchmarks.md).
// A transposed B is packed into a per-thread k x n panel, capped here at 4 MB. Products under 48
// columns with B as stored stay with the library: the tiny model's P V (128 x 32 x 128 per head)
// ran at 0.91-0.98x of oneDNN's speed on the kernel's 12 x 32 tiles (its q k^T, 128 columns from
// a transposed B, at 1.07-1.11x).
bool small_gemm_on() {
  return cpu::small_gemm_available() && !gemm_lib_forced() &&
         g_small_gemm_on.load(std::memory_order_relaxed);
}

bool small_gemm_takes(bool trans_b, int64_t n, int64_t k, int64_t batch, double work) {
  return batch > 1 && work < kSmallGemmWork && small_gemm_on() &&
         (trans_b ? static_cast<double>(k) * static_cast<double>(n) <= 1024.0 * 1024.0 : n >= 48);
}

template <class T>
bool use_small_gemm(const GemmArgs& g, double work) {
  return std::is_same_v<T, float> && small_gemm_takes(g.trans_b, g.n, g.k, g.batch, work);
}

GemmLib chosen_gemm_lib() {
  static const GemmLib lib = [] {
    const char* e = std::getenv("ENGINE_CPU_GEMM");
    if (!e || !*e)
      return kHaveOnednn ? GemmLib::onednn : kHaveOpenblas ? GemmLib::openblas : GemmLib::eigen;
    if (std::strcmp(e, "onednn") == 0) {
      ENGINE_CHECK(kHaveOnednn, "[gemm] ENGINE_CPU_GEMM=onednn but libengine was built without ",
                   "oneDNN (install libdnnl-dev and reconfigure)");
      return GemmLib::onednn;
    }
    if (std::strcmp(e, "openblas") == 0) {
      ENGINE_CHECK(kHaveOpenblas, "[gemm] ENGINE_CPU_GEMM=openblas but libengine was built ",
                   "without OpenBLAS (install libopenblas-openmp-dev and reconfigure)");
      return GemmLib::openblas;
    }
    ENGINE_CHECK(std::strcmp(e, "eigen") == 0, "[gemm] ENGINE_CPU_GEMM=", e,
                 ": expected onednn, openblas or eigen (unset: the fastest the build has)");
    return GemmLib::eigen;
  }();
  return lib;
}

// The library for products of T: oneDNN multiplies f32 only.
template <class T>
GemmLib gemm_lib_for() {
  const GemmLib lib = chosen_gemm_lib();
  if (lib == GemmLib::onednn && !std::is_same_v<T, float>)
    return kHaveOpenblas ? GemmLib::openblas : GemmLib::eigen;
  return lib;
}

// C = alpha op(A) op(B) + beta C through a library (row-major; the layouts are cuBLAS's: ld >= the
// stored columns, which gemm() in ops/matmul.cpp guarantees).
[[maybe_unused]] void library_gemm(GemmLib lib, const float* a, const float* b, float* c,
                                   const GemmArgs& g) {
#if defined(ENGINE_WITH_ONEDNN)
  if (lib == GemmLib::onednn) {
    // Row-major like cblas. Inside a parallel region (the split below, or a batch spread over the
    // threads) it runs on the calling thread alone.
    const dnnl_status_t st =
        dnnl_sgemm(g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', g.m, g.n, g.k, float(g.alpha), a,
                   g.lda, b, g.ldb, float(g.beta), c, g.ldc);
    ENGINE_CHECK(st == dnnl_success, "[gemm] oneDNN's sgemm failed (status ", int(st), ") on ", g.m,
                 "x", g.k, " @ ", g.k, "x", g.n);
    return;
  }
#endif
#if defined(ENGINE_WITH_OPENBLAS)
  cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
              g.trans_b ? CblasTrans : CblasNoTrans, int(g.m), int(g.n), int(g.k), float(g.alpha),
              a, int(g.lda), b, int(g.ldb), float(g.beta), c, int(g.ldc));
#endif
  (void)lib;
}
[[maybe_unused]] void library_gemm(GemmLib, const double* a, const double* b, double* c,
                                   const GemmArgs& g) {
#if defined(ENGINE_WITH_OPENBLAS)
  cblas_dgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
              g.trans_b ? CblasTrans : CblasNoTrans, int(g.m), int(g.n), int(g.k), g.alpha, a,
              int(g.lda), b, int(g.ldb), g.beta, c, int(g.ldc));
#endif
}

// The columns of C each library call covers (all of them, but for the chunks above): a multiple of
// 16 (a cache line of f32).
int64_t epilogue_chunk_cols(const GemmArgs& g, int64_t elem_size) {
  if (g.epilogue == GemmEpilogue::none || g.batch != 1 ||
      g.m * g.n * elem_size <= 2 * kEpilogueChunkBytes ||
      g.m * g.k * elem_size > kEpilogueChunkMaxA)
    return std::max<int64_t>(g.n, 1);
  return std::max<int64_t>(16, kEpilogueChunkBytes / (g.m * elem_size) / 16 * 16);
}

// OA / OB: Eigen storage order that makes the stored matrix read as op(A) (m x k) / op(B)
// (k x n): row-major as stored, or column-major when the flag asks for the transpose.
template <class T, int OA, int OB>
void gemm_typed(const GemmArgs& g) {
  using MatA = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, OA>;
  using MatB = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, OB>;
  using MatC = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using MapA = Eigen::Map<const MatA, Eigen::Unaligned, Eigen::OuterStride<>>;
  using MapB = Eigen::Map<const MatB, Eigen::Unaligned, Eigen::OuterStride<>>;
  using MapC = Eigen::Map<MatC, Eigen::Unaligned, Eigen::OuterStride<>>;
  const T* pa = static_cast<const T*>(g.a);
  const T* pb = static_cast<const T*>(g.b);
  T* pc = static_cast<T*>(g.c);
  const T alpha = static_cast<T>(g.alpha), beta = static_cast<T>(g.beta);
  const bool fits = g.m <= kBlasMaxDim && g.n <= kBlasMaxDim && g.k <= kBlasMaxDim &&
                    g.lda <= kBlasMaxDim && g.ldb <= kBlasMaxDim && g.ldc <= kBlasMaxDim;
  [[maybe_unused]] const GemmLib lib = fits ? gemm_lib_for<T>() : GemmLib::eigen;

  const double work =
      static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  if (g.batch == 1 && g.trans_a && g.m >= kRowBlockFrom) {
    // Fixed blocks of rows (see kRowBlock), taken by the threads as they come free: with a run of
    // 15 blocks each, one thread once waited a sixth of a dE for the other (one vCPU of a VM runs
    // slower than the other for a while; bench/thread_scaling.py). Inside a parallel region
    // (or on one thread) the calling thread runs them all, in the same blocks: a block's bits do
    // not depend on the thread that runs it.
    const int64_t blocks = (g.m + kRowBlock - 1) / kRowBlock;
    const bool spread = omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (spread)
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t begin = i * kRowBlock;
      GemmArgs s = g;
      s.m = std::min(kRowBlock, g.m - begin);
      s.a = pa + begin;  // op(A) = A^T: C's rows are A's columns
      s.c = pc + begin * g.ldc;
      gemm_typed<T, OA, OB>(s);  // fewer rows than kRowBlockFrom, and no split inside the region
    }
    return;
  }
  if (g.batch == 1 && work >= kSplitWork && omp_get_max_threads() > 1 && !omp_in_parallel()) {
    // One product over the threads: each computes its own slice of C's rows (or of its columns
    // when C is wider than tall), with the library on one thread and the epilogue on its slice.
    // OpenBLAS's own threading split BERT's small products badly: the tiny model's
    // (2048 x 128) x (128 x 128) ran 1.1x faster on 2 threads than on 1.
    const bool by_rows = g.m >= g.n;
    const int64_t len = by_rows ? g.m : g.n;
#pragma omp parallel
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      // Column slices aligned to 16 columns (a cache line of f32: no line of C written by two
      // threads), the last takes the rest. Row slices need no alignment and are balanced to the
      // row: aligned to 16, the MLM decoder's 307 rows split 144 / 163 and dH = dlogits E ran
      // at 83% of the peak on 2 threads against 88-90% split 153 / 154 (bench_ops, the AVX-512
      // EPYC).
      const int64_t align = by_rows ? 1 : 16;
      const int64_t begin = len * t / nt / align * align;
      const int64_t end = t + 1 == nt ? len : len * (t + 1) / nt / align * align;
      if (end > begin) {
        GemmArgs s = g;
        if (by_rows) {
          s.m = end - begin;
          s.a = pa + (g.trans_a ? begin : begin * g.lda);
          s.c = pc + begin * g.ldc;
        } else {
          s.n = end - begin;
          s.b = pb + (g.trans_b ? begin * g.ldb : begin);
          s.c = pc + begin;
          if (g.bias) s.bias = static_cast<const T*>(g.bias) + begin;
        }
        gemm_typed<T, OA, OB>(s);  // inside the region: no further split
      }
    }
    return;
  }

  const bool with_bias =
      g.epilogue == GemmEpilogue::bias || g.epilogue == GemmEpilogue::bias_gelu_tanh;
  const bool with_gelu =
      g.epilogue == GemmEpilogue::gelu_tanh || g.epilogue == GemmEpilogue::bias_gelu_tanh;
  // On C's columns [col, col + c.cols()).
  auto epilogue = [&](MapC& c, int64_t col = 0) {
    if (with_bias)
      c.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(
          static_cast<const T*>(g.bias) + col, c.cols());
    if (with_gelu) c = c.unaryExpr([](T x) { return gelu_tanh(x); });
  };
  const bool small = use_small_gemm<T>(g, work);
  auto one = [&](int64_t i) {
    MapC c(pc + i * g.stride_c, g.m, g.n, Eigen::OuterStride<>(g.ldc));
    if (g.k == 0) {  // an empty sum: C = beta C
      if (g.beta == 0.0)
        c.setZero();
      else
        c *= beta;
      epilogue(c);
      return;
    }
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (lib != GemmLib::eigen) {
        const int64_t cols = epilogue_chunk_cols(g, sizeof(T));
        for (int64_t j = 0; j < g.n; j += cols) {
          GemmArgs s = g;
          s.n = std::min(cols, g.n - j);
          T* cj = pc + i * g.stride_c + j;
          library_gemm(lib, pa + i * g.stride_a, pb + i * g.stride_b + (g.trans_b ? j * g.ldb : j),
                       cj, s);
          MapC c_part(cj, g.m, s.n, Eigen::OuterStride<>(g.ldc));
          epilogue(c_part, j);
        }
        return;
      }
    }
    MapA a(pa + i * g.stride_a, g.m, g.k, Eigen::OuterStride<>(g.lda));
    MapB b(pb + i * g.stride_b, g.k, g.n, Eigen::OuterStride<>(g.ldb));
    if (g.beta == 0.0) {
      c.noalias() = alpha * (a * b);  // C is not read: garbage (even NaN) in it is fine
    } else {
      if (g.beta != 1.0) c *= beta;
      c.noalias() += alpha * (a * b);
    }
    epilogue(c);
  };

  const bool over_batch = g.batch > 1 && work < kSmallGemmWork &&
                          work * static_cast<double>(g.batch) >= kMinParallelWork;
  if constexpr (std::is_same_v<T, float>) {
    if (small) {
      // Each thread takes a contiguous run of the matrices (as schedule(static) would) in one
      // call, so a transposed B that the batch shares is packed once per thread.
#pragma omp parallel if (over_batch)
      {
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t i0 = g.batch * t / nt, i1 = g.batch * (t + 1) / nt;
        if (i1 > i0) {
          cpu::small_gemm_f32(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, pa + i0 * g.stride_a,
                              g.lda, g.stride_a, pb + i0 * g.stride_b, g.ldb, g.stride_b, beta,
                              pc + i0 * g.stride_c, g.ldc, g.stride_c, i1 - i0);
          if (g.epilogue != GemmEpilogue::none)
            for (int64_t i = i0; i < i1; ++i) {
              MapC c(pc + i * g.stride_c, g.m, g.n, Eigen::OuterStride<>(g.ldc));
              epilogue(c);
            }
        }
      }
      return;
    }
  }
  // Inside this region Eigen sees omp_get_num_threads() > 1 and does not nest its own threads.
#pragma omp parallel for schedule(static) if (over_batch)
  for (int64_t i = 0; i < g.batch; ++i) one(i);
}

}  // namespace

void gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  ENGINE_CHECK(!g.c_f32, "[gemm] CPU kernels compute in f32 or f64, got ", dtype_name(g.dtype),
               " operands for an f32 result");
  ENGINE_ASSERT(g.lda >= 1 && g.ldb >= 1 && g.ldc >= g.n && (g.batch == 1 || g.stride_c != 0));
  dispatch_floating(g.dtype, "gemm", [&]<class T>() {
    constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
    if (!g.trans_a && !g.trans_b)
      gemm_typed<T, R, R>(g);
    else if (!g.trans_a && g.trans_b)
      gemm_typed<T, R, C>(g);
    else if (g.trans_a && !g.trans_b)
      gemm_typed<T, C, R>(g);
    else
      gemm_typed<T, C, C>(g);
  });
}

}  // namespace cpu

const char* cpu_gemm_library() {
  switch (cpu::chosen_gemm_lib()) {
    case cpu::GemmLib::onednn:
      return cpu::kHaveOpenblas ? "oneDNN (f64: OpenBLAS)" : "oneDNN (f64: Eigen)";
    case cpu::GemmLib::openblas:
      return "OpenBLAS";
    case cpu::GemmLib::eigen:
      break;
  }
  return "Eigen";
}

bool cpu_small_gemm_takes(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_b) {
  return cpu::small_gemm_takes(trans_b, n, k, batch, double(m) * double(n) * double(k));
}

bool cpu_small_gemm_active() { return cpu::small_gemm_on(); }

void set_cpu_small_gemm(bool on) { cpu::g_small_gemm_on.store(on); }

std::string describe_cpu_gemms() {
  std::string s = cpu_gemm_library();
  if (cpu_small_gemm_active()) s += "; batches of small products: the AVX-512 small-GEMM kernel";
  return s;
}

}  // namespace engine
