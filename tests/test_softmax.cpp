// softmax (with broadcast bias and mask) and log_softmax: values against naive double
// computations, finite-difference gradients, raw helpers and error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::gradcheck;
using engine::testing::rand_input;

namespace {

// Softmax of one row over the kept positions, in double; all zeros when nothing is kept.
std::vector<double> naive_softmax(const std::vector<double>& z, const std::vector<bool>& keep) {
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < z.size(); ++j)
    if (keep[j]) mx = std::max(mx, z[j]);
  std::vector<double> y(z.size(), 0.0);
  if (mx == -std::numeric_limits<double>::infinity()) return y;
  double s = 0;
  for (size_t j = 0; j < z.size(); ++j)
    if (keep[j]) s += std::exp(z[j] - mx);
  for (size_t j = 0; j < z.size(); ++j)
    if (keep[j]) y[j] = std::exp(z[j] - mx) / s;
  return y;
}

template <class T>
void require_close(const std::vector<T>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::abs(static_cast<double>(got[i]) - want[i]) <= tol);
  }
}

}  // namespace

TEST_CASE("softmax of {1, 2, 3}", "[softmax]") {
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0), s = e1 + e2 + e3;
  std::vector<double> want = {e1 / s, e2 / s, e3 / s};  // 0.0900306, 0.2447285, 0.6652410
  REQUIRE(want[0] == Approx(0.09003057317038046));
  require_close(softmax(Tensor::from_vector<double>({1, 2, 3}, {3})).to_vector<double>(), want,
                1e-15);
  require_close(softmax(Tensor::from_vector<float>({1, 2, 3}, {1, 3})).to_vector<float>(), want,
                1e-7);
}

TEST_CASE("softmax subtracts the row max: large logits do not overflow", "[softmax]") {
  Tensor big = Tensor::from_vector<float>({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3});
  std::vector<float> y = softmax(big).to_vector<float>();
  std::vector<double> a = naive_softmax({0, 1, 2}, {true, true, true});
  std::vector<double> b = naive_softmax({0, -1, -2}, {true, true, true});
  require_close(y, {a[0], a[1], a[2], b[0], b[1], b[2]}, 1e-6);
}

TEST_CASE("softmax mask: masked positions are 0, a fully masked row is all 0", "[softmax]") {
  Tensor x = Tensor::from_vector<double>({0.5, -1, 2, 3, 1, 2, 3, 4}, {2, 4});
  std::vector<uint8_t> keep = {1, 0, 1, 1, 0, 0, 0, 0};
  Tensor mask = Tensor::from_vector<uint8_t>(keep, {2, 4});
  std::vector<double> r0 = naive_softmax({0.5, -1, 2, 3}, {true, false, true, true});
  std::vector<double> want = {r0[0], 0, r0[2], r0[3], 0, 0, 0, 0};
  std::vector<double> got = softmax(x, Tensor(), mask).to_vector<double>();
  require_close(got, want, 1e-15);
  REQUIRE(got[1] == 0.0);
  for (int j = 4; j < 8; ++j) REQUIRE(got[j] == 0.0);  // exactly zero, not NaN
}

TEST_CASE("softmax: a row whose kept logits are all -inf gives 0, not NaN", "[softmax]") {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::from_vector<double>({-inf, -inf, -inf, 0.0}, {2, 2});
  std::vector<double> y = softmax(x).to_vector<double>();
  REQUIRE(y == std::vector<double>{0, 0, 0, 1});
}

TEST_CASE("softmax: every mask dtype gives the same result", "[softmax]") {
  Generator g(7);
  Tensor x = Tensor::randn({3, 6}, g);
  std::vector<int> keep = {1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  std::vector<uint8_t> ku(keep.begin(), keep.end());
  std::vector<int32_t> k32(keep.begin(), keep.end());
  std::vector<int64_t> k64(keep.begin(), keep.end());
  std::vector<float> kf;
  for (int k : keep) kf.push_back(k ? 2.5f : 0.0f);  // any nonzero keeps
  std::vector<float> ref = softmax(x, Tensor(), Tensor::from_vector(ku, {3, 6})).to_vector<float>();
  REQUIRE(softmax(x, Tensor(), Tensor::from_vector(k32, {3, 6})).to_vector<float>() == ref);
  REQUIRE(softmax(x, Tensor(), Tensor::from_vector(k64, {3, 6})).to_vector<float>() == ref);
  REQUIRE(softmax(x, Tensor(), Tensor::from_vector(kf, {3, 6})).to_vector<float>() == ref);
  REQUIRE(
      softmax(x, Tensor(), Tensor::from_vector(kf, {3, 6}).to(DType::bf16)).to_vector<float>() ==
      ref);
  // A strided mask view (last-dim stride 3) is read through its strides.
  Tensor mt = Tensor::from_vector(ku, {3, 6}).transpose(0, 1).contiguous().transpose(0, 1);
  REQUIRE(mt.stride(1) == 3);
  REQUIRE(softmax(x, Tensor(), mt).to_vector<float>() == ref);
  // A per-row (query) mask (3, 1): stride 0 along the softmax axis.
  std::vector<float> rows =
      softmax(x, Tensor(), Tensor::from_vector<uint8_t>({1, 0, 1}, {3, 1})).to_vector<float>();
  std::vector<float> full = softmax(x).to_vector<float>();
  for (int j = 0; j < 18; ++j) REQUIRE(rows[j] == (j / 6 == 1 ? 0.0f : full[j]));
  // And the reference itself against the naive computation.
  std::vector<float> xv = x.to_vector<float>();
  for (int r = 0; r < 3; ++r) {
    std::vector<double> z(xv.begin() + 6 * r, xv.begin() + 6 * r + 6);
    std::vector<bool> k(keep.begin() + 6 * r, keep.begin() + 6 * r + 6);
    std::vector<double> want = naive_softmax(z, k);
    std::vector<float> got(ref.begin() + 6 * r, ref.begin() + 6 * r + 6);
    require_close(got, want, 1e-6);
  }
}

TEST_CASE("softmax: positional bias (1, H, T, T) and key mask (B, 1, 1, T) broadcast",
          "[softmax]") {
  const int64_t B = 2, H = 3, T = 5;
  Generator g(11);
  Tensor x = Tensor::randn({B, H, T, T}, g);     // (B, H, T, T) attention scores
  Tensor bias = Tensor::randn({1, H, T, T}, g);  // shared over the batch
  std::vector<uint8_t> km = {1, 1, 1, 0, 0,      // batch 0: two padded keys
                             1, 1, 1, 1, 1};     // batch 1: none
  Tensor mask = Tensor::from_vector(km, {B, 1, 1, T});
  std::vector<float> xv = x.to_vector<float>(), bv = bias.to_vector<float>();
  std::vector<double> want;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> z(T);
        std::vector<bool> k(T);
        for (int64_t j = 0; j < T; ++j) {
          z[j] = double(xv[((b * H + h) * T + i) * T + j]) + double(bv[(h * T + i) * T + j]);
          k[j] = km[b * T + j] != 0;
        }
        for (double v : naive_softmax(z, k)) want.push_back(v);
      }
  require_close(softmax(x, bias, mask).to_vector<float>(), want, 1e-6);
  // Without the mask the bias alone.
  std::vector<float> nomask = softmax(x, bias).to_vector<float>();
  std::vector<float> composed = softmax(x + bias).to_vector<float>();
  require_close(nomask, std::vector<double>(composed.begin(), composed.end()), 1e-6);
  // A non-contiguous bias view is read through its strides.
  Tensor bias_t = bias.transpose(2, 3).contiguous().transpose(2, 3);
  REQUIRE_FALSE(bias_t.is_contiguous());
  REQUIRE(softmax(x, bias_t, mask).to_vector<float>() == softmax(x, bias, mask).to_vector<float>());
}

TEST_CASE("softmax_forward_raw / softmax_backward_raw, also in place", "[softmax]") {
  Generator g(3);
  Tensor x = Tensor::randn({2, 3, 4}, g, 0, 1, DType::f64);
  Tensor bias = Tensor::randn({3, 1}, g, 0, 1, DType::f64);
  Tensor mask = Tensor::from_vector<int32_t>({1, 0, 1, 1}, {4});
  Tensor ref = softmax(x, bias, mask);
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  softmax_forward_raw(x, bias, mask, y);
  REQUIRE(y.to_vector<double>() == ref.to_vector<double>());
  Tensor inplace = x.clone();
  softmax_forward_raw(inplace, bias, mask, inplace);
  REQUIRE(inplace.to_vector<double>() == ref.to_vector<double>());

  Tensor dy = Tensor::randn(x.shape(), g, 0, 1, DType::f64);
  std::vector<double> yv = y.to_vector<double>(), gv = dy.to_vector<double>(), want(yv.size());
  for (int r = 0; r < 6; ++r) {
    double dot = 0;
    for (int j = 0; j < 4; ++j) dot += yv[4 * r + j] * gv[4 * r + j];
    for (int j = 0; j < 4; ++j) want[4 * r + j] = yv[4 * r + j] * (gv[4 * r + j] - dot);
  }
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  softmax_backward_raw(y, dy, dx);
  require_close(dx.to_vector<double>(), want, 1e-14);
  softmax_backward_raw(y, dy, dy);  // in place
  require_close(dy.to_vector<double>(), want, 1e-14);
}

TEST_CASE("log_softmax values", "[softmax]") {
  Tensor x = Tensor::from_vector<double>({1, 2, 3, -5, 0, 700}, {2, 3});
  std::vector<double> want;
  for (int r = 0; r < 2; ++r) {
    std::vector<double> row =
        r == 0 ? std::vector<double>{1, 2, 3} : std::vector<double>{-5, 0, 700};
    for (double p : naive_softmax(row, {true, true, true})) want.push_back(p > 0 ? std::log(p) : 0);
  }
  // log of the naive softmax underflows for -705; use the exact form there.
  want[3] = -705.0;
  want[4] = -700.0;
  require_close(log_softmax(x).to_vector<double>(), want, 1e-12);
  std::vector<float> yf = log_softmax(x.to(DType::f32)).to_vector<float>();
  require_close(yf, want, 1e-4);  // f32 spacing at 700 is 6e-5
}

TEST_CASE("softmax gradcheck: x only", "[softmax]") {
  Tensor x = rand_input({3, 5, 7}, 101);
  auto rep = gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0]); }, {x});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
}

TEST_CASE("softmax gradcheck: broadcast bias (1, 5, 7) gets the batch-summed gradient",
          "[softmax]") {
  Tensor x = rand_input({3, 5, 7}, 102);
  Tensor b = rand_input({1, 5, 7}, 103);
  auto rep = gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0], in[1]); }, {x, b});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
  REQUIRE(b.grad().shape() == Shape{1, 5, 7});
}

TEST_CASE("softmax gradcheck: bias (5, 1), bias only requiring grad", "[softmax]") {
  Tensor x = rand_input({3, 5, 7}, 104, /*requires_grad=*/false);
  Tensor b = rand_input({5, 1}, 105);
  auto rep = gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0], in[1]); }, {x, b});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
  REQUIRE(b.grad().shape() == Shape{5, 1});
}

TEST_CASE("softmax gradcheck: with a mask (one batch fully masked) and a bias", "[softmax]") {
  Tensor x = rand_input({3, 5, 7}, 106);
  Tensor b = rand_input({5, 7}, 107);
  std::vector<uint8_t> km = {1, 0, 1, 1, 0, 1, 1,   // batch 0
                             0, 0, 0, 0, 0, 0, 0,   // batch 1: every key masked
                             1, 1, 1, 1, 1, 1, 0};  // batch 2
  Tensor mask = Tensor::from_vector(km, {3, 1, 7});
  auto rep =
      gradcheck([&](const std::vector<Tensor>& in) { return softmax(in[0], in[1], mask); }, {x, b});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
  // Masked positions get no gradient.
  std::vector<double> gx = x.grad().to_vector<double>();
  for (int64_t i = 0; i < 3 * 5 * 7; ++i) {
    int64_t bb = i / 35, j = i % 7;
    if (!km[bb * 7 + j]) REQUIRE(gx[i] == 0.0);
  }
}

TEST_CASE("log_softmax gradcheck", "[softmax]") {
  Tensor x = rand_input({3, 5, 7}, 108);
  auto rep = gradcheck([](const std::vector<Tensor>& in) { return log_softmax(in[0]); }, {x});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
}

TEST_CASE("softmax on a non-contiguous input", "[softmax]") {
  Tensor x = rand_input({5, 3}, 109);
  auto rep =
      gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0].transpose(0, 1)); }, {x});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
}

TEST_CASE("softmax records nothing without grad", "[softmax]") {
  size_t before = tape_size();
  Tensor y = softmax(Tensor::ones({2, 3}), Tensor::ones({3}));
  Tensor z = log_softmax(y);
  REQUIRE_FALSE(z.requires_grad());
  REQUIRE(tape_size() == before);
}

TEST_CASE("softmax errors", "[softmax]") {
  Tensor x = Tensor::zeros({2, 3, 4});
  REQUIRE_THROWS_WITH(softmax(x, Tensor::zeros({3, 3})),
                      Catch::Contains("[softmax] bias (3, 3) f32 cpu is not broadcastable"));
  REQUIRE_THROWS_WITH(softmax(x, Tensor::zeros({3, 4}, DType::f64)),
                      Catch::Contains("[softmax]") && Catch::Contains("dtype"));
  REQUIRE_THROWS_WITH(softmax(x, Tensor(), Tensor::ones({2, 1, 5}, DType::u8)),
                      Catch::Contains("[softmax] mask (2, 1, 5) u8 cpu is not broadcastable"));
  REQUIRE_THROWS_WITH(softmax(Tensor::zeros({2, 3}, DType::i32)),
                      Catch::Contains("[softmax] expects a floating input"));
  REQUIRE_THROWS_WITH(log_softmax(Tensor::zeros({2, 3}, DType::i64)),
                      Catch::Contains("[log_softmax] expects a floating input"));
  REQUIRE_THROWS_WITH(softmax_forward_raw(x, Tensor(), Tensor(), Tensor::empty({2, 3})),
                      Catch::Contains("[softmax] output must be contiguous"));
}
