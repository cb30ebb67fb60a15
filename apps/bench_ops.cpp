// bench_ops: times libengine's ops (forward, and forward + backward) at BERT-like shapes on the
// CPU and prints one line per case: name, median milliseconds, and a rate (GFLOP/s or GB/s).
// tools/bench_cpu.py runs it beside the same cases in PyTorch and prints both side by side.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "engine/backend.h"
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

void bench(const char* name, const std::function<void()>& f, double work, const char* unit) {
  if (!g_only.empty() && std::string(name).find(g_only) == std::string::npos) return;
  report(name, time_ms(f), work, unit);
}

Tensor param(const Shape& s, Generator& g) {
  return Tensor::randn(s, g, 0.0, 0.02).set_requires_grad();
}

void run(bool quick) {
  Generator g(0);
  const int64_t B = quick ? 2 : 8, T = 128, D = 768, H = 12, F = 3072, V = 30522;
  const int64_t rows = B * T;
  const int64_t SB = quick ? 2 : 32;  // the sum_to cases' batch
  std::printf("# bench_ops: f32, CPU, B=%lld T=%lld D=%lld H=%lld (sum_to cases: B=%lld)\n",
              (long long)B, (long long)T, (long long)D, (long long)H, (long long)SB);
  std::printf("case\tms\trate\tunit\n");

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
  Tensor sb = Tensor::randn({SB, H, T, T}, g);
  bench_sum_to("sum_to_batch (B,12,128,128)->(1,12,128,128)", sb, {1, H, T, T});
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
            "prints tab-separated: case, median ms, rate, unit. --only: the cases whose name "
            "contains SUBSTRING.");
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
