// Fused cross-entropy: hand-computed losses (with ignored rows), reductions, the recomputed-
// softmax gradient against finite differences and a naive formula, and the error messages.
#include <catch2/catch.hpp>

#include <cmath>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::gradcheck;
using engine::testing::rand_input;

namespace {

// -log softmax(row)[t], straight from the definition (no max shift: small test values).
double naive_nll(const std::vector<double>& row, int64_t t) {
  double s = 0;
  for (double v : row) s += std::exp(v);
  return -std::log(std::exp(row[t]) / s);
}

}  // namespace

TEST_CASE("cross_entropy of a hand-computed 3x3 example with an ignored row", "[cross_entropy]") {
  Tensor logits = Tensor::from_vector<double>({1, 2, 3,   //
                                               1, 0, -1,  //
                                               0.5, 0.5, 0.5},
                                              {3, 3});
  Tensor targets = Tensor::from_vector<int64_t>({2, -100, 0}, {3});
  // Row 0: log(e + e^2 + e^3) - 3; row 1 ignored; row 2: three equal logits, log 3.
  const double r0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  const double r2 = std::log(3.0);
  REQUIRE(r0 == Approx(0.40760596444438).epsilon(1e-12));  // the value itself, once by hand

  REQUIRE(cross_entropy(logits, targets).item() == Approx((r0 + r2) / 2).epsilon(1e-12));
  REQUIRE(cross_entropy(logits, targets, -100, Reduction::sum).item() ==
          Approx(r0 + r2).epsilon(1e-12));
  std::vector<double> none =
      cross_entropy(logits, targets, -100, Reduction::none).to_vector<double>();
  REQUIRE(none.size() == 3);
  CHECK(none[0] == Approx(r0).epsilon(1e-12));
  CHECK(none[1] == 0.0);
  CHECK(none[2] == Approx(r2).epsilon(1e-12));

  // A custom ignore_index: now row 1 (target 1) counts and nothing is ignored.
  Tensor t2 = Tensor::from_vector<int32_t>({2, 1, 0}, {3});
  const double r1 = naive_nll({1, 0, -1}, 1);
  REQUIRE(cross_entropy(logits, t2, 7).item() == Approx((r0 + r1 + r2) / 3).epsilon(1e-12));
}

TEST_CASE("cross_entropy 2x3 in f32 against the naive formula", "[cross_entropy]") {
  Tensor logits = Tensor::from_vector<float>({0.2f, -1.3f, 0.7f, 2.0f, 0.1f, -0.4f}, {2, 3});
  Tensor targets = Tensor::from_vector<int32_t>({1, 0}, {2});
  double expect = (naive_nll({0.2f, -1.3f, 0.7f}, 1) + naive_nll({2.0f, 0.1f, -0.4f}, 0)) / 2;
  Tensor loss = cross_entropy(logits, targets);
  REQUIRE(loss.shape() == Shape{});
  REQUIRE(loss.dtype() == DType::f32);
  REQUIRE(loss.item() == Approx(expect).epsilon(1e-6));
}

TEST_CASE("cross_entropy with every row ignored is 0 with a zero gradient", "[cross_entropy]") {
  Tensor logits = rand_input({4, 5}, 3);
  Tensor targets = Tensor::from_vector<int64_t>({-100, -100, -100, -100}, {4});
  for (Reduction r : {Reduction::mean, Reduction::sum}) {
    logits.set_grad(Tensor());
    Tensor loss = cross_entropy(logits, targets, -100, r);
    REQUIRE(loss.item() == 0.0);  // not NaN (0 / 0)
    loss.backward();
    for (double g : logits.grad().to_vector<double>()) REQUIRE(g == 0.0);
  }
}

TEST_CASE("cross_entropy is stable for large logits", "[cross_entropy]") {
  Tensor logits = Tensor::from_vector<float>({1000.f, 0.f, -1000.f, 0.f}, {2, 2});
  Tensor targets = Tensor::from_vector<int64_t>({1, 0}, {2});
  // Row 0: lse = 1000, loss = 1000 - 0; row 1: lse = log(e^-1000 + 1) = 0, loss = 0 + 1000.
  // Without the max shift exp(1000) overflows to inf.
  std::vector<float> l = cross_entropy(logits, targets, -100, Reduction::none).to_vector<float>();
  REQUIRE(l[0] == Approx(1000.f));
  REQUIRE(l[1] == Approx(1000.f));
}

TEST_CASE("cross_entropy gradient is (softmax - onehot) / count", "[cross_entropy]") {
  std::vector<double> lv = {0.3, -0.2, 1.1, 0.0, 2.0, -1.0, 0.5, 0.5, 0.25, -0.75, 1.5, 0.1};
  Tensor logits = Tensor::from_vector(lv, {3, 4}).set_requires_grad();
  std::vector<int64_t> tv = {3, -100, 1};
  cross_entropy(logits, Tensor::from_vector(tv, {3})).backward();
  std::vector<double> g = logits.grad().to_vector<double>();
  for (int i = 0; i < 3; ++i) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += std::exp(lv[i * 4 + j]);
    for (int j = 0; j < 4; ++j) {
      double expect = tv[i] == -100 ? 0.0 : (std::exp(lv[i * 4 + j]) / s - (j == tv[i])) / 2.0;
      REQUIRE(g[i * 4 + j] == Approx(expect).margin(1e-14));
    }
  }
}

TEST_CASE("cross_entropy gradients match finite differences", "[cross_entropy]") {
  // 7 rows, 5 classes, rows 1 and 4 ignored; targets in both index dtypes.
  std::vector<int64_t> tv = {4, -100, 0, 2, -100, 3, 4};
  std::vector<int32_t> tv32(tv.begin(), tv.end());
  for (Tensor targets : {Tensor::from_vector(tv, {7}), Tensor::from_vector(tv32, {7})}) {
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
      Tensor logits = rand_input({7, 5}, 41);
      auto rep = gradcheck(
          [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets, -100, r); },
          {logits});
      INFO("reduction " << static_cast<int>(r) << "\n" << rep.detail);
      REQUIRE(rep.max_rel_error < 1e-6);
    }
  }
  SECTION("non-contiguous logits (a transposed view)") {
    Tensor base = rand_input({5, 7}, 42);
    Tensor targets = Tensor::from_vector<int64_t>({1, 1, -100, 0, 4, 2, 3}, {7});
    auto rep = gradcheck(
        [&](const std::vector<Tensor>& in) {
          return cross_entropy(in[0].transpose(0, 1), targets);  // (7, 5)
        },
        {base});
    INFO(rep.detail);
    REQUIRE(rep.max_rel_error < 1e-6);
  }
}

TEST_CASE("cross_entropy errors name the op, the row and the value", "[cross_entropy]") {
  Tensor logits = Tensor::zeros({3, 4});
  REQUIRE_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1}, {3})),
                      Catch::Contains("[cross_entropy]") && Catch::Contains("target 4") &&
                          Catch::Contains("row 1") && Catch::Contains("4 classes"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int32_t>({0, 1, -1}, {3})),
                      Catch::Contains("[cross_entropy]") && Catch::Contains("target -1") &&
                          Catch::Contains("row 2"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<float>({0, 1, 2}, {3})),
                      Catch::Contains("[cross_entropy]") && Catch::Contains("i32 or i64"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1}, {2})),
                      Catch::Contains("[cross_entropy]") && Catch::Contains("do not match"));
  REQUIRE_THROWS_WITH(cross_entropy(Tensor::zeros({12}), Tensor::from_vector<int64_t>({0}, {1})),
                      Catch::Contains("[cross_entropy]") && Catch::Contains("(N, C)"));
}

TEST_CASE("cross_entropy records one node, and none without grad", "[cross_entropy]") {
  Tensor logits = rand_input({3, 4}, 81);
  Tensor targets = Tensor::from_vector<int64_t>({0, 3, -100}, {3});
  const size_t before = tape_size();
  Tensor loss = cross_entropy(logits, targets);
  REQUIRE(tape_size() == before + 1);
  {
    NoGrad ng;
    Tensor l2 = cross_entropy(logits, targets);
    REQUIRE(tape_size() == before + 1);
  }
}
