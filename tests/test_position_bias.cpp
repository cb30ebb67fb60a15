// bucket_lookup / cls_reset: hand-checked values forward and backward, finite-difference
// gradients, equality with the compositions they replace (an embedding lookup permuted to the
// channels first; products with 0/1 masks), and the errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using Catch::Contains;
using engine::testing::gradcheck;
using engine::testing::GradcheckReport;
using engine::testing::rand_input;

TEST_CASE("bucket_lookup on a hand-checked example", "[position_bias]") {
  // table (R 3, C 2): row r = (10 r, 10 r + 1)
  Tensor table = Tensor::from_vector<double>({0, 1, 10, 11, 20, 21}, {3, 2}).set_requires_grad();
  Tensor idx = Tensor::from_vector<int64_t>({2, 0, 0, 1, 2, 2}, {2, 3});
  Tensor out = bucket_lookup(table, idx);
  REQUIRE(out.shape() == Shape{2, 2, 3});  // (C, ...index)
  REQUIRE(out.to_vector<double>() ==
          std::vector<double>{20, 0, 0, 10, 20, 20, 21, 1, 1, 11, 21, 21});
  Tensor g = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60}, {2, 2, 3});
  out.backward(g);
  // bucket 0 <- positions 1, 2; bucket 1 <- 3; bucket 2 <- 0, 4, 5 (per channel)
  REQUIRE(table.grad().to_vector<double>() == std::vector<double>{5, 50, 4, 40, 12, 120});

  // A bucket no position names gets 0; a 0-d index gives (C).
  Tensor t4 = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}).set_requires_grad();
  Tensor one = bucket_lookup(t4, Tensor::from_vector<int64_t>({3}, {}));
  REQUIRE(one.shape() == Shape{2});
  REQUIRE(one.to_vector<double>() == std::vector<double>{7, 8});
  one.backward(Tensor::from_vector<double>({1, -1}, {2}));
  REQUIRE(t4.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 0, 0, 0, 1, -1});
}

TEST_CASE("bucket_lookup equals the embedding lookup permuted to the channels first",
          "[position_bias]") {
  Generator g(5);
  const int64_t r = 7, c = 3, t = 9;
  std::vector<int64_t> v(size_t(t * t));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j)
      v[size_t(i * t + j)] = std::min<int64_t>(std::abs(j - i), r - 1);
  Tensor idx = Tensor::from_vector<int64_t>(v, {t, t});
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor a = Tensor::randn({r, c}, g, 0, 1, dt).set_requires_grad();
    Tensor b = a.detach().clone().set_requires_grad();
    Tensor got = bucket_lookup(a, idx);
    Tensor want = embedding(b, idx).permute({2, 0, 1}).contiguous();
    REQUIRE(got.to_vector<double>() == want.to_vector<double>());
    Tensor dy = Tensor::randn({c, t, t}, g, 0, 1, dt);
    got.backward(dy);
    want.backward(dy);
    std::vector<double> ga = a.grad().to_vector<double>(), gb = b.grad().to_vector<double>();
    for (size_t k = 0; k < ga.size(); ++k) REQUIRE(ga[k] == Approx(gb[k]).epsilon(1e-5));
  }
}

TEST_CASE("bucket_lookup and cls_reset pass finite-difference gradient checks",
          "[position_bias][gradcheck]") {
  Tensor idx = Tensor::from_vector<int64_t>({4, 0, 4, 3, 2, 2, 2, 5, 1, 0, 1, 1}, {3, 4});
  struct Case {
    const char* name;
    engine::testing::TestFn f;
    std::vector<Tensor> in;
  };
  std::vector<Case> cases = {
      {"bucket_lookup (6, 2) at a (3, 4) index",
       [&](const std::vector<Tensor>& v) { return bucket_lookup(v[0], idx); },
       {rand_input({6, 2}, 81)}},
      {"bucket_lookup of a transposed table",
       [&](const std::vector<Tensor>& v) { return bucket_lookup(v[0].transpose(0, 1), idx); },
       {rand_input({3, 6}, 82)}},
      {"cls_reset (2, 4, 5), all three inputs",
       [](const std::vector<Tensor>& v) { return cls_reset(v[0], v[1], v[2]); },
       {rand_input({2, 4, 5}, 83), rand_input({2}, 84), rand_input({2}, 85)}},
      {"cls_reset of a transposed view (3, 5, 4), one row, one column",
       [](const std::vector<Tensor>& v) { return cls_reset(v[0].transpose(1, 2), v[1], v[2]); },
       {rand_input({3, 4, 5}, 86), rand_input({3}, 87), rand_input({3}, 88)}},
      {"cls_reset of a (1, 1, 3) tensor (only the row)",
       [](const std::vector<Tensor>& v) { return cls_reset(v[0], v[1], v[2]); },
       {rand_input({1, 1, 3}, 89), rand_input({1}, 90), rand_input({1}, 91)}},
      {"cls_reset then bucket_lookup's sum (the TUPE-R chain)",
       [&](const std::vector<Tensor>& v) {
         return cls_reset(bucket_lookup(v[0], idx) * 1.5, v[1], v[2]);
       },
       {rand_input({6, 2}, 92), rand_input({2}, 93), rand_input({2}, 94)}},
  };
  for (auto& c : cases) {
    GradcheckReport r = gradcheck(c.f, c.in);
    INFO(c.name << "\n" << r.detail);
    REQUIRE(r.max_rel_error < 1e-6);
  }
}

TEST_CASE("cls_reset on a hand-checked example and against the masked composition",
          "[position_bias]") {
  Tensor v = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {1, 3, 2}).set_requires_grad();
  Tensor row = Tensor::from_vector<double>({-1}, {1}).set_requires_grad();
  Tensor col = Tensor::from_vector<double>({-2}, {1}).set_requires_grad();
  Tensor out = cls_reset(v, row, col);
  REQUIRE(out.to_vector<double>() == std::vector<double>{-1, -1, -2, 4, -2, 6});
  out.backward(Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {1, 3, 2}));
  REQUIRE(v.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 4, 0, 6});
  REQUIRE(row.grad().to_vector<double>() == std::vector<double>{3});
  REQUIRE(col.grad().to_vector<double>() == std::vector<double>{8});

  // A non-finite value in the replaced row or column does not leak (a product with a 0 mask
  // would make it NaN).
  Tensor w = Tensor::from_vector<float>({INFINITY, 1, NAN, 2}, {1, 2, 2});
  Tensor r1 = Tensor::from_vector<float>({7}, {1}), c1 = Tensor::from_vector<float>({8}, {1});
  REQUIRE(cls_reset(w, r1, c1).to_vector<float>() == std::vector<float>{7, 7, 8, 2});

  // The composition it replaces: v keep + row row0 + col col0.
  Generator g(9);
  const int64_t c = 3, t = 5, u = 6;
  Tensor x = Tensor::randn({c, t, u}, g);
  Tensor a = Tensor::randn({c}, g), b = Tensor::randn({c}, g);
  std::vector<float> keep(size_t(t * u), 1.f), row0(size_t(t * u), 0.f), col0(size_t(t * u), 0.f);
  for (int64_t j = 0; j < u; ++j) keep[size_t(j)] = 0.f, row0[size_t(j)] = 1.f;
  for (int64_t i = 1; i < t; ++i) keep[size_t(i * u)] = 0.f, col0[size_t(i * u)] = 1.f;
  Tensor want = x * Tensor::from_vector<float>(keep, {t, u}) +
                a.view({c, 1, 1}) * Tensor::from_vector<float>(row0, {t, u}) +
                b.view({c, 1, 1}) * Tensor::from_vector<float>(col0, {t, u});
  REQUIRE(cls_reset(x, a, b).to_vector<float>() == want.to_vector<float>());
}

TEST_CASE("bucket_lookup and cls_reset reject bad input with one clear error", "[position_bias]") {
  Tensor table = Tensor::zeros({3, 2});
  REQUIRE_THROWS_WITH(
      bucket_lookup(table, Tensor::from_vector<int64_t>({0, 3}, {2})),
      Contains("[bucket_lookup] index value 3 at flat position 1") && Contains("3 buckets"));
  REQUIRE_THROWS_WITH(bucket_lookup(table, Tensor::from_vector<int64_t>({-1}, {1})),
                      Contains("index value -1"));
  REQUIRE_THROWS_WITH(bucket_lookup(Tensor::zeros({3}), Tensor::from_vector<int64_t>({0}, {1})),
                      Contains("table must be a floating (R, C) tensor"));
  REQUIRE_THROWS_WITH(bucket_lookup(table, Tensor::zeros({2})), Contains("must be an i64"));
  Tensor t3 = Tensor::ones({2, 3, 3});
  REQUIRE_THROWS_WITH(cls_reset(t3, Tensor::ones({3}), Tensor::ones({2})),
                      Contains("row and col must be (C) = (2)"));
  REQUIRE_THROWS_WITH(cls_reset(t3, Tensor::ones({2}).to(DType::f64), Tensor::ones({2})),
                      Contains("of v's dtype"));
  REQUIRE_THROWS_WITH(cls_reset(Tensor::ones({2, 3}), Tensor::ones({2}), Tensor::ones({2})),
                      Contains("v must be a floating (C, T, U)"));
  REQUIRE_THROWS_WITH(cls_reset(Tensor::ones({2, 0, 3}), Tensor::ones({2}), Tensor::ones({2})),
                      Contains("T, U >= 1"));
}

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to(DType::f64).to_vector<double>(),
                      y = b.to(DType::f64).to_vector<double>();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// untied_bias by the ops it replaces: s P's (T, T) block, the reset through cls_reset with
// theta from P's diagonal, add before the reset (paper) or after it (code).
Tensor untied_composed(const Tensor& p, const Tensor& add, const UntiedBiasOptions& o) {
  const int64_t k = o.reset ? 2 : 0, t = p.shape()[1] - k;
  Tensor v = p.slice(1, 0, t).slice(2, 0, t) * o.scale;
  if (!o.reset) return add.defined() ? v + add : v;
  auto theta = [&](int64_t r) { return p.select(1, t + r).select(1, t + r) * o.scale; };
  if (!add.defined()) return cls_reset(v, theta(0), theta(1));
  return o.add_at_reset ? cls_reset(v, theta(0), theta(1)) + add
                        : cls_reset(v + add, theta(0), theta(1));
}

UntiedBiasOptions untied_options(double scale, bool reset, bool add_at_reset) {
  UntiedBiasOptions o;
  o.scale = scale;
  o.reset = reset;
  o.add_at_reset = add_at_reset;
  return o;
}

}  // namespace

TEST_CASE("untied_bias on a hand-checked example", "[position_bias]") {
  // P (1, 4, 4) = 1 .. 16 row-major: T = 2 with the reset; theta1 = s P[2, 2] = 2 * 11,
  // theta2 = s P[3, 3] = 2 * 16; the one entry off the reset is s P[1, 1] = 2 * 6.
  Tensor p = (Tensor::arange(16, DType::f64) + 1.0).view({1, 4, 4}).set_requires_grad();
  Tensor add = Tensor::from_vector<double>({100, 200, 300, 400}, {1, 2, 2}).set_requires_grad();
  Tensor paper = untied_bias(p, add, untied_options(2, true, false));
  REQUIRE(paper.to_vector<double>() == std::vector<double>{22, 22, 32, 412});
  paper.backward(Tensor::from_vector<double>({1, 2, 3, 4}, {1, 2, 2}));
  // dP: 2 * 4 at (1, 1), 2 * (1 + 2) at (2, 2), 2 * 3 at (3, 3); dadd: dout off the reset.
  std::vector<double> dp(16, 0.0);
  dp[5] = 8, dp[10] = 6, dp[15] = 6;
  REQUIRE(p.grad().to_vector<double>() == dp);
  REQUIRE(add.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 4});

  Tensor code = untied_bias(p, add, untied_options(2, true, true));
  REQUIRE(code.to_vector<double>() == std::vector<double>{122, 222, 332, 412});
  Tensor none =
      untied_bias(p.slice(1, 0, 2).slice(2, 0, 2), Tensor(), untied_options(0.5, false, false));
  REQUIRE(none.to_vector<double>() == std::vector<double>{0.5, 1, 2.5, 3});

  // A non-finite entry of P under the reset does not leak (the reset overwrites it).
  Tensor w = Tensor::from_vector<float>({NAN, INFINITY, 5, 1, 2, 3, 4, 5, 6}, {1, 3, 3});
  REQUIRE(untied_bias(w, Tensor(), untied_options(1, true, false)).to_vector<float>() ==
          std::vector<float>{2});  // theta1 = P[1, 1]; P[0, 0] is NaN
}

TEST_CASE("untied_bias equals the composition it replaces, every mode", "[position_bias]") {
  Generator g(12);
  for (bool reset : {false, true})
    for (bool with_add : {false, true})
      for (bool at_reset : {false, true}) {
        INFO("reset " << reset << " add " << with_add << " add_at_reset " << at_reset);
        const int64_t c = 3, t = 6, n = t + (reset ? 2 : 0);
        Tensor p = Tensor::randn({c, n, n}, g),
               add = with_add ? Tensor::randn({c, t, t}, g) : Tensor();
        const UntiedBiasOptions o = untied_options(0.125, reset, at_reset);
        // (Within a rounding: the pass may fuse s P + add into one FMA.)
        REQUIRE(max_abs_diff(untied_bias(p, add, o), untied_composed(p, add, o)) < 1e-6);
        // Gradients against the composition's, P through a transposed view.
        Tensor a = p.transpose(1, 2).contiguous().set_requires_grad();
        Tensor b = p.clone().set_requires_grad();
        Tensor da = with_add ? add.clone().set_requires_grad() : Tensor(),
               db = with_add ? add.clone().set_requires_grad() : Tensor();
        Tensor dy = Tensor::randn({c, t, t}, g);
        untied_bias(a.transpose(1, 2), da, o).backward(dy);
        untied_composed(b, db, o).backward(dy);
        REQUIRE(max_abs_diff(a.grad().transpose(1, 2), b.grad()) < 1e-6);
        if (with_add) REQUIRE(max_abs_diff(da.grad(), db.grad()) == 0.0);
      }
  // The promoted dtype: an f64 add makes an f64 term of an f32 product; at_least_f32 keeps f64.
  Tensor p = Tensor::randn({2, 5, 5}, g), add = Tensor::randn({2, 3, 3}, g).to(DType::f64);
  REQUIRE(untied_bias(p, add, untied_options(1, true, false)).dtype() == DType::f64);
  UntiedBiasOptions wide = untied_options(1, true, false);
  wide.at_least_f32 = true;
  REQUIRE(untied_bias(p.to(DType::f64), Tensor(), wide).dtype() == DType::f64);
  REQUIRE(untied_bias(p, Tensor(), wide).dtype() == DType::f32);
}

TEST_CASE("untied_bias passes finite-difference gradient checks", "[position_bias][gradcheck]") {
  struct Case {
    const char* name;
    UntiedBiasOptions o;
    bool add;
  };
  for (const Case& k :
       {Case{"reset, paper (add overwritten)", untied_options(0.7, true, false), true},
        Case{"reset, code (add kept)", untied_options(0.7, true, true), true},
        Case{"reset, no add", untied_options(1.3, true, false), false},
        Case{"no reset", untied_options(0.5, false, false), true}}) {
    const int64_t c = 2, t = 4, n = t + (k.o.reset ? 2 : 0);
    std::vector<Tensor> in = {rand_input({c, n, n}, 95)};
    if (k.add) in.push_back(rand_input({c, t, t}, 96));
    const UntiedBiasOptions o = k.o;
    GradcheckReport r = gradcheck(
        [o](const std::vector<Tensor>& v) {
          return untied_bias(v[0], v.size() > 1 ? v[1] : Tensor(), o);
        },
        in);
    INFO(k.name << "\n" << r.detail);
    REQUIRE(r.max_rel_error < 1e-6);
  }
}

TEST_CASE("untied_bias rejects bad input with one clear error", "[position_bias]") {
  const UntiedBiasOptions reset = untied_options(1, true, false);
  REQUIRE_THROWS_WITH(untied_bias(Tensor::ones({2, 3, 4}), Tensor(), reset),
                      Contains("[untied_bias] product must be a floating (C, T + 2, T + 2)"));
  REQUIRE_THROWS_WITH(untied_bias(Tensor::ones({2, 2, 2}), Tensor(), reset), Contains("T >= 1"));
  REQUIRE_THROWS_WITH(untied_bias(Tensor::ones({2, 5, 5}), Tensor::ones({2, 5, 5}), reset),
                      Contains("add must be a floating (C, T, T) = (2, 3, 3)"));
  REQUIRE_THROWS_WITH(untied_bias(Tensor(), Tensor(), reset), Contains("undefined product"));
}
