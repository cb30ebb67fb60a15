// models/poscorr.h: the property measures on synthetic matrices with known answers, the pattern
// rules, and what the extraction gives for each kind of preset (TUPE's probe is its positional
// term plus a constant; no_pe's probe is flat; the relative bias per offset is the table's).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>

#include "engine/autograd.h"
#include "models/bert.h"
#include "models/poscorr.h"

using namespace models;
using engine::Tensor;

namespace {

std::vector<float> make(int64_t n, const std::function<double(int64_t, int64_t)>& f) {
  std::vector<float> m(size_t(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) m[size_t(i * n + j)] = float(f(i, j));
  return m;
}

std::vector<float> random_matrix(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g;
  return make(n, [&](int64_t, int64_t) { return g(rng); });
}

BertConfig tiny(const std::string& preset, const std::string& reset = "paper") {
  BertConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.ffn_size = 64;
  c.max_positions = 24;
  c.hidden_dropout = c.attention_dropout = 0.1;  // extraction must switch dropout off
  apply_position_preset(c.position, preset, reset);
  c.position.rpe_clip = 5;
  c.validate();
  return c;
}

const CorrelationMatrix& find(const std::vector<CorrelationMatrix>& ms, const std::string& name) {
  for (const auto& m : ms)
    if (m.name == name) return m;
  FAIL("no matrix " << name);
  return ms.front();
}

std::vector<std::string> names(const std::vector<CorrelationMatrix>& ms) {
  std::vector<std::string> out;
  for (const auto& m : ms) out.push_back(m.name);
  return out;
}

}  // namespace

TEST_CASE("poscorr: a Toeplitz matrix is fully translation invariant, a random one is not",
          "[poscorr]") {
  const int64_t n = 48;
  std::vector<float> offsets(size_t(2 * n - 1));
  std::mt19937_64 rng(5);
  std::normal_distribution<double> g;
  for (auto& v : offsets) v = float(g(rng));
  const std::vector<float> toeplitz = toeplitz_of_offsets(offsets.data(), n);
  CHECK(toeplitz[size_t(3 * n + 7)] == offsets[size_t(7 - 3 + n - 1)]);
  CHECK(measure(toeplitz.data(), n).translation_invariance == Approx(1.0).margin(1e-9));
  const double random_ti = measure(random_matrix(n, 1).data(), n).translation_invariance;
  CHECK(random_ti < 0.1);  // only the 2n - 1 diagonal means explain anything: ~ (2n - 1) / n^2
  // A Toeplitz matrix plus noise: in between, and less with more noise.
  std::vector<float> noisy = toeplitz, noisier = toeplitz;
  const std::vector<float> noise = random_matrix(n, 2);
  for (size_t k = 0; k < noisy.size(); ++k)
    noisy[k] += 0.3f * noise[k], noisier[k] += 1.0f * noise[k];
  const double a = measure(noisy.data(), n).translation_invariance,
               b = measure(noisier.data(), n).translation_invariance;
  CHECK(a > b);
  CHECK(a < 1.0);
  CHECK(b > random_ti);
  // A matrix that varies only with i + j (a Hankel matrix) is not translation invariant.
  CHECK(
      measure(make(n, [](int64_t i, int64_t j) { return std::sin(0.2 * double(i + j)); }).data(), n)
          .translation_invariance < 0.1);
}

TEST_CASE(
    "poscorr: symmetry is 1 for symmetric, 0 for antisymmetric, about 1/2 for random matrices",
    "[poscorr]") {
  const int64_t n = 40;
  const std::vector<float> r = random_matrix(n, 3);
  auto at = [&](int64_t i, int64_t j) { return double(r[size_t(i * n + j)]); };
  CHECK(measure(make(n, [&](int64_t i, int64_t j) { return at(i, j) + at(j, i) + 5.0; }).data(), n)
            .symmetry == Approx(1.0).margin(1e-9));
  CHECK(measure(make(n, [&](int64_t i, int64_t j) { return at(i, j) - at(j, i); }).data(), n)
            .symmetry == Approx(0.0).margin(1e-9));
  CHECK(measure(r.data(), n).symmetry == Approx(0.5).margin(0.1));
  // A constant offset is removed first: an antisymmetric pattern on a large constant stays 0.
  CHECK(
      measure(make(n, [&](int64_t i, int64_t j) { return 100.0 + at(i, j) - at(j, i); }).data(), n)
          .symmetry == Approx(0.0).margin(1e-6));
  // A constant matrix is symmetric and Toeplitz, with no monotonic window.
  const Properties flat = measure(make(n, [](int64_t, int64_t) { return 2.5; }).data(), n);
  CHECK(flat.symmetry == 1.0);
  CHECK(flat.translation_invariance == 1.0);
  CHECK(flat.window_forward == 0);
  CHECK(flat.window_backward == 0);
  CHECK(flat.min == 2.5);
  CHECK(flat.max == 2.5);
}

TEST_CASE("poscorr: a strictly decreasing band has the expected monotonic window", "[poscorr]") {
  const int64_t n = 32;
  // max(0, w - |j - i|): falls for w steps, then flat.
  for (int64_t w : {1, 3, 6, 10}) {
    const Properties p = measure(
        make(n, [&](int64_t i,
                    int64_t j) { return std::max<double>(0.0, double(w - std::abs(j - i))); })
            .data(),
        n);
    CHECK(p.profile_peak == 0);
    CHECK(p.window_forward == w);
    CHECK(p.window_backward == w);
    CHECK(p.symmetry == Approx(1.0).margin(1e-9));
    CHECK(p.translation_invariance == Approx(1.0).margin(1e-9));
  }
  // Asymmetric: 4 steps forward (j > i), 9 backward; not symmetric.
  const Properties p = measure(make(n,
                                    [](int64_t i, int64_t j) {
                                      const int64_t r = j - i;
                                      return r >= 0 ? std::max<double>(0.0, 36.0 - 9.0 * double(r))
                                                    : std::max<double>(0.0, 36.0 + 4.0 * double(r));
                                    })
                                   .data(),
                               n);
  CHECK(p.window_forward == 4);
  CHECK(p.window_backward == 9);
  CHECK(p.symmetry < 0.95);
  // Peaked at +1 (attend to next): forward from +1 to 5, backward from +1 down to -3.
  const Properties next = measure(
      make(n, [](int64_t i,
                 int64_t j) { return std::max<double>(0.0, 4.0 - double(std::abs(j - i - 1))); })
          .data(),
      n);
  CHECK(next.profile_peak == 1);
  CHECK(next.window_forward == 5);
  CHECK(next.window_backward == 3);
  // Strictly falling over the whole matrix: the window is n - 1; a rise right away: 0.
  CHECK(measure(make(n, [](int64_t i, int64_t j) { return -double(std::abs(i - j)); }).data(), n)
            .window_forward == n - 1);
  // f(r) = r: the peak among -1, 0, 1 is +1; from there it falls backward over the whole matrix
  // and rises forward at once.
  const Properties rising =
      measure(make(n, [](int64_t i, int64_t j) { return double(j - i); }).data(), n);
  CHECK(rising.profile_peak == 1);
  CHECK(rising.window_forward == 1);
  CHECK(rising.window_backward == n - 1);
}

TEST_CASE("poscorr: measures skip the [CLS] row and column when asked", "[poscorr]") {
  const int64_t n = 20;
  std::vector<float> m =
      make(n, [](int64_t i, int64_t j) { return -0.5 * double(std::abs(j - i)); });
  for (int64_t k = 0; k < n; ++k) m[size_t(k)] = 7.f, m[size_t(k * n)] = -3.f;  // theta1, theta2
  const Properties body = measure(m.data(), n, 1);
  CHECK(body.translation_invariance == Approx(1.0).margin(1e-9));
  CHECK(body.symmetry == Approx(1.0).margin(1e-9));
  CHECK(body.window_forward == n - 2);
  CHECK(body.max == 0.0);
  const Properties whole = measure(m.data(), n, 0);
  CHECK(whole.translation_invariance < 0.9);
  CHECK(whole.max == 7.0);
  CHECK_THROWS_WITH(measure(m.data(), n, n),
                    Catch::Contains("cannot measure a 20 x 20 matrix from index 20"));
}

TEST_CASE("poscorr: the five patterns on prototypes", "[poscorr]") {
  const int64_t n = 64;
  auto pattern = [&](const std::function<double(int64_t, int64_t)>& f, int64_t first = 0) {
    return classify_pattern(make(n, f).data(), n, first);
  };
  const Pattern global =
      pattern([](int64_t i, int64_t j) { return 0.01 * std::sin(double(3 * i + 7 * j)); });
  CHECK(global.name == "global");
  CHECK(global.entropy > 0.99);
  const Pattern prev = pattern([](int64_t i, int64_t j) { return j == i - 1 ? 8.0 : 0.0; });
  CHECK(prev.name == "previous");
  CHECK(prev.peak_offset == -1);
  const Pattern next = pattern([](int64_t i, int64_t j) { return j == i + 1 ? 8.0 : 0.0; });
  CHECK(next.name == "next");
  CHECK(next.peak_offset == 1);
  const Pattern local =
      pattern([](int64_t i, int64_t j) { return -2.0 * double(std::abs(i - j)); });
  CHECK(local.name == "local");
  CHECK(local.peak_offset == 0);
  CHECK(local.local_mass > 0.9);
  const Pattern broad =
      pattern([](int64_t i, int64_t j) { return -std::pow(double(i - j) / 10.0, 2); });
  CHECK(broad.name == "broad");
  CHECK(broad.peak_offset == 0);
  CHECK(broad.local_mass < 0.5);
  CHECK(broad.entropy < 0.9);
  // The [CLS] row and column are left out with first = 1: a huge theta there changes nothing.
  const Pattern with_cls = pattern(
      [](int64_t i, int64_t j) { return i == 0 || j == 0 ? 50.0 : (j == i + 1 ? 8.0 : 0.0); }, 1);
  CHECK(with_cls.name == "next");
}

TEST_CASE("poscorr: the matrices of each kind of preset", "[poscorr]") {
  const int64_t t = 16;
  ProbeOptions probe;
  probe.tokens = 5;
  auto extract = [&](const BertConfig& c, std::vector<int64_t>* ids = nullptr) {
    engine::Generator init(11);
    BertModel bert(c, init);
    bert.train(true);
    return extract_correlations(bert, t, probe, ids);
  };
  CHECK(names(extract(tiny("tupe_a"))) == std::vector<std::string>{"tupe_term", "probe_logits"});
  CHECK(names(extract(tiny("tupe_r"))) ==
        std::vector<std::string>{"tupe_term", "relative_bias", "probe_logits"});
  CHECK(names(extract(tiny("bert_a"))) ==
        std::vector<std::string>{"ape_dot", "ape_qk", "probe_logits"});
  CHECK(names(extract(tiny("bert_r"))) ==
        std::vector<std::string>{"ape_dot", "ape_qk", "relative_bias", "probe_logits"});
  CHECK(names(extract(tiny("bert_a_d"))) ==
        std::vector<std::string>{"decomposed_term", "ape_dot", "probe_logits"});
  CHECK(names(extract(tiny("learned_rpe"))) == std::vector<std::string>{"rpe_dot", "probe_logits"});
  CHECK(names(extract(tiny("bert_a+sin_rpe"))) ==
        std::vector<std::string>{"ape_dot", "ape_qk", "rpe_dot", "probe_logits"});
  CHECK(names(extract(tiny("no_pe"))) == std::vector<std::string>{"probe_logits"});

  SECTION("TUPE: the term is the model's, and the probe is that term plus a constant per head") {
    for (const char* preset : {"tupe_a", "tupe_r"}) {
      const BertConfig c = tiny(preset);
      engine::Generator init(11);
      BertModel bert(c, init);
      std::vector<int64_t> ids;
      const auto ms = extract_correlations(bert, t, probe, &ids);
      CHECK(ids.size() == 5);
      CHECK_FALSE(bert.training());
      const CorrelationMatrix& term = find(ms, "tupe_term");
      CHECK(term.first == 1);
      CHECK(term.logits);
      CHECK(term.values.shape() == engine::Shape{4, t, t});
      Tensor want;
      {
        engine::NoGrad ng;
        want = bert.position->attention_terms(t, bert.token_embedding.device())
                   .bias.select(0, 0)
                   .contiguous();
      }
      CHECK(term.values.to_vector<float>() == want.to_vector<float>());
      // x^0 = LN(w) is the same at every position, so the content logits are one constant.
      const std::vector<float> v = term.values.to_vector<float>(),
                               pr = find(ms, "probe_logits").values.to_vector<float>();
      for (int64_t h = 0; h < 4; ++h) {
        const float offset = pr[size_t(h * t * t)] - v[size_t(h * t * t)];
        for (int64_t k = 0; k < t * t; ++k)
          REQUIRE(pr[size_t(h * t * t + k)] - v[size_t(h * t * t + k)] ==
                  Approx(offset).margin(1e-4));
      }
    }
  }
  SECTION(
      "no_pe sees no position; bert_r's probe is Toeplitz; the bias per offset is the table's") {
    const auto flat = extract(tiny("no_pe"));
    for (int64_t h = 0; h < 4; ++h) {
      const std::vector<float> v =
          find(flat, "probe_logits").values.select(0, h).contiguous().to_vector<float>();
      const Properties p = measure(v.data(), t);
      CHECK(p.max - p.min < 1e-4);
      CHECK(classify_pattern(v.data(), t).name == "global");
    }
    const BertConfig c = tiny("bert_r");
    engine::Generator init(11);
    BertModel bert(c, init);
    const auto ms = extract_correlations(bert, t, probe);
    const CorrelationMatrix& bias = find(ms, "relative_bias");
    CHECK(bias.values.shape() == engine::Shape{4, 1, 2 * t - 1});
    CHECK(bias.col_start == -(t - 1));
    CHECK(bias.per_offset);
    const std::vector<float> table = bert.position->parameter("relative_table").to_vector<float>(),
                             b = bias.values.to_vector<float>();
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t r : std::vector<int64_t>{-(t - 1), -9, -1, 0, 1, 8, t - 1})
        CHECK(b[size_t(h * (2 * t - 1) + r + t - 1)] == table[size_t(t5_bucket(r) * 4 + h)]);
  }
  SECTION("explicit probe ids, and errors") {
    probe.ids = {3, 3, 7};
    std::vector<int64_t> ids;
    extract(tiny("bert_a"), &ids);
    CHECK(ids == std::vector<int64_t>{3, 3, 7});
    probe.ids = {40};
    CHECK_THROWS_WITH(extract(tiny("bert_a")),
                      Catch::Contains("probe token id 40 is outside the vocabulary [0, 40)"));
    probe.ids.clear();
    engine::Generator init(11);
    BertModel bert(tiny("tupe_a"), init);
    CHECK_THROWS_WITH(extract_correlations(bert, 32, probe),
                      Catch::Contains("sequence length 32 exceeds model.max_positions 24"));
  }
}
