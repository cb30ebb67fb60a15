// index_select / embedding: forward against naive loops, scatter-add gradients (repeated
// indices), finite-difference checks and the error messages.
#include <omp.h>

#include <algorithm>

#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::gradcheck;
using engine::testing::rand_input;

TEST_CASE("index_select picks rows of an (N, ...) tensor", "[embedding]") {
  // x (4, 2, 3) with x[n, a, b] = 100 n + 10 a + b, so every value names its position.
  std::vector<float> xv;
  for (int n = 0; n < 4; ++n)
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 3; ++b) xv.push_back(100.f * n + 10.f * a + b);
  Tensor x = Tensor::from_vector(xv, {4, 2, 3});
  std::vector<int64_t> idx = {3, 0, 3, 1};
  Tensor y = index_select(x, Tensor::from_vector(idx, {4}));
  REQUIRE(y.shape() == Shape{4, 2, 3});
  std::vector<float> yv = y.to_vector<float>();
  for (int m = 0; m < 4; ++m)
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 3; ++b) REQUIRE(yv[(m * 2 + a) * 3 + b] == 100.f * idx[m] + 10.f * a + b);

  // A non-contiguous source (transposed) gives the rows of the view, not of its storage.
  Tensor xt = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3}).transpose(0, 1);  // (3, 2)
  Tensor r = index_select(xt, Tensor::from_vector<int32_t>({2, 0}, {2}));
  REQUIRE(r.to_vector<float>() == std::vector<float>{2, 5, 0, 3});

  // An empty index gives an empty (0, ...) result.
  Tensor e = index_select(x, Tensor::from_vector<int64_t>({}, {0}));
  REQUIRE(e.shape() == Shape{0, 2, 3});
}

TEST_CASE("embedding looks up (V, D) rows for ids of any shape", "[embedding]") {
  Tensor w = Tensor::from_vector<double>({0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42},
                                         {5, 3});
  Tensor ids = Tensor::from_vector<int32_t>({4, 0, 2, 2}, {2, 2});
  Tensor y = embedding(w, ids);
  REQUIRE(y.shape() == Shape{2, 2, 3});
  REQUIRE(y.to_vector<double>() ==
          std::vector<double>{40, 41, 42, 0, 1, 2, 20, 21, 22, 20, 21, 22});

  // A 0-dim id gives one (D) row.
  Tensor one = embedding(w, Tensor::scalar(3, DType::i64));
  REQUIRE(one.shape() == Shape{3});
  REQUIRE(one.to_vector<double>() == std::vector<double>{30, 31, 32});
}

TEST_CASE("embedding backward accumulates repeated ids", "[embedding]") {
  Tensor w = rand_input({6, 4}, 11);
  std::vector<int64_t> ids = {5, 1, 5, 5, 0, 1};
  Tensor y = embedding(w, Tensor::from_vector(ids, {2, 3}));  // (2, 3, 4)
  // Upstream gradient g[p, d] = p + 1 (p the flat id position): row r's gradient is the sum of
  // (p + 1) over the positions holding r.
  std::vector<double> gv;
  for (int p = 0; p < 6; ++p)
    for (int d = 0; d < 4; ++d) gv.push_back(p + 1);
  y.backward(Tensor::from_vector(gv, {2, 3, 4}));
  std::vector<double> expect(6 * 4, 0.0);
  for (int p = 0; p < 6; ++p)
    for (int d = 0; d < 4; ++d) expect[ids[p] * 4 + d] += p + 1;
  REQUIRE(w.grad().shape() == Shape{6, 4});
  REQUIRE(w.grad().to_vector<double>() == expect);
}

TEST_CASE("index_select and embedding gradients match finite differences", "[embedding]") {
  SECTION("index_select on (5, 3, 7) with repeated indices") {
    Tensor x = rand_input({5, 3, 7}, 21);
    Tensor idx = Tensor::from_vector<int64_t>({4, 1, 4, 0, 4, 2}, {6});
    auto rep =
        gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0], idx); }, {x});
    INFO(rep.detail);
    REQUIRE(rep.max_rel_error < 1e-6);
  }
  SECTION("embedding (7, 5) with (3, 4) i32 ids, repeats included") {
    Tensor w = rand_input({7, 5}, 22);
    Tensor ids = Tensor::from_vector<int32_t>({6, 0, 3, 3, 1, 6, 6, 2, 0, 5, 3, 6}, {3, 4});
    auto rep = gradcheck([&](const std::vector<Tensor>& in) { return embedding(in[0], ids); }, {w});
    INFO(rep.detail);
    REQUIRE(rep.max_rel_error < 1e-6);
  }
  SECTION("index_select of a 1-D tensor") {
    Tensor x = rand_input({9}, 23);
    Tensor idx = Tensor::from_vector<int32_t>({8, 8, 0, 3}, {4});
    auto rep =
        gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0], idx); }, {x});
    INFO(rep.detail);
    REQUIRE(rep.max_rel_error < 1e-6);
  }
}

TEST_CASE("embedding backward is deterministic for many repeated ids", "[embedding]") {
  // Large enough to take the OpenMP path (m * d > 65536): two runs must agree bit for bit.
  Tensor w = Tensor::zeros({3, 700}, DType::f32).set_requires_grad();
  std::vector<int64_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7) % 3);
  Generator gen(5);
  Tensor g = Tensor::randn({300, 700}, gen);
  auto run = [&] {
    w.set_grad(Tensor());
    embedding(w, Tensor::from_vector(ids, {300})).backward(g);
    return w.grad().to_vector<float>();
  };
  std::vector<float> a = run(), b = run();
  REQUIRE(a == b);
  // Row 0's gradient is the sum of the upstream rows with id 0 (checked in double).
  std::vector<float> gv = g.to_vector<float>();
  for (int c = 0; c < 700; c += 99) {
    double s = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == 0) s += gv[i * 700 + c];
    REQUIRE(a[c] == Approx(s).margin(1e-4));
  }
}

// The forward's row copies go over the threads from 128 KB on (600 rows of 128-768 floats: 300
// KB-1.8 MB); the backward's threads split the features in whole cache lines (one block each),
// and every element's sum runs over the ids in order: the bits of a float sum in that order at
// any thread count, for a feature dim under one block (the tiny model's 128) and over several
// (BERT's 768).
TEST_CASE(
    "embedding gathers rows, and its backward sums each element in id order, at any thread "
    "count",
    "[embedding][threads]") {
  const int max_threads = omp_get_max_threads();
  for (int64_t d : {128, 200, 768}) {
    const int64_t m = 600, v = 50;
    std::vector<int64_t> ids(m);
    for (int64_t i = 0; i < m; ++i) ids[i] = (i * 13 + i / 7) % v;
    Generator gen(static_cast<uint64_t>(d));
    Tensor g = Tensor::randn({m, d}, gen);
    const std::vector<float> gv = g.to_vector<float>();
    std::vector<float> want(v * d, 0.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < d; ++c) want[ids[i] * d + c] += gv[i * d + c];
    for (int t : {1, 2, 3, 7}) {
      omp_set_num_threads(t);
      INFO("d " << d << ", " << t << " threads");
      Tensor w = Tensor::randn({v, d}, gen).set_requires_grad();
      const std::vector<float> wv = w.to_vector<float>();
      Tensor out = embedding(w, Tensor::from_vector(ids, {m}));
      const std::vector<float> ov = out.to_vector<float>();
      bool rows_ok = true;
      for (int64_t i = 0; i < m; ++i)
        rows_ok = rows_ok &&
                  std::equal(ov.begin() + i * d, ov.begin() + (i + 1) * d, wv.begin() + ids[i] * d);
      CHECK(rows_ok);
      out.backward(g);
      CHECK(w.grad().to_vector<float>() == want);
    }
  }
  omp_set_num_threads(max_threads);
}

TEST_CASE("embedding and index_select errors name the op and the bad id", "[embedding]") {
  Tensor w = Tensor::zeros({10, 4});
  Tensor bad = Tensor::from_vector<int64_t>({1, 2, 3, 12}, {2, 2});
  REQUIRE_THROWS_WITH(embedding(w, bad), Catch::Contains("[embedding]") &&
                                             Catch::Contains("id 12") &&
                                             Catch::Contains("position (1, 1)") &&
                                             Catch::Contains("table of 10 rows"));
  REQUIRE_THROWS_WITH(
      embedding(w, Tensor::from_vector<int32_t>({0, -1}, {2})),
      Catch::Contains("[embedding]") && Catch::Contains("id -1") && Catch::Contains("position 1"));
  REQUIRE_THROWS_WITH(embedding(w, Tensor::from_vector<float>({0, 1}, {2})),
                      Catch::Contains("[embedding]") && Catch::Contains("i32 or i64"));
  REQUIRE_THROWS_WITH(embedding(Tensor::zeros({10}), Tensor::from_vector<int64_t>({0}, {1})),
                      Catch::Contains("[embedding]") && Catch::Contains("(V, D)"));
  REQUIRE_THROWS_WITH(index_select(w, Tensor::from_vector<int64_t>({0, 10}, {2})),
                      Catch::Contains("[index_select]") && Catch::Contains("index 10") &&
                          Catch::Contains("position 1"));
  REQUIRE_THROWS_WITH(index_select(w, Tensor::from_vector<int64_t>({0, 1}, {1, 2})),
                      Catch::Contains("[index_select]") && Catch::Contains("1-D"));
}

TEST_CASE("embedding records one node, and none without grad", "[embedding]") {
  Tensor ids = Tensor::from_vector<int64_t>({0, 2, 2}, {3});
  Tensor w = rand_input({4, 3}, 71);
  const size_t before = tape_size();
  Tensor y = embedding(w, ids);
  REQUIRE(tape_size() == before + 1);  // no stray contiguous/view nodes around the gather
  {
    NoGrad ng;
    Tensor z = embedding(w, ids);
    REQUIRE(tape_size() == before + 1);
  }
}

TEST_CASE("index_select with a unique index: one row add each, the general scatter's bits",
          "[embedding]") {
  Generator g(5);
  // Distinct positions in no order (a staged batch's padding comes after its ascending ones).
  const std::vector<int64_t> ids = {7, 2, 9, 0, 4, 11, 1};
  Tensor idx = Tensor::from_vector(ids, {7});
  Tensor x = Tensor::randn({12, 3, 5}, g);
  Tensor dy = Tensor::randn({7, 3, 5}, g);
  Tensor a = x.clone().set_requires_grad(), b = x.clone().set_requires_grad();
  Tensor ya = index_select(a, idx, true), yb = index_select(b, idx);
  REQUIRE(ya.to_vector<float>() == yb.to_vector<float>());
  ya.backward(dy);
  yb.backward(dy);
  REQUIRE(a.grad().to_vector<float>() == b.grad().to_vector<float>());
  // Into a gradient already held (a second backward adds): still the same bits.
  index_select(a, idx, true).backward(dy * 0.5);
  index_select(b, idx).backward(dy * 0.5);
  REQUIRE(a.grad().to_vector<float>() == b.grad().to_vector<float>());
  // Rows no index names get nothing.
  const std::vector<float> ga = a.grad().to_vector<float>();
  for (int64_t r : {3, 5, 6, 8, 10})
    for (int64_t e = 0; e < 15; ++e) REQUIRE(ga[size_t(r * 15 + e)] == 0.f);

  // Finite differences through the unique path.
  auto r = gradcheck(
      [&](const std::vector<Tensor>& v) {
        return index_select(v[0], Tensor::from_vector<int32_t>({3, 0, 2}, {3}), true);
      },
      {rand_input({4, 2}, 31)});
  INFO(r.detail);
  REQUIRE(r.max_rel_error < 1e-6);

  // A CPU index given as unique that repeats: an error naming the value and both positions.
  Tensor w = Tensor::randn({6, 2}, g).set_requires_grad();
  REQUIRE_THROWS_WITH(index_select(w, Tensor::from_vector<int64_t>({1, 4, 1}, {3}), true),
                      Catch::Contains("[index_select] index 1 at positions 0 and 2 repeats") &&
                          Catch::Contains("given as unique"));
  // Without a gradient to scatter nothing is checked (the forward is a gather either way).
  REQUIRE(index_select(w.detach(), Tensor::from_vector<int64_t>({1, 1}, {2}), true).size(0) == 2);
}
