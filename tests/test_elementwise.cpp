// Elementwise ops: values, broadcasting, finite-difference gradients, errors.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/cpu/parallel.h"
#include "engine/cpu/strided.h"
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

// strided_for_parallel shares a strided walk out over the threads: every element of operand 0 is
// handed to exactly one call, at the offsets the one-thread walk gives it, and a destination that
// repeats an element (a zero stride) stays on one thread.
TEST_CASE("strided_for_parallel visits every element once, split over the threads",
          "[elementwise][threads]") {
  const int max_threads = omp_get_max_threads();
  struct Case {
    Shape shape;
    std::vector<int64_t> dst, src;
    bool one_thread;  // the walk must stay on one thread
  };
  const std::vector<Case> cases = {
      {{40, 33, 50}, {1, 40 * 50, 40}, {33 * 50, 50, 1}, false},  // a permuted copy: many runs
      {{40000}, {2}, {1}, false},                                 // one strided run
      {{3, 20000}, {20000, 1}, {1, 3}, false},                    // fewer runs than threads
      {{300, 200}, {0, 1}, {200, 1}, true},                       // operand 0 repeats rows
      {{100, 50}, {50, 1}, {1, 100}, true},                       // below the threshold
  };
  for (const Case& c : cases) {
    int64_t numel = 1, span = 1;
    for (size_t d = 0; d < c.shape.size(); ++d) {
      numel *= c.shape[d];
      span += (c.shape[d] - 1) * c.dst[d];
    }
    for (int t : {1, 2, 3, 7}) {
      omp_set_num_threads(t);
      INFO(numel << " elements, " << t << " threads");
      std::vector<int> visits(span, 0);
      std::vector<int64_t> src_of(span, -1);
      std::vector<int> threads_seen(8, 0);
      engine::cpu::strided_for_parallel<2>(
          c.shape, {&c.dst, &c.src}, engine::cpu::kParallelMinElems,
          [&](const int64_t* off, int64_t n, const int64_t* step) {
            const int th = omp_get_thread_num();
#pragma omp atomic
            threads_seen[th] += 1;
            for (int64_t i = 0; i < n; ++i) {
              const int64_t d = off[0] + i * step[0];
#pragma omp atomic
              visits[d] += 1;
              src_of[d] = off[1] + i * step[1];  // raced only where a second visit fails it
            }
          });
      int64_t visited = 0;
      for (int v : visits) visited += v;
      CHECK(visited == numel);
      int busy = 0;
      for (int v : threads_seen) busy += v > 0;
      if (c.one_thread || t == 1) {
        CHECK(busy == 1);
      } else {
        CHECK(busy == t);
      }
      if (c.one_thread) continue;
      // Each element once, and paired with the source element the index math gives.
      bool once = true, paired = true;
      std::vector<int64_t> idx(c.shape.size(), 0);
      for (int64_t e = 0; e < numel; ++e) {
        int64_t d = 0, s = 0;
        for (size_t k = 0; k < c.shape.size(); ++k) {
          d += idx[k] * c.dst[k];
          s += idx[k] * c.src[k];
        }
        once &= visits[d] == 1;
        paired &= src_of[d] == s;
        for (int64_t k = int64_t(c.shape.size()) - 1; k >= 0; --k)
          if (++idx[k] < c.shape[k])
            break;
          else
            idx[k] = 0;
      }
      CHECK(once);
      CHECK(paired);
    }
  }
  omp_set_num_threads(max_threads);
}

// The kernels on that walk (a strided copy, fill_, add_, the binary ops, affine) at several thread
// counts against values from the index math.
TEST_CASE("strided copies and element-wise ops over many elements, at any thread count",
          "[elementwise][threads]") {
  const int max_threads = omp_get_max_threads();
  const int64_t A = 40, B = 33, C = 50;  // 66,000 elements: above the parallel threshold
  Tensor x = Tensor::arange(A * B * C, DType::f64).reshape({A, B, C});
  Tensor row = Tensor::arange(A, DType::f64);  // broadcast along the permuted inner dim
  for (int t : {1, 2, 3, 7}) {
    omp_set_num_threads(t);
    INFO(t << " threads");
    Tensor p = x.permute({2, 0, 1});  // (C, A, B), strided
    const std::vector<double> pc = p.contiguous().to_vector<double>();
    const std::vector<double> sum = (p + row.reshape({1, A, 1})).to_vector<double>();
    const std::vector<double> aff = affine(p, 2.0, -1.0).to_vector<double>();
    Tensor y = Tensor::zeros({A, B, C}, DType::f64);
    Tensor yp = y.permute({2, 0, 1});
    yp.fill_(3.0);
    yp.add_(p, 0.5);  // y[a][b][c] = 3 + 0.5 x[a][b][c], written through the permuted view
    Tensor f = Tensor::empty({C, A, B}, DType::f32);
    f.copy_(p);  // f64 -> f32 through the strided walk
    const std::vector<double> yv = y.to_vector<double>();
    const std::vector<float> fv = f.to_vector<float>();
    bool ok_copy = true, ok_sum = true, ok_aff = true, ok_add = true, ok_cast = true;
    for (int64_t c = 0, e = 0; c < C; ++c)
      for (int64_t a = 0; a < A; ++a)
        for (int64_t b = 0; b < B; ++b, ++e) {
          const double v = double((a * B + b) * C + c);
          ok_copy &= pc[e] == v;
          ok_sum &= sum[e] == v + double(a);
          ok_aff &= aff[e] == 2.0 * v - 1.0;
          ok_cast &= fv[e] == float(v);
        }
    for (int64_t e = 0; e < A * B * C; ++e) ok_add &= yv[e] == 3.0 + 0.5 * double(e);
    CHECK(ok_copy);
    CHECK(ok_sum);
    CHECK(ok_aff);
    CHECK(ok_add);
    CHECK(ok_cast);
    // A strided copy onto an overlapping view of the same storage keeps the one-thread order:
    // each element of z's even slots takes the one two before it, already overwritten, so all
    // become z[0]. Split over threads, the second thread's first read would come too early.
    const int64_t n = 2 * 40000;
    Tensor z = Tensor::arange(n, DType::f64);
    z.slice(0, 2, n, 2).copy_(z.slice(0, 0, n - 2, 2));
    const std::vector<double> zv = z.to_vector<double>();
    bool smeared = true;
    for (int64_t e = 0; e < n; e += 2) smeared &= zv[e] == 0.0;
    CHECK(smeared);
  }
  omp_set_num_threads(max_threads);
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
      {"bias_gelu", [](auto& v) { return bias_gelu(v[0], v[1]); }, {x, row}},
      {"bias_gelu of a strided input",
       [](auto& v) { return bias_gelu(v[0].transpose(0, 2), v[1]); },
       {x, rand_input({3}, 16)}},
  };
  for (auto& c : cases) {
    GradcheckReport r = gradcheck(c.f, c.in);
    INFO(c.name << "\n" << r.detail);
    REQUIRE(r.max_rel_error < 1e-6);
  }
}

namespace {

// The bias gradient's contract (elementwise.h): dx summed over chunks of rows fixed by the row
// count, each in row order in T, then the chunks in order in double.
template <class T>
std::vector<T> chunked_bias_sum(const std::vector<T>& dx, int64_t rows, int64_t n) {
  const int64_t chunks = std::min(rows, kBiasGeluChunks);
  std::vector<double> total(static_cast<size_t>(n), 0.0);
  for (int64_t k = 0; k < chunks; ++k) {
    std::vector<T> part(static_cast<size_t>(n), T(0));
    for (int64_t r = rows * k / chunks; r < rows * (k + 1) / chunks; ++r)
      for (int64_t j = 0; j < n; ++j) part[j] += dx[r * n + j];
    for (int64_t j = 0; j < n; ++j) total[j] += static_cast<double>(part[j]);
  }
  return std::vector<T>(total.begin(), total.end());
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("bias_gelu is gelu(x + bias) forward and backward", "[elementwise]") {
  // f64: the exact functions on both sides.
  {
    Tensor x = rand_input({3, 5, 7}, 21), b = rand_input({7}, 22);
    Tensor x2 = x.detach().set_requires_grad(), b2 = b.detach().set_requires_grad();
    Tensor y = bias_gelu(x, b), want = gelu(x2 + b2);
    const std::vector<double> yv = y.to_vector<double>(), wv = want.to_vector<double>();
    for (size_t i = 0; i < yv.size(); ++i)
      REQUIRE(yv[i] == Approx(wv[i]).epsilon(1e-14).margin(1e-15));
    Tensor dy = rand_input({3, 5, 7}, 23, false);
    y.backward(dy);
    want.backward(dy);
    const std::vector<double> gx = x.grad().to_vector<double>(),
                              gx2 = x2.grad().to_vector<double>();
    for (size_t i = 0; i < gx.size(); ++i)
      REQUIRE(gx[i] == Approx(gx2[i]).epsilon(1e-13).margin(1e-15));
    const std::vector<double> gb = b.grad().to_vector<double>(),
                              gb2 = b2.grad().to_vector<double>();
    for (size_t i = 0; i < gb.size(); ++i)
      REQUIRE(gb[i] == Approx(gb2[i]).epsilon(1e-12).margin(1e-14));
  }
}

namespace {

// More rows than chunks and a width that is no multiple of a vector: the forward as gelu(x + b)
// (in f32 Eigen's vectorised erf on both), dx likewise, and the bias gradient bit for bit as the
// contract sums the op's own dx, at 1, 2, 3 and 7 threads.
template <class T>
void check_bias_gelu_rows(DType dt, double tol) {
  const int max_threads = omp_get_max_threads();
  Generator g(24);
  const int64_t rows = 1000, n = 1030;
  Tensor x0 = Tensor::randn({4, rows / 4, n}, g, 0.0, 2.0, dt);
  Tensor b0 = Tensor::randn({n}, g, 0.0, 1.0, dt),
         dy = Tensor::randn({4, rows / 4, n}, g, 0, 1, dt);
  Tensor ref_x = x0.detach().set_requires_grad(), ref_b = b0.detach().set_requires_grad();
  Tensor ref = gelu(ref_x + ref_b);
  ref.backward(dy);
  std::vector<T> first_db;
  for (int t : {1, 2, 3, 7}) {
    omp_set_num_threads(t);
    INFO(dtype_name(dt) << ", " << t << " threads");
    Tensor x = x0.detach().set_requires_grad(), b = b0.detach().set_requires_grad();
    Tensor y = bias_gelu(x, b);
    const std::vector<T> yv = y.to_vector<T>(), rv = ref.to_vector<T>();
    for (size_t i = 0; i < yv.size(); ++i)
      REQUIRE(yv[i] == Approx(rv[i]).epsilon(tol).margin(tol / 10));
    y.backward(dy);
    const std::vector<T> dx = x.grad().to_vector<T>(), rdx = ref_x.grad().to_vector<T>();
    for (size_t i = 0; i < dx.size(); ++i)
      REQUIRE(dx[i] == Approx(rdx[i]).epsilon(tol).margin(tol / 10));
    const std::vector<T> db = b.grad().to_vector<T>();
    REQUIRE(same_bits(db, chunked_bias_sum(dx, rows, n)));
    const std::vector<T> rdb = ref_b.grad().to_vector<T>();
    for (int64_t j = 0; j < n; ++j)
      REQUIRE(db[j] == Approx(rdb[j]).epsilon(100 * tol).margin(100 * tol));
    if (first_db.empty()) first_db = db;
    REQUIRE(same_bits(db, first_db));
  }
  omp_set_num_threads(max_threads);
}

}  // namespace

TEST_CASE("bias_gelu over many rows: its bias gradient's order at any thread count",
          "[elementwise]") {
  check_bias_gelu_rows<float>(DType::f32, 1e-6);
  check_bias_gelu_rows<double>(DType::f64, 1e-13);
}

TEST_CASE("bias_gelu gradients reach only the inputs that need them, and empty rows",
          "[elementwise]") {
  Tensor x = rand_input({4, 6}, 31), b = rand_input({6}, 32, false);
  sum(bias_gelu(x, b)).backward();
  REQUIRE(x.grad().defined());
  REQUIRE_FALSE(b.grad().defined());
  Tensor x2 = rand_input({4, 6}, 33, false), b2 = rand_input({6}, 34);
  sum(bias_gelu(x2, b2)).backward();
  REQUIRE_FALSE(x2.grad().defined());
  // d/db sum gelu(x + b) = sum over rows of gelu'(x + b): against the composition.
  Tensor b3 = b2.detach().set_requires_grad();
  sum(gelu(x2 + b3)).backward();
  const std::vector<double> gb = b2.grad().to_vector<double>(),
                            want = b3.grad().to_vector<double>();
  for (size_t j = 0; j < gb.size(); ++j) REQUIRE(gb[j] == Approx(want[j]).epsilon(1e-13));
  // No rows: an empty output and a zero bias gradient.
  Tensor e = Tensor::zeros({0, 6}, DType::f64).set_requires_grad();
  Tensor be = Tensor::ones({6}, DType::f64).set_requires_grad();
  Tensor ye = bias_gelu(e, be);
  REQUIRE(ye.shape() == Shape{0, 6});
  sum(ye).backward();
  REQUIRE(be.grad().to_vector<double>() == std::vector<double>(6, 0.0));
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
  REQUIRE_THROWS_WITH(bias_gelu(Tensor::zeros({2, 3}), Tensor::zeros({2})),
                      Contains("[bias_gelu] bias (2) f32 cpu does not match x (2, 3) f32 cpu: "
                               "expected bias (3)"));
  REQUIRE_THROWS_WITH(bias_gelu(Tensor::zeros({2, 3}), Tensor::zeros({3}, DType::f64)),
                      Contains("[bias_gelu] dtype mismatch"));
  REQUIRE_THROWS_WITH(bias_gelu(Tensor::zeros({2, 3}), Tensor()),
                      Contains("[bias_gelu] got an undefined input"));
  REQUIRE_THROWS_WITH(bias_gelu(Tensor::zeros({2, 3}, DType::i32), Tensor::zeros({3}, DType::i32)),
                      Contains("[bias_gelu] expects floating tensors"));
}
