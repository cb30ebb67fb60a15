// matmul, linear and the raw gemm helper: forward values against a naive double-precision loop,
// layouts (transposed views read in place, batch folding), finite-difference gradients, errors.
#include <catch2/catch.hpp>

#include <omp.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include "engine/cpu/gemm.h"
#include "engine/cpu/small_gemm.h"
#include "gradcheck.h"
#include "ops/matmul.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::gradcheck;
using engine::testing::rand_input;

namespace {

std::vector<double> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

Tensor make(const std::vector<double>& v, const Shape& shape, DType dt) {
  return Tensor::from_vector<double>(v, shape).to(dt);
}

// Values of the (..., c, r) tensor `v` with its last two dims swapped, i.e. the logical values
// of `t.transpose(-1, -2)` for a tensor t holding v.
std::vector<double> swap_last2(const std::vector<double>& v, const Shape& shape) {
  const int64_t r = shape[shape.size() - 2], c = shape.back();
  std::vector<double> out(v.size());
  for (size_t base = 0; base < v.size(); base += static_cast<size_t>(r * c))
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) out[base + j * r + i] = v[base + i * c + j];
  return out;
}

// Naive broadcast-batched matmul in double: a (..., M, K) @ b (..., K, N), both >= 2-D.
std::vector<double> ref_matmul(const std::vector<double>& a, const Shape& as,
                               const std::vector<double>& b, const Shape& bs, Shape* out_shape) {
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const size_t na = as.size() - 2, nb = bs.size() - 2, nd = std::max(na, nb);
  Shape ba(nd, 1), bb(nd, 1), bo(nd, 1);
  for (size_t i = 0; i < na; ++i) ba[nd - na + i] = as[i];
  for (size_t i = 0; i < nb; ++i) bb[nd - nb + i] = bs[i];
  int64_t total = 1;
  for (size_t i = 0; i < nd; ++i) {
    bo[i] = std::max(ba[i], bb[i]);
    total *= bo[i];
  }
  *out_shape = bo;
  out_shape->push_back(m);
  out_shape->push_back(n);
  std::vector<double> out(static_cast<size_t>(total * m * n), 0.0);
  std::vector<int64_t> idx(nd, 0);
  for (int64_t t = 0; t < total; ++t) {
    // Row-major index of this batch item in a's and b's own batch shapes (size-1 dims pinned).
    int64_t ia = 0, ib = 0;
    for (size_t d = 0; d < nd; ++d) {
      ia = ia * ba[d] + (ba[d] == 1 ? 0 : idx[d]);
      ib = ib * bb[d] + (bb[d] == 1 ? 0 : idx[d]);
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += a[ia * m * k + i * k + p] * b[ib * k * n + p * n + j];
        out[t * m * n + i * n + j] = s;
      }
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < bo[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

void require_close(const Tensor& got, const std::vector<double>& want, const Shape& shape,
                   double tol) {
  REQUIRE(got.shape() == shape);
  std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - want[i]));
  INFO("max abs error " << worst);
  REQUIRE(worst <= tol);
}

// Replaces the CPU gemm kernel while alive and records every launch (then runs the real one).
struct GemmSpy {
  static inline std::vector<GemmArgs> calls;
  static inline void (*real)(const GemmArgs&) = nullptr;
  static void record(const GemmArgs& g) {
    calls.push_back(g);
    real(g);
  }
  GemmSpy() {
    calls.clear();
    real = gemm_kernel.get(DeviceType::CPU);
    gemm_kernel.set(DeviceType::CPU, &record);
  }
  ~GemmSpy() { gemm_kernel.set(DeviceType::CPU, real); }
};

int64_t cpu_allocs() { return cpu_allocator().stats().num_allocs; }

void check_grad(const engine::testing::TestFn& f, const std::vector<Tensor>& inputs) {
  auto rep = gradcheck(f, inputs);
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
}

}  // namespace

TEST_CASE("matmul forward matches a naive loop (odd and broadcast shapes)", "[matmul]") {
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {{3, 5}, {5, 7}},
      {{2, 3, 5}, {2, 5, 7}},
      {{4, 3, 5}, {5, 7}},
      {{3, 5}, {4, 5, 7}},
      {{2, 1, 3, 5}, {1, 4, 5, 7}},
      {{1, 1}, {1, 1}},
      {{3, 70, 130}, {130, 90}},    // folded into one (210, 130) GEMM
      {{64, 9, 17}, {64, 17, 11}},  // many small: threads over the batch
      {{200, 300}, {300, 250}},     // one big: Eigen's own threading
      {{2, 3, 0}, {0, 4}},          // K = 0: an empty sum is 0
  };
  for (DType dt : {DType::f64, DType::f32}) {
    for (const Case& c : cases) {
      DYNAMIC_SECTION(shape_str(c.a) << " @ " << shape_str(c.b) << " " << dtype_name(dt)) {
        auto av = random_values(shape_numel(c.a), 1);
        auto bv = random_values(shape_numel(c.b), 2);
        Shape os;
        auto want = ref_matmul(av, c.a, bv, c.b, &os);
        Tensor out = matmul(make(av, c.a, dt), make(bv, c.b, dt));
        REQUIRE(out.dtype() == dt);
        // f32: products of values in [-1, 1] summed over K terms, rounding error ~ K * 2^-24.
        const double k = static_cast<double>(c.a.back());
        require_close(out, want, os, dt == DType::f64 ? 1e-12 : 1e-6 * std::max(k, 1.0));
      }
    }
  }
}

TEST_CASE("matmul supports 1-D operands as NumPy does", "[matmul]") {
  auto av = random_values(5, 3), bv = random_values(2 * 5 * 7, 4), mv = random_values(3 * 5, 5);
  Shape os;
  // (5) @ (2, 5, 7) -> (2, 7)
  auto want = ref_matmul(av, {1, 5}, bv, {2, 5, 7}, &os);
  require_close(matmul(make(av, {5}, DType::f64), make(bv, {2, 5, 7}, DType::f64)), want, {2, 7},
                1e-12);
  // (3, 5) @ (5) -> (3)
  want = ref_matmul(mv, {3, 5}, av, {5, 1}, &os);
  require_close(matmul(make(mv, {3, 5}, DType::f64), make(av, {5}, DType::f64)), want, {3}, 1e-12);
  // (5) @ (5) -> ()
  want = ref_matmul(av, {1, 5}, av, {5, 1}, &os);
  require_close(matmul(make(av, {5}, DType::f64), make(av, {5}, DType::f64)), want, {}, 1e-12);
}

TEST_CASE("matmul reads transposed views in place", "[matmul]") {
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    // at (2, 5, 3) holds a^T; bt (7, 5) holds b^T.
    auto atv = random_values(2 * 5 * 3, 6), btv = random_values(7 * 5, 7);
    auto av = swap_last2(atv, {2, 5, 3}), bv = swap_last2(btv, {7, 5});
    Tensor at = make(atv, {2, 5, 3}, dt), bt = make(btv, {7, 5}, dt);
    Tensor a = at.transpose(-1, -2);  // (2, 3, 5), strides (15, 1, 3)
    Tensor b = bt.transpose(-1, -2);  // (5, 7), strides (1, 5)
    Tensor a_plain = make(av, {2, 3, 5}, dt), b_plain = make(bv, {5, 7}, dt);
    Shape os;

    SECTION("both transposed, " + std::string(dtype_name(dt))) {
      auto want = ref_matmul(av, {2, 3, 5}, bv, {5, 7}, &os);
      GemmSpy spy;
      const int64_t before = cpu_allocs();
      Tensor out = matmul(a, b);
      // The output is the only allocation: neither operand was copied.
      REQUIRE(cpu_allocs() - before == 1);
      REQUIRE(spy.calls.size() == 1);
      REQUIRE(spy.calls[0].trans_a);
      REQUIRE(spy.calls[0].trans_b);
      REQUIRE(spy.calls[0].batch == 2);
      REQUIRE(spy.calls[0].stride_b == 0);  // the 2-D b is shared by the batch
      require_close(out, want, os, tol);
    }
    SECTION("a transposed, " + std::string(dtype_name(dt))) {
      auto want = ref_matmul(av, {2, 3, 5}, bv, {5, 7}, &os);
      const int64_t before = cpu_allocs();
      Tensor out = matmul(a, b_plain);
      REQUIRE(cpu_allocs() - before == 1);
      require_close(out, want, os, tol);
    }
    SECTION("b transposed, 2-D @ 2-D, " + std::string(dtype_name(dt))) {
      auto want =
          ref_matmul(std::vector<double>(av.begin(), av.begin() + 15), {3, 5}, bv, {5, 7}, &os);
      const int64_t before = cpu_allocs();
      Tensor out = matmul(a_plain.select(0, 0), b);
      REQUIRE(cpu_allocs() - before == 1);
      require_close(out, want, os, tol);
    }
    SECTION("neither dim has stride 1: falls back to a copy, " + std::string(dtype_name(dt))) {
      // Every other row and column of a (6, 10) tensor.
      auto big = random_values(6 * 10, 8);
      Tensor s = make(big, {6, 10}, dt).slice(0, 0, 6, 2).slice(1, 0, 10, 2);  // (3, 5)
      std::vector<double> sv;
      for (int i = 0; i < 6; i += 2)
        for (int j = 0; j < 10; j += 2) sv.push_back(big[i * 10 + j]);
      auto want = ref_matmul(sv, {3, 5}, bv, {5, 7}, &os);
      require_close(matmul(s, b_plain), want, os, tol);
    }
  }
}

TEST_CASE("a batched transposed b gets its gradient in its own layout", "[matmul]") {
  // q (2, 5, 3) @ k^T with k (2, 7, 3): dk comes back row-major (made as dC^T q, handed to the
  // transpose transposed), the values those of k^T made contiguous first; with a broadcast batch
  // the general path (its gradient summed over the batch).
  Generator g(31);
  const Tensor q = Tensor::randn({2, 5, 3}, g, 0.0, 1.0, DType::f64);
  const Tensor k = Tensor::randn({2, 7, 3}, g, 0.0, 1.0, DType::f64);
  const Tensor w = Tensor::randn({2, 5, 7}, g, 0.0, 1.0, DType::f64);
  Tensor k1 = k.detach().set_requires_grad(), k2 = k.detach().set_requires_grad();
  sum(matmul(q, k1.transpose(1, 2)) * w).backward();
  sum(matmul(q, k2.transpose(1, 2).contiguous()) * w).backward();
  REQUIRE(k1.grad().is_contiguous());
  const std::vector<double> a = k1.grad().to_vector<double>(), b = k2.grad().to_vector<double>();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(std::abs(a[i] - b[i]) <= 1e-12);
  // b (1, 7, 3)^T broadcast over q's batch of 2: summed over it.
  Tensor kb = Tensor::randn({1, 7, 3}, g, 0.0, 1.0, DType::f64).set_requires_grad();
  Tensor kc = kb.detach().set_requires_grad();
  sum(matmul(q, kb.transpose(1, 2)) * w).backward();
  sum(matmul(q, kc.transpose(1, 2).contiguous()) * w).backward();
  const std::vector<double> c = kb.grad().to_vector<double>(), d = kc.grad().to_vector<double>();
  for (size_t i = 0; i < c.size(); ++i) REQUIRE(std::abs(c[i] - d[i]) <= 1e-12);
}

TEST_CASE("matmul folds the batch into M for a 2-D right operand, forward and backward",
          "[matmul]") {
  Tensor a = rand_input({4, 3, 5}, 11);
  Tensor b = rand_input({5, 7}, 12);
  GemmSpy spy;
  Tensor out = matmul(a, b);  // (4, 3, 7)
  REQUIRE(spy.calls.size() == 1);
  REQUIRE(spy.calls[0].batch == 1);
  REQUIRE(spy.calls[0].m == 12);
  spy.calls.clear();
  Generator g(3);
  out.backward(Tensor::randn(out.shape(), g, 0.0, 1.0, DType::f64));
  // dA = dC @ B^T and dB = A^T @ dC, each one GEMM over the 12 folded rows.
  REQUIRE(spy.calls.size() == 2);
  for (const GemmArgs& c : spy.calls) REQUIRE(c.batch == 1);
  REQUIRE(a.grad().shape() == Shape{4, 3, 5});
  REQUIRE(b.grad().shape() == Shape{5, 7});
}

TEST_CASE("matmul gradients match finite differences", "[matmul]") {
  auto mm = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  SECTION("plain") { check_grad(mm, {rand_input({3, 5}, 1), rand_input({5, 7}, 2)}); }
  SECTION("batched") { check_grad(mm, {rand_input({2, 3, 5}, 3), rand_input({2, 5, 7}, 4)}); }
  SECTION("3-D @ 2-D") { check_grad(mm, {rand_input({4, 3, 5}, 5), rand_input({5, 7}, 6)}); }
  SECTION("2-D @ 3-D") { check_grad(mm, {rand_input({3, 5}, 7), rand_input({4, 5, 7}, 8)}); }
  SECTION("(2, 1, 3, 5) @ (1, 4, 5, 7)") {
    check_grad(mm, {rand_input({2, 1, 3, 5}, 9), rand_input({1, 4, 5, 7}, 10)});
  }
  SECTION("1-D operands") {
    check_grad(mm, {rand_input({5}, 11), rand_input({2, 5, 7}, 12)});
    check_grad(mm, {rand_input({3, 5}, 13), rand_input({5}, 14)});
  }
  SECTION("transposed views") {
    auto mt = [](const std::vector<Tensor>& in) {
      return matmul(in[0].transpose(-1, -2), in[1].transpose(-1, -2));
    };
    check_grad(mt, {rand_input({2, 5, 3}, 15), rand_input({7, 5}, 16)});
    check_grad(mt, {rand_input({5, 3}, 17), rand_input({2, 7, 5}, 18)});
  }
  SECTION("only one input requires grad") {
    check_grad(mm, {rand_input({2, 3, 5}, 19), rand_input({5, 7}, 20, false)});
    check_grad(mm, {rand_input({2, 3, 5}, 21, false), rand_input({5, 7}, 22)});
  }
}

TEST_CASE("linear forward matches x W^T + b", "[matmul]") {
  for (DType dt : {DType::f64, DType::f32}) {
    auto xv = random_values(2 * 3 * 5, 30), wv = random_values(4 * 5, 31),
         bv = random_values(4, 32);
    Shape os;
    auto want = ref_matmul(xv, {2, 3, 5}, swap_last2(wv, {4, 5}), {5, 4}, &os);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    Tensor x = make(xv, {2, 3, 5}, dt), w = make(wv, {4, 5}, dt), b = make(bv, {4}, dt);
    require_close(linear(x, w), want, {2, 3, 4}, tol);
    for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 4];
    require_close(linear(x, w, b), want, {2, 3, 4}, tol);
    // A 1-D x is one row.
    std::vector<double> row(want.begin(), want.begin() + 4);
    require_close(linear(x.select(0, 0).select(0, 0), w, b), row, {4}, tol);
  }
}

TEST_CASE("linear gradients match finite differences", "[matmul]") {
  SECTION("3-D x with bias") {
    check_grad([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
               {rand_input({2, 3, 5}, 40), rand_input({4, 5}, 41), rand_input({4}, 42)});
  }
  SECTION("3-D x without bias") {
    check_grad([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
               {rand_input({2, 3, 5}, 43), rand_input({4, 5}, 44)});
  }
  SECTION("2-D x, transposed x view") {
    check_grad(
        [](const std::vector<Tensor>& in) { return linear(in[0].transpose(0, 1), in[1], in[2]); },
        {rand_input({5, 3}, 45), rand_input({4, 5}, 46), rand_input({4}, 47)});
  }
  SECTION("only the bias requires grad") {
    check_grad(
        [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
        {rand_input({2, 3, 5}, 48, false), rand_input({4, 5}, 49, false), rand_input({4}, 50)});
  }
}

TEST_CASE("linear computes dW as one GEMM over all leading dims", "[matmul]") {
  Tensor x = rand_input({2, 3, 5}, 60), w = rand_input({4, 5}, 61), b = rand_input({4}, 62);
  Tensor y = linear(x, w, b);
  Generator g(5);
  Tensor dy = Tensor::randn(y.shape(), g, 0.0, 1.0, DType::f64);  // (2, 3, 4)
  GemmSpy spy;
  y.backward(dy);
  REQUIRE(spy.calls.size() == 2);  // dX and dW; db is a column sum
  for (const GemmArgs& c : spy.calls) {
    REQUIRE(c.batch == 1);
    REQUIRE(c.m * c.n * c.k == 6 * 4 * 5);  // all 6 rows in one product
  }
  // db = column sums of dY, checked independently of the op.
  std::vector<double> gy = dy.to_vector<double>();
  std::vector<double> db(4, 0.0);
  for (size_t i = 0; i < gy.size(); ++i) db[i % 4] += gy[i];
  require_close(b.grad(), db, {4}, 1e-12);
}

TEST_CASE("gemm helper: alpha, beta, transposes and a transposed output", "[matmul]") {
  auto av = random_values(3 * 5, 70), bv = random_values(5 * 7, 71), cv = random_values(21, 72);
  Shape os;
  auto ab = ref_matmul(av, {3, 5}, bv, {5, 7}, &os);
  Tensor a = make(av, {3, 5}, DType::f64), b = make(bv, {5, 7}, DType::f64);

  SECTION("alpha and beta accumulate into c") {
    Tensor c = make(cv, {3, 7}, DType::f64);
    gemm(a, false, b, false, c, 2.0, 0.5);
    std::vector<double> want(21);
    for (size_t i = 0; i < 21; ++i) want[i] = 2.0 * ab[i] + 0.5 * cv[i];
    require_close(c, want, {3, 7}, 1e-12);
  }
  SECTION("beta 0 does not read c") {
    Tensor c = Tensor::full({3, 7}, std::numeric_limits<double>::quiet_NaN(), DType::f64);
    gemm(a, false, b, false, c);
    require_close(c, ab, {3, 7}, 1e-12);
  }
  SECTION("transpose flags on contiguous operands") {
    Tensor at = make(swap_last2(av, {3, 5}), {5, 3}, DType::f64);
    Tensor bt = make(swap_last2(bv, {5, 7}), {7, 5}, DType::f64);
    Tensor c = Tensor::empty({3, 7}, DType::f64);
    gemm(at, true, bt, true, c);
    require_close(c, ab, {3, 7}, 1e-12);
  }
  SECTION("c is a transposed view") {
    Tensor ct = Tensor::empty({7, 3}, DType::f64);
    gemm(a, false, b, false, ct.transpose(0, 1));
    require_close(ct, swap_last2(ab, {3, 7}), {7, 3}, 1e-12);
  }
  SECTION("batched with a shared b") {
    auto a3v = random_values(2 * 3 * 5, 73);
    Tensor c = Tensor::empty({2, 3, 7}, DType::f64);
    gemm(make(a3v, {2, 3, 5}, DType::f64), false, b, false, c);
    require_close(c, ref_matmul(a3v, {2, 3, 5}, bv, {5, 7}, &os), {2, 3, 7}, 1e-12);
  }
}

TEST_CASE("matmul is deterministic run to run", "[matmul]") {
  Generator g(9);
  Tensor a = Tensor::randn({300, 400}, g), b = Tensor::randn({400, 350}, g);
  Tensor a3 = Tensor::randn({128, 16, 24}, g), b3 = Tensor::randn({128, 24, 20}, g);
  REQUIRE(matmul(a, b).to_vector<float>() == matmul(a, b).to_vector<float>());
  REQUIRE(matmul(a3, b3).to_vector<float>() == matmul(a3, b3).to_vector<float>());
}

TEST_CASE("a tall product with A transposed has the same bits on 1, 2 and 3 threads", "[matmul]") {
  // The tied embeddings' gradient's shape (dlogits^T H) at a smaller vocabulary: C's rows go
  // through the library in fixed blocks (4500 rows: four blocks of 1024 and one of 404), whatever
  // the thread count; a whole product, or halves, would give other bits (oneDNN's depend on the
  // rows of the call).
  const int max_threads = omp_get_max_threads();
  Generator g(21);
  const int64_t m = 4500, k = 307, n = 128;
  Tensor a = Tensor::randn({k, m}, g), b = Tensor::randn({k, n}, g);
  std::vector<std::vector<float>> got;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    Tensor c = Tensor::empty({m, n});
    gemm(a, true, b, false, c);
    got.push_back(c.to_vector<float>());
  }
  omp_set_num_threads(max_threads);
  // Eigen (ENGINE_CPU_GEMM=eigen, not a default) rounds a product differently inside a parallel
  // region than on one thread, blocks or not; there the blocks' results are only close.
  if (std::string(engine::cpu_gemm_library()) != "Eigen") {
    CHECK((got[1] == got[0]));
    CHECK((got[2] == got[0]));
  }
  // And it is the product: rows from every block, against a double-precision loop.
  const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  double worst = 0;
  for (int64_t i : {int64_t{0}, int64_t{1023}, int64_t{1024}, int64_t{2500}, int64_t{4095},
                    int64_t{4096}, m - 1}) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t p = 0; p < k; ++p) want += double(av[p * m + i]) * double(bv[p * n + j]);
      worst = std::max(worst, std::abs(double(got[0][i * n + j]) - want));
    }
  }
  CHECK(worst < 1e-3);
}

TEST_CASE("matmul records nothing without grad", "[matmul]") {
  const size_t before = tape_size();
  Tensor out = matmul(rand_input({3, 5}, 80, false), rand_input({5, 7}, 81, false));
  REQUIRE_FALSE(out.requires_grad());
  REQUIRE(tape_size() == before);
}

TEST_CASE("matmul, linear and gemm errors name the op and the shapes", "[matmul]") {
  Tensor a = Tensor::zeros({4, 7}), b = Tensor::zeros({8, 3});
  REQUIRE_THROWS_WITH(matmul(a, b), Catch::Contains("[matmul] inner dims do not match: a (4, 7) "
                                                    "f32 cpu @ b (8, 3) f32 cpu (7 vs 8)"));
  REQUIRE_THROWS_WITH(
      matmul(a, Tensor::zeros({7, 3}, DType::f64)),
      Catch::Contains("[matmul] dtype mismatch") && Catch::Contains("(7, 3) f64 cpu"));
  REQUIRE_THROWS_WITH(matmul(a, Tensor()), Catch::Contains("[matmul] got an undefined input"));
  REQUIRE_THROWS_WITH(
      matmul(Tensor::zeros({2, 4, 7}), Tensor::zeros({3, 7, 3})),
      Catch::Contains("[matmul] batch dims do not broadcast") && Catch::Contains("(2) vs (3)"));
  REQUIRE_THROWS_WITH(matmul(Tensor::scalar(1.0), a),
                      Catch::Contains("[matmul]") && Catch::Contains("at least 1 dim"));
  REQUIRE_THROWS_WITH(matmul(Tensor::zeros({4, 7}, DType::i32), Tensor::zeros({7, 3}, DType::i32)),
                      Catch::Contains("[matmul] expects floating tensors"));
  // bf16 is a valid dtype, but the CPU GEMM computes in f32/f64 only.
  REQUIRE_THROWS_WITH(
      matmul(Tensor::zeros({4, 7}, DType::bf16), Tensor::zeros({7, 3}, DType::bf16)),
      Catch::Contains("[gemm] CPU kernels compute in f32 or f64, got bf16"));

  Tensor x = Tensor::zeros({2, 3, 5}), w = Tensor::zeros({4, 5});
  REQUIRE_THROWS_WITH(linear(x, Tensor::zeros({4, 6})),
                      Catch::Contains("[linear] x (2, 3, 5) f32 cpu does not match weight (4, 6) "
                                      "f32 cpu"));
  REQUIRE_THROWS_WITH(linear(x, Tensor::zeros({5})),
                      Catch::Contains("[linear] weight must be 2-D (out, in)"));
  REQUIRE_THROWS_WITH(linear(x, w, Tensor::zeros({3})),
                      Catch::Contains("[linear] bias (3) f32 cpu does not match weight (4, 5) "
                                      "f32 cpu: expected bias (4)"));
  REQUIRE_THROWS_WITH(linear(x, w, Tensor::zeros({4}, DType::f64)),
                      Catch::Contains("[linear] dtype mismatch"));
  REQUIRE_THROWS_WITH(linear(Tensor(), w), Catch::Contains("[linear] got an undefined input"));

  Tensor c = Tensor::empty({4, 3});
  REQUIRE_THROWS_WITH(gemm(a, false, b, false, c), Catch::Contains("[gemm] shapes do not match"));
  Tensor strided = Tensor::zeros({8, 14}).slice(0, 0, 8, 2).slice(1, 0, 14, 2);  // (4, 7)
  REQUIRE_THROWS_WITH(gemm(strided, false, Tensor::zeros({7, 3}), false, c),
                      Catch::Contains("[gemm] a (4, 7) f32 cpu with strides (28, 2) is not a "
                                      "matrix the GEMM can read in place"));
  REQUIRE_THROWS_WITH(gemm(Tensor::zeros({2, 4, 7}), false, Tensor::zeros({3, 7, 3}), false,
                           Tensor::empty({2, 4, 3})),
                      Catch::Contains("[gemm] b (3, 7, 3) f32 cpu has batch 3"));
}

TEST_CASE("gemm epilogues add a bias per column and apply GELU's tanh form", "[matmul]") {
  Tensor a = Tensor::from_vector<double>({1, 2, -3, 0.5, -1, 2}, {2, 3});
  Tensor b = Tensor::from_vector<double>({1, 0, 2, -1, 1, 0}, {3, 2});  // a @ b = [2 -2; 0.5 1]
  Tensor bias = Tensor::from_vector<double>({0.25, -2}, {2});
  const std::vector<double> plain = {2, -2, 0.5, 1};
  auto gelu_tanh = [](double x) {
    return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  };
  for (GemmEpilogue e : {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::gelu_tanh,
                         GemmEpilogue::bias_gelu_tanh}) {
    const bool with_bias = e == GemmEpilogue::bias || e == GemmEpilogue::bias_gelu_tanh;
    const bool with_gelu = e == GemmEpilogue::gelu_tanh || e == GemmEpilogue::bias_gelu_tanh;
    Tensor c = Tensor::full({2, 2}, 7.0, DType::f64);
    gemm(a, false, b, false, c, 1.0, 0.0, e, with_bias ? bias : Tensor());
    const std::vector<double> got = c.to_vector<double>();
    for (int i = 0; i < 4; ++i) {
      double want = plain[i] + (with_bias ? (i % 2 ? -2.0 : 0.25) : 0.0);
      if (with_gelu) want = gelu_tanh(want);
      REQUIRE(got[i] == Approx(want).epsilon(1e-15));
    }
  }
  Tensor c = Tensor::zeros({2, 2}, DType::f64);
  REQUIRE_THROWS_WITH(gemm(a, false, b, false, c, 1.0, 0.0, GemmEpilogue::bias),
                      Catch::Contains("the bias epilogue needs a contiguous (2) bias"));
  REQUIRE_THROWS_WITH(gemm(a, false, b, false, c, 1.0, 0.0, GemmEpilogue::none, bias),
                      Catch::Contains("a bias was given without a bias epilogue"));
  REQUIRE_THROWS_WITH(gemm(a, false, b, false, Tensor::zeros({2, 2}, DType::f64).transpose(0, 1),
                           1.0, 0.0, GemmEpilogue::gelu_tanh),
                      Catch::Contains("an epilogue needs a row-major c"));
}

TEST_CASE("a wide product's epilogue in column chunks matches the whole", "[matmul]") {
  // (33 x 24) @ (24 x 12000): C is 1.5 MB in f32 and A 3 KB, so the library multiplies it in
  // chunks of columns, each finished by the epilogue (engine/cpu/gemm.cpp, kEpilogueChunkBytes),
  // also when split over the threads. Every column's bias differs: a chunk reading another's bias,
  // or B's columns from the wrong offset, is off by far more than the tolerance.
  const int64_t m = 33, k = 24, n = 12000;
  Generator g(7);
  Tensor a = Tensor::randn({m, k}, g);
  Tensor bias = Tensor::randn({n}, g);
  auto gelu_tanh = [](double x) {
    return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  };
  for (const bool trans_b : {false, true}) {
    Tensor b = trans_b ? Tensor::randn({n, k}, g) : Tensor::randn({k, n}, g);
    const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>(),
                             biasv = bias.to_vector<float>();
    for (GemmEpilogue e : {GemmEpilogue::bias, GemmEpilogue::bias_gelu_tanh}) {
      Tensor c = Tensor::full({m, n}, 7.0);
      gemm(a, false, b, trans_b, c, 1.0, 0.0, e, bias);
      const std::vector<float> got = c.to_vector<float>();
      int64_t bad = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double want = biasv[j];
          for (int64_t p = 0; p < k; ++p)
            want += double(av[i * k + p]) * double(trans_b ? bv[j * k + p] : bv[p * n + j]);
          if (e == GemmEpilogue::bias_gelu_tanh) want = gelu_tanh(want);
          if (std::abs(got[i * n + j] - want) > 1e-4 * (1 + std::abs(want))) ++bad;
        }
      INFO("trans_b " << trans_b << ", epilogue " << int(e));
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("the CPU GEMM library is the one ENGINE_CPU_GEMM names", "[matmul]") {
  // ctest runs the [matmul] cases with ENGINE_CPU_GEMM=openblas and =eigen too: those runs must
  // really multiply through that library.
  const char* e = std::getenv("ENGINE_CPU_GEMM");
  const std::string lib = engine::cpu_gemm_library();
  if (e && std::strcmp(e, "eigen") == 0) CHECK(lib == "Eigen");
  if (e && std::strcmp(e, "openblas") == 0) CHECK(lib == "OpenBLAS");
  if (e && std::strcmp(e, "onednn") == 0) CHECK(lib.rfind("oneDNN", 0) == 0);
  if (!e || !*e) CHECK(lib != "");
}

TEST_CASE("the AVX-512 small GEMM matches a double loop in every layout and edge", "[matmul]") {
  // engine/cpu/small_gemm.h: the kernel behind attention's batched products on AVX-512 builds.
  // Called directly (the gemm op reaches it only for f32 batches of small products): row counts
  // around its 6-, 8- and 12-row tiles, column counts around its 16-column vectors and 64-column
  // strips (32 and 48: the 12- and 8-row tiles), k
  // around the 16 x 16 transposes of a packed B, leading dims wider than the matrices, batches of
  // 3 with a shared (stride 0) A or B in some, alpha and beta, and C full of NaN when beta == 0
  // (must not be read).
  if (!engine::cpu::small_gemm_available()) {
    WARN("this build has no AVX-512: no small GEMM kernel to test (the library runs instead)");
    return;
  }
  uint32_t seed = 1;
  const int64_t batch = 3;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const int64_t m : {1, 5, 6, 7, 9, 12, 13, 25})
        for (const int64_t n : {1, 15, 16, 17, 32, 48, 64, 65, 130})
          for (const int64_t k : {0, 1, 15, 16, 33, 64}) {
            const float alpha = 0.75f, beta = (m + n + k) % 2 == 0 ? 0.0f : -0.5f;
            const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
            const int64_t size_a = (ta ? k : m) * lda, size_b = (tb ? n : k) * ldb;
            const int64_t stride_a = (m + n) % 3 == 1 ? 0 : size_a + 7;
            const int64_t stride_b = (m + n) % 3 == 2 ? 0 : size_b + 9;
            const int64_t stride_c = m * ldc + 4;
            const std::vector<double> av = random_values(size_a + 2 * stride_a, seed++);
            const std::vector<double> bv = random_values(size_b + 2 * stride_b, seed++);
            const std::vector<double> cv = random_values(batch * stride_c, seed++);
            std::vector<float> a(av.begin(), av.end()), b(bv.begin(), bv.end());
            std::vector<float> c(cv.begin(), cv.end());
            if (beta == 0.0f)
              std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
            const std::vector<float> c_before = c;
            engine::cpu::small_gemm_f32(ta, tb, m, n, k, alpha, a.data(), lda, stride_a, b.data(),
                                        ldb, stride_b, beta, c.data(), ldc, stride_c, batch);
            for (int64_t e = 0; e < batch; ++e)
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < ldc; ++j) {
                  const int64_t at = e * stride_c + i * ldc + j;
                  const float got = c[at];
                  if (j >= n) {  // outside C's columns: untouched
                    REQUIRE(std::memcmp(&got, &c_before[at], sizeof got) == 0);
                    continue;
                  }
                  const float* ae = a.data() + e * stride_a;
                  const float* be = b.data() + e * stride_b;
                  double ref = 0;
                  for (int64_t p = 0; p < k; ++p)
                    ref += double(ae[ta ? p * lda + i : i * lda + p]) *
                           double(be[tb ? j * ldb + p : p * ldb + j]);
                  ref = alpha * ref + (beta == 0.0f ? 0.0 : beta * double(c_before[at]));
                  INFO("ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k
                             << " matrix " << e << " at (" << i << ", " << j << ")");
                  REQUIRE(std::abs(got - ref) <= 1e-5 * (1.0 + double(k)));
                }
            // The padding between matrices is untouched too.
            for (int64_t e = 0; e < batch; ++e)
              for (int64_t x = m * ldc; x < stride_c; ++x)
                REQUIRE(std::memcmp(&c[e * stride_c + x], &c_before[e * stride_c + x], 4) == 0);
          }
}
