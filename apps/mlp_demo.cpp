// mlp_demo: trains a small classifier with libengine on a synthetic three-arm spiral — the
// smallest end-to-end use of the engine, an example to read: modules, one flat parameter slab,
// linear, LayerNorm, GELU, dropout, index_select, cross-entropy, backward, and SGD with momentum
// written as two in-place ops over the slabs (not the Trainer of train/trainer.h, which
// pretraining and finetuning use). Only the apps_version test runs it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "apps/cli.h"
#include "ops/ops.h"

using namespace engine;

namespace {

struct Options {
  int64_t steps = 600;
  int64_t hidden = 64;
  int64_t batch = 128;
  double lr = 0.05;
  double dropout = 0.1;
  uint64_t seed = 1;
  int64_t log_every = 100;
};

const char* kUsage =
    "usage: mlp_demo [--steps N] [--hidden N] [--batch N] [--lr X] [--dropout P] [--seed N]\n"
    "                [--log-every N]\n"
    "Trains a GELU/LayerNorm MLP on a synthetic 3-class spiral (2-D points) with SGD+momentum\n"
    "and prints training loss and held-out accuracy. --version: the version and git commit.\n";

int64_t parse_int(const std::string& flag, const char* v) {
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  ENGINE_CHECK(end && *end == '\0' && x > 0, "[mlp_demo] ", flag,
               " expects a positive integer, got '", v, "'");
  return x;
}
double parse_double(const std::string& flag, const char* v, double lo, double hi) {
  char* end = nullptr;
  double x = std::strtod(v, &end);
  ENGINE_CHECK(end && *end == '\0' && x >= lo && x < hi, "[mlp_demo] ", flag,
               " expects a number in [", lo, ", ", hi, "), got '", v, "'");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--version") {
      std::printf("mlp_demo %s\n", cli::version());
      std::exit(0);
    }
    ENGINE_CHECK(i + 1 < argc, "[mlp_demo] ", a, " needs a value (or unknown argument)\n", kUsage);
    const char* v = argv[++i];
    if (a == "--steps")
      o.steps = parse_int(a, v);
    else if (a == "--hidden")
      o.hidden = parse_int(a, v);
    else if (a == "--batch")
      o.batch = parse_int(a, v);
    else if (a == "--log-every")
      o.log_every = parse_int(a, v);
    else if (a == "--seed")
      o.seed = static_cast<uint64_t>(parse_int(a, v));
    else if (a == "--lr")
      o.lr = parse_double(a, v, 1e-9, 10.0);
    else if (a == "--dropout")
      o.dropout = parse_double(a, v, 0.0, 1.0);
    else
      ENGINE_FAIL("[mlp_demo] unknown argument '", a, "'\n", kUsage);
  }
  return o;
}

// n points per class on three interleaved spiral arms, with noise: (3n, 2) inputs, (3n) labels.
void spiral(int64_t n, Generator& g, Tensor& x, Tensor& y) {
  std::vector<double> noise =
      Tensor::randn({3 * n, 2}, g, 0.0, 0.15, DType::f64).to_vector<double>();
  std::vector<double> u = Tensor::rand({3 * n}, g, DType::f64).to_vector<double>();
  std::vector<float> xs(static_cast<size_t>(6 * n));
  std::vector<int64_t> ys(static_cast<size_t>(3 * n));
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t j = c * n + i;
      double r = u[j];
      double t = 7.0 * r + c * 2.0 * M_PI / 3.0;  // more than a full turn per arm
      xs[2 * j] = static_cast<float>(r * std::cos(t) + noise[2 * j] * r);
      xs[2 * j + 1] = static_cast<float>(r * std::sin(t) + noise[2 * j + 1] * r);
      ys[j] = c;
    }
  }
  x = Tensor::from_vector(xs, {3 * n, 2});
  y = Tensor::from_vector(ys, {3 * n});
}

struct Linear : Module {
  Tensor weight, bias;
  Linear(int64_t in, int64_t out, Generator& g) {
    // Kaiming-style scale for a GELU net of this size; BERT's models use N(0, 0.02).
    weight = register_parameter("weight", Tensor::randn({out, in}, g, 0.0, std::sqrt(2.0 / in)));
    bias = register_parameter("bias", Tensor::zeros({out}));
  }
  Tensor operator()(const Tensor& x) const { return linear(x, weight, bias); }
};

struct Mlp : Module {
  Linear in, mid, out;
  Tensor ln_w, ln_b;
  double p;
  Generator* gen;
  Mlp(int64_t hidden, double dropout, Generator& g)
      : in(2, hidden, g), mid(hidden, hidden, g), out(hidden, 3, g), p(dropout), gen(&g) {
    register_module("in", in);
    register_module("mid", mid);
    register_module("out", out);
    ln_w = register_parameter("ln_weight", Tensor::ones({hidden}));
    ln_b = register_parameter("ln_bias", Tensor::zeros({hidden}));
  }
  Tensor operator()(const Tensor& x) const {
    Tensor h = gelu(layer_norm(in(x), ln_w, ln_b, 1e-5));  // (B, hidden)
    h = dropout(h, p, training(), *gen);
    h = gelu(mid(h));
    return out(h);  // (B, 3) logits
  }
};

double accuracy(const Tensor& logits, const Tensor& labels) {
  std::vector<float> l = logits.to_vector<float>();
  std::vector<int64_t> y = labels.to_vector<int64_t>();
  int64_t right = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const float* r = &l[3 * i];
    int64_t arg = std::max_element(r, r + 3) - r;
    right += arg == y[i];
  }
  return static_cast<double>(right) / static_cast<double>(y.size());
}

int run(const Options& o) {
  Generator g(o.seed);
  Tensor x_train, y_train, x_valid, y_valid;
  spiral(1000, g, x_train, y_train);
  spiral(300, g, x_valid, y_valid);
  Mlp model(o.hidden, o.dropout, g);
  FlatParameters flat(model.named_parameters());
  Tensor momentum = Tensor::zeros({flat.numel()});
  std::printf("mlp_demo: %lld parameters in one slab, %lld training points, %lld steps\n",
              static_cast<long long>(model.num_parameters()),
              static_cast<long long>(x_train.size(0)), static_cast<long long>(o.steps));

  const int64_t n = x_train.size(0);
  double first_loss = -1, loss_avg = 0;
  for (int64_t step = 1; step <= o.steps; ++step) {
    // A random batch of row indices from the counter-based generator.
    std::vector<double> u = Tensor::rand({o.batch}, g, DType::f64).to_vector<double>();
    std::vector<int64_t> rows(u.size());
    for (size_t i = 0; i < u.size(); ++i) rows[i] = static_cast<int64_t>(u[i] * n);
    Tensor idx = Tensor::from_vector(rows, {o.batch});
    model.train(true);
    Tensor loss = cross_entropy(model(index_select(x_train, idx)), index_select(y_train, idx));
    flat.zero_grad();
    loss.backward();
    {
      NoGrad ng;  // SGD with momentum 0.9 over the flat slabs, one pass each
      momentum.mul_(0.9).add_(flat.grad());
      double lr = o.lr * (1.0 - static_cast<double>(step - 1) / o.steps);  // linear decay
      flat.data().add_(momentum, -lr);
    }
    double l = loss.item();
    if (first_loss < 0) first_loss = l;
    loss_avg = step == 1 ? l : 0.9 * loss_avg + 0.1 * l;
    if (step % o.log_every == 0 || step == o.steps) {
      NoGrad ng;
      model.train(false);
      double acc = accuracy(model(x_valid), y_valid);
      std::printf("step %5lld  loss %.4f  valid accuracy %.3f\n", static_cast<long long>(step),
                  loss_avg, acc);
    }
  }
  NoGrad ng;
  model.train(false);
  double acc = accuracy(model(x_valid), y_valid);
  std::printf("done: loss %.4f -> %.4f, held-out accuracy %.3f (chance 0.333)\n", first_loss,
              loss_avg, acc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_demo: error: %s\n", e.what());
    return 1;
  }
}
