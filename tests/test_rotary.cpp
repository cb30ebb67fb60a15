// rotary (RoPE): hand-checked values, the rotation's invariants (norms kept, q.k depends on the
// offset only, the inverse undoes it), finite-difference gradients and the errors.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using Catch::Contains;
using engine::testing::gradcheck;
using engine::testing::GradcheckReport;
using engine::testing::rand_input;

namespace {

// theta_{t,i} = t * base^(-2i / d) as cos / sin (T, d / 2).
std::pair<Tensor, Tensor> angles(int64_t t, int64_t d, double base = 10000.0) {
  std::vector<float> c, s;
  for (int64_t p = 0; p < t; ++p)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = double(p) * std::pow(base, -2.0 * double(i) / double(d));
      c.push_back(float(std::cos(a)));
      s.push_back(float(std::sin(a)));
    }
  return {Tensor::from_vector<float>(c, {t, d / 2}), Tensor::from_vector<float>(s, {t, d / 2})};
}

}  // namespace

TEST_CASE("rotary on a hand-checked example", "[rotary]") {
  // Two positions, one pair: position 0 is not rotated, position 1 by 90 degrees.
  Tensor c = Tensor::from_vector<float>({1, 0}, {2, 1});
  Tensor s = Tensor::from_vector<float>({0, 1}, {2, 1});
  Tensor x = Tensor::from_vector<double>({3, 4, 3, 4}, {2, 2});
  REQUIRE(rotary(x, c, s).to_vector<double>() == std::vector<double>{3, 4, -4, 3});
  // Leading dims share the angles; a non-contiguous x is read through its view.
  Tensor x3 = Tensor::from_vector<float>({1, 2, 5, 6, 3, 4, 7, 8}, {2, 2, 2}).transpose(0, 1);
  REQUIRE(rotary(x3, c, s).to_vector<float>() == std::vector<float>{1, 2, -4, 3, 5, 6, -8, 7});
}

TEST_CASE("rotary keeps norms, makes q.k a function of the offset, and inverts", "[rotary]") {
  const int64_t t = 9, d = 8;
  auto [c, s] = angles(t, d);
  Tensor q = rand_input({d}, 71, false), k = rand_input({d}, 72, false);
  // The same q and k at every position: rotated, q_i . k_j depends on j - i only.
  Tensor rq = rotary(q.unsqueeze(0).expand({t, d}), c.to(DType::f32), s);
  Tensor rk = rotary(k.unsqueeze(0).expand({t, d}), c, s);
  std::vector<double> dots = matmul(rq, rk.transpose(0, 1)).to_vector<double>();
  for (int64_t i = 1; i < t; ++i)
    for (int64_t j = 1; j < t; ++j)
      REQUIRE(dots[size_t(i * t + j)] == Approx(dots[size_t((i - 1) * t + j - 1)]).margin(1e-6));
  std::vector<double> a = rq.to_vector<double>(), qv = q.to_vector<double>();
  double nq = 0;
  for (double v : qv) nq += v * v;
  for (int64_t i = 0; i < t; ++i) {
    double n = 0;
    for (int64_t j = 0; j < d; ++j) n += a[size_t(i * d + j)] * a[size_t(i * d + j)];
    REQUIRE(n == Approx(nq).epsilon(1e-6));
  }
  // Rotating by -theta (sin negated) undoes it.
  Tensor back = rotary(rq, c, s * -1.0);
  std::vector<double> b = back.to_vector<double>();
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < d; ++j)
      REQUIRE(b[size_t(i * d + j)] == Approx(qv[size_t(j)]).margin(1e-6));
}

TEST_CASE("rotary gradients match finite differences", "[rotary]") {
  auto [c, s] = angles(5, 6);
  for (auto [name, shape] :
       {std::pair<const char*, Shape>{"(5, 6)", {5, 6}}, {"(2, 3, 5, 6)", {2, 3, 5, 6}}}) {
    GradcheckReport r =
        gradcheck([&](const std::vector<Tensor>& v) { return rotary(v[0], c, s) * 1.5; },
                  {rand_input(shape, 81)});
    INFO(name << "\n" << r.detail);
    REQUIRE(r.max_rel_error < 1e-6);
  }
  // A transposed view, chained with a second rotation.
  GradcheckReport r = gradcheck(
      [&](const std::vector<Tensor>& v) {
        return rotary(rotary(v[0].transpose(0, 1), c, s), c, s);
      },
      {rand_input({6, 5}, 82)});
  INFO(r.detail);
  REQUIRE(r.max_rel_error < 1e-6);
}

TEST_CASE("rotary's errors name what was expected", "[rotary]") {
  auto [c, s] = angles(4, 6);
  REQUIRE_THROWS_WITH(rotary(Tensor::zeros({4, 5}), c, s), Contains("D even"));
  REQUIRE_THROWS_WITH(rotary(Tensor::zeros({3, 6}), c, s), Contains("(T, D / 2) = (3, 3)"));
  REQUIRE_THROWS_WITH(rotary(Tensor::zeros({4, 6}), c.to(DType::f64), s), Contains("must be f32"));
  REQUIRE_THROWS_WITH(rotary(Tensor::zeros({4, 6}, DType::i64), c, s), Contains("floating"));
  REQUIRE_THROWS_WITH(rotary(Tensor::zeros({4, 6}), c.detach().set_requires_grad(), s),
                      Contains("constants"));
}
