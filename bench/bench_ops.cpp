// bench_ops: times libengine's ops (forward, and forward + backward) at BERT-like shapes on the
// CPU and prints one line per case: name, median milliseconds, and a rate (GFLOP/s or GB/s).
// bench/bench_cpu.py runs it beside the same cases in PyTorch and prints both side by side.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "apps/cli.h"
#include "engine/backend.h"
#include "engine/cpu/gemm.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "ops/ops.h"

using namespace engine;

namespace {

// Median wall time of f over repeats after warm-up: at least 3 runs and ~0.3 s of runs.
double time_ms(const std::function<void()>& f) {
  using clock = std::chrono::steady_clock;
  f();
  f();
  std::vector<double> ms;
  auto start = clock::now();
  while (ms.size() < 3 ||
         (std::chrono::duration<double>(clock::now() - start).count() < 0.3 && ms.size() < 200)) {
    auto t0 = clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void report(const char* name, double ms, double work, const char* unit) {
  // work in GFLOP or GB: rate = work / seconds
  std::printf("%s\t%.4f\t%.2f\t%s\n", name, ms, work / (ms * 1e-3), unit);
  std::fflush(stdout);
}

// --only SUBSTRING: the cases whose name contains it (all when empty).
std::string g_only;

// Whether --only selects a case of this name.
bool selected(const std::string& name) {
  return g_only.empty() || name.find(g_only) != std::string::npos;
}

void bench(const char* name, const std::function<void()>& f, double work, const char* unit) {
  if (!selected(name)) return;
  report(name, time_ms(f), work, unit);
}

// ---- the machine's f32 FMA peak and the GEMMs against it ------------------------------------

// f32 multiply-adds per second that `threads` threads sustain, each running independent chains of
// the widest vector FMA this build targets (enough chains to cover the FMA latency on every
// port): the measured peak = FMA units x lanes x 2 x clock x cores.
// The chains are 12 named accumulators (not an array, which the compiler may keep in memory):
// 12 independent FMAs per iteration cover a 4-cycle latency on 2 FMA ports (8 needed).
#define ENGINE_FMA_CHAINS(FMA) \
  FMA(a0);                     \
  FMA(a1);                     \
  FMA(a2);                     \
  FMA(a3);                     \
  FMA(a4);                     \
  FMA(a5);                     \
  FMA(a6);                     \
  FMA(a7);                     \
  FMA(a8);                     \
  FMA(a9);                     \
  FMA(a10);                    \
  FMA(a11)
constexpr int kFmaChains = 12;
constexpr long kFmaIters = 40'000'000;

double fma_gflops(int threads, int* lanes_out, long iters = kFmaIters) {
  double sink = 0;
#if defined(__AVX512F__)
  constexpr int kLanes = 16;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    const float seed = float(omp_get_thread_num() + 1);
    // Different starting values: identical chains would be computed once.
    __m512 a0 = _mm512_set1_ps(seed), a1 = _mm512_set1_ps(seed + 1), a2 = _mm512_set1_ps(seed + 2),
           a3 = _mm512_set1_ps(seed + 3), a4 = _mm512_set1_ps(seed + 4),
           a5 = _mm512_set1_ps(seed + 5), a6 = _mm512_set1_ps(seed + 6),
           a7 = _mm512_set1_ps(seed + 7), a8 = _mm512_set1_ps(seed + 8),
           a9 = _mm512_set1_ps(seed + 9), a10 = _mm512_set1_ps(seed + 10),
           a11 = _mm512_set1_ps(seed + 11);
    const __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
#define ENGINE_FMA512(x) x = _mm512_fmadd_ps(x, m, a)
    for (long i = 0; i < iters; ++i) {
      ENGINE_FMA_CHAINS(ENGINE_FMA512);
    }
#undef ENGINE_FMA512
    const __m512 t =
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                    _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
                      _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    sink += _mm512_reduce_add_ps(t);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  constexpr int kLanes = 8;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    const float seed = float(omp_get_thread_num() + 1);
    __m256 a0 = _mm256_set1_ps(seed), a1 = _mm256_set1_ps(seed + 1), a2 = _mm256_set1_ps(seed + 2),
           a3 = _mm256_set1_ps(seed + 3), a4 = _mm256_set1_ps(seed + 4),
           a5 = _mm256_set1_ps(seed + 5), a6 = _mm256_set1_ps(seed + 6),
           a7 = _mm256_set1_ps(seed + 7), a8 = _mm256_set1_ps(seed + 8),
           a9 = _mm256_set1_ps(seed + 9), a10 = _mm256_set1_ps(seed + 10),
           a11 = _mm256_set1_ps(seed + 11);
    const __m256 m = _mm256_set1_ps(0.9999999f), a = _mm256_set1_ps(1e-7f);
#define ENGINE_FMA256(x) x = _mm256_fmadd_ps(x, m, a)
    for (long i = 0; i < iters; ++i) {
      ENGINE_FMA_CHAINS(ENGINE_FMA256);
    }
#undef ENGINE_FMA256
    const __m256 t =
        _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                    _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))),
                      _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float v[8];
    _mm256_storeu_ps(v, t);
    for (float x : v) sink += x;
  }
#else
  constexpr int kLanes = 1;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    float a0 = 1, a1 = 2, a2 = 3, a3 = 4, a4 = 5, a5 = 6, a6 = 7, a7 = 8, a8 = 9, a9 = 10, a10 = 11,
          a11 = 12;
#define ENGINE_FMA1(x) x = x * 0.9999999f + 1e-7f
    for (long i = 0; i < iters; ++i) {
      ENGINE_FMA_CHAINS(ENGINE_FMA1);
    }
#undef ENGINE_FMA1
    sink += a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  }
#endif
  *lanes_out = kLanes;
  return sink;
}
#undef ENGINE_FMA_CHAINS

// The core clock under load, from a chain of dependent integer adds (one per cycle): /proc/cpuinfo
// gives a VM's nominal clock, not the turbo clock the cores run at. 0 where not measurable.
double measured_ghz() {
#if defined(__x86_64__)
  using clock = std::chrono::steady_clock;
  constexpr long kIters = 100'000'000;
  long x = 0, one = 1;
  const auto t0 = clock::now();
  // Register-register adds: some cores fold add-immediate chains at rename, several a cycle.
  for (long i = 0; i < kIters; ++i)
    asm volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(x) : "r"(one));
  const double s = std::chrono::duration<double>(clock::now() - t0).count();
  return x == 4 * kIters ? 4.0 * kIters / s * 1e-9 : 0.0;
#else
  return 0.0;
#endif
}

// Prints the measured FMA peak for 1 and all threads (the best of 5 runs each).
// volatile: the sink keeps the chains from being optimised away.
void measure_peak() {
  const int threads = omp_get_max_threads();
  const double ghz = measured_ghz();
  for (int t : {1, threads}) {
    int lanes = 1;
    using clock = std::chrono::steady_clock;
    volatile double sink = fma_gflops(t, &lanes);  // warm-up (clock ramp)
    // The best of 5 runs: a peak is what the cores can do, and a run during which the hypervisor
    // gave a vCPU to someone else is slower (a single run measured 383 instead of 463 GFLOP/s).
    double s = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = clock::now();
      sink = sink + fma_gflops(t, &lanes);
      s = std::min(s, std::chrono::duration<double>(clock::now() - t0).count());
    }
    const double flops = 2.0 * lanes * kFmaChains * double(kFmaIters) * t;
    const double gf = flops / s * 1e-9;
    std::printf("peak_fma_f32 %d thread%s\t%.4f\t%.2f\tGFLOP/s", t, t == 1 ? "" : "s", s * 1e3, gf);
    if (ghz > 0)
      std::printf("\t# %d-lane FMA at %.2f GHz (measured): %.1f flop/cycle/core = %.2f FMA units",
                  lanes, ghz, gf / ghz / t, gf / ghz / t / (2.0 * lanes));
    std::printf("\n");
    std::fflush(stdout);
    if (threads == 1) break;
  }
}

// What a parallel region costs and from how many elements a memory-bound loop (y = a x + y in
// f32, the shape of most elementwise kernels) gains from all threads: the basis of the
// kernels' thresholds (engine/cpu/parallel.h).
void measure_parallel_threshold() {
  const int threads = omp_get_max_threads();
  if (threads < 2) return;
  using clock = std::chrono::steady_clock;
  auto median_us = [&](const std::function<void()>& f) {
    std::vector<double> us;
    for (int r = 0; r < 201; ++r) {
      const auto t0 = clock::now();
      f();
      us.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  volatile int sink = 0;
  const double region = median_us([&] {
#pragma omp parallel
    { sink = sink + 0; }
  });
  std::printf("omp_parallel_region %d threads\t%.4f\t-\tus\t# an empty region\n", threads,
              region * 1e-3);
  int64_t crossover = -1;
  for (int64_t n = 1024; n <= (int64_t(1) << 22); n *= 2) {
    std::vector<float> x(size_t(n), 1.0f), y(size_t(n), 2.0f);
    auto axpy = [&](bool par) {
      float* py = y.data();
      const float* px = x.data();
#pragma omp parallel for schedule(static) if (par)
      for (int64_t i = 0; i < n; ++i) py[i] = 0.5f * px[i] + py[i];
    };
    const double serial = median_us([&] { axpy(false); });
    const double parallel = median_us([&] { axpy(true); });
    std::printf("axpy_f32 n=%lld\t%.4f\t%.2f\tx on %d threads\t# serial %.2f us\n", (long long)n,
                parallel * 1e-3, serial / parallel, threads, serial);
    if (crossover < 0 && serial > parallel * 1.1) crossover = n;
  }
  std::printf("# parallel loops gain (>10%%) from %lld elements of a memory-bound f32 loop\n",
              (long long)crossover);
  std::fflush(stdout);
}

// The memory bandwidth all threads get copying 64 MB into another 64 MB (bytes read + bytes
// written a second, the best of 5), printed as stream_copy: the bound for a GEMM whose operands
// and result do not fit the caches (a batch of attention products moves ~12.6 MB a call).
double measure_copy_bandwidth() {
  using clock = std::chrono::steady_clock;
  const int64_t n = int64_t(16) << 20;  // floats: 64 MB
  std::vector<float> src(size_t(n), 1.0f), dst(size_t(n), 0.0f);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = clock::now();
    float* d = dst.data();
    const float* x = src.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = x[i];
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);  // the first run faults the pages in
  }
  const double gbs = 2.0 * double(n) * sizeof(float) / best * 1e-9;
  std::printf(
      "stream_copy %d threads\t%.4f\t%.2f\tGB/s\t# 64 MB -> 64 MB, read + written, best of 5\n",
      omp_get_max_threads(), best * 1e3, gbs);
  std::fflush(stdout);
  return gbs;
}

// A GEMM's rate against the FMA peak measured in the same seconds. On a VM the rate the cores
// give swings by 20-30% within a minute (other tenants): a GEMM timed now against a peak timed
// before can read 62% or 94% of it in two runs a minute apart. So each of 9 rounds times the peak
// (all threads, ~20 ms) and then the GEMM (a window of ~40 ms of calls) back to back, and the
// share is the median of the 9 rounds' ratios.
struct PairedRate {
  double ms = 0;           // median over the rounds of one call's mean time in its window
  double gflops = 0;       // gflop / ms
  double best_gflops = 0;  // the fastest round's window
  double share = 0;        // median of the rounds' (GEMM rate / peak rate)
};
PairedRate paired_with_peak(const std::function<void()>& f, double gflop) {
  using clock = std::chrono::steady_clock;
  const int threads = omp_get_max_threads();
  constexpr long kIters = 10'000'000;
  int lanes = 1;
  auto secs = [](clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  f();
  auto t0 = clock::now();
  f();
  const double one = std::max(secs(t0), 1e-7);
  const int calls = std::max(1, int(0.04 / one));
  volatile double sink = fma_gflops(threads, &lanes, kIters);
  std::vector<double> ms, ratio;
  PairedRate r;
  for (int round = 0; round < 9; ++round) {
    t0 = clock::now();
    sink = sink + fma_gflops(threads, &lanes, kIters);
    const double peak = 2.0 * lanes * kFmaChains * double(kIters) * threads / secs(t0) * 1e-9;
    t0 = clock::now();
    for (int c = 0; c < calls; ++c) f();
    const double call_s = secs(t0) / calls;
    ms.push_back(call_s * 1e3);
    ratio.push_back(gflop / call_s / peak);
    r.best_gflops = std::max(r.best_gflops, gflop / call_s);
  }
  std::sort(ms.begin(), ms.end());
  std::sort(ratio.begin(), ratio.end());
  r.ms = ms[ms.size() / 2];
  r.gflops = gflop / (r.ms * 1e-3);
  r.share = ratio[ratio.size() / 2];
  return r;
}

// The small-GEMM kernel against the library on the same product (set_cpu_small_gemm): 9 rounds,
// each timing ~40 ms of calls with the kernel and then without, back to back; the median of the
// rounds' speed ratios (kernel / library) -- the comparison this VM's drift leaves readable.
double paired_small_vs_library(const std::function<void()>& f) {
  using clock = std::chrono::steady_clock;
  auto window = [&](bool small, int calls) {
    set_cpu_small_gemm(small);
    const auto t0 = clock::now();
    for (int c = 0; c < calls; ++c) f();
    return std::chrono::duration<double>(clock::now() - t0).count() / calls;
  };
  window(false, 1);
  const int calls = std::max(1, int(0.04 / std::max(window(false, 1), 1e-7)));
  std::vector<double> ratio;
  for (int round = 0; round < 9; ++round) {
    const double small = window(true, calls), library = window(false, calls);
    ratio.push_back(library / small);
  }
  set_cpu_small_gemm(true);
  std::sort(ratio.begin(), ratio.end());
  return ratio[ratio.size() / 2];
}

// The model's GEMM shapes through engine::gemm (the kernel the ops call): C (batch, m, n) =
// op(A) op(B), rate and share of the FMA peak measured beside it (paired_with_peak).
void bench_gemms(bool quick) {
  Generator g(1);
  const double copy_gbs = measure_copy_bandwidth();
  const int64_t B = quick ? 2 : 8, T = 128, D = 768, F = 3072, H = 12, dh = 64;
  const int64_t rows = B * T;
  struct Case {
    std::string name;
    int64_t batch, m, n, k;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {"gemm (BT,768)x(768,768)^T", 1, rows, D, D, false, true},
      {"gemm (BT,768)x(768,3072)^T", 1, rows, F, D, false, true},
      {"gemm (BT,3072)x(3072,768)^T", 1, rows, D, F, false, true},
      {"gemm dW (3072,BT)x(BT,768)", 1, F, D, rows, true, false},
      {"gemm dX (BT,3072)x(3072,768)", 1, rows, D, F, false, false},
      {"gemm QK^T (BH,128,64)x(64,128)", B * H, T, T, dh, false, true},
      {"gemm PV (BH,128,128)x(128,64)", B * H, T, dh, T, false, false},
      {"gemm tiny (2048,128)x(128,512)^T", 1, 2048, 512, 128, false, true},
      {"gemm tiny (2048,128)x(128,128)^T", 1, 2048, 128, 128, false, true},
      // The tiny model's MLM decoder, tied to the word embedding (15% of 16 x 128 tokens
      // predicted, BERT's vocabulary): logits, their input gradient, and the embedding's
      // gradient dE = dlogits^T H, whose A is read across its 307 rows 122 KB apart.
      {"gemm tiny decoder (307,128)x(30522,128)^T", 1, 307, 30522, 128, false, true},
      {"gemm tiny decoder dH (307,30522)x(30522,128)", 1, 307, 128, 30522, false, false},
      {"gemm tiny decoder dE (307,30522)^T x(307,128)", 1, 30522, 128, 307, true, false},
      // The tiny model's attention (16 x 128 tokens, 4 heads of 32).
      {"gemm tiny QK^T (64,128,32)x(32,128)", 64, 128, 128, 32, false, true},
      {"gemm tiny PV (64,128,128)x(128,32)", 64, 128, 32, 128, false, false},
      // The attention backward's transposed-A product (dK = dS^T Q, dV = P^T dO).
      {"gemm dK (BH,128,128)^T x(128,64)", B * H, T, dh, T, true, false},
      // As the attention op runs them: one batch entry's 12 heads per thread, whose operands and
      // scores (1.5 MB) stay in the core's L2 from call to call, so the FMA units and not the
      // memory bound them -- the kernel's own share of the peak.
      {"gemm QK^T L2-resident (2x12,128,64)x(64,128)", 2 * H, T, T, dh, false, true},
      {"gemm PV L2-resident (2x12,128,128)x(128,64)", 2 * H, T, dh, T, false, false},
  };
  for (const Case& c : cases) {
    if (!selected(c.name)) continue;
    auto mat = [&](int64_t r, int64_t cols) {
      return c.batch == 1 ? Tensor::randn({r, cols}, g) : Tensor::randn({c.batch, r, cols}, g);
    };
    Tensor a = c.ta ? mat(c.k, c.m) : mat(c.m, c.k);
    Tensor b = c.tb ? mat(c.n, c.k) : mat(c.k, c.n);
    Tensor out = c.batch == 1 ? Tensor::empty({c.m, c.n}) : Tensor::empty({c.batch, c.m, c.n});
    const double gflop = 2.0 * c.batch * c.m * c.n * c.k * 1e-9;
    // The bytes a call must move at least: A, B and C once each (C written: beta = 0).
    const double mb = 4.0 * c.batch * (c.m * c.k + c.k * c.n + c.m * c.n) * 1e-6;
    const auto call = [&] { gemm(a, c.ta, b, c.tb, out); };
    const bool kernel = cpu_small_gemm_takes(c.batch, c.m, c.n, c.k, c.tb);
    const PairedRate r = paired_with_peak(call, gflop);
    std::printf(
        "%s\t%.4f\t%.2f\tGFLOP/s\t# %.0f%% of the peak measured beside it (median of 9 paired "
        "rounds; best round %.1f GFLOP/s; %s); moves %.1f MB a call = %.0f%% of stream_copy\n",
        c.name.c_str(), r.ms, r.gflops, 100.0 * r.share, r.best_gflops,
        kernel ? "the small-GEMM kernel" : cpu_gemm_library(), mb,
        100.0 * mb * 1e-3 / (r.ms * 1e-3) / copy_gbs);
    if (kernel)
      std::printf(
          "%s: small-GEMM kernel vs library\t-\t%.3f\tx\t# the kernel's speed over %s's, "
          "median of 9 paired rounds\n",
          c.name.c_str(), paired_small_vs_library(call), cpu_gemm_library());
    std::fflush(stdout);
  }
}

Tensor param(const Shape& s, Generator& g) {
  return Tensor::randn(s, g, 0.0, 0.02).set_requires_grad();
}

// One optimizer step over BERT-Base's parameter list (12 layers, vocabulary 30522; --quick: 2
// layers, 8000 words): AdamW's one pass (29 bytes an element) against LAMB's two (42) and their
// per-tensor sums; the rate counts those bytes.
void bench_optimizers(bool quick) {
  if (!selected("optimizer")) return;
  Generator g(3);
  const int64_t D = 768, F = 3072, layers = quick ? 2 : 12, V = quick ? 8000 : 30522;
  NamedTensors ps = {{"emb.word.weight", param({V, D}, g)},
                     {"emb.position.weight", param({512, D}, g)},
                     {"emb.norm.weight", param({D}, g)},
                     {"emb.norm.bias", param({D}, g)}};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "layer." + std::to_string(l) + ".";
    for (auto [name, shape] :
         std::vector<std::pair<std::string, Shape>>{{"qkv.weight", {3 * D, D}},
                                                    {"qkv.bias", {3 * D}},
                                                    {"out.weight", {D, D}},
                                                    {"out.bias", {D}},
                                                    {"attention_norm.weight", {D}},
                                                    {"attention_norm.bias", {D}},
                                                    {"ffn1.weight", {F, D}},
                                                    {"ffn1.bias", {F}},
                                                    {"ffn2.weight", {D, F}},
                                                    {"ffn2.bias", {D}},
                                                    {"ffn_norm.weight", {D}},
                                                    {"ffn_norm.bias", {D}}})
      ps.emplace_back(p + name, param(shape, g));
  }
  FlatParameters flat(ps);
  flat.grad().copy_(Tensor::randn({flat.numel()}, g, 0.0, 1e-3));
  const double n = static_cast<double>(flat.numel());
  for (const char* name : {"adamw", "lamb"}) {
    OptimizerOptions o;
    o.name = name;
    std::unique_ptr<Optimizer> opt =
        make_optimizer(flat, o, [](const std::string& k) { return !default_no_decay(k); });
    const std::string label = std::string("optimizer step ") + name + " (BERT-Base, " +
                              std::to_string(static_cast<long long>(n / 1e6)) + "M parameters)";
    report(label.c_str(), time_ms([&] { opt->step(1e-4); }),
           (name == std::string("adamw") ? 29.0 : 42.0) * n * 1e-9, "GB/s");
  }
}

void run(bool quick) {
  Generator g(0);
  const int64_t B = quick ? 2 : 8, T = 128, D = 768, H = 12, F = 3072, V = 30522;
  const int64_t rows = B * T;
  const int64_t SB = quick ? 2 : 32;  // the sum_to cases' batch
  std::printf("# bench_ops: f32, CPU, B=%lld T=%lld D=%lld H=%lld (sum_to cases: B=%lld)\n",
              (long long)B, (long long)T, (long long)D, (long long)H, (long long)SB);
  std::printf("case\tms\trate\tunit\n");
  // The peak whenever a GEMM case runs (each is also paired with its own peak runs).
  if (selected("peak_fma_f32") || g_only.rfind("gemm", 0) == 0) {
    measure_peak();
    bench_gemms(quick);
  }
  // Only on request (--only parallel_threshold): a sweep of sizes, not an op.
  if (!g_only.empty() && selected("parallel_threshold")) measure_parallel_threshold();

  Tensor x = Tensor::randn({B, T, D}, g).set_requires_grad();
  Tensor w = param({F, D}, g), bias = param({F}, g);
  double flops = 2.0 * rows * D * F * 1e-9;
  bench(
      "linear_fwd (BT,768)x(768,3072)",
      [&] {
        NoGrad ng;
        linear(x, w, bias);
      },
      flops, "GFLOP/s");
  bench(
      "linear_fwd_bwd",
      [&] {
        Tensor y = linear(x, w, bias);
        y.backward(Tensor::ones(y.shape()));
      },
      3 * flops, "GFLOP/s");

  Tensor q = Tensor::randn({B, H, T, D / H}, g).set_requires_grad();
  Tensor k = Tensor::randn({B, H, T, D / H}, g).set_requires_grad();
  Tensor v = Tensor::randn({B, H, T, D / H}, g).set_requires_grad();
  Tensor pos = Tensor::randn({1, H, T, T}, g).set_requires_grad();
  AttentionOptions opt;
  opt.bias = pos;
  double aflops = 4.0 * B * H * T * T * (D / H) * 1e-9;
  bench(
      "attention_fwd (bias 1,H,T,T)",
      [&] {
        NoGrad ng;
        attention(q, k, v, opt);
      },
      aflops, "GFLOP/s");
  bench(
      "attention_fwd_bwd",
      [&] {
        Tensor y = attention(q, k, v, opt);
        y.backward(Tensor::ones(y.shape()));
      },
      3 * aflops, "GFLOP/s");

  Tensor lw = Tensor::ones({D}).set_requires_grad(), lb = Tensor::zeros({D}).set_requires_grad();
  double lbytes = 2.0 * rows * D * 4 * 1e-9;  // read x, write y
  bench(
      "layer_norm_fwd",
      [&] {
        NoGrad ng;
        layer_norm(x, lw, lb, 1e-12);
      },
      lbytes, "GB/s");
  bench(
      "layer_norm_fwd_bwd",
      [&] {
        Tensor y = layer_norm(x, lw, lb, 1e-12);
        y.backward(Tensor::ones(y.shape()));
      },
      3 * lbytes, "GB/s");

  // The residual join of a post-LN block: the sublayer's output before its bias and the block's
  // input. Fused (dropout_add_layer_norm: the forward reads x and the residual and writes the sum
  // and y, the backward reads the sum and dy, writes both input gradients and sums the three
  // parameter gradients in the same pass: 8 passes) beside the ops it replaces; both rated at 8.
  Tensor res = Tensor::randn({B, T, D}, g).set_requires_grad();
  Tensor b768 = param({D}, g);
  bench(
      "dropout_add_layer_norm_fwd_bwd (BT,768)",
      [&] {
        Generator dg(1);
        DropoutAddNorm o = dropout_add_layer_norm(x, b768, res, 0.1, true, dg, lw, lb, 1e-12);
        o.normed.backward(Tensor::ones(o.normed.shape()));
      },
      4 * lbytes, "GB/s");
  bench(
      "bias_dropout_add_layer_norm_fwd_bwd (BT,768), unfused",
      [&] {
        Generator dg(1);
        Tensor y = layer_norm(res + dropout(x + b768, 0.1, true, dg), lw, lb, 1e-12);
        y.backward(Tensor::ones(y.shape()));
      },
      4 * lbytes, "GB/s");

  // The heads' split of a (B, T, D) activation, as contiguous() of its (B, H, T, D/H) view:
  // a strided copy (read and written once).
  Tensor heads_view = x.detach().view({B, T, H, D / H}).permute({0, 2, 1, 3});
  bench(
      "permute_copy (B,T,H,64)->(B,H,T,64)",
      [&] {
        NoGrad ng;
        heads_view.contiguous();
      },
      2.0 * heads_view.numel() * 4 * 1e-9, "GB/s");

  Tensor s = Tensor::randn({B, H, T, T}, g);
  bench(
      "softmax_fwd (B,H,T,T)",
      [&] {
        NoGrad ng;
        softmax(s);
      },
      2.0 * s.numel() * 4 * 1e-9, "GB/s");
  Tensor big = Tensor::randn({rows, F}, g).set_requires_grad();
  bench(
      "gelu_fwd_bwd (BT,3072)",
      [&] {
        Tensor y = gelu(big);
        y.backward(Tensor::ones(y.shape()));
      },
      4.0 * big.numel() * 4 * 1e-9, "GB/s");

  // Dropout at BERT's p = 0.1 (forward reads x, writes y; backward reads dy, writes dx; each
  // draws the Philox words of its mask anew: no mask is stored).
  bench(
      "dropout_fwd_bwd (BT,3072)",
      [&] {
        Tensor y = dropout(big, 0.1, true);
        y.backward(Tensor::ones(y.shape()));
      },
      4.0 * big.numel() * 4 * 1e-9, "GB/s");

  // GELU with its bias as the FFN's first layer runs it: bias_gelu over the bias-free product
  // (forward reads x, writes y; backward reads x and dy, writes dx and sums the bias: 5 passes),
  // beside the unfused pair, the bias added to y and a gelu of its own (7 passes).
  Tensor b3072 = param({F}, g);
  const double gbytes = big.numel() * 4 * 1e-9;
  bench(
      "bias_gelu_fwd_bwd (BT,3072)+(3072)",
      [&] {
        Tensor y = bias_gelu(big, b3072);
        y.backward(Tensor::ones(y.shape()));
      },
      5.0 * gbytes, "GB/s");
  bench(
      "bias_add_gelu_fwd_bwd (BT,3072)+(3072), unfused",
      [&] {
        Tensor y = gelu(big + b3072);
        y.backward(Tensor::ones(y.shape()));
      },
      5.0 * gbytes, "GB/s");

  // MLM-style loss over 15% of the rows.
  const int64_t n = std::max<int64_t>(1, rows * 15 / 100);
  Tensor logits = Tensor::randn({n, V}, g).set_requires_grad();
  std::vector<int64_t> tv(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tv[i] = (i * 7919) % V;
  Tensor targets = Tensor::from_vector(tv, {n});
  bench(
      "cross_entropy_fwd_bwd (0.15BT,30522)",
      [&] {
        Tensor l = cross_entropy(logits, targets);
        l.backward();
      },
      3.0 * logits.numel() * 4 * 1e-9, "GB/s");

  // sum_to, the reduction behind every broadcast backward, at a BERT-Base pretraining batch
  // (B=32; --quick: 2): bias gradients (also from a transposed gradient), a full sum (one output:
  // serial by construction), and positional biases shared by the heads or by the batch.
  const int64_t srows = SB * T;
  auto bench_sum_to = [&](const char* name, const Tensor& src, const Shape& to) {
    bench(
        name, [&] { sum_to_shape(src, to); }, src.numel() * 4.0 * 1e-9, "GB/s");
  };
  {
    Tensor g768 = Tensor::randn({srows, D}, g);
    bench_sum_to("sum_to_bias768 (B*T,768)->(768)", g768, {D});
    bench_sum_to("sum_to_all (B*T,768)->()", g768, {});
    Tensor g768t = Tensor::randn({D, srows}, g).transpose(0, 1);
    bench_sum_to("sum_to_bias768_t (768,B*T)^T->(768)", g768t, {D});
    Tensor g3072 = Tensor::randn({srows, F}, g);
    bench_sum_to("sum_to_bias3072 (B*T,3072)->(3072)", g3072, {F});
  }
  bench_sum_to("sum_to_heads (12,128,128)->(1,128,128)", Tensor::randn({H, T, T}, g), {1, T, T});
  // The tiny model's bias gradients (B = 16, d = 128): L2-resident, where thread start-up shows.
  bench_sum_to("sum_to_tiny_bias (16*T,128)->(128)", Tensor::randn({16 * T, 128}, g), {128});
  Tensor sb = Tensor::randn({SB, H, T, T}, g);
  bench_sum_to("sum_to_batch (B,12,128,128)->(1,12,128,128)", sb, {1, H, T, T});
  bench_optimizers(quick);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
      if (!std::strcmp(argv[i], "--quick")) {
        quick = true;
      } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
        g_only = argv[++i];
      } else if (!std::strcmp(argv[i], "--version")) {
        std::printf("bench_ops %s\n", cli::version());
        return 0;
      } else if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
        std::puts(
            "usage: bench_ops [--quick] [--only SUBSTRING] [--version]\nTimes the CPU ops at "
            "BERT-Base "
            "shapes (B=8, T=128; --quick: B=2; the sum_to cases at B=32, --quick: 2) and "
            "prints tab-separated: case, median ms, rate, unit (and a note). First the measured "
            "f32 FMA peak (1 and all threads, with the measured clock), the copy bandwidth "
            "(stream_copy) and the model's GEMM shapes against both; where the AVX-512 small-GEMM "
            "kernel takes a case (attention's batches), also its speed over the library's in "
            "paired rounds (ENGINE_CPU_GEMM=onednn|openblas|eigen sends every product to that "
            "library; unset, the fastest the build has). --only: "
            "the cases whose name contains SUBSTRING (the peak runs with any gemm case); --only "
            "parallel_threshold: the parallel-region cost and the element count from which a "
            "memory-bound loop gains from all threads.");
        return 0;
      } else {
        std::fprintf(stderr, "bench_ops: error: unknown argument '%s' (try --help)\n", argv[i]);
        return 2;
      }
    }
    run(quick);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ops: error: %s\n", e.what());
    return 1;
  }
}
