// Matrix products: shape/layout checks, autograd wiring for matmul and linear, the raw gemm()
// helper and the CPU GEMM kernel (f32: oneDNN, else OpenBLAS, else Eigen, as the build found them;
// f64: OpenBLAS, else Eigen).
#include "ops/matmul.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#if defined(ENGINE_WITH_OPENBLAS)
#include <cblas.h>
#endif
#if defined(ENGINE_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#endif

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/cpu/small_gemm.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

// ---- layouts ---------------------------------------------------------------------------------

// How the GEMM can read the matrix in the last two dims (rows, cols) of a tensor in place.
struct MatLayout {
  bool ok = false;
  bool transposed = false;  // stored column-major (a transposed view): the GEMM reads t^T
  int64_t ld = 0;           // row-major leading dim of the matrix as stored
};

MatLayout mat_layout(const Tensor& t) {
  const int64_t r = t.size(-2), c = t.size(-1);
  const int64_t sr = t.stride(-2), sc = t.stride(-1);
  // Nothing is read from an empty matrix; any legal ld will do.
  if (t.numel() == 0) return {true, false, std::max<int64_t>(c, 1)};
  // Size-1 dims carry arbitrary strides; they get the smallest legal ld instead (cuBLAS rejects
  // ld < stored columns even when it never steps by it). ld >= cols also rules out overlapping
  // rows (stride-0 broadcast matrices), which BLAS cannot read.
  if ((c == 1 || sc == 1) && (r == 1 || sr >= c)) return {true, false, r == 1 ? c : sr};
  if ((r == 1 || sr == 1) && (c == 1 || sc >= r)) return {true, true, c == 1 ? r : sc};
  return {};
}

// The single stride that steps through dims [begin, end) of (shape, strides) as one flattened
// dim, if there is one. Size-1 dims are skipped; all-size-1 (or empty) ranges give 0.
std::optional<int64_t> collapse_stride(const Shape& shape, const std::vector<int64_t>& strides,
                                       size_t begin, size_t end) {
  std::optional<int64_t> inner;
  int64_t next = 0;  // the stride the next outer non-1 dim must have
  for (size_t d = end; d-- > begin;) {
    if (shape[d] == 1) continue;
    if (!inner) {
      inner = strides[d];
    } else if (strides[d] != next) {
      return std::nullopt;
    }
    next = strides[d] * shape[d];
  }
  return inner.value_or(0);
}

// `t` as is when the GEMM can read its last two dims in place, else a contiguous copy.
Tensor gemm_ready(const Tensor& t) { return mat_layout(t).ok ? t : t.contiguous(); }

// `t` (..., r, c) broadcast to batch + (r, c) and viewed as (B, r, c) with one batch stride.
// No copy when the batch dims collapse to one stride (contiguous batches, or a matrix shared by
// every item); otherwise the broadcast is materialised.
Tensor as_batched(Tensor t, const Shape& batch) {
  t = gemm_ready(t);
  const int64_t r = t.size(-2), c = t.size(-1), nb = shape_numel(batch);
  Shape full = batch;
  full.push_back(r);
  full.push_back(c);
  std::vector<int64_t> st = broadcast_strides(t.shape(), t.strides(), full);
  if (auto bs = collapse_stride(full, st, 0, batch.size()))
    return make_view(t, {nb, r, c}, {*bs, st[st.size() - 2], st.back()}, t.storage_offset());
  Tensor copy = make_view(t, full, st, t.storage_offset()).contiguous();
  return make_view(copy, {nb, r, c}, {r * c, c, 1}, copy.storage_offset());
}

// `t` (..., r, c) viewed as (prod(...) * r, c), one GEMM operand, if its rows collapse to one
// stride in place.
std::optional<Tensor> fold_rows(const Tensor& t) {
  const size_t nd = t.shape().size();
  auto rs = collapse_stride(t.shape(), t.strides(), 0, nd - 1);
  if (!rs) return std::nullopt;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < nd; ++d) rows *= t.shape()[d];
  Tensor v = make_view(t, {rows, t.size(-1)}, {*rs, t.stride(-1)}, t.storage_offset());
  if (!mat_layout(v).ok) return std::nullopt;
  return v;
}

// `t` (..., c) as a 2-D (rows, c) GEMM operand: in place when possible, else copied.
Tensor rows_of(const Tensor& t) {
  if (auto v = fold_rows(t)) return *v;
  Tensor copy = t.contiguous();
  return *fold_rows(copy);
}

Shape batch_dims(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// ---- checks ----------------------------------------------------------------------------------

void check_pair(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  ENGINE_CHECK(a.defined() && b.defined(), "[", op, "] got an undefined input: ", na, " ",
               describe(a), ", ", nb, " ", describe(b));
  ENGINE_CHECK(a.device() == b.device(), "[", op, "] inputs are on different devices: ", na, " ",
               describe(a), ", ", nb, " ", describe(b));
  ENGINE_CHECK(a.dtype() == b.dtype(), "[", op, "] dtype mismatch: ", na, " ", describe(a), ", ",
               nb, " ", describe(b), " (convert one with .to())");
  ENGINE_CHECK(is_floating(a.dtype()), "[", op, "] expects floating tensors, got ", na, " ",
               describe(a), ", ", nb, " ", describe(b));
}

// ---- forward without autograd ----------------------------------------------------------------

// x (..., M, K) @ y (..., K, N), both at least 2-D and detached, shapes already checked.
Tensor matmul_raw(const Tensor& x, const Tensor& y) {
  const int64_t m = x.size(-2), n = y.size(-1);
  const Shape batch = broadcast_shapes(batch_dims(x), batch_dims(y), "matmul");
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  // A 2-D right operand (a weight): fold x's batch into its rows, one (B*M, K) @ (K, N) GEMM,
  // instead of B small ones.
  if (y.dim() == 2 && x.dim() > 2) {
    if (auto x2 = fold_rows(x)) {
      gemm(*x2, false, y, false, make_view(out, {x2->size(0), n}, {n, 1}, 0));
      return out;
    }
  }
  const int64_t nb = shape_numel(batch);
  gemm(as_batched(x, batch), false, as_batched(y, batch), false,
       make_view(out, {nb, m, n}, {m * n, n, 1}, 0));
  return out;
}

// ---- autograd --------------------------------------------------------------------------------

// The f32 .grad behind input i's autocast cast (Node::grad_sink_f32) when the 16-bit gradient g
// can be added into it by the GEMM: on a device whose GEMM stores a 16-bit product in f32 (CUDA).
const Tensor* f32_grad_sink(const Node& node, size_t i, const Tensor& g) {
  if (g.device().is_cpu() || (g.dtype() != DType::bf16 && g.dtype() != DType::f16)) return nullptr;
  return node.grad_sink_f32(i);
}

struct MatmulNode : Node {
  Tensor a;  // (..., M, K), saved when b needs a gradient
  Tensor b;  // (..., K, N), saved when a needs a gradient
  const char* name() const override { return "matmul"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];  // (batch..., M, N)
    Tensor ga, gb;
    if (needs_input_grad(0)) {
      // dA = dC @ B^T; B^T is a transposed view, read in place by the GEMM.
      ga = sum_to_shape(matmul_raw(g, b.transpose(-1, -2)), inputs[0].shape);
    }
    if (needs_input_grad(1)) {
      if (b_is_2d()) {
        // dB = sum over every row of the batch of A^T dC: one (K, B*M) @ (B*M, N) GEMM over
        // the folded rows instead of B products and a reduction; added straight into B's .grad
        // when the engine offers it (beta 1).
        Tensor a2 = rows_of(a);  // (B*M, K)
        Tensor g2 = rows_of(g);  // (B*M, N)
        if (const Tensor* sink = grad_sink(1, g.dtype())) {
          gemm(a2, true, g2, false, *sink, 1.0, 1.0);
        } else if (const Tensor* f32 = f32_grad_sink(*this, 1, g)) {
          gemm(a2, true, g2, false, *f32, 1.0, 1.0);  // 16-bit product added in f32
        } else {
          gb = Tensor::empty(inputs[1].shape, g.dtype(), g.device());
          gemm(a2, true, g2, false, gb);
        }
      } else {
        gb = sum_to_shape(matmul_raw(a.transpose(-1, -2), g), inputs[1].shape);
      }
    }
    return {ga, gb};
  }
  bool b_is_2d() const { return inputs[1].shape.size() == 2; }
  void release_saved() override { a = b = Tensor(); }
};

struct LinearNode : Node {
  Tensor x;       // (..., in)
  Tensor weight;  // (out, in)
  const char* name() const override { return "linear"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor g2 = rows_of(grads[0]);  // (R, out), R = prod of x's leading dims
    const Device dev = g2.device();
    const DType dt = g2.dtype();
    Tensor gx, gw, gbias;
    if (needs_input_grad(0)) {
      gx = Tensor::empty(inputs[0].shape, dt, dev);  // (..., in)
      gemm(g2, false, gemm_ready(weight), false,
           make_view(gx, {g2.size(0), weight.size(1)}, {weight.size(1), 1}, 0));
    }
    if (needs_input_grad(1)) {
      // (out, in) = dY^T X over all rows; added straight into the weight's .grad (beta 1) when the
      // engine offers it: the tied embeddings' 15.6 MB dE of the tiny model then costs no second
      // pass to add it.
      if (const Tensor* sink = grad_sink(1, dt)) {
        gemm(g2, true, rows_of(x), false, *sink, 1.0, 1.0);
      } else if (const Tensor* f32 = f32_grad_sink(*this, 1, g2)) {
        gemm(g2, true, rows_of(x), false, *f32, 1.0, 1.0);  // 16-bit product added in f32
      } else {
        gw = Tensor::empty(inputs[1].shape, dt, dev);
        gemm(g2, true, rows_of(x), false, gw);
      }
    }
    if (needs_input_grad(2)) {
      gbias = sum_to_shape(g2, inputs[2].shape);  // (out): column sums of dY
    }
    return {gx, gw, gbias};
  }
  void release_saved() override { x = weight = Tensor(); }
};

// ---- CPU kernel ------------------------------------------------------------------------------

namespace cpu_gemm {

// Below this many multiply-adds per matrix a batch is spread across threads one whole matrix
// each: Eigen's own threading of a product this small (attention's (T x d) @ (d x T) at T = 128,
// ~1M multiply-adds) costs more in synchronisation than it gains: on 2 cores the attention
// forward at B=8, H=12, T=128 went from 61 ms to 7 ms with this threshold raised from 64^3.
// Above it, Eigen threads each product itself. Either way every element of C is computed by one
// thread in a fixed order, so results do not change from run to run.
constexpr double kSmallGemmWork = 256.0 * 256.0 * 256.0;
// Less total work than this is not worth starting threads for.
constexpr double kMinParallelWork = 32.0 * 32.0 * 32.0;
// A single product with at least this many multiply-adds is split over the threads by rows or
// columns of C (below it, one thread: the tiny model's smallest products, (307 x 128) x (128 x
// 128), take ~30 us).
constexpr double kSplitWork = 64.0 * 64.0 * 64.0;
// A product whose A is read transposed (op(A) = A^T, A stored k x m) with at least
// kRowBlockFrom rows of C goes through the library in blocks of kRowBlock rows, in one thread or
// shared out over the threads, so each block's slice of A^T stays in cache and the bits do not
// depend on the thread count with oneDNN (whose bits depend on the rows of the call) or OpenBLAS
// (not with Eigen, which rounds differently inside a parallel region). The tied embeddings'
// gradient dE = dlogits^T H, (30522 x 307) x (307 x 128), on the AVX2 EPYC (bench_ops, ms):
// 2 threads 25.3-29.7 as halves -> 21.7-23.1 in these blocks; 1 thread 37.6-50.6 whole ->
// 35.7-43.4 (docs/benchmarks.md).
constexpr int64_t kRowBlock = 1024;
constexpr int64_t kRowBlockFrom = 4 * kRowBlock;
// A library product with an epilogue (bias, GELU) whose C is over twice kEpilogueChunkBytes goes
// through the library in chunks of C's columns of about that size, each finished by the epilogue
// right after its product, when op(A) is at most kEpilogueChunkMaxA (the library packs it again
// for every chunk). Whole, the epilogue was a second pass through memory: the tiny model's MLM
// decoder logits with their bias, (331 x 30522) at 1 thread, 13.8 -> 13.1-13.2 ms a call in the
// step on the AVX-512 EPYC (chunks of 128 KB to 1 MB within the noise; its L2 is 1 MB a core).
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
// stored columns, which mat_layout guarantees).
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
    // 15 blocks each, one thread once waited 4.7 ms of a 27 ms dE for the other (one vCPU of a VM
    // runs slower than the other for a while; bench/thread_scaling.py). Inside a parallel region
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

}  // namespace cpu_gemm

ENGINE_REGISTER_KERNEL(gemm_kernel, DeviceType::CPU, cpu_gemm::gemm);

}  // namespace

// ---- public ----------------------------------------------------------------------------------

const char* cpu_gemm_library() {
  switch (cpu_gemm::chosen_gemm_lib()) {
    case cpu_gemm::GemmLib::onednn:
      return cpu_gemm::kHaveOpenblas ? "oneDNN (f64: OpenBLAS)" : "oneDNN (f64: Eigen)";
    case cpu_gemm::GemmLib::openblas:
      return "OpenBLAS";
    case cpu_gemm::GemmLib::eigen:
      break;
  }
  return "Eigen";
}

bool cpu_small_gemm_takes(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_b) {
  return cpu_gemm::small_gemm_takes(trans_b, n, k, batch, double(m) * double(n) * double(k));
}

bool cpu_small_gemm_active() { return cpu_gemm::small_gemm_on(); }

void set_cpu_small_gemm(bool on) { cpu_gemm::g_small_gemm_on.store(on); }

std::string describe_cpu_gemms() {
  std::string s = cpu_gemm_library();
  if (cpu_small_gemm_active()) s += "; batches of small products: the AVX-512 small-GEMM kernel";
  return s;
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          double alpha, double beta, GemmEpilogue epilogue, const Tensor& bias) {
  ENGINE_CHECK(a.defined() && b.defined() && c.defined(), "[gemm] got an undefined tensor: a ",
               describe(a), ", b ", describe(b), ", c ", describe(c));
  ENGINE_CHECK(a.device() == c.device() && b.device() == c.device(),
               "[gemm] tensors are on different devices: a ", describe(a), ", b ", describe(b),
               ", c ", describe(c));
  // One dtype, or 16-bit a and b accumulated into an f32 c (a gradient added straight into an
  // f32 master's .grad; the CUDA GEMM only).
  const bool c_f32 = c.dtype() == DType::f32 && a.dtype() != DType::f32 &&
                     (a.dtype() == DType::bf16 || a.dtype() == DType::f16);
  ENGINE_CHECK(a.dtype() == b.dtype() && (a.dtype() == c.dtype() || c_f32),
               "[gemm] dtype mismatch: a ", describe(a), ", b ", describe(b), ", c ", describe(c),
               " (one dtype, or bf16 / f16 a and b with an f32 c)");
  ENGINE_CHECK(is_floating(c.dtype()), "[gemm] expects floating tensors, got c ", describe(c));
  for (const Tensor* t : {&a, &b, &c})
    ENGINE_CHECK(t->dim() == 2 || t->dim() == 3,
                 "[gemm] expects 2-D (rows, cols) or 3-D (batch, rows, cols) tensors, got a ",
                 describe(a), ", b ", describe(b), ", c ", describe(c));
  const int64_t batch = c.dim() == 3 ? c.size(0) : 1;
  const int64_t m = c.size(-2), n = c.size(-1);
  const int64_t am = trans_a ? a.size(-1) : a.size(-2), k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t bk = trans_b ? b.size(-1) : b.size(-2), bn = trans_b ? b.size(-2) : b.size(-1);
  ENGINE_CHECK(am == m && bk == k && bn == n, "[gemm] shapes do not match: op(a) ", am, "x", k,
               " @ op(b) ", bk, "x", bn, " -> c ", m, "x", n, " (a ", describe(a),
               trans_a ? " transposed" : "", ", b ", describe(b), trans_b ? " transposed" : "",
               ", c ", describe(c), ")");
  auto batch_stride = [&](const Tensor& t, const char* name) -> int64_t {
    if (t.dim() == 2 || t.size(0) == 1) return 0;  // one matrix shared by the batch
    ENGINE_CHECK(t.size(0) == batch, "[gemm] ", name, " ", describe(t), " has batch ", t.size(0),
                 " but c ", describe(c), " has batch ", batch);
    return t.stride(0);
  };
  const int64_t sa = batch_stride(a, "a"), sb = batch_stride(b, "b");
  const int64_t sc = batch_stride(c, "c");
  ENGINE_CHECK(batch <= 1 || sc != 0, "[gemm] c ", describe(c),
               " has batch stride 0: every batch item would write the same matrix");
  const MatLayout la = mat_layout(a), lb = mat_layout(b), lc = mat_layout(c);
  auto check_layout = [](const MatLayout& l, const Tensor& t, const char* name) {
    ENGINE_CHECK(l.ok, "[gemm] ", name, " ", describe(t), " with strides ", shape_str(t.strides()),
                 " is not a matrix the GEMM can read in place: it needs stride 1 in its last "
                 "or second-last dim (call .contiguous() first)");
  };
  check_layout(la, a, "a");
  check_layout(lb, b, "b");
  check_layout(lc, c, "c");

  const bool with_bias = epilogue == GemmEpilogue::bias || epilogue == GemmEpilogue::bias_gelu_tanh;
  ENGINE_CHECK(!c_f32 || epilogue == GemmEpilogue::none,
               "[gemm] an epilogue with 16-bit a and b into an f32 c is not supported");
  if (with_bias) {
    ENGINE_CHECK(bias.defined() && bias.dim() == 1 && bias.size(0) == n && bias.is_contiguous() &&
                     bias.dtype() == c.dtype() && bias.device() == c.device(),
                 "[gemm] the bias epilogue needs a contiguous (", n,
                 ") bias of c's dtype and "
                 "device, got ",
                 describe(bias), " for c ", describe(c));
    ENGINE_CHECK(!lc.transposed, "[gemm] the bias epilogue needs a row-major c, got ", describe(c),
                 " with strides ", shape_str(c.strides()));
  } else {
    ENGINE_CHECK(!bias.defined(), "[gemm] a bias was given without a bias epilogue");
  }
  ENGINE_CHECK(epilogue == GemmEpilogue::none || !lc.transposed,
               "[gemm] an epilogue needs a row-major c, got ", describe(c), " with strides ",
               shape_str(c.strides()));

  GemmArgs g;
  g.epilogue = epilogue;
  g.bias = with_bias ? bias.raw_data() : nullptr;
  g.k = k;
  g.batch = batch;
  g.alpha = alpha;
  g.beta = beta;
  g.dtype = a.dtype();
  g.c_f32 = c_f32;
  g.device = c.device();
  g.c = c.raw_data();
  g.ldc = lc.ld;
  g.stride_c = sc;
  // The flag the kernel sees is the caller's transpose combined with the storage order.
  const bool ta = trans_a != la.transposed, tb = trans_b != lb.transposed;
  if (!lc.transposed) {
    g.m = m, g.n = n;
    g.a = a.raw_data(), g.lda = la.ld, g.stride_a = sa, g.trans_a = ta;
    g.b = b.raw_data(), g.ldb = lb.ld, g.stride_b = sb, g.trans_b = tb;
  } else {
    // c is stored column-major: write C^T (n x m, row-major) = op(B)^T @ op(A)^T.
    g.m = n, g.n = m;
    g.a = b.raw_data(), g.lda = lb.ld, g.stride_a = sb, g.trans_a = !tb;
    g.b = a.raw_data(), g.ldb = la.ld, g.stride_b = sa, g.trans_b = !ta;
  }
  gemm_kernel(c.device(), g);
}

void add_work_cost(WorkCost& cost, const GemmArgs& g) {
  const double e = double(dtype_size(g.dtype)), ec = g.c_f32 ? 4.0 : e;
  const double ba = g.stride_a == 0 ? 1 : double(g.batch),
               bb = g.stride_b == 0 ? 1 : double(g.batch);
  cost.bytes +=
      e * (ba * double(g.m * g.k) + bb * double(g.k * g.n) + (g.bias ? double(g.n) : 0.0)) +
      ec * double(g.batch) * double(g.m * g.n) * (g.beta != 0.0 ? 2 : 1);
  cost.flops += 2.0 * double(g.batch) * double(g.m) * double(g.n) * double(g.k);
  if (!cost.shape.empty()) cost.shape += " ";
  cost.shape += "m" + std::to_string(g.m) + " n" + std::to_string(g.n) + " k" +
                std::to_string(g.k) + " batch" + std::to_string(g.batch) + " " +
                std::string(dtype_name(g.dtype)) + (g.c_f32 ? " c_f32" : "") +
                (g.trans_a ? " Ta" : "") + (g.trans_b ? " Tb" : "") +
                (g.beta != 0.0 ? " beta" : "");
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast_to_compute(a_in), b = autocast_to_compute(b_in);
  check_pair(a, b, "matmul", "a", "b");
  ENGINE_CHECK(a.dim() >= 1 && b.dim() >= 1, "[matmul] expects tensors with at least 1 dim: a ",
               describe(a), " @ b ", describe(b));
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  ENGINE_CHECK(ka == kb, "[matmul] inner dims do not match: a ", describe(a), " @ b ", describe(b),
               " (", ka, " vs ", kb, ")");
  // NumPy 1-D rules: a (K) is a row (1, K), b (K) a column (K, 1); the added dim is dropped.
  // Done with views so autograd routes the gradients back through them.
  if (a.dim() == 1 || b.dim() == 1) {
    Tensor out = matmul(a.dim() == 1 ? a.unsqueeze(0) : a, b.dim() == 1 ? b.unsqueeze(-1) : b);
    if (a.dim() == 1) out = out.squeeze(-2);  // (..., 1, N) -> (..., N)
    if (b.dim() == 1) out = out.squeeze(-1);  // (..., M, 1) -> (..., M)
    return out;
  }
  {
    const Shape ba = batch_dims(a), bb = batch_dims(b);
    const size_t nd = std::max(ba.size(), bb.size());
    for (size_t i = 1; i <= nd; ++i) {
      int64_t x = i <= ba.size() ? ba[ba.size() - i] : 1;
      int64_t y = i <= bb.size() ? bb[bb.size() - i] : 1;
      ENGINE_CHECK(x == y || x == 1 || y == 1, "[matmul] batch dims do not broadcast: a ",
                   describe(a), " @ b ", describe(b), " (", shape_str(ba), " vs ", shape_str(bb),
                   ")");
    }
  }
  Tensor out = matmul_raw(a.detach(), b.detach());
  if (needs_grad(a, b)) {
    auto n = std::make_shared<MatmulNode>();
    if (b.requires_grad()) n->a = a.detach();
    if (a.requires_grad()) n->b = b.detach();
    record(n, {a, b}, {out});
  }
  return out;
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const Tensor x = autocast_to_compute(x_in), weight = autocast_to_compute(weight_in),
               bias = autocast_to_compute(bias_in);
  check_pair(x, weight, "linear", "x", "weight");
  ENGINE_CHECK(weight.dim() == 2, "[linear] weight must be 2-D (out, in), got weight ",
               describe(weight), " for x ", describe(x));
  ENGINE_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "[linear] x ", describe(x),
               " does not match weight ", describe(weight), ": expected x (..., ", weight.size(1),
               ")");
  const int64_t out_f = weight.size(0);
  if (bias.defined()) {
    check_pair(weight, bias, "linear", "weight", "bias");
    ENGINE_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "[linear] bias ", describe(bias),
                 " does not match weight ", describe(weight), ": expected bias (", out_f, ")");
  }
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_f);
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());    // (..., out)
  Tensor x2 = rows_of(x.detach());                               // (R, in)
  Tensor y2 = make_view(y, {x2.size(0), out_f}, {out_f, 1}, 0);  // (R, out)
  if (bias.defined()) {
    // The bias added by the GEMM's epilogue (CPU: one vectorised pass over y; CUDA: cuBLASLt's
    // BIAS epilogue, in the kernel that stores y): no broadcast copy of the bias into y first.
    gemm(x2, false, gemm_ready(weight.detach()), true, y2, 1.0, 0.0, GemmEpilogue::bias,
         bias.detach().contiguous());
  } else {
    gemm(x2, false, gemm_ready(weight.detach()), true, y2);
  }
  if (needs_grad(x, weight, bias)) {
    auto n = std::make_shared<LinearNode>();
    // dX needs W, dW needs X; db needs neither.
    if (weight.requires_grad()) n->x = x.detach();
    if (x.requires_grad()) n->weight = weight.detach();
    record(n, {x, weight, bias}, {y});
  }
  return y;
}

}  // namespace engine
