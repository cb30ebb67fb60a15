// The training step (train/trainer.h) and the gradient-slab ops under it (ops/gradients.h):
// statistics against independent sums, micro-batch weighting against one large batch, exact loss
// scaling, skipped steps on inf/NaN gradients, clipping, and the one host read per step. And the
// loop around it (train/loop.h): the cadences of the log, the evaluation and the checkpoints.
#include <omp.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "ops/ops.h"
#include "test_support.h"
#include "train/loop.h"
#include "train/trainer.h"

using namespace engine;
using Catch::Contains;
using engine::testing::error_of;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The statistics as gradients.h defines them: squares summed in double over chunks of 2^15
// elements (four interleaved chains inside a chunk), the chunks added in order.
double chunked_sum_squares(const std::vector<float>& x) {
  const size_t chunk = 1 << 15;
  double total = 0;
  for (size_t begin = 0; begin < x.size(); begin += chunk) {
    const size_t end = std::min(x.size(), begin + chunk);
    double acc[4] = {0, 0, 0, 0};
    size_t i = begin;
    for (; i + 4 <= end; i += 4)
      for (size_t k = 0; k < 4; ++k) acc[k] += double(x[i + k]) * double(x[i + k]);
    for (; i < end; ++i) acc[0] += double(x[i]) * double(x[i]);
    total += (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  return total;
}

// A linear least-squares model y ~ x W^T + b: its loss is a mean over rows, so micro-batches
// weighted by their share of the rows add up to the whole batch.
struct Regression : Module {
  Tensor w, b;
  explicit Regression(uint64_t seed) {
    Generator gen(seed);
    w = register_parameter("w", Tensor::randn({3, 5}, gen, 0, 0.5));
    b = register_parameter("bias", Tensor::randn({3}, gen, 0, 0.5));
  }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    Tensor d = linear(x, w, b) - y;
    return mean(d * d);
  }
};

struct Data {
  Tensor x, y;  // (8, 5), (8, 3)
  Data() {
    Generator gen(77);
    x = Tensor::randn({8, 5}, gen);
    y = Tensor::randn({8, 3}, gen);
  }
  Tensor rows_x(int64_t lo, int64_t hi) const { return x.slice(0, lo, hi).contiguous(); }
  Tensor rows_y(int64_t lo, int64_t hi) const { return y.slice(0, lo, hi).contiguous(); }
};

std::vector<float> values(const Tensor& t) { return t.contiguous().to_vector<float>(); }

}  // namespace

TEST_CASE("unscale_and_check_ returns the chunked sum of squares and the non-finite count",
          "[trainer][gradients]") {
  Generator gen(3);
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1 << 15), int64_t(300001)}) {
    INFO("n = " << n);
    Tensor g = Tensor::randn({n}, gen, 0, 0.3);
    const std::vector<float> before = values(g);
    std::vector<double> s = unscale_and_check_(g).to_vector<double>();
    CHECK(s[0] == chunked_sum_squares(before));  // bit for bit: the documented order
    CHECK(s[1] == 0.0);
    CHECK(values(g) == before);  // inv_scale 1 leaves the slab alone

    // Unscaling multiplies each element once by the factor rounded to f32.
    const double inv = 1.0 / 1024.0;
    s = unscale_and_check_(g, inv).to_vector<double>();
    std::vector<float> want(before);
    for (float& v : want) v *= static_cast<float>(inv);
    CHECK(values(g) == want);
    CHECK(s[0] == chunked_sum_squares(want));
  }
  // The thread count does not change a bit of it.
  Tensor big = Tensor::randn({500000}, gen);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = unscale_and_check_(big).to_vector<double>()[0];
  omp_set_num_threads(std::max(2, threads));
  const double two = unscale_and_check_(big).to_vector<double>()[0];
  omp_set_num_threads(threads);
  CHECK(one == two);

  Tensor bad = Tensor::from_vector<float>({1, kInf, 2, kNaN, -kInf, 3}, {6});
  std::vector<double> s = unscale_and_check_(bad, 0.5).to_vector<double>();
  CHECK(s[1] == 3.0);
  CHECK_FALSE(std::isfinite(s[0]));
  Tensor f64 = Tensor::from_vector<double>({3, 4}, {2});
  CHECK(unscale_and_check_(f64).to_vector<double>() == std::vector<double>{25, 0});
}

TEST_CASE("scale_ multiplies in place by the factor rounded to the slab's dtype",
          "[trainer][gradients]") {
  Tensor g = Tensor::from_vector<float>({1, -2, 3.5f, 0}, {4});
  const double f = 1.0 / 3.0;
  scale_(g, f);
  const float ff = static_cast<float>(f);
  CHECK(values(g) == std::vector<float>{1 * ff, -2 * ff, 3.5f * ff, 0});
}

TEST_CASE("gradient ops refuse what is not a floating contiguous slab", "[trainer][gradients]") {
  Tensor m = Tensor::zeros({4, 3});
  CHECK_THAT(error_of([&] { unscale_and_check_(m.transpose(0, 1)); }),
             Contains("[unscale_and_check_] expects a contiguous"));
  CHECK_THAT(error_of([&] { unscale_and_check_(Tensor::zeros({3}, DType::i64)); }),
             Contains("expects a floating tensor"));
  CHECK_THAT(error_of([&] { unscale_and_check_(m, 0.0); }),
             Contains("inv_scale must be finite and > 0"));
  CHECK_THAT(error_of([&] { scale_(m, std::numeric_limits<double>::infinity()); }),
             Contains("[scale_] factor must be finite"));
  CHECK_THAT(error_of([&] { unscale_and_check_(Tensor()); }), Contains("undefined"));
}

TEST_CASE("Trainer: weighted micro-batches train like one batch", "[trainer]") {
  const Data d;
  OptimizerOptions adam;
  adam.lr = 0.05;
  Regression whole(5), parts(5);
  FlatParameters fw(whole.named_parameters()), fp(parts.named_parameters());
  Trainer tw(fw, adam, {}, constant_lr(adam.lr)), tp(fp, adam, {}, constant_lr(adam.lr));
  const double one = 1.0;
  const std::vector<double> quarters = {0.25, 0.25, 0.5};  // rows 0-2, 2-4, 4-8
  for (int step = 0; step < 3; ++step) {
    const StepStats a = tw.step(1, [&](int64_t) { return whole.loss(d.x, d.y); }, {&one, 1});
    const StepStats b = tp.step(
        3,
        [&](int64_t m) {
          const int64_t lo[] = {0, 2, 4}, hi[] = {2, 4, 8};
          return parts.loss(d.rows_x(lo[m], hi[m]), d.rows_y(lo[m], hi[m]));
        },
        quarters);
    CHECK(b.loss == Approx(a.loss).epsilon(1e-6));
    CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-5));
    CHECK(a.applied);
    CHECK(b.applied);
  }
  const std::vector<float> pw = values(fw.data()), pp = values(fp.data());
  for (size_t i = 0; i < pw.size(); ++i) CHECK(pp[i] == Approx(pw[i]).margin(1e-6));
  CHECK(tw.steps_taken() == 3);
  CHECK(tw.optimizer().step_count() == 3);
}

TEST_CASE("Trainer: a power-of-two loss scale trains bit for bit like none", "[trainer]") {
  const Data d;
  OptimizerOptions adam;
  adam.lr = 0.01;
  TrainerOptions scaled;
  scaled.loss_scale.enabled = true;
  scaled.loss_scale.init_scale = 1024;
  scaled.loss_scale.growth_interval = 2;  // grows to 2048 after two clean steps
  Regression plain_model(9), scaled_model(9);
  FlatParameters a(plain_model.named_parameters()), b(scaled_model.named_parameters());
  Trainer ta(a, adam, {}, constant_lr(adam.lr)), tb(b, adam, {}, constant_lr(adam.lr), scaled);
  const double one = 1.0;
  std::vector<double> scales;
  for (int step = 0; step < 4; ++step) {
    const StepStats sa = ta.step(1, [&](int64_t) { return plain_model.loss(d.x, d.y); }, {&one, 1});
    const StepStats sb =
        tb.step(1, [&](int64_t) { return scaled_model.loss(d.x, d.y); }, {&one, 1});
    CHECK(sa.loss == sb.loss);
    CHECK(sa.grad_norm == sb.grad_norm);  // unscaled before the norm
    scales.push_back(sb.loss_scale);
  }
  CHECK(values(a.data()) == values(b.data()));
  CHECK(scales == std::vector<double>{1024, 1024, 2048, 2048});
}

TEST_CASE("Trainer: inf/NaN gradients skip the step and back the scale off", "[trainer]") {
  const Data d;
  OptimizerOptions adam;
  adam.lr = 0.01;
  TrainerOptions o;
  o.loss_scale.enabled = true;
  o.loss_scale.init_scale = 256;
  Regression model(2);
  FlatParameters flat(model.named_parameters());
  Trainer t(flat, adam, {}, constant_lr(adam.lr), o);
  const double one = 1.0;
  for (float poison : {kNaN, kInf}) {
    INFO("poison " << poison);
    const std::vector<float> before = values(flat.data());
    const double scale = t.scaler().scale();
    const StepStats s = t.step(
        1, [&](int64_t) { return model.loss(d.x, d.y) * Tensor::scalar(poison); }, {&one, 1});
    CHECK_FALSE(s.applied);
    CHECK(values(flat.data()) == before);  // nothing applied
    CHECK(t.scaler().scale() == scale / 2);
    CHECK(t.optimizer().step_count() == 0);
  }
  CHECK(t.steps_taken() == 2);  // skipped steps still advance the schedule
  CHECK(t.scaler().skipped_steps() == 2);
  const StepStats ok = t.step(1, [&](int64_t) { return model.loss(d.x, d.y); }, {&one, 1});
  CHECK(ok.applied);
  CHECK(t.optimizer().step_count() == 1);

  // Without loss scaling a non-finite step is skipped all the same.
  Regression plain(2);
  FlatParameters pf(plain.named_parameters());
  Trainer tp(pf, adam, {}, constant_lr(adam.lr));
  const std::vector<float> before = values(pf.data());
  CHECK_FALSE(
      tp.step(1, [&](int64_t) { return plain.loss(d.x, d.y) * Tensor::scalar(kNaN); }, {&one, 1})
          .applied);
  CHECK(values(pf.data()) == before);
}

TEST_CASE("Trainer: clipping scales the gradients to clip_norm before AdamW", "[trainer]") {
  const Data d;
  OptimizerOptions adam;
  adam.lr = 0.1;
  adam.weight_decay = 0;
  TrainerOptions o;
  o.clip_norm = 0.05;
  Regression clipped(4), manual(4);
  FlatParameters fc(clipped.named_parameters()), fm(manual.named_parameters());
  Trainer t(fc, adam, {}, constant_lr(adam.lr), o);
  AdamW reference(fm, adam);
  const double one = 1.0;
  const StepStats s = t.step(1, [&](int64_t) { return clipped.loss(d.x, d.y); }, {&one, 1});
  // The same by hand: backward, the norm, clip_grad_norm, AdamW.
  fm.zero_grad();
  manual.loss(d.x, d.y).backward();
  const double norm = clip_grad_norm(fm, o.clip_norm);
  reference.step(adam.lr);
  CHECK(s.grad_norm == norm);
  CHECK(s.grad_norm > o.clip_norm);
  CHECK(values(fc.data()) == values(fm.data()));
}

TEST_CASE("Trainer: one host read and one upload per step, none per micro-batch",
          "[trainer][host_sync]") {
  const Data d;
  OptimizerOptions adam;
  Regression model(6);
  FlatParameters flat(model.named_parameters());
  Trainer t(flat, adam, {}, constant_lr(1e-3));
  const std::vector<double> w = {0.5, 0.25, 0.25};
  const Tensor x0 = d.rows_x(0, 4), x1 = d.rows_x(4, 6), x2 = d.rows_x(6, 8);
  const Tensor y0 = d.rows_y(0, 4), y1 = d.rows_y(4, 6), y2 = d.rows_y(6, 8);
  auto loss_of = [&](int64_t m) {
    return m == 0 ? model.loss(x0, y0) : m == 1 ? model.loss(x1, y1) : model.loss(x2, y2);
  };
  t.step(3, loss_of, w);
  const TransferCounts before = transfer_counts();
  for (int i = 0; i < 4; ++i) t.step(3, loss_of, w);
  const TransferCounts after = transfer_counts();
  CHECK(after.to_host - before.to_host == 4);      // the statistics, at the step's end
  CHECK(after.from_host - before.from_host == 4);  // the step block, at its start
}

TEST_CASE("Trainer: bad arguments are named", "[trainer]") {
  Regression model(1);
  FlatParameters flat(model.named_parameters());
  OptimizerOptions adam;
  TrainerOptions o;
  o.clip_norm = -1;
  CHECK_THAT(error_of([&] { Trainer(flat, adam, {}, constant_lr(1e-3), o); }),
             Contains("[trainer] clip_norm"));
  CHECK_THAT(error_of([&] { constant_lr(-1); }), Contains("[trainer] the learning rate"));
  Trainer t(flat, adam, {}, constant_lr(1e-3));
  const double one = 1.0;
  CHECK_THAT(error_of([&] { t.step(0, [&](int64_t) { return Tensor(); }, {}); }),
             Contains("at least one micro-batch"));
  CHECK_THAT(error_of([&] {
               t.step(2, [&](int64_t) { return Tensor(); }, {&one, 1});
             }),
             Contains("1 weights for 2"));
  CHECK_THAT(error_of([&] {
               t.step(1, [&](int64_t) { return Tensor::zeros({2}); }, {&one, 1});
             }),
             Contains("gave no scalar loss"));
  CHECK_THAT(error_of([&] { t.set_steps_taken(-1); }), Contains("steps taken must be >= 0"));
  TrainerOptions graph;
  graph.cuda_graph = true;
  Trainer tg(flat, adam, {}, constant_lr(1e-3), graph);
  CHECK_THAT(error_of([&] {
               tg.step(1, [&](int64_t) { return Tensor::zeros({1}); }, {&one, 1});
             }),
             Contains("[trainer] cuda_graph needs the parameters on a CUDA device, got cpu"));
}

TEST_CASE("TrainingLoop::run: the hooks at their cadences, in order", "[trainer][loop]") {
  const Data d;
  OptimizerOptions adam;
  adam.lr = 0.05;
  LoopOptions options;
  options.progress = false;
  const engine::testing::TempDir dir;
  for (const bool joined : {true, false}) {
    Regression model(5);
    TrainingLoop loop(model.named_parameters(), adam, constant_lr(adam.lr), options);
    loop.open_metrics(dir / "metrics.jsonl", /*append=*/false);
    std::vector<std::string> calls;
    LoopHooks hooks;
    hooks.log.every = 3;
    hooks.log_line = [&](int64_t step, const StepStats& s, const LoopWindow&) {
      calls.push_back("log " + std::to_string(step));
      CHECK(s.applied);
      return LoopReport{", \"train\": " + std::to_string(step), ""};
    };
    hooks.eval.every = 2;
    hooks.eval.at = {3};
    hooks.eval_in_step_line = joined;
    hooks.evaluate = [&](int64_t step) {
      calls.push_back("eval " + std::to_string(step));
      return LoopReport{", \"eval\": " + std::to_string(step), ""};
    };
    hooks.checkpoint.every = 4;
    hooks.save = [&](int64_t step) { calls.push_back("save " + std::to_string(step)); };
    std::vector<int64_t> taken;
    const int64_t run = loop.run(
        7,
        [&](int64_t before) {
          taken.push_back(before);
          loop.count(8);
          const double one = 1.0;
          return loop.step(1, [&](int64_t) { return model.loss(d.x, d.y); }, {&one, 1});
        },
        hooks);
    CHECK(run == 7);
    CHECK(taken == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});
    // Evaluation at 2, 4, 6 (every 2), 3 (listed) and 7 (the end); a log line every 3 steps and
    // at the end, and at every evaluation when it joins the step's line; checkpoints at 4 and 7.
    std::vector<std::string> want, lines;
    if (joined) {
      want = {"eval 2", "log 2",  "eval 3", "log 3",  "eval 4", "log 4",
              "save 4", "eval 6", "log 6",  "eval 7", "log 7",  "save 7"};
      lines = {
          "{\"step\": 2, \"train\": 2, \"eval\": 2}", "{\"step\": 3, \"train\": 3, \"eval\": 3}",
          "{\"step\": 4, \"train\": 4, \"eval\": 4}", "{\"step\": 6, \"train\": 6, \"eval\": 6}",
          "{\"step\": 7, \"train\": 7, \"eval\": 7}"};
    } else {
      want = {"eval 2", "log 3",  "eval 3", "eval 4", "save 4",
              "log 6",  "eval 6", "log 7",  "eval 7", "save 7"};
      lines = {"{\"step\": 2, \"eval\": 2}",  "{\"step\": 3, \"train\": 3}",
               "{\"step\": 3, \"eval\": 3}",  "{\"step\": 4, \"eval\": 4}",
               "{\"step\": 6, \"train\": 6}", "{\"step\": 6, \"eval\": 6}",
               "{\"step\": 7, \"train\": 7}", "{\"step\": 7, \"eval\": 7}"};
    }
    CHECK(calls == want);
    std::ifstream in(dir / "metrics.jsonl");
    std::vector<std::string> got;
    for (std::string line; std::getline(in, line);) got.push_back(line);
    CHECK(got == lines);
    // Resumed at the end: nothing runs.
    CHECK(loop.run(
              7,
              [&](int64_t) -> StepStats {
                FAIL("a step past the end");
                return {};
              },
              hooks) == 0);
  }
}
