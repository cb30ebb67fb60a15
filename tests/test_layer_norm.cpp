// layer_norm: values against naive double computations, finite-difference gradients w.r.t. x,
// weight and bias, deterministic parameter gradients, error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::gradcheck;
using engine::testing::rand_input;

namespace {

// Rows of length c, normalised in double with the biased variance.
std::vector<double> naive_layer_norm(const std::vector<double>& x, int64_t c,
                                     const std::vector<double>& w, const std::vector<double>& b,
                                     double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / c; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) mu += x[r * c + j];
    mu /= c;
    for (int64_t j = 0; j < c; ++j) var += (x[r * c + j] - mu) * (x[r * c + j] - mu);
    var /= c;
    for (int64_t j = 0; j < c; ++j) {
      double h = (x[r * c + j] - mu) / std::sqrt(var + eps);
      y[r * c + j] = h * (w.empty() ? 1.0 : w[j]) + (b.empty() ? 0.0 : b[j]);
    }
  }
  return y;
}

template <class T>
std::vector<double> as_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

void require_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= tol);
  }
}

}  // namespace

TEST_CASE("layer_norm of a known row", "[layer_norm]") {
  // x = 1..4: mean 2.5, biased variance 1.25, xhat = (x - 2.5) / sqrt(1.25).
  const double s = std::sqrt(1.25);
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4}, {1, 4});
  std::vector<double> xhat = {-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s};
  REQUIRE(xhat[0] == Approx(-1.3416407864998738));
  require_close(layer_norm(x, Tensor(), Tensor(), 0.0).to_vector<double>(), xhat, 1e-15);

  Tensor w = Tensor::from_vector<double>({1, 2, 0.5, -1}, {4});
  Tensor b = Tensor::from_vector<double>({0.1, 0.2, 0.3, 0.4}, {4});
  std::vector<double> want = {xhat[0] + 0.1, 2 * xhat[1] + 0.2, 0.5 * xhat[2] + 0.3,
                              -xhat[3] + 0.4};
  require_close(layer_norm(x, w, b, 0.0).to_vector<double>(), want, 1e-15);
  // eps enters under the square root: var 1.25 + eps 0.75 = 2.
  std::vector<double> want_eps = {-1.5 / std::sqrt(2.0), -0.5 / std::sqrt(2.0),
                                  0.5 / std::sqrt(2.0), 1.5 / std::sqrt(2.0)};
  require_close(layer_norm(x, Tensor(), Tensor(), 0.75).to_vector<double>(), want_eps, 1e-15);
  // A constant row has xhat = 0 (rstd = 1 / sqrt(eps) stays finite for eps > 0).
  Tensor c = Tensor::full({1, 3}, 5.0, DType::f64);
  require_close(layer_norm(c, w.slice(0, 0, 3), b.slice(0, 0, 3)).to_vector<double>(),
                {0.1, 0.2, 0.3}, 1e-15);
}

TEST_CASE("layer_norm f32 on random data, weight only / bias only, non-contiguous input",
          "[layer_norm]") {
  Generator g(21);
  Tensor x = Tensor::randn({2, 3, 7}, g, 1.0, 3.0);
  Tensor w = Tensor::randn({7}, g);
  Tensor b = Tensor::randn({7}, g);
  std::vector<double> xv = as_double(x.to_vector<float>()), wv = as_double(w.to_vector<float>()),
                      bv = as_double(b.to_vector<float>());
  require_close(as_double(layer_norm(x, w, b, 1e-5).to_vector<float>()),
                naive_layer_norm(xv, 7, wv, bv, 1e-5), 1e-5);
  require_close(as_double(layer_norm(x, w, Tensor(), 1e-5).to_vector<float>()),
                naive_layer_norm(xv, 7, wv, {}, 1e-5), 1e-5);
  require_close(as_double(layer_norm(x, Tensor(), b, 1e-5).to_vector<float>()),
                naive_layer_norm(xv, 7, {}, bv, 1e-5), 1e-5);
  // A transposed view is normalised along its logical last dim.
  Tensor xt = Tensor::randn({7, 4}, g).transpose(0, 1);  // (4, 7), not contiguous
  REQUIRE_FALSE(xt.is_contiguous());
  require_close(as_double(layer_norm(xt, w, b, 1e-5).to_vector<float>()),
                naive_layer_norm(as_double(xt.to_vector<float>()), 7, wv, bv, 1e-5), 1e-5);
}

TEST_CASE("layer_norm gradcheck: x, weight and bias", "[layer_norm]") {
  Tensor x = rand_input({3, 5, 7}, 201);
  Tensor w = rand_input({7}, 202);
  Tensor b = rand_input({7}, 203);
  auto rep =
      gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
                {x, w, b});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
}

TEST_CASE("layer_norm gradcheck: no affine, weight only, bias only", "[layer_norm]") {
  Tensor x = rand_input({4, 9}, 204);
  auto plain = gradcheck(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor()); }, {x});
  INFO(plain.detail);
  REQUIRE(plain.max_rel_error < 1e-6);

  Tensor w = rand_input({9}, 205);
  auto wonly = gradcheck(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], Tensor(), 1e-5); },
      {x, w});
  INFO(wonly.detail);
  REQUIRE(wonly.max_rel_error < 1e-6);

  Tensor b = rand_input({9}, 206);
  auto bonly = gradcheck(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), in[1], 1e-5); },
      {x, b});
  INFO(bonly.detail);
  REQUIRE(bonly.max_rel_error < 1e-6);
}

TEST_CASE("layer_norm gradcheck: only the parameters require grad", "[layer_norm]") {
  Tensor x = rand_input({6, 5}, 207, /*requires_grad=*/false);
  Tensor w = rand_input({5}, 208);
  Tensor b = rand_input({5}, 209);
  auto rep =
      gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
                {x, w, b});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
}

TEST_CASE("layer_norm backward is deterministic and matches naive sums", "[layer_norm]") {
  // Large enough for the parallel path: the fixed row chunks must give bitwise-equal results.
  const int64_t R = 1500, C = 64;
  Generator g(31);
  Tensor xd = Tensor::randn({R, C}, g);
  Tensor wd = Tensor::randn({C}, g);
  Tensor bd = Tensor::randn({C}, g);
  Tensor dy = Tensor::randn({R, C}, g);
  auto run = [&]() {
    Tensor x = xd.clone().set_requires_grad();
    Tensor w = wd.clone().set_requires_grad();
    Tensor b = bd.clone().set_requires_grad();
    layer_norm(x, w, b, 1e-5).backward(dy);
    return std::vector<std::vector<float>>{x.grad().to_vector<float>(), w.grad().to_vector<float>(),
                                           b.grad().to_vector<float>()};
  };
  auto first = run();
  for (int k = 0; k < 3; ++k) REQUIRE(run() == first);

  // dweight = sum_rows dy * xhat, dbias = sum_rows dy, in double.
  std::vector<double> xv = as_double(xd.to_vector<float>()), gv = as_double(dy.to_vector<float>());
  std::vector<double> xhat = naive_layer_norm(xv, C, {}, {}, 1e-5);
  std::vector<double> dw(C, 0.0), db(C, 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < C; ++j) {
      dw[j] += gv[r * C + j] * xhat[r * C + j];
      db[j] += gv[r * C + j];
    }
  require_close(as_double(first[1]), dw, 1e-3);
  require_close(as_double(first[2]), db, 1e-3);
}

TEST_CASE("layer_norm errors", "[layer_norm]") {
  Tensor x = Tensor::zeros({4, 7});
  REQUIRE_THROWS_WITH(
      layer_norm(x, Tensor::ones({8}), Tensor()),
      Catch::Contains("[layer_norm] input (4, 7) f32 cpu does not match weight (8) f32 cpu"));
  REQUIRE_THROWS_WITH(layer_norm(x, Tensor(), Tensor::zeros({7, 1})),
                      Catch::Contains("[layer_norm] input (4, 7) f32 cpu does not match bias"));
  REQUIRE_THROWS_WITH(layer_norm(x, Tensor::ones({7}, DType::f64), Tensor()),
                      Catch::Contains("[layer_norm] weight (7) f64 cpu does not match the dtype"));
  REQUIRE_THROWS_WITH(layer_norm(Tensor::zeros({4, 7}, DType::i32), Tensor(), Tensor()),
                      Catch::Contains("[layer_norm] expects a floating input"));
  REQUIRE_THROWS_WITH(layer_norm(x, Tensor(), Tensor(), -1.0),
                      Catch::Contains("[layer_norm] eps must be >= 0"));
}
