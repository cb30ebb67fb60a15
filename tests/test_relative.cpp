// relative_gather / relative_scatter: hand-checked values, adjointness, finite-difference
// gradients, the Shaw-style compositions with matmul against explicit loops, and the errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "ops/ops.h"
#include "relative_index.h"

using namespace engine;
using Catch::Contains;
using engine::testing::gradcheck;
using engine::testing::GradcheckReport;
using engine::testing::rand_input;
using engine::testing::shaw_index;

namespace {

double dot(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

}  // namespace

TEST_CASE("relative_gather and relative_scatter on a hand-checked example", "[relative]") {
  Tensor x = Tensor::from_vector<double>({10, 11, 12, 20, 21, 22}, {2, 3});     // (Tq 2, R 3)
  Tensor idx = Tensor::from_vector<int64_t>({0, 2, 2, 1, 1, 0, 2, 2}, {2, 4});  // (Tq 2, Tk 4)
  Tensor g = relative_gather(x, idx);
  REQUIRE(g.shape() == Shape{2, 4});
  REQUIRE(g.to_vector<double>() == std::vector<double>{10, 12, 12, 11, 21, 20, 22, 22});

  Tensor y = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  Tensor s = relative_scatter(y, idx, 3);
  REQUIRE(s.shape() == Shape{2, 3});
  // row 0: bucket 0 <- y[0,0], bucket 1 <- y[0,3], bucket 2 <- y[0,1] + y[0,2]
  REQUIRE(s.to_vector<double>() == std::vector<double>{1, 4, 5, 6, 5, 15});
  // A bucket no index names stays 0.
  REQUIRE(relative_scatter(y, idx, 4).to_vector<double>() ==
          std::vector<double>{1, 4, 5, 0, 6, 5, 15, 0});

  // Leading dims: every (..., Tq, R) matrix is gathered with the same index.
  Tensor x3 =
      Tensor::from_vector<float>({10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42}, {2, 2, 3});
  Tensor g3 = relative_gather(x3, idx);
  REQUIRE(g3.shape() == Shape{2, 2, 4});
  REQUIRE(g3.to_vector<float>() ==
          std::vector<float>{10, 12, 12, 11, 21, 20, 22, 22, 30, 32, 32, 31, 41, 40, 42, 42});
  Tensor s3 = relative_scatter(g3, idx, 3);  // sums of the gathered values per bucket
  REQUIRE(s3.shape() == Shape{2, 2, 3});
  REQUIRE(s3.to_vector<float>() ==
          std::vector<float>{10, 11, 24, 20, 21, 44, 30, 31, 64, 40, 41, 84});

  // Non-contiguous inputs are read through their view, not their storage.
  Tensor xt = Tensor::from_vector<double>({10, 20, 11, 21, 12, 22}, {3, 2}).transpose(0, 1);
  REQUIRE(relative_gather(xt, idx).to_vector<double>() == g.to_vector<double>());
  Tensor yt = Tensor::from_vector<double>({1, 5, 2, 6, 3, 7, 4, 8}, {4, 2}).transpose(0, 1);
  REQUIRE(relative_scatter(yt, idx, 3).to_vector<double>() == s.to_vector<double>());
}

TEST_CASE("relative ops on the Shaw index and empty shapes", "[relative]") {
  // T = 4, k = 1: buckets 0 (j < i), 1 (j == i), 2 (j > i).
  Tensor idx = shaw_index(4, 4, 1);
  REQUIRE(idx.to_vector<int64_t>() ==
          std::vector<int64_t>{1, 2, 2, 2, 0, 1, 2, 2, 0, 0, 1, 2, 0, 0, 0, 1});
  Tensor ones = Tensor::ones({4, 4}, DType::f64);
  // Per row i: i keys before, 1 on the diagonal, 3 - i after.
  REQUIRE(relative_scatter(ones, idx, 3).to_vector<double>() ==
          std::vector<double>{0, 1, 3, 1, 1, 2, 2, 1, 1, 3, 1, 0});
  // Tq != Tk: queries over a longer key sequence.
  Tensor rect = shaw_index(2, 5, 2);
  Tensor x = rand_input({3, 2, 5}, 3, false);
  std::vector<double> xv = x.to_vector<double>(), gv = relative_gather(x, rect).to_vector<double>();
  std::vector<int64_t> iv = rect.to_vector<int64_t>();
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 5; ++j)
        REQUIRE(gv[(b * 2 + i) * 5 + j] == xv[(b * 2 + i) * 5 + iv[i * 5 + j]]);

  // A zero-size leading dim gives an empty result of the right shape.
  REQUIRE(relative_gather(Tensor::zeros({0, 4, 3}), idx).shape() == Shape{0, 4, 4});
  REQUIRE(relative_scatter(Tensor::zeros({2, 0, 4, 4}), idx, 3).shape() == Shape{2, 0, 4, 3});
}

TEST_CASE("relative_gather and relative_scatter are adjoint", "[relative]") {
  // <gather(x), y> == <x, scatter(y)> for any x, y: the identity the backward passes rely on.
  Tensor idx = shaw_index(5, 7, 2);
  Tensor x = rand_input({2, 3, 5, 5}, 41, false);
  Tensor y = rand_input({2, 3, 5, 7}, 42, false);
  REQUIRE(dot(relative_gather(x, idx), y) ==
          Approx(dot(x, relative_scatter(y, idx, 5))).epsilon(1e-12));
}

TEST_CASE("relative op gradients match finite differences", "[relative]") {
  // Repeats in every row, so the gather's backward has to sum.
  Tensor idx = Tensor::from_vector<int64_t>(
      {6, 0, 6, 3, 2, 2, 2, 5, 1, 4, 1, 1, 0, 0, 6, 3, 5, 5, 4, 4}, {5, 4});
  struct Case {
    const char* name;
    engine::testing::TestFn f;
    Tensor in;
  };
  std::vector<Case> cases = {
      {"gather, no leading dims (5, 7)",
       [&](const std::vector<Tensor>& v) { return relative_gather(v[0], idx); },
       rand_input({5, 7}, 51)},
      {"gather, 2 leading dims (2, 3, 5, 7)",
       [&](const std::vector<Tensor>& v) { return relative_gather(v[0], idx); },
       rand_input({2, 3, 5, 7}, 52)},
      {"gather of a transposed view",
       [&](const std::vector<Tensor>& v) { return relative_gather(v[0].transpose(1, 2), idx); },
       rand_input({3, 7, 5}, 53)},
      {"scatter, no leading dims (5, 4) into 7 buckets",
       [&](const std::vector<Tensor>& v) { return relative_scatter(v[0], idx, 7); },
       rand_input({5, 4}, 54)},
      {"scatter, 2 leading dims (3, 2, 5, 4) into 9 buckets (2 never named)",
       [&](const std::vector<Tensor>& v) { return relative_scatter(v[0], idx, 9); },
       rand_input({3, 2, 5, 4}, 55)},
      {"scatter of a transposed view",
       [&](const std::vector<Tensor>& v) { return relative_scatter(v[0].transpose(1, 2), idx, 7); },
       rand_input({2, 4, 5}, 56)},
      {"gather of scatter (both backwards chained)",
       [&](const std::vector<Tensor>& v) {
         return relative_gather(relative_scatter(v[0], idx, 7) * 1.5, idx);
       },
       rand_input({2, 5, 4}, 57)},
  };
  for (auto& c : cases) {
    GradcheckReport r = gradcheck(c.f, {c.in});
    INFO(c.name << "\n" << r.detail);
    REQUIRE(r.max_rel_error < 1e-6);
  }
}

TEST_CASE("Shaw relative terms through matmul equal explicit loops", "[relative]") {
  const int64_t b = 2, h = 3, t = 5, d = 4, k = 2, r = 2 * k + 1;
  Tensor idx = shaw_index(t, t, k);
  Tensor q = rand_input({b, h, t, d}, 61);
  Tensor a = rand_input({r, d}, 62);
  Tensor p = rand_input({b, h, t, t}, 63);
  std::vector<double> qv = q.to_vector<double>(), av = a.to_vector<double>(),
                      pv = p.to_vector<double>();
  std::vector<int64_t> iv = idx.to_vector<int64_t>();

  // logits[b, h, i, j] = q[b, h, i] . a[idx[i, j]]
  Tensor logits = relative_gather(matmul(q, a.transpose(0, 1)), idx);
  REQUIRE(logits.shape() == Shape{b, h, t, t});
  std::vector<double> lv = logits.to_vector<double>();
  // ctx[b, h, i] = sum_j p[b, h, i, j] a[idx[i, j]]
  Tensor ctx = matmul(relative_scatter(p, idx, r), a);
  REQUIRE(ctx.shape() == Shape{b, h, t, d});
  std::vector<double> cv = ctx.to_vector<double>();
  for (int64_t m = 0; m < b * h; ++m)
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < t; ++j) {
        const int64_t c = iv[i * t + j];
        double s = 0;
        for (int64_t e = 0; e < d; ++e) s += qv[(m * t + i) * d + e] * av[c * d + e];
        REQUIRE(lv[(m * t + i) * t + j] == Approx(s).epsilon(1e-12).margin(1e-14));
      }
      for (int64_t e = 0; e < d; ++e) {
        double s = 0;
        for (int64_t j = 0; j < t; ++j) s += pv[(m * t + i) * t + j] * av[iv[i * t + j] * d + e];
        REQUIRE(cv[(m * t + i) * d + e] == Approx(s).epsilon(1e-12).margin(1e-14));
      }
    }

  // And both compositions differentiate through q, a and p.
  auto rep = gradcheck(
      [&](const std::vector<Tensor>& v) {
        Tensor lg = relative_gather(matmul(v[0], v[1].transpose(0, 1)), idx);  // (b, h, t, t)
        return matmul(relative_scatter(lg * v[2], idx, r), v[1]);
      },
      {q, a, p});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
}

TEST_CASE("relative ops in f32 on the threaded path", "[relative]") {
  // rows * Tk = 4 * 8 * 64 * 64 > the OpenMP threshold: results must match a double reference
  // and repeat bit for bit.
  const int64_t tq = 64, tk = 64, k = 16, r = 2 * k + 1;
  Tensor idx = shaw_index(tq, tk, k);
  Generator gen(7);
  Tensor y = Tensor::randn({4, 8, tq, tk}, gen);
  Tensor s1 = relative_scatter(y, idx, r), s2 = relative_scatter(y, idx, r);
  std::vector<float> a = s1.to_vector<float>();
  REQUIRE(a == s2.to_vector<float>());
  std::vector<float> yv = y.to_vector<float>();
  std::vector<int64_t> iv = idx.to_vector<int64_t>();
  for (int64_t row = 0; row < 4 * 8 * tq; row += 37) {
    std::vector<double> ref(r, 0.0);
    for (int64_t j = 0; j < tk; ++j) ref[iv[(row % tq) * tk + j]] += yv[row * tk + j];
    for (int64_t c = 0; c < r; ++c) REQUIRE(a[row * r + c] == Approx(ref[c]).margin(1e-4));
  }
  Tensor g = relative_gather(s1, idx);
  std::vector<float> gv = g.to_vector<float>();
  for (int64_t row = 0; row < 4 * 8 * tq; row += 37)
    for (int64_t j = 0; j < tk; ++j)
      REQUIRE(gv[row * tk + j] == a[row * r + iv[(row % tq) * tk + j]]);
}

TEST_CASE("relative_index_inverse: the index's CSR per row, and the ops given it", "[relative]") {
  // row 0: buckets 0 <- j 0; 2 <- j 1, 2; 1 <- j 3. row 1: 1 <- j 0, 1; 0 <- j 2; 2 <- j 3.
  Tensor idx = Tensor::from_vector<int64_t>({0, 2, 2, 1, 1, 1, 0, 2}, {2, 4});
  Tensor inv = relative_index_inverse(idx, 4);  // a 4th bucket nothing names
  REQUIRE(inv.dtype() == DType::i32);
  REQUIRE(inv.to_vector<int32_t>() ==
          std::vector<int32_t>{0, 1, 2, 4, 4, 0, 1, 3, 4, 4,  // offsets (Tq, R + 1)
                               0, 3, 1, 2, 2, 0, 1, 3});      // keys (Tq, Tk), j increasing
  // The ops give the same values and gradients with it as without.
  Tensor x = rand_input({3, 2, 4}, 72), x2 = x.detach().clone().set_requires_grad();
  Tensor y = relative_scatter(relative_gather(x, idx) * 1.5, idx, 4);
  Tensor y2 = relative_scatter(relative_gather(x2, idx, inv) * 1.5, idx, 4, inv);
  REQUIRE(y.to_vector<double>() == y2.to_vector<double>());
  Tensor dy = rand_input({3, 2, 4}, 73, false);
  y.backward(dy);
  y2.backward(dy);
  REQUIRE(x.grad().to_vector<double>() == x2.grad().to_vector<double>());
  // An inverse of another shape, dtype or index; an index out of range.
  REQUIRE_THROWS_WITH(
      relative_scatter(y, idx, 3, inv),
      Contains("[relative_scatter] inverse must be relative_index_inverse(index, 3)"));
  REQUIRE_THROWS_WITH(
      relative_gather(x, idx, inv.to(DType::i64)),
      Contains("[relative_gather] inverse must be relative_index_inverse(index, 4)"));
  REQUIRE_THROWS_WITH(relative_index_inverse(idx, 2),
                      Contains("[relative_index_inverse] index value 2 at (0, 1) is out of range"));
  REQUIRE_THROWS_WITH(relative_index_inverse(Tensor::zeros({2, 2}), 2),
                      Contains("[relative_index_inverse] index must be a 2-D (Tq, Tk) i64 tensor"));
}

TEST_CASE("relative ops record one node, and none without grad", "[relative]") {
  Tensor idx = shaw_index(3, 3, 1);
  Tensor x = rand_input({2, 3, 3}, 71);
  const size_t before = tape_size();
  Tensor g = relative_gather(x.transpose(1, 2), idx);  // the transpose records its own node
  Tensor s = relative_scatter(g, idx, 3);
  REQUIRE(tape_size() == before + 3);  // no stray contiguous nodes inside either op
  {
    NoGrad ng;
    relative_scatter(relative_gather(x, idx), idx, 3);
    REQUIRE(tape_size() == before + 3);
  }
}

TEST_CASE("relative op errors name the op, the shapes and the bad value", "[relative]") {
  Tensor x = Tensor::zeros({2, 3, 4});  // (L 2, Tq 3, R 4)
  Tensor idx = Tensor::from_vector<int64_t>({0, 1, 2, 3, 3, 2, 1, 0, 4}, {3, 3});
  REQUIRE_THROWS_WITH(relative_gather(x, idx),
                      Contains("[relative_gather] index value 4 at (2, 2) is out of range for 4 "
                               "buckets"));
  Tensor neg = Tensor::from_vector<int64_t>({0, 1, 2, 0, -1, 2, 1, 0, 1}, {3, 3});
  REQUIRE_THROWS_WITH(relative_scatter(Tensor::zeros({3, 3}), neg, 3),
                      Contains("[relative_scatter] index value -1 at (1, 1) is out of range for "
                               "3 buckets (num_buckets"));
  REQUIRE_THROWS_WITH(relative_scatter(Tensor::zeros({3, 3}), shaw_index(3, 3, 1), 2),
                      Contains("[relative_scatter] index value 2 at (0, 1)"));
  REQUIRE_THROWS_WITH(
      relative_gather(x, Tensor::from_vector<int32_t>({0, 1, 2, 3, 3, 2, 1, 0, 1}, {3, 3})),
      Contains("[relative_gather] index must be an i64 tensor, got (3, 3) i32 cpu"));
  REQUIRE_THROWS_WITH(relative_gather(x, Tensor::zeros({3, 3})),
                      Contains("[relative_gather] index must be an i64 tensor, got (3, 3) f32"));
  REQUIRE_THROWS_WITH(relative_gather(x, Tensor::from_vector<int64_t>({0, 1, 2}, {3})),
                      Contains("[relative_gather] index must be 2-D (Tq, Tk), got (3) i64 cpu"));
  REQUIRE_THROWS_WITH(relative_gather(x, shaw_index(4, 3, 1)),
                      Contains("[relative_gather] x must be (..., Tq, R) with Tq = index's 4 "
                               "rows, got x (2, 3, 4) f32 cpu and index (4, 3) i64 cpu"));
  REQUIRE_THROWS_WITH(relative_gather(Tensor::zeros({4}), shaw_index(1, 3, 1)),
                      Contains("[relative_gather] x must have at least 2 dims"));
  REQUIRE_THROWS_WITH(relative_gather(Tensor::zeros({3, 3}, DType::i64), shaw_index(3, 3, 1)),
                      Contains("[relative_gather] expects a floating x, got (3, 3) i64 cpu"));
  REQUIRE_THROWS_WITH(relative_scatter(Tensor::zeros({2, 3, 4}), shaw_index(3, 3, 1), 3),
                      Contains("[relative_scatter] y must be (..., Tq, Tk) with (Tq, Tk) = "
                               "index's shape (3, 3), got y (2, 3, 4) f32 cpu"));
  REQUIRE_THROWS_WITH(relative_scatter(Tensor::zeros({3, 3}), shaw_index(3, 3, 1), -1),
                      Contains("[relative_scatter] num_buckets must be >= 0, got -1"));
  REQUIRE_THROWS_WITH(relative_scatter(Tensor::zeros({3, 3}), Tensor(), 3),
                      Contains("[relative_scatter] got an undefined input"));
  // The CPU computes in f32/f64: a bf16 scatter says so (a bf16 gather is a copy and works).
  REQUIRE_THROWS_WITH(relative_scatter(Tensor::zeros({3, 3}, DType::bf16), shaw_index(3, 3, 1), 3),
                      Contains("[relative_scatter] CPU kernels compute in f32 or f64, got bf16"));
  REQUIRE(relative_gather(Tensor::zeros({3, 3}, DType::bf16), shaw_index(3, 3, 1)).dtype() ==
          DType::bf16);
}
