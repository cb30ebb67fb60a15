// sample_categorical and replace_tokens (ELECTRA's generator draws and discriminator input): the
// draws against the Gumbel-max rule computed here from rng.h, their frequencies against the
// softmax, reproducibility and generator bookkeeping, the labels, and the errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/ops.h"

using namespace engine;

TEST_CASE("sample_categorical is the Gumbel-max argmax of word i * C + c", "[sampling]") {
  Generator init(3);
  for (auto [n, c] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 130}, {2, 1031}, {130, 7}}) {
    INFO(n << " x " << c);
    Tensor logits = Tensor::randn({n, c}, init, 0.0, 3.0);
    for (double t : {1.0, 0.5, 2.0}) {
      Generator g(11);
      g.set_state({77, 5});
      const PhiloxState s{77, 5};
      std::vector<int64_t> got = sample_categorical(logits, t, g).to_vector<int64_t>();
      REQUIRE(g.offset() == 5 + uint64_t((n * c + 3) / 4));
      std::vector<float> x = logits.to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t arg = 0;
        for (int64_t j = 0; j < c; ++j) {
          const float v = x[size_t(i * c + j)] / float(t) +
                          gumbel_from_word(philox_word(s, uint64_t(i * c + j)));
          if (v > best) best = v, arg = j;
        }
        REQUIRE(got[size_t(i)] == arg);
      }
    }
  }
}

TEST_CASE("sample_categorical draws with the softmax's frequencies", "[sampling]") {
  // 40000 rows of the same 5 logits: every class's count within 5 standard deviations of
  // n * softmax(logits / t) (a wrong temperature or noise moves some class by far more).
  const int64_t n = 40000;
  const std::vector<float> row = {0.0f, 1.0f, -1.0f, 2.0f, 0.5f};
  std::vector<float> all;
  for (int64_t i = 0; i < n; ++i) all.insert(all.end(), row.begin(), row.end());
  Tensor logits = Tensor::from_vector<float>(all, {n, 5});
  for (double t : {1.0, 2.0, 0.5}) {
    INFO("temperature " << t);
    Generator g(2024);
    std::vector<int64_t> draws = sample_categorical(logits, t, g).to_vector<int64_t>();
    std::vector<double> count(5, 0.0), p(5);
    for (int64_t d : draws) count[size_t(d)] += 1;
    double z = 0;
    for (size_t k = 0; k < 5; ++k) z += p[k] = std::exp(double(row[k]) / t);
    for (size_t k = 0; k < 5; ++k) {
      const double expect = double(n) * p[k] / z;
      const double sd = std::sqrt(expect * (1 - p[k] / z));
      INFO("class " << k << " count " << count[k] << " expected " << expect);
      REQUIRE(std::abs(count[k] - expect) < 5 * sd);
    }
  }
}

TEST_CASE("sample_categorical: same stream state, same draws, f64 and f32 logits agree",
          "[sampling]") {
  Generator init(9);
  Tensor logits = Tensor::randn({64, 100}, init);
  Generator a(5), b(5);
  Tensor x = sample_categorical(logits, 1.0, a), y = sample_categorical(logits, 1.0, b);
  REQUIRE(x.to_vector<int64_t>() == y.to_vector<int64_t>());
  REQUIRE(x.dtype() == DType::i64);
  REQUIRE(x.shape() == Shape{64});
  // A second draw from the advanced stream differs (64 rows of 100 classes).
  REQUIRE(sample_categorical(logits, 1.0, a).to_vector<int64_t>() != x.to_vector<int64_t>());
  Generator c(5);
  REQUIRE(sample_categorical(logits.to(DType::f64), 1.0, c).to_vector<int64_t>() ==
          x.to_vector<int64_t>());
  // A very low temperature is the argmax of the logits.
  Generator d(5);
  std::vector<int64_t> cold = sample_categorical(logits, 1e-6, d).to_vector<int64_t>();
  std::vector<float> v = logits.to_vector<float>();
  for (int64_t i = 0; i < 64; ++i) {
    const float* r = v.data() + i * 100;
    REQUIRE(cold[size_t(i)] == std::max_element(r, r + 100) - r);
  }
}

TEST_CASE("sample_categorical refuses bad arguments", "[sampling]") {
  Generator g(1);
  Tensor logits = Tensor::zeros({2, 3});
  REQUIRE_THROWS_WITH(sample_categorical(logits, 0.0, g),
                      Catch::Contains("temperature must be positive"));
  REQUIRE_THROWS_WITH(sample_categorical(Tensor::zeros({6}), 1.0, g),
                      Catch::Contains("must be (N, C) floating"));
  REQUIRE_THROWS_WITH(sample_categorical(Tensor::zeros({2, 0}), 1.0, g),
                      Catch::Contains("no class to draw"));
  REQUIRE(g.offset() == 0);  // nothing reserved by a refused call
}

TEST_CASE("replace_tokens writes the values and labels replaced tokens, tokens and padding",
          "[sampling]") {
  // Two rows of 4; the second row's last two positions are padding.
  Tensor ids = Tensor::from_vector<int64_t>({10, 11, 12, 13, 20, 21, 0, 0}, {2, 4});
  Tensor mask = Tensor::from_vector<int64_t>({1, 1, 1, 1, 1, 1, 0, 0}, {2, 4});
  Tensor positions = Tensor::from_vector<int64_t>({1, 3, 5}, {3});
  Tensor values = Tensor::from_vector<int64_t>({7, 13, 9}, {3});
  Tensor original = Tensor::from_vector<int64_t>({11, 13, 21}, {3});  // position 3 drew its own
  ReplacedTokens r = replace_tokens(ids, mask, positions, values, original);
  REQUIRE(r.ids.to_vector<int64_t>() == std::vector<int64_t>{10, 7, 12, 13, 20, 9, 0, 0});
  REQUIRE(r.labels.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0, 0, 0, 1, -100, -100});
  REQUIRE(r.labels.shape() == Shape{2, 4});
  ReplacedTokens all = replace_tokens(ids, Tensor(), positions, values, original);
  REQUIRE(all.labels.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0, 0, 0, 1, 0, 0});
  // The inputs are not modified.
  REQUIRE(ids.to_vector<int64_t>() == std::vector<int64_t>{10, 11, 12, 13, 20, 21, 0, 0});
}

TEST_CASE("replace_tokens refuses positions out of range and mismatched shapes", "[sampling]") {
  Tensor ids = Tensor::zeros({2, 4}, DType::i64);
  Tensor one = Tensor::from_vector<int64_t>({8}, {1});
  REQUIRE_THROWS_WITH(replace_tokens(ids, Tensor(), one, one, one),
                      Catch::Contains("position 8 at 0 is outside"));
  Tensor two = Tensor::from_vector<int64_t>({1, 2}, {2});
  REQUIRE_THROWS_WITH(replace_tokens(ids, Tensor(), two, one, two),
                      Catch::Contains("must have one shape"));
  REQUIRE_THROWS_WITH(replace_tokens(ids, Tensor::ones({2, 3}, DType::i64), two, two, two),
                      Catch::Contains("does not match input_ids"));
  REQUIRE_THROWS_WITH(replace_tokens(ids.to(DType::i32), Tensor(), two, two, two),
                      Catch::Contains("input_ids must be a 2-d i64 tensor"));
}
