// Elementwise ops: values, broadcasting, finite-difference gradients, errors.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using namespace engine::testing;
using Catch::Contains;

TEST_CASE("binary ops broadcast like NumPy", "[elementwise]") {
  Tensor a = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row = Tensor::from_vector<double>({10, 20, 30}, {3});
  Tensor col = Tensor::from_vector<double>({2, 4}, {2, 1});
  REQUIRE((a + row).to_vector<double>() == std::vector<double>{11, 22, 33, 14, 25, 36});
  REQUIRE((a - col).to_vector<double>() == std::vector<double>{-1, 0, 1, 0, 1, 2});
  REQUIRE((a * col).to_vector<double>() == std::vector<double>{2, 4, 6, 16, 20, 24});
  REQUIRE((a / col).to_vector<double>() == std::vector<double>{0.5, 1, 1.5, 1, 1.25, 1.5});
  REQUIRE((col + row).shape() == Shape{2, 3});
  REQUIRE((a * 2.0 + 1.0).to_vector<double>() == std::vector<double>{3, 5, 7, 9, 11, 13});
  REQUIRE((-a).to_vector<double>()[5] == -6);
  // Transposed (strided) operands.
  Tensor at = a.transpose(0, 1);  // (3, 2)
  REQUIRE((at + at).to_vector<double>() == std::vector<double>{2, 8, 4, 10, 6, 12});
}

TEST_CASE("gelu (erf form) and tanh values", "[elementwise]") {
  Tensor x = Tensor::from_vector<double>({-1, 0, 1, 3}, {4});
  std::vector<double> g = gelu(x).to_vector<double>();
  REQUIRE(g[0] == Approx(-0.15865525393145707).epsilon(1e-14));
  REQUIRE(g[1] == 0.0);
  REQUIRE(g[2] == Approx(0.8413447460685429).epsilon(1e-14));
  REQUIRE(g[3] == Approx(2.9959503059051).epsilon(1e-14));
  std::vector<double> t = engine::tanh(x).to_vector<double>();
  REQUIRE(t[0] == Approx(-0.7615941559557649).epsilon(1e-14));
  REQUIRE(t[3] == Approx(0.9950547536867305).epsilon(1e-14));
  std::vector<float> gf = gelu(x.to(DType::f32)).to_vector<float>();
  REQUIRE(gf[2] == Approx(0.8413447460685429).epsilon(1e-6));
}

TEST_CASE("sin and cos values", "[elementwise]") {
  // Quarter turns give exact zeros and ones up to rounding; 1 and -2.5 check general points.
  const double pi = 3.14159265358979323846;
  Tensor x = Tensor::from_vector<double>({0, pi / 2, pi, -pi / 2, 1, -2.5}, {2, 3});
  std::vector<double> s = engine::sin(x).to_vector<double>();
  std::vector<double> c = engine::cos(x).to_vector<double>();
  const std::vector<double> sin_ref = {0, 1, 0, -1, 0.8414709848078965, -0.5984721441039564};
  const std::vector<double> cos_ref = {1, 0, -1, 0, 0.5403023058681398, -0.8011436155469337};
  for (size_t i = 0; i < sin_ref.size(); ++i) {
    INFO("element " << i);
    REQUIRE(s[i] == Approx(sin_ref[i]).epsilon(1e-14).margin(1e-15));
    REQUIRE(c[i] == Approx(cos_ref[i]).epsilon(1e-14).margin(1e-15));
  }
  REQUIRE(engine::sin(x).shape() == Shape{2, 3});

  // f32 (Eigen's SIMD path): long enough for several chunks, angles spanning a few turns and a
  // strided input.
  std::vector<float> xv(10000);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = -20.0f + 40.0f * static_cast<float>(i) / 9999.0f;
  Tensor xf = Tensor::from_vector(xv, {100, 100}).transpose(0, 1);
  std::vector<float> sf = engine::sin(xf).to_vector<float>();
  std::vector<float> cf = engine::cos(xf).to_vector<float>();
  std::vector<float> xt = xf.to_vector<float>();
  for (size_t i = 0; i < xt.size(); ++i) {
    REQUIRE(sf[i] == Approx(std::sin(static_cast<double>(xt[i]))).margin(2e-6));
    REQUIRE(cf[i] == Approx(std::cos(static_cast<double>(xt[i]))).margin(2e-6));
  }
}

TEST_CASE("sin/cos f32 backward", "[elementwise]") {
  Tensor x = Tensor::from_vector<float>({-3, -0.5f, 0, 0.25f, 2, 7}, {6}).set_requires_grad();
  engine::sum(engine::sin(x) + engine::cos(x)).backward();
  std::vector<float> g = x.grad().to_vector<float>();
  std::vector<float> xv = x.to_vector<float>();
  for (size_t i = 0; i < xv.size(); ++i)
    REQUIRE(g[i] == Approx(std::cos(double(xv[i])) - std::sin(double(xv[i]))).margin(1e-6));
}

TEST_CASE("elementwise gradients match finite differences", "[elementwise][gradcheck]") {
  Tensor x = rand_input({3, 5, 7}, 11);
  Tensor y = rand_input({3, 5, 7}, 12);
  Tensor col = rand_input({5, 1}, 13);
  Tensor row = rand_input({7}, 14);
  Tensor pos = rand_input({5, 1}, 15, false);  // keep divisors away from 0
  {
    NoGrad ng;
    pos = (pos * pos + 1.0).clone();
    pos.set_requires_grad();
  }
  struct Case {
    const char* name;
    TestFn f;
    std::vector<Tensor> in;
  };
  std::vector<Case> cases = {
      {"add", [](auto& v) { return v[0] + v[1]; }, {x, y}},
      {"add broadcast", [](auto& v) { return v[0] + v[1]; }, {x, col}},
      {"sub broadcast", [](auto& v) { return v[1] - v[0]; }, {x, row}},
      {"mul broadcast", [](auto& v) { return v[0] * v[1]; }, {x, col}},
      {"mul same tensor", [](auto& v) { return v[0] * v[0]; }, {x}},
      {"div broadcast", [](auto& v) { return v[0] / v[1]; }, {x, pos}},
      {"scale/affine", [](auto& v) { return v[0] * 3.0 - 2.0; }, {x}},
      {"gelu", [](auto& v) { return gelu(v[0]); }, {x}},
      {"tanh", [](auto& v) { return engine::tanh(v[0]); }, {x}},
      {"gelu of broadcast", [](auto& v) { return gelu(v[0] * v[1]); }, {col, row}},
      {"sin", [](auto& v) { return engine::sin(v[0]); }, {x}},
      {"cos", [](auto& v) { return engine::cos(v[0]); }, {x}},
      // A learnable sinusoidal encoding: angle = pos * freq, broadcast (5, 1) x (7).
      {"sin/cos of pos * freq",
       [](auto& v) { return engine::sin(v[0] * v[1]) + engine::cos(v[0] * v[1]); },
       {col, row}},
      {"sin of a strided input", [](auto& v) { return engine::sin(v[0].transpose(0, 2)); }, {x}},
  };
  for (auto& c : cases) {
    GradcheckReport r = gradcheck(c.f, c.in);
    INFO(c.name << "\n" << r.detail);
    REQUIRE(r.max_rel_error < 1e-6);
  }
}

TEST_CASE("elementwise errors", "[elementwise][errors]") {
  Tensor a = Tensor::zeros({2, 3});
  REQUIRE_THROWS_WITH(a + Tensor::zeros({4}),
                      Contains("[add] shapes (2, 3) and (4) cannot be broadcast"));
  REQUIRE_THROWS_WITH(a * Tensor::zeros({3}, DType::f64),
                      Contains("[mul] dtype mismatch: (2, 3) f32 cpu and (3) f64 cpu"));
  REQUIRE_THROWS_WITH(a - Tensor(), Contains("[sub] got an undefined input"));
  REQUIRE_THROWS_WITH(gelu(Tensor::zeros({2}, DType::i64)), Contains("[gelu] expects a floating"));
  REQUIRE_THROWS_WITH(gelu(Tensor::zeros({2}, DType::bf16)),
                      Contains("CPU kernels compute in f32 or f64, got bf16"));
  REQUIRE_THROWS_WITH(engine::sin(Tensor::zeros({2}, DType::i32)),
                      Contains("[sin] expects a floating tensor, got (2) i32 cpu"));
  REQUIRE_THROWS_WITH(engine::cos(Tensor()), Contains("[cos] got an undefined input"));
}
