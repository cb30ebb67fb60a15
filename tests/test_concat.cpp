// concat / split: forward against naive index arithmetic, views, finite-difference gradients
// (including split -> weight -> recombine) and the error messages.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::gradcheck;
using engine::testing::rand_input;

TEST_CASE("concat of three tensors along a middle dim", "[concat]") {
  // Input k has values 1000 k + its own flat index, so the result says where each came from.
  const std::vector<int64_t> widths = {1, 2, 3};
  std::vector<Tensor> xs;
  for (int k = 0; k < 3; ++k) {
    std::vector<float> v(2 * widths[k] * 3);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 1000.f * k + static_cast<float>(i);
    xs.push_back(Tensor::from_vector(v, {2, widths[k], 3}));
  }
  Tensor y = concat(xs, 1);
  REQUIRE(y.shape() == Shape{2, 6, 3});
  std::vector<float> yv = y.to_vector<float>();
  for (int a = 0; a < 2; ++a)
    for (int j = 0; j < 6; ++j)
      for (int c = 0; c < 3; ++c) {
        int k = j < 1 ? 0 : j < 3 ? 1 : 2;
        int jj = j - (k == 0 ? 0 : k == 1 ? 1 : 3);
        float want = 1000.f * k + static_cast<float>((a * widths[k] + jj) * 3 + c);
        REQUIRE(yv[(a * 6 + j) * 3 + c] == want);
      }
  // Negative dim and a strided input.
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).transpose(0, 1);  // [[1,3],[2,4]]
  Tensor z = concat({t, Tensor::from_vector<float>({9, 9}, {2, 1})}, -1);
  REQUIRE(z.to_vector<float>() == std::vector<float>{1, 3, 9, 2, 4, 9});
}

TEST_CASE("split returns views of the given sizes", "[concat]") {
  Tensor x = Tensor::arange(14, DType::f32).reshape({2, 7});
  std::vector<Tensor> parts = split(x, {2, 0, 5}, 1);
  REQUIRE(parts.size() == 3);
  REQUIRE(parts[0].shape() == Shape{2, 2});
  REQUIRE(parts[1].shape() == Shape{2, 0});
  REQUIRE(parts[2].shape() == Shape{2, 5});
  REQUIRE(parts[0].shares_storage(x));
  REQUIRE(parts[0].to_vector<float>() == std::vector<float>{0, 1, 7, 8});
  REQUIRE(parts[2].to_vector<float>() == std::vector<float>{2, 3, 4, 5, 6, 9, 10, 11, 12, 13});

  std::vector<Tensor> chunks = split(x, int64_t{3}, -1);  // 7 = 3 + 3 + 1, like torch.split
  REQUIRE(chunks.size() == 3);
  REQUIRE(chunks[2].shape() == Shape{2, 1});
  REQUIRE(chunks[2].to_vector<float>() == std::vector<float>{6, 13});
  REQUIRE(split(x, int64_t{2}, 0).size() == 1);
  // Splitting and concatenating again gives x back.
  REQUIRE(concat(chunks, 1).to_vector<float>() == x.to_vector<float>());
}

TEST_CASE("concat gradients match finite differences", "[concat]") {
  Tensor a = rand_input({3, 1, 7}, 51), b = rand_input({3, 5, 7}, 52),
         c = rand_input({3, 2, 7}, 53);
  auto rep = gradcheck([](const std::vector<Tensor>& in) { return concat(in, 1); }, {a, b, c});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);

  // An input outside the graph gets no gradient; the others still do.
  Tensor fixed = rand_input({3, 2, 7}, 54, false);
  auto rep2 = gradcheck(
      [&](const std::vector<Tensor>& in) {
        return concat({in[0], fixed, in[1]}, -2);
      },
      {a, b});
  INFO(rep2.detail);
  REQUIRE(rep2.max_rel_error < 1e-6);
  REQUIRE_FALSE(fixed.grad().defined());
}

TEST_CASE("split, weight and recombine: gradients match finite differences", "[concat]") {
  Tensor x = rand_input({3, 5, 7}, 61);
  Tensor w0 = rand_input({3, 1, 7}, 62), w1 = rand_input({3, 2, 7}, 63);
  auto rep = gradcheck(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = split(in[0], {1, 2, 2}, 1);  // (3,1,7) (3,2,7) (3,2,7)
        // Recombine out of order, each piece weighted differently (one by a constant).
        return concat({p[2] * 3.0, p[0] * in[1], p[1] * in[2]}, 1);
      },
      {x, w0, w1});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);

  auto rep_chunks = gradcheck(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = split(in[0], int64_t{3}, 2);  // 7 = 3 + 3 + 1 along the last dim
        return concat({p[1] * p[0], p[2] * -2.0}, 2);
      },
      {x});
  INFO(rep_chunks.detail);
  REQUIRE(rep_chunks.max_rel_error < 1e-6);
}

TEST_CASE("concat and split errors name the op", "[concat]") {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 3});
  REQUIRE_THROWS_WITH(concat({a, b}, 1),
                      Catch::Contains("[concat]") && Catch::Contains("does not match"));
  REQUIRE_THROWS_WITH(concat({a, Tensor::zeros({2, 3, 1})}, 0), Catch::Contains("[concat]"));
  REQUIRE_THROWS_WITH(concat({a, Tensor::zeros({2, 3}, DType::f64)}, 0),
                      Catch::Contains("[concat]") && Catch::Contains("dtype"));
  REQUIRE_THROWS_WITH(concat({}, 0), Catch::Contains("[concat]"));
  REQUIRE_THROWS_WITH(concat({a, b}, 2), Catch::Contains("[concat]") && Catch::Contains("dim 2"));
  REQUIRE_THROWS_WITH(split(b, {1, 1}, 0),
                      Catch::Contains("[split]") && Catch::Contains("sum to 2"));
  REQUIRE_THROWS_WITH(split(b, {4, -1}, 0), Catch::Contains("[split]"));
  REQUIRE_THROWS_WITH(split(b, int64_t{0}, 0), Catch::Contains("[split]"));
}
