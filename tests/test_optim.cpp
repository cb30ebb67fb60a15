// The optimizer pieces: AdamW and LAMB against double-precision transcriptions of their updates
// (torch.optim.AdamW's, apex FusedLAMB's), hand-computed first steps, checkpoint state, gradient
// clipping and the linear schedule.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "engine/optim.h"
#include "ops/ops.h"
#include "train/trainer.h"

using namespace engine;
using Catch::Contains;

namespace {

// A few parameters with names that exercise default_no_decay, numels that leave slab padding,
// and one large enough for the kernels' threaded path.
NamedTensors make_params(uint64_t seed) {
  Generator gen(seed);
  return {
      {"enc.embeddings.word.weight", Tensor::randn({70001}, gen, 0, 0.5).set_requires_grad()},
      {"enc.layer.0.attention.qkv.weight", Tensor::randn({3, 5}, gen, 0, 0.5).set_requires_grad()},
      {"enc.layer.0.attention.qkv.bias", Tensor::randn({5}, gen, 0, 0.5).set_requires_grad()},
      {"enc.layer.0.attention_norm.weight", Tensor::randn({7}, gen, 1, 0.1).set_requires_grad()},
      {"head.weight", Tensor::randn({2, 9}, gen, 0, 0.5).set_requires_grad()},
      {"mlm.decoder_bias", Tensor::randn({3}, gen, 0, 0.5).set_requires_grad()}};
}

// Gradients for step `t`: fresh values in every entry, zero in the padding.
void set_grads(FlatParameters& flat, int t) {
  Generator gen(1000 + static_cast<uint64_t>(t));
  std::vector<float> g(static_cast<size_t>(flat.numel()), 0.0f);
  for (const auto& e : flat.entries()) {
    std::vector<float> r = Tensor::randn({e.numel}, gen, 0, 1.0 + t).to_vector<float>();
    std::copy(r.begin(), r.end(), g.begin() + e.offset);
  }
  flat.grad().copy_(Tensor::from_vector(g, {flat.numel()}));
}

bool decays(const std::string& name) { return !default_no_decay(name); }

// Two optimizers of one kind (decay by default_no_decay) over equal parameters: one to step as
// the reference, one as the test says.
struct Twin {
  NamedTensors pa, pb;
  FlatParameters fa, fb;
  std::unique_ptr<Optimizer> a, b;
  Twin(const char* name, uint64_t seed)
      : pa(make_params(seed)), pb(make_params(seed)), fa(pa), fb(pb) {
    OptimizerOptions opt;
    opt.name = name;
    a = make_optimizer(fa, opt, decays);
    b = make_optimizer(fb, opt, decays);
  }
};

// A bf16 or f16 tensor's bit patterns.
std::vector<uint16_t> half_bits(const Tensor& t) {
  std::vector<uint16_t> out;
  if (t.dtype() == DType::bf16)
    for (const bf16_t x : t.to_vector<bf16_t>()) out.push_back(x.bits);
  else
    for (const f16_t x : t.to_vector<f16_t>()) out.push_back(x.bits);
  return out;
}

bool close(double got, double want, double rel, double abs) {
  return std::abs(got - want) <= rel * std::abs(want) + abs;
}

}  // namespace

TEST_CASE("default_no_decay picks biases and norm weights", "[optim]") {
  CHECK(default_no_decay("encoder.layer.0.attention.qkv.bias"));
  CHECK(default_no_decay("mlm.decoder_bias"));
  CHECK(default_no_decay("bias"));
  CHECK(default_no_decay("encoder.layer.0.attention_norm.weight"));
  CHECK(default_no_decay("encoder.layer.3.ffn_norm.bias"));
  CHECK(default_no_decay("embeddings.LayerNorm.weight"));
  CHECK(default_no_decay("final_norm.weight"));
  CHECK(default_no_decay("norm_scale"));
  CHECK_FALSE(default_no_decay("encoder.layer.0.attention.qkv.weight"));
  CHECK_FALSE(default_no_decay("embeddings.word.weight"));
  CHECK_FALSE(default_no_decay("head.weight"));
  CHECK_FALSE(default_no_decay("bias_table.weight"));  // "bias" only at the end of the leaf name
  // Only the leaf and its owning module count, not modules further up.
  CHECK_FALSE(default_no_decay("normalizer.proj.weight"));
}

TEST_CASE("adamw matches a double-precision reference over several steps", "[optim]") {
  NamedTensors ps = make_params(7);
  FlatParameters flat(ps);
  OptimizerOptions opt;
  opt.beta1 = 0.85;
  opt.beta2 = 0.98;
  opt.eps = 1e-6;
  opt.weight_decay = 0.1;
  AdamW adamw(flat, opt, decays);
  REQUIRE(adamw.step_count() == 0);

  // The reference: torch.optim.AdamW's update for one element, in double.
  const int64_t n = flat.numel();
  std::vector<double> p(static_cast<size_t>(n)), m(p.size(), 0.0), v(p.size(), 0.0);
  // Tolerances are relative to the magnitudes that meet in each sum: m of |g| (m itself may
  // cancel to near 0) and the running sum of |update| for p.
  std::vector<double> m_mag(p.size(), 0.0), p_mag(p.size(), 0.0);
  std::vector<float> p0 = flat.data().to_vector<float>();
  for (size_t i = 0; i < p.size(); ++i) p[i] = p0[i];
  std::vector<bool> decay_on(p.size(), false);
  for (const auto& e : flat.entries())
    for (int64_t i = 0; i < e.numel; ++i)
      decay_on[static_cast<size_t>(e.offset + i)] = decays(e.name);

  const double lrs[] = {1e-2, 3e-2, 2e-2, 5e-3, 1e-3, 0.0};
  int t = 0;
  for (double lr : lrs) {
    ++t;
    set_grads(flat, t);
    std::vector<float> g = flat.grad().to_vector<float>();
    adamw.step(lr);
    REQUIRE(adamw.step_count() == t);
    const double bc1 = 1 - std::pow(opt.beta1, t), bc2 = 1 - std::pow(opt.beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      if (decay_on[i]) p[i] *= 1 - lr * opt.weight_decay;
      m[i] = opt.beta1 * m[i] + (1 - opt.beta1) * g[i];
      v[i] = opt.beta2 * v[i] + (1 - opt.beta2) * double(g[i]) * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + opt.eps;
      p[i] -= (lr / bc1) * m[i] / denom;
      m_mag[i] = opt.beta1 * m_mag[i] + (1 - opt.beta1) * std::abs(g[i]);
      p_mag[i] += (lr / bc1) * m_mag[i] / denom;
    }
    std::vector<float> got_p = flat.data().to_vector<float>();
    NamedTensors st = adamw.state();
    std::vector<float> got_m = st[0].second.to_vector<float>();
    std::vector<float> got_v = st[1].second.to_vector<float>();
    // Count the misses instead of one REQUIRE per element (there are 70k).
    int64_t bad = 0, first_bad = -1;
    for (size_t i = 0; i < p.size(); ++i) {
      const bool ok = close(got_p[i], p[i], 1e-6, 1e-6 * p_mag[i]) &&
                      close(got_m[i], m[i], 0.0, 1e-6 * m_mag[i]) &&
                      close(got_v[i], v[i], 1e-6, 0.0);
      if (!ok && bad++ == 0) first_bad = static_cast<int64_t>(i);
    }
    INFO("step " << t << ", first bad element " << first_bad);
    REQUIRE(bad == 0);
  }
  // Padding never moves.
  std::vector<float> got_p = flat.data().to_vector<float>();
  for (const auto& e : flat.entries())
    for (int64_t i = e.offset + e.numel; i % 16 != 0; ++i)
      REQUIRE(got_p[static_cast<size_t>(i)] == 0.0f);
  // The model's own handles see the update.
  REQUIRE(ps[0].second.to_vector<float>()[0] == got_p[0]);
}

TEST_CASE("adamw decays only the chosen entries", "[optim]") {
  NamedTensors ps = make_params(11);
  FlatParameters flat(ps);
  OptimizerOptions opt;
  opt.weight_decay = 0.5;
  AdamW adamw(flat, opt, decays);
  std::vector<float> before = flat.data().to_vector<float>();
  adamw.step(0.1);  // zero gradients: m = v = 0, so only the decay moves parameters
  std::vector<float> after = flat.data().to_vector<float>();
  const float factor = static_cast<float>(1 - 0.1 * 0.5);
  std::vector<float> want = before;
  for (const auto& e : flat.entries())
    if (decays(e.name))
      for (int64_t i = e.offset; i < e.offset + e.numel; ++i)
        want[static_cast<size_t>(i)] *= factor;
  REQUIRE(after == want);
  REQUIRE(after != before);
  // An empty decay function decays everything.
  NamedTensors qs = make_params(11);
  FlatParameters flat2(qs);
  AdamW all(flat2, opt);
  all.step(0.1);
  std::vector<float> want2 = before;
  for (float& x : want2) x *= factor;
  REQUIRE(flat2.data().to_vector<float>() == want2);
}

TEST_CASE("adamw first step by hand: update is lr * g / (|g| + eps)", "[optim]") {
  // Step 1: m = (1-b1) g, v = (1-b2) g^2, so m / bc1 = g and sqrt(v / bc2) = |g|.
  NamedTensors ps = {{"w", Tensor::from_vector<float>({1.0f}, {1}).set_requires_grad()},
                     {"b_bias", Tensor::from_vector<float>({0.5f}, {1}).set_requires_grad()}};
  FlatParameters flat(ps);
  OptimizerOptions opt;
  opt.weight_decay = 0.01;
  opt.eps = 1e-6;
  AdamW adamw(flat, opt, decays);
  {
    NoGrad ng;
    ps[0].second.grad().fill_(0.5);
    ps[1].second.grad().fill_(-2.0);
  }
  adamw.step(0.1);
  // w: 1 * (1 - 0.1 * 0.01) - 0.1 * 0.5 / 0.500001 = 0.999 - 0.0999998000004
  REQUIRE(ps[0].second.item() == Approx(0.8990001999996).epsilon(1e-7));
  // b_bias (no decay): 0.5 + 0.1 * 2 / 2.000001
  REQUIRE(ps[1].second.item() == Approx(0.599999950000025).epsilon(2e-7));
  NamedTensors st = adamw.state();
  REQUIRE(st[0].second.to_vector<float>()[0] == Approx(0.05).epsilon(1e-7));
  REQUIRE(st[1].second.to_vector<float>()[0] == Approx(0.00025).epsilon(1e-6));
  REQUIRE(st[2].second.item() == 1.0);
  // torch.optim.AdamW (1.13, CPU) gives exactly these f32 values for this step: the kernel rounds
  // the same operations in the same order.
  CHECK(static_cast<float>(ps[0].second.item()) == 0.8990002274513245f);
  CHECK(static_cast<float>(ps[1].second.item()) == 0.5999999642372131f);
  // The update is about lr * sign(g).
  REQUIRE(std::abs(ps[1].second.item() - 0.5 - 0.1) < 1e-6);
}

TEST_CASE("adamw and lamb: a state round trip continues identically", "[optim]") {
  for (const char* name : {"adamw", "lamb"}) {
    INFO(name);
    OptimizerOptions opt;
    opt.lr = 3e-3;
    opt.name = name;
    NamedTensors ps = make_params(3);
    FlatParameters flat(ps);
    std::unique_ptr<Optimizer> a = make_optimizer(flat, opt, decays);
    REQUIRE(std::string(a->name()) == name);
    for (int t = 1; t <= 3; ++t) {
      set_grads(flat, t);
      a->step(1e-2 * t);
    }
    // state() hands out the live slabs: copy them, as a checkpoint writer does.
    NamedTensors saved;
    for (auto& [n, t] : a->state()) saved.emplace_back(n, t.clone());
    saved.emplace_back("model.params", flat.data().clone());  // other names are ignored
    for (int t = 4; t <= 6; ++t) {
      set_grads(flat, t);
      a->step();  // options().lr
    }

    NamedTensors qs = make_params(99);  // other values, overwritten below
    FlatParameters flat2(qs);
    {
      NoGrad ng;
      flat2.data().copy_(saved.back().second);
    }
    std::unique_ptr<Optimizer> b = make_optimizer(flat2, opt, decays);
    b->load_state(saved);
    REQUIRE(b->step_count() == 3);
    for (int t = 4; t <= 6; ++t) {
      set_grads(flat2, t);
      b->step();
    }
    REQUIRE(b->step_count() == a->step_count());
    REQUIRE(flat2.data().to_vector<float>() == flat.data().to_vector<float>());
    REQUIRE(b->state()[0].second.to_vector<float>() == a->state()[0].second.to_vector<float>());
    REQUIRE(b->state()[1].second.to_vector<float>() == a->state()[1].second.to_vector<float>());
  }
}
TEST_CASE("adamw errors", "[optim][errors]") {
  NamedTensors ps = make_params(5);
  FlatParameters flat(ps);
  AdamW a(flat, OptimizerOptions{});
  const int64_t n = flat.numel();
  auto with = [&](const std::string& name, Tensor t) {
    NamedTensors st = a.state();
    for (auto& [k, v] : st)
      if (k == name) v = t;
    return st;
  };
  REQUIRE_THROWS_WITH(
      a.load_state(with("optim.exp_avg", Tensor::zeros({n + 16}))),
      Contains("[adamw] load_state: 'optim.exp_avg' is (" + std::to_string(n + 16) +
               ") f32 cpu but this optimizer's is (" + std::to_string(n) + ") f32"));
  REQUIRE_THROWS_WITH(a.load_state(with("optim.exp_avg_sq", Tensor::zeros({n, 1}))),
                      Contains("'optim.exp_avg_sq' is (" + std::to_string(n) + ", 1) f32 cpu"));
  REQUIRE_THROWS_WITH(a.load_state(with("optim.exp_avg", Tensor::zeros({n}, DType::f64))),
                      Contains("f64"));
  REQUIRE_THROWS_WITH(a.load_state(with("optim.step", Tensor::scalar(3.0))),
                      Contains("'optim.step' is () f32 cpu but should be an i64 scalar"));
  REQUIRE_THROWS_WITH(a.load_state(with("optim.step", Tensor::scalar(-1.0, DType::i64))),
                      Contains("expected >= 0"));
  NamedTensors st = a.state();
  st.pop_back();
  REQUIRE_THROWS_WITH(a.load_state(st), Contains("[adamw] load_state: 'optim.step' is missing"));
  st = a.state();
  st.emplace_back("optim.max_exp_avg_sq", Tensor::zeros({n}));
  REQUIRE_THROWS_WITH(a.load_state(st), Contains("unknown optimizer state 'optim.max_exp_avg_sq'"));
  st = a.state();
  st.push_back(st[0]);
  REQUIRE_THROWS_WITH(a.load_state(st), Contains("'optim.exp_avg' is given twice"));
  REQUIRE(a.step_count() == 0);  // nothing was loaded

  NamedTensors d = {{"w", Tensor::ones({4}, DType::f64).set_requires_grad()}};
  FlatParameters flat64(d);
  REQUIRE_THROWS_WITH(
      AdamW(flat64, OptimizerOptions{}),
      Contains("[adamw] parameters must be f32 (the master copy), got (16) f64 cpu"));
  OptimizerOptions bad;
  bad.beta2 = 1.0;
  REQUIRE_THROWS_WITH(AdamW(flat, bad), Contains("[adamw] beta2 must be in [0, 1)"));
  bad = OptimizerOptions{};
  bad.weight_decay = -0.1;
  REQUIRE_THROWS_WITH(AdamW(flat, bad), Contains("[adamw] weight_decay must be >= 0"));
  REQUIRE_THROWS_WITH(a.step(std::numeric_limits<double>::quiet_NaN()),
                      Contains("[adamw] step lr"));
  REQUIRE_THROWS_WITH(a.step(1e-3, 0.0),
                      Contains("[adamw] step grad_scale must be a finite value > 0, got 0"));
  REQUIRE(a.step_count() == 0);
}

TEST_CASE("adamw and lamb: grad_scale is scale_ then a step, bit for bit, leaving the slab",
          "[optim]") {
  for (const char* name : {"adamw", "lamb"}) {
    INFO(name);
    OptimizerOptions opt;
    opt.name = name;
    NamedTensors pa = make_params(3), pb = make_params(3);
    FlatParameters fa(pa), fb(pb);
    std::unique_ptr<Optimizer> a = make_optimizer(fa, opt), b = make_optimizer(fb, opt);
    Generator g(5);
    for (int step = 1; step <= 3; ++step) {
      const Tensor grad = Tensor::randn({fa.numel()}, g);
      fa.grad().copy_(grad);
      fb.grad().copy_(grad);
      const double coef = step == 2 ? 1.0 : 0.3 / step;
      a->step(1e-2, coef);
      scale_(fb.grad(), coef);
      b->step(1e-2);
      REQUIRE(fa.data().to_vector<float>() == fb.data().to_vector<float>());
      REQUIRE(fa.grad().to_vector<float>() == grad.to_vector<float>());  // the slab is not scaled
    }
    REQUIRE(a->state()[0].second.to_vector<float>() == b->state()[0].second.to_vector<float>());
    REQUIRE(a->state()[1].second.to_vector<float>() == b->state()[1].second.to_vector<float>());
  }
}

TEST_CASE("adamw and lamb: the device controls give step()'s bits, clip and skip included",
          "[optim]") {
  // step_on_device reads [s0, s1, s2, sum of squares, non-finite count] where the kernels run: the
  // same bits as step(lr, clip_coefficient(norm, clip_norm)); a count > 0 or a non-finite norm
  // changes nothing.
  for (const char* name : {"adamw", "lamb"}) {
    INFO(name);
    Twin twin(name, 4);
    FlatParameters &fa = twin.fa, &fb = twin.fb;
    std::unique_ptr<Optimizer>&a = twin.a, &b = twin.b;
    const double clip_norm = 2.0;
    const double inf = std::numeric_limits<double>::infinity();
    const struct {
      double sum_squares, nonfinite;
      bool applied;
    } cases[] = {
        {16.0, 0, true}, {1.0, 0, true}, {16.0, 2, false}, {inf, 0, false}, {9.0, 0, true}};
    int t = 0;
    for (const auto& c : cases) {
      INFO("sum of squares " << c.sum_squares << ", non-finite " << c.nonfinite);
      set_grads(fa, ++t);
      fb.grad().copy_(fa.grad());
      const double lr = 1e-2 * t;
      const std::array<double, 3> next = b->next_step_scalars(lr);
      const Tensor controls = Tensor::from_vector(
          std::vector<double>{next[0], next[1], next[2], c.sum_squares, c.nonfinite}, {5});
      const std::vector<float> before = fb.data().to_vector<float>();
      b->step_on_device(controls, clip_norm);
      if (c.applied) {
        a->step(lr, clip_coefficient(std::sqrt(c.sum_squares), clip_norm));
        b->count_step();
      } else {
        REQUIRE(fb.data().to_vector<float>() == before);
      }
      REQUIRE(fa.data().to_vector<float>() == fb.data().to_vector<float>());
      REQUIRE(a->step_count() == b->step_count());
    }
    REQUIRE(a->state()[1].second.to_vector<float>() == b->state()[1].second.to_vector<float>());
    const std::string tag = std::string("[") + name + "] ";
    REQUIRE_THROWS_WITH(
        b->step_on_device(Tensor::zeros({4}, DType::f64), 1.0),
        Contains(tag + "step_on_device: the controls must be a contiguous (5) f64"));
    REQUIRE_THROWS_WITH(b->step_on_device(Tensor::zeros({5}, DType::f64), -1.0),
                        Contains(tag + "clip_norm must be 0 (off) or positive"));
  }
}

TEST_CASE(
    "adamw and lamb: step_on_device writes the parameters' 16-bit copy with Tensor::to's bits, "
    "untouched by a skipped step",
    "[optim]") {
  // The copy autocast's casts read (engine/autocast.h): after an applied step it holds the new
  // slab converted; a skipped step leaves slab and copy as they were; the steps themselves are
  // those without a copy.
  for (const char* name : {"adamw", "lamb"})
    for (const DType dt : {DType::bf16, DType::f16}) {
      INFO(name << " " << dtype_name(dt));
      Twin twin(name, 6);
      FlatParameters &fa = twin.fa, &fb = twin.fb;
      std::unique_ptr<Optimizer>&a = twin.a, &b = twin.b;
      const Tensor copy = fb.data().to(dt);
      for (int t = 1; t <= 3; ++t) {
        INFO("step " << t);
        set_grads(fa, t);
        fb.grad().copy_(fa.grad());
        const std::array<double, 3> next = b->next_step_scalars(1e-2 * t);
        const double nonfinite = t == 2 ? 1.0 : 0.0;
        const Tensor controls = Tensor::from_vector(
            std::vector<double>{next[0], next[1], next[2], 4.0, nonfinite}, {5});
        const std::vector<uint16_t> copy_before = half_bits(copy);
        a->step_on_device(controls, 1.0);
        b->step_on_device(controls, 1.0, copy);
        REQUIRE(fa.data().to_vector<float>() == fb.data().to_vector<float>());
        if (nonfinite > 0) {
          REQUIRE(half_bits(copy) == copy_before);
        } else {
          a->count_step();
          b->count_step();
          REQUIRE(half_bits(copy) == half_bits(fb.data().to(dt)));
          REQUIRE(half_bits(copy) != copy_before);
        }
      }
      const std::string tag = std::string("[") + name + "] ";
      const Tensor ctl = Tensor::from_vector(std::vector<double>{1, 1e-3, 1, 1, 0}, {5});
      REQUIRE_THROWS_WITH(
          b->step_on_device(ctl, 1.0, fb.data().clone()),
          Contains(tag +
                   "step_on_device: the parameters' copy must be a contiguous bf16 or f16 "
                   "tensor of " +
                   std::to_string(fb.numel()) + " elements on cpu, got"));
      REQUIRE_THROWS_WITH(b->step_on_device(ctl, 1.0, Tensor::zeros({5}, dt)),
                          Contains(tag + "step_on_device: the parameters' copy must be"));
    }
}

// ---- LAMB ---------------------------------------------------------------------------------------

TEST_CASE("lamb matches a double-precision reference over several steps", "[optim]") {
  // apex FusedLAMB's update in double: per tensor, u = m_hat / (sqrt(v_hat) + eps) + wd p, the
  // trust ratio ||p|| / ||u|| where decay applies (or everywhere: trust_ratio_all), p -= lr ratio
  // u.
  for (const bool all : {false, true}) {
    INFO("trust_ratio_all " << all);
    NamedTensors ps = make_params(7);
    FlatParameters flat(ps);
    OptimizerOptions opt;
    opt.beta1 = 0.85;
    opt.beta2 = 0.98;
    opt.eps = 1e-6;
    opt.weight_decay = 0.1;
    opt.trust_ratio_all = all;
    Lamb lamb(flat, opt, decays);
    const int64_t n = flat.numel();
    std::vector<double> p(static_cast<size_t>(n)), m(p.size(), 0.0), v(p.size(), 0.0);
    {
      const std::vector<float> p0 = flat.data().to_vector<float>();
      std::copy(p0.begin(), p0.end(), p.begin());
    }
    double worst = 0;
    for (int t = 1; t <= 5; ++t) {
      set_grads(flat, t);
      const double lr = 0.02 * t, scale = t == 3 ? 0.25 : 1.0;
      const std::vector<float> g = flat.grad().to_vector<float>();
      const double bc1 = 1 - std::pow(opt.beta1, t), bc2 = 1 - std::pow(opt.beta2, t);
      for (const auto& e : flat.entries()) {
        const bool decay = decays(e.name);
        std::vector<double> u(static_cast<size_t>(e.numel));
        double pn = 0, un = 0;
        for (int64_t k = 0; k < e.numel; ++k) {
          const size_t i = static_cast<size_t>(e.offset + k);
          const double gi = g[i] * scale;
          m[i] = opt.beta1 * m[i] + (1 - opt.beta1) * gi;
          v[i] = opt.beta2 * v[i] + (1 - opt.beta2) * gi * gi;
          u[size_t(k)] = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + opt.eps) +
                         (decay ? opt.weight_decay * p[i] : 0.0);
          pn += p[i] * p[i];
          un += u[size_t(k)] * u[size_t(k)];
        }
        const double ratio =
            (all || decay) && pn > 0 && un > 0 ? std::sqrt(pn) / std::sqrt(un) : 1.0;
        for (int64_t k = 0; k < e.numel; ++k) p[size_t(e.offset + k)] -= lr * ratio * u[size_t(k)];
      }
      lamb.step(lr, scale);
      const std::vector<float> got = flat.data().to_vector<float>();
      for (const auto& e : flat.entries()) {
        double max_ref = 0, max_err = 0;
        for (int64_t k = 0; k < e.numel; ++k) {
          const size_t i = static_cast<size_t>(e.offset + k);
          max_ref = std::max(max_ref, std::abs(p[i]));
          max_err = std::max(max_err, std::abs(got[i] - p[i]));
        }
        INFO("step " << t << " " << e.name);
        CHECK(max_err <= 1e-6 * max_ref);
        worst = std::max(worst, max_err / max_ref);
      }
    }
    // The padding stays zero.
    const std::vector<float> got = flat.data().to_vector<float>();
    for (const auto& e : flat.entries())
      for (int64_t i = e.offset + e.numel; i % 16 != 0; ++i) CHECK(got[size_t(i)] == 0.0f);
    WARN("lamb vs double reference, 5 steps: worst relative error " << worst);
  }
}

TEST_CASE("lamb first step by hand: the trust ratio, 1 where a norm is 0 or it does not apply",
          "[optim]") {
  // Step 1: m_hat = g, v_hat = g^2, so u = g / (|g| + eps) (+ wd p). With p = (3, 4), g = (1, -1)
  // and no decay term, ||p|| = 5, ||u|| = sqrt(2) / (1 + eps): p - lr (5 / sqrt 2) (1, -1) exactly
  // (the eps cancels) where the ratio applies, p - lr u where it does not.
  const double lr = 0.1, eps = 1e-6;
  for (const bool all : {false, true}) {
    INFO("trust_ratio_all " << all);
    NamedTensors ps = {{"w", Tensor::from_vector<float>({3, 4}, {2}).set_requires_grad()},
                       {"z.weight", Tensor::zeros({3}).set_requires_grad()},
                       {"b.bias", Tensor::from_vector<float>({1, 1}, {2}).set_requires_grad()}};
    FlatParameters flat(ps);
    OptimizerOptions opt;
    opt.weight_decay = 0.5;
    opt.eps = eps;
    opt.trust_ratio_all = all;
    // Only z decays: w and b get their ratio from trust_ratio_all alone.
    Lamb lamb(flat, opt, [](const std::string& n) { return n == "z.weight"; });
    std::vector<float> g(static_cast<size_t>(flat.numel()), 0.0f);
    const float gw[] = {1, -1}, gz[] = {1, -3, 5}, gb[] = {2, 2};
    const float* gs[] = {gw, gz, gb};
    for (size_t k = 0; k < 3; ++k)
      for (int64_t i = 0; i < flat.entries()[k].numel; ++i)
        g[size_t(flat.entries()[k].offset + i)] = gs[k][i];
    flat.grad().copy_(Tensor::from_vector(g, {flat.numel()}));
    lamb.step(lr);
    const std::vector<float> w = ps[0].second.to_vector<float>();
    const std::vector<float> z = ps[1].second.to_vector<float>();
    const std::vector<float> b = ps[2].second.to_vector<float>();
    const double u1 = 1.0 / (1.0 + eps);
    if (all) {
      CHECK(w[0] == Approx(3 - lr * 5 / std::sqrt(2.0)).epsilon(1e-6));
      CHECK(w[1] == Approx(4 + lr * 5 / std::sqrt(2.0)).epsilon(1e-6));
      // b: ||p|| = sqrt 2, ||u|| = sqrt 2 * 2 / (2 + eps): p - lr (1, 1).
      CHECK(b[0] == Approx(1 - lr).epsilon(1e-6));
    } else {
      CHECK(w[0] == Approx(3 - lr * u1).epsilon(1e-6));
      CHECK(w[1] == Approx(4 + lr * u1).epsilon(1e-6));
      CHECK(b[0] == Approx(1 - lr * (2.0 / (2.0 + eps))).epsilon(1e-6));
    }
    // z decays but is 0: ||p|| = 0, ratio 1, p = -lr u with u = g / (|g| + eps) (wd p = 0).
    CHECK(z[0] == Approx(-lr * 1 / (1 + eps)).epsilon(1e-6));
    CHECK(z[1] == Approx(lr * 3 / (3 + eps)).epsilon(1e-6));
    CHECK(z[2] == Approx(-lr * 5 / (5 + eps)).epsilon(1e-6));
  }
}

TEST_CASE("lamb's chunks: a tensor across several chunks has one trust ratio", "[optim]") {
  // 3 x 4096 + 5 elements: four chunks, the last partial and not a multiple of 4. Step 1 against
  // the double formula with the whole tensor's norms.
  Generator gen(11);
  const int64_t n = 3 * 4096 + 5;
  NamedTensors ps = {{"big.weight", Tensor::randn({n}, gen, 0, 0.5).set_requires_grad()}};
  FlatParameters flat(ps);
  OptimizerOptions opt;
  Lamb lamb(flat, opt);
  const std::vector<float> p0 = flat.data().to_vector<float>();
  std::vector<float> gv = Tensor::randn({n}, gen).to_vector<float>();
  gv.resize(size_t(flat.numel()), 0.0f);
  flat.grad().copy_(Tensor::from_vector(gv, {flat.numel()}));
  lamb.step(0.05);
  const std::vector<float> got = flat.data().to_vector<float>();
  double pn = 0, un = 0;
  std::vector<double> u(static_cast<size_t>(n));
  for (size_t i = 0; i < size_t(n); ++i) {
    u[i] = gv[i] / (std::abs(double(gv[i])) + opt.eps) + opt.weight_decay * p0[i];
    pn += double(p0[i]) * p0[i];
    un += u[i] * u[i];
  }
  const double ratio = std::sqrt(pn) / std::sqrt(un);
  double max_err = 0;
  for (size_t i = 0; i < size_t(n); ++i)
    max_err = std::max(max_err, std::abs(got[i] - (p0[i] - 0.05 * ratio * u[i])));
  CHECK(max_err < 1e-6);
  for (size_t i = size_t(n); i < got.size(); ++i) CHECK(got[i] == 0.0f);  // padding
}

TEST_CASE("make_optimizer names both and refuses others", "[optim][errors]") {
  NamedTensors ps = make_params(5);
  FlatParameters flat(ps);
  OptimizerOptions opt;
  CHECK(std::string(make_optimizer(flat, opt)->name()) == "adamw");
  opt.name = "lamb";
  CHECK(std::string(make_optimizer(flat, opt)->name()) == "lamb");
  opt.name = "sgd";
  REQUIRE_THROWS_WITH(make_optimizer(flat, opt),
                      Contains("[optimizer] unknown optimizer 'sgd' (expected adamw or lamb)"));
  opt = OptimizerOptions{};
  opt.beta1 = 1.5;
  REQUIRE_THROWS_WITH(Lamb(flat, opt), Contains("[lamb] beta1 must be in [0, 1)"));
}
TEST_CASE("clip_grad_norm returns the norm and scales above max_norm", "[optim]") {
  NamedTensors ps = {{"a", Tensor::zeros({2}).set_requires_grad()},
                     {"b", Tensor::zeros({1}).set_requires_grad()}};
  FlatParameters flat(ps);
  auto set = [&](float x, float y, float z) {
    NoGrad ng;
    ps[0].second.grad().copy_(Tensor::from_vector<float>({x, y}, {2}));
    ps[1].second.grad().fill_(z);
  };
  set(3, 0, 4);  // norm 5, split across entries (and padding)
  REQUIRE(clip_grad_norm(flat, 10.0) == 5.0);
  REQUIRE(ps[0].second.grad().to_vector<float>() == std::vector<float>{3, 0});  // untouched
  REQUIRE(ps[1].second.grad().item() == 4.0);

  REQUIRE(clip_grad_norm(flat, 1.0) == 5.0);  // the norm before clipping
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  REQUIRE(ps[0].second.grad().to_vector<float>() == std::vector<float>{3 * coef, 0});
  REQUIRE(ps[1].second.grad().item() == 4 * coef);
  REQUIRE(clip_grad_norm(flat, 1.0) == Approx(1.0).epsilon(1e-6));

  set(3, std::numeric_limits<float>::infinity(), 4);
  REQUIRE(std::isinf(clip_grad_norm(flat, 1.0)));
  REQUIRE(ps[1].second.grad().item() == 4.0);  // nothing scaled
  set(std::numeric_limits<float>::quiet_NaN(), 0, 4);
  REQUIRE(std::isnan(clip_grad_norm(flat, 1.0)));
  REQUIRE(ps[1].second.grad().item() == 4.0);

  REQUIRE_THROWS_WITH(clip_grad_norm(flat, 0.0),
                      Contains("[clip_grad_norm] max_norm must be finite and > 0"));
}

TEST_CASE("clip_grad_norm over a large slab matches a double sum", "[optim]") {
  Generator gen(42);
  NamedTensors ps = {{"big", Tensor::zeros({300001}).set_requires_grad()},
                     {"small", Tensor::zeros({17}).set_requires_grad()}};
  FlatParameters flat(ps);
  {
    NoGrad ng;
    flat.grad().copy_(Tensor::randn({flat.numel()}, gen, 0, 0.01));
  }
  std::vector<float> g = flat.grad().to_vector<float>();
  double ss = 0;
  for (float x : g) ss += double(x) * x;
  const double norm = clip_grad_norm(flat, 0.5);
  REQUIRE(norm == Approx(std::sqrt(ss)).epsilon(1e-12));
  REQUIRE(norm > 0.5);
  std::vector<float> after = flat.grad().to_vector<float>();
  const float coef = static_cast<float>(0.5 / (norm + 1e-6));
  for (size_t i = 0; i < g.size(); i += 997) REQUIRE(after[i] == g[i] * coef);
  REQUIRE(clip_grad_norm(flat, 0.5) == Approx(0.5).epsilon(1e-5));
}

TEST_CASE("linear schedule: warmup then linear decay, transformers' values", "[optim]") {
  // lr(s): s = optimizer steps already taken.
  LinearSchedule s(1e-3, 10, 100);
  REQUIRE(s.lr(0) == 0.0);
  REQUIRE(s.lr(1) == Approx(1e-4));
  REQUIRE(s.lr(5) == Approx(5e-4));
  REQUIRE(s.lr(9) == Approx(9e-4));
  REQUIRE(s.lr(10) == 1e-3);  // warmup end: the peak
  REQUIRE(s.lr(11) == Approx(1e-3 * 89.0 / 90.0));
  REQUIRE(s.lr(55) == Approx(5e-4));
  REQUIRE(s.lr(99) == Approx(1e-3 / 90.0));
  REQUIRE(s.lr(100) == 0.0);
  REQUIRE(s.lr(150) == 0.0);

  LinearSchedule no_warmup(2.0, 0, 4);
  REQUIRE(no_warmup.lr(0) == 2.0);
  REQUIRE(no_warmup.lr(1) == 1.5);
  REQUIRE(no_warmup.lr(3) == 0.5);
  REQUIRE(no_warmup.lr(4) == 0.0);

  LinearSchedule all_warmup(1.0, 4, 4);
  REQUIRE(all_warmup.lr(2) == 0.5);
  REQUIRE(all_warmup.lr(3) == 0.75);
  REQUIRE(all_warmup.lr(4) == 0.0);

  REQUIRE(LinearSchedule::with_warmup_ratio(1e-3, 0.1, 1000).warmup_steps() == 100);
  REQUIRE(LinearSchedule::with_warmup_ratio(1e-3, 0.25, 10).warmup_steps() == 3);  // ceil(2.5)
  REQUIRE(LinearSchedule::with_warmup_ratio(1e-3, 0.0, 10).warmup_steps() == 0);
  REQUIRE(LinearSchedule::with_warmup_ratio(1e-3, 1.0, 10).warmup_steps() == 10);
  LinearSchedule r = LinearSchedule::with_warmup_ratio(4e-4, 0.06, 10000);
  REQUIRE(r.warmup_steps() == 600);
  REQUIRE(r.total_steps() == 10000);
  REQUIRE(r.peak_lr() == 4e-4);
  REQUIRE(r.lr(300) == Approx(2e-4));
}

TEST_CASE("linear schedule drives adamw", "[optim]") {
  NamedTensors ps = make_params(21);
  FlatParameters flat(ps);
  AdamW adamw(flat, OptimizerOptions{}, decays);
  LinearSchedule sched(1e-2, 2, 5);
  std::vector<float> before = flat.data().to_vector<float>();
  set_grads(flat, 1);
  adamw.step(
      sched.lr(adamw.step_count()));  // lr(0) = 0: the first step leaves parameters as they are
  REQUIRE(flat.data().to_vector<float>() == before);
  adamw.step(sched.lr(adamw.step_count()));
  REQUIRE(flat.data().to_vector<float>() != before);
  REQUIRE(adamw.step_count() == 2);
}

TEST_CASE("linear schedule errors", "[optim][errors]") {
  REQUIRE_THROWS_WITH(LinearSchedule(1e-3, 0, 0),
                      Contains("[linear_schedule] total_steps must be > 0, got 0"));
  REQUIRE_THROWS_WITH(
      LinearSchedule(1e-3, -1, 10),
      Contains("[linear_schedule] warmup_steps must be in [0, total_steps = 10], got -1"));
  REQUIRE_THROWS_WITH(LinearSchedule(1e-3, 11, 10), Contains("got 11"));
  REQUIRE_THROWS_WITH(LinearSchedule(-1.0, 1, 10), Contains("[linear_schedule] peak_lr"));
  REQUIRE_THROWS_WITH(LinearSchedule::with_warmup_ratio(1e-3, 1.5, 10),
                      Contains("[linear_schedule] warmup_ratio must be in [0, 1], got 1.5"));
  REQUIRE_THROWS_WITH(LinearSchedule::with_warmup_ratio(1e-3, 0.1, -5),
                      Contains("total_steps must be > 0"));
  REQUIRE_THROWS_WITH(LinearSchedule(1e-3, 1, 10).lr(-1),
                      Contains("[linear_schedule] steps_taken must be >= 0"));
}
