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
}
