// sum / mean: forward against naive loops (dims, keepdim, negative dims, strided inputs),
// finite-difference gradients and the error messages.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::gradcheck;
using engine::testing::rand_input;

namespace {

// x (A, B, C) summed naively over the dims flagged in `r`, into the keepdim layout.
std::vector<double> naive_sum(const std::vector<double>& x, int A, int B, int C, bool r0, bool r1,
                              bool r2) {
  int a_n = r0 ? 1 : A, b_n = r1 ? 1 : B, c_n = r2 ? 1 : C;
  std::vector<double> out(a_n * b_n * c_n, 0.0);
  for (int a = 0; a < A; ++a)
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < C; ++c)
        out[((r0 ? 0 : a) * b_n + (r1 ? 0 : b)) * c_n + (r2 ? 0 : c)] += x[(a * B + b) * C + c];
  return out;
}

void require_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).epsilon(1e-12));
}

}  // namespace

TEST_CASE("sum and mean over everything", "[reduce]") {
  Tensor x = Tensor::arange(24, DType::f64).reshape({2, 3, 4});
  Tensor s = sum(x);
  REQUIRE(s.shape() == Shape{});
  REQUIRE(s.item() == 276.0);  // 0 + 1 + ... + 23 = 23 * 24 / 2
  REQUIRE(mean(x).item() == 11.5);
  REQUIRE(sum(x, {}).item() == 276.0);  // empty dims: every dim, as in PyTorch
  REQUIRE(sum(Tensor::scalar(2.5, DType::f64)).item() == 2.5);
}

TEST_CASE("sum and mean over dims match naive loops", "[reduce]") {
  Tensor x = rand_input({3, 5, 7}, 7, false);
  std::vector<double> xv = x.to_vector<double>();

  Tensor s02 = sum(x, {0, 2});
  REQUIRE(s02.shape() == Shape{5});
  require_close(s02.to_vector<double>(), naive_sum(xv, 3, 5, 7, true, false, true));

  Tensor s02k = sum(x, {2, 0}, /*keepdim=*/true);
  REQUIRE(s02k.shape() == Shape{1, 5, 1});
  require_close(s02k.to_vector<double>(), naive_sum(xv, 3, 5, 7, true, false, true));

  Tensor s_last = sum(x, {-1});
  REQUIRE(s_last.shape() == Shape{3, 5});
  require_close(s_last.to_vector<double>(), naive_sum(xv, 3, 5, 7, false, false, true));

  Tensor m1 = mean(x, {1}, true);
  REQUIRE(m1.shape() == Shape{3, 1, 7});
  std::vector<double> want = naive_sum(xv, 3, 5, 7, false, true, false);
  for (double& v : want) v /= 5;
  require_close(m1.to_vector<double>(), want);

  Tensor m012 = mean(x, {0, 1, 2});
  REQUIRE(m012.shape() == Shape{});
  REQUIRE(m012.item() == Approx(naive_sum(xv, 3, 5, 7, true, true, true)[0] / 105).epsilon(1e-12));
}

TEST_CASE("sum of a strided view reduces the view's elements", "[reduce]") {
  Tensor base = Tensor::arange(12, DType::f32).reshape({3, 4});
  Tensor t = base.transpose(0, 1);  // (4, 3): t[i, j] = 4 j + i
  REQUIRE(sum(t, {1}).to_vector<float>() == std::vector<float>{12, 15, 18, 21});
  REQUIRE(sum(base.slice(1, 1, 4, 2), {0}).to_vector<float>() == std::vector<float>{15, 21});
}

TEST_CASE("sum and mean gradients match finite differences", "[reduce]") {
  struct Case {
    std::vector<int64_t> dims;
    bool keepdim;
  };
  const std::vector<Case> cases = {{{1}, false},    {{1}, true},        {{0, 2}, false},
                                   {{-1, 0}, true}, {{0, 1, 2}, false}, {{}, false}};
  for (bool is_mean : {false, true}) {
    for (const Case& c : cases) {
      Tensor x = rand_input({3, 5, 7}, 31);
      auto rep = gradcheck(
          [&](const std::vector<Tensor>& in) {
            return is_mean ? mean(in[0], c.dims, c.keepdim) : sum(in[0], c.dims, c.keepdim);
          },
          {x});
      INFO((is_mean ? "mean" : "sum")
           << " dims " << shape_str(c.dims) << " keepdim " << c.keepdim << "\n"
           << rep.detail);
      REQUIRE(rep.max_rel_error < 1e-6);
    }
  }
  Tensor x = rand_input({3, 5, 7}, 32);
  auto all_sum = gradcheck([](const std::vector<Tensor>& in) { return sum(in[0]); }, {x});
  auto all_mean = gradcheck([](const std::vector<Tensor>& in) { return mean(in[0]); }, {x});
  INFO(all_sum.detail << all_mean.detail);
  REQUIRE(all_sum.max_rel_error < 1e-6);
  REQUIRE(all_mean.max_rel_error < 1e-6);
}

TEST_CASE("mean backward spreads 1 / count to every element", "[reduce]") {
  Tensor x = rand_input({2, 3, 4}, 33);
  mean(x, {0, 2}).backward(Tensor::from_vector<double>({1, 2, 3}, {3}));
  std::vector<double> g = x.grad().to_vector<double>();
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c) REQUIRE(g[(a * 3 + b) * 4 + c] == Approx((b + 1) / 8.0));
}

TEST_CASE("sum and mean errors name the op", "[reduce]") {
  Tensor x = Tensor::zeros({2, 3});
  REQUIRE_THROWS_WITH(sum(x, {1, -1}), Catch::Contains("[sum]") && Catch::Contains("repeated"));
  REQUIRE_THROWS_WITH(mean(x, {0, 0}), Catch::Contains("[mean]") && Catch::Contains("repeated"));
  REQUIRE_THROWS_WITH(sum(x, {2}), Catch::Contains("[sum]") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(mean(Tensor::zeros({2}, DType::i64)),
                      Catch::Contains("[mean]") && Catch::Contains("floating"));
}
