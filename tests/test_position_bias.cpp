// bucket_lookup / cls_reset: hand-checked values forward and backward, finite-difference
// gradients, equality with the compositions they replace (an embedding lookup permuted to the
// channels first; products with 0/1 masks), and the errors.
#include <catch2/catch.hpp>
#include <cmath>

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
