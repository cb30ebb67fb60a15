// dropout: the keep rule against rng.h computed here, keep rate, reproducibility from
// (seed, offset), generator bookkeeping, eval mode, scaling, gradients and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::gradcheck;
using engine::testing::rand_input;

TEST_CASE("dropout keep rule: exact threshold on the 24-bit uniform", "[dropout]") {
  // uniform_from_word(0x80000000) is exactly 0.5: kept at p = 0.5 (>=), one step below is not.
  const uint32_t t = dropout_threshold(0.5);
  REQUIRE(dropout_keep(0x80000000u, t));
  REQUIRE_FALSE(dropout_keep(0x7FFFFFFFu, t));
  REQUIRE(dropout_keep(0u, dropout_threshold(0.0)));                 // p = 0 keeps everything
  REQUIRE_FALSE(dropout_keep(0xFFFFFFFFu, dropout_threshold(1.0)));  // p = 1 keeps nothing
  // The integer test agrees with the float rule on a sweep of p and words.
  Generator g(5);
  PhiloxState s = g.reserve_words(4096);
  for (double p : {0.1, 0.25, 1.0 / 3.0, 0.5, 0.9, 0.999}) {
    for (uint64_t i = 0; i < 4096; ++i) {
      uint32_t w = philox_word(s, i);
      REQUIRE(dropout_keep(w, dropout_threshold(p)) == (uniform_from_word(w) >= p));
    }
  }
}

TEST_CASE("dropout_mask follows philox_word(state, i) element by element", "[dropout]") {
  PhiloxState s{1234, 17};
  const double p = 0.3;
  std::vector<float> m = dropout_mask({7, 13}, p, s).to_vector<float>();
  for (uint64_t i = 0; i < m.size(); ++i)
    REQUIRE(m[i] == (uniform_from_word(philox_word(s, i)) >= p ? 1.0f : 0.0f));
  std::vector<uint8_t> mu = dropout_mask({7, 13}, p, s, DType::u8).to_vector<uint8_t>();
  for (size_t i = 0; i < m.size(); ++i) REQUIRE(float(mu[i]) == m[i]);
}

TEST_CASE("dropout_mask's vectorised Philox equals philox_word across the 2^32 counter carry",
          "[dropout]") {
  // Counters from 2^32 - 40 on: the carry into the counter's high word happens inside a group of
  // 64 blocks (engine/cpu/philox.h, in its third 16-block vector on AVX-512); a 64-bit seed; a
  // size that ends mid-group; and a parallel-sized one.
  for (int64_t n : {int64_t(333), int64_t(70001)}) {
    const PhiloxState s{0x0123456789ABCDEFull, (uint64_t(1) << 32) - 40};
    const double p = 0.45;
    std::vector<uint8_t> m = dropout_mask({n}, p, s, DType::u8).to_vector<uint8_t>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += m[size_t(i)] != (uniform_from_word(philox_word(s, uint64_t(i))) >= p ? 1 : 0);
    INFO("n = " << n);
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("dropout keep rate is 1 - p over 1e5 elements", "[dropout]") {
  for (double p : {0.1, 0.5, 0.8}) {
    Generator g(99);
    Tensor y = dropout(Tensor::ones({100000}), p, true, g);
    std::vector<float> v = y.to_vector<float>();
    const float scaled = static_cast<float>(1.0 / (1.0 - p));
    int64_t kept = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const float e = v[i];
      REQUIRE((e == 0.0f || e == scaled));  // kept values scaled by 1 / (1 - p)
      // Large enough for the parallel kernel path: still element i <-> word i of (99, 0).
      REQUIRE((e != 0.0f) == (uniform_from_word(philox_word({99, 0}, i)) >= p));
      kept += e != 0.0f;
    }
    INFO("p = " << p << ", kept " << kept);
    REQUIRE(std::abs(double(kept) / 1e5 - (1.0 - p)) < 0.01);
  }
}

TEST_CASE("dropout: same state, same mask, other offset or seed, other mask", "[dropout]") {
  const Shape shape{3, 50};
  const double p = 0.5;
  Tensor a = dropout_mask(shape, p, {7, 100});
  REQUIRE(dropout_mask(shape, p, {7, 100}).to_vector<float>() == a.to_vector<float>());
  REQUIRE(dropout_mask(shape, p, {7, 101}).to_vector<float>() != a.to_vector<float>());
  REQUIRE(dropout_mask(shape, p, {8, 100}).to_vector<float>() != a.to_vector<float>());

  // dropout() itself uses the generator's state at the call.
  Tensor x = Tensor::ones(shape);
  Generator g1(7), g2(7);
  Tensor y1 = dropout(x, p, true, g1), y2 = dropout(x, p, true, g2);
  REQUIRE(y1.to_vector<float>() == y2.to_vector<float>());
  Tensor y3 = dropout(x, p, true, g1);  // the stream moved on
  REQUIRE(y3.to_vector<float>() != y1.to_vector<float>());
  std::vector<float> m = dropout_mask(shape, p, {7, 0}).to_vector<float>();
  std::vector<float> v1 = y1.to_vector<float>();
  for (size_t i = 0; i < m.size(); ++i) REQUIRE(v1[i] == 2.0f * m[i]);
}

TEST_CASE("dropout advances the generator by ceil(n / 4) blocks", "[dropout]") {
  Generator g(1);
  dropout(Tensor::ones({10}), 0.5, true, g);
  REQUIRE(g.offset() == 3);
  dropout(Tensor::ones({3, 4}), 0.5, true, g);
  REQUIRE(g.offset() == 6);
  dropout(Tensor::ones({13}), 0.5, true, g);
  REQUIRE(g.offset() == 10);
  REQUIRE(g.seed() == 1);
}

TEST_CASE("dropout is the identity in eval mode and at p = 0, consuming no RNG", "[dropout]") {
  Generator g(2);
  Tensor x = Tensor::from_vector<float>({1, -2, 3, 4}, {2, 2});
  Tensor e = dropout(x, 0.5, false, g);
  REQUIRE(e.to_vector<float>() == x.to_vector<float>());
  REQUIRE(dropout(x, 0.0, true, g).to_vector<float>() == x.to_vector<float>());
  REQUIRE(g.offset() == 0);
  // p == 1: everything dropped, no draw taken, zero gradient.
  Tensor xr = x.clone().set_requires_grad();
  Tensor z = dropout(xr, 1.0, true, g);
  REQUIRE(z.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  REQUIRE(g.offset() == 0);
  z.backward(Tensor::ones({2, 2}));
  REQUIRE(xr.grad().to_vector<float>() == std::vector<float>{0, 0, 0, 0});
}

TEST_CASE("dropout scales kept values by 1 / (1 - p) (f64)", "[dropout]") {
  const double p = 0.25;
  Generator g(3);
  Tensor x = Tensor::randn({4, 25}, g, 0, 1, DType::f64);
  PhiloxState s = g.state();
  std::vector<double> y = dropout(x, p, true, g).to_vector<double>();
  std::vector<double> xv = x.to_vector<double>();
  std::vector<float> m = dropout_mask({4, 25}, p, s).to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i)
    REQUIRE(y[i] == Approx(m[i] ? xv[i] / 0.75 : 0.0).epsilon(1e-15));
}

TEST_CASE("dropout indexes a non-contiguous input by its logical row-major order", "[dropout]") {
  Generator g0(4);
  Tensor base = Tensor::randn({6, 5}, g0);
  Tensor xt = base.transpose(0, 1);  // (5, 6) view
  Generator g1(8), g2(8);
  REQUIRE(dropout(xt, 0.4, true, g1).to_vector<float>() ==
          dropout(xt.contiguous(), 0.4, true, g2).to_vector<float>());
}

TEST_CASE("dropout backward regenerates the forward mask", "[dropout]") {
  const double p = 0.4;
  Generator g(12);
  g.reserve_words(40);  // start mid-stream
  Tensor x = Tensor::randn({3, 11}, g, 0, 1, DType::f64).set_requires_grad();
  const PhiloxState s = g.state();  // randn consumed words too; the mask starts here
  Tensor y = dropout(x, p, true, g);
  Generator gg(77);
  Tensor dy = Tensor::randn({3, 11}, gg, 0, 1, DType::f64);
  y.backward(dy);
  std::vector<float> m = dropout_mask({3, 11}, p, s).to_vector<float>();
  std::vector<double> gx = x.grad().to_vector<double>(), gv = dy.to_vector<double>();
  for (size_t i = 0; i < m.size(); ++i)
    REQUIRE(gx[i] == Approx(m[i] ? gv[i] / (1 - p) : 0.0).epsilon(1e-15));
}

TEST_CASE("dropout gradcheck with a fixed stream", "[dropout]") {
  Tensor x = rand_input({3, 5, 7}, 301);
  // Every evaluation builds the same generator, hence the same mask.
  auto rep = gradcheck(
      [](const std::vector<Tensor>& in) {
        Generator g(42);
        return dropout(in[0], 0.3, true, g);
      },
      {x});
  INFO(rep.detail);
  REQUIRE(rep.max_rel_error < 1e-6);
}

TEST_CASE("dropout errors", "[dropout]") {
  Generator g;
  Tensor x = Tensor::ones({4});
  REQUIRE_THROWS_WITH(dropout(x, -0.1, true, g), Catch::Contains("[dropout] p must be in [0, 1]"));
  REQUIRE_THROWS_WITH(dropout(x, 1.5, true, g), Catch::Contains("[dropout] p must be in [0, 1]"));
  REQUIRE_THROWS_WITH(dropout(x, std::nan(""), true, g), Catch::Contains("[dropout]"));
  REQUIRE_THROWS_WITH(dropout(Tensor::ones({4}, DType::i32), 0.5, true, g),
                      Catch::Contains("[dropout] expects a floating input"));
  REQUIRE_THROWS_WITH(dropout_mask({4}, 0.5, {}, DType::i64),
                      Catch::Contains("[dropout_mask] mask dtype"));
  REQUIRE(g.offset() == 0);
}

TEST_CASE(
    "attention's dropout rule: eight 16-bit draws a Philox block, its kernel and its keep rate",
    "[dropout]") {
  // Element e keeps iff halfword e % 8 of block offset + e / 8 (word (e % 8) / 2, low half for
  // even e) >= ceil(p 2^16), computed here from philox_word; the kernel over a size that ends
  // mid-block, across the 2^32 counter carry and at a parallel size; runs of 4 and 8 from any
  // element; the keep rate.
  const double p = 0.3;
  const uint32_t t = attention_dropout_threshold(p);
  REQUIRE(t == 19661);  // ceil(0.3 * 65536)
  REQUIRE(attention_dropout_threshold(0.0) == 0);
  REQUIRE(attention_dropout_threshold(1.0) == 65536);  // nothing kept
  REQUIRE(attention_dropout_words(7) == 4);
  const auto want_keep = [&](PhiloxState s, uint64_t e) {
    const uint32_t w = philox_word(s, e / 2);  // word e / 2 of the stream holds e and e ^ 1
    return ((e % 2 == 0 ? w & 0xFFFFu : w >> 16)) >= t;
  };
  for (const PhiloxState s :
       {PhiloxState{1234, 17}, PhiloxState{0x0123456789ABCDEFull, (uint64_t(1) << 32) - 40}})
    for (int64_t n : {int64_t(13), int64_t(333), int64_t(70001)}) {
      INFO("offset " << s.offset << ", n " << n);
      const Tensor x = Tensor::ones({n}, DType::f64);
      const Tensor y = Tensor::empty({n}, DType::f64);
      attention_dropout_kernel(Device::cpu(), x, y, p, s);
      const std::vector<double> got = y.to_vector<double>();
      int64_t wrong = 0;
      for (int64_t e = 0; e < n; ++e) {
        const bool keep = want_keep(s, uint64_t(e));
        wrong += got[size_t(e)] != (keep ? 1.0 / (1.0 - p) : 0.0);
        wrong += attention_keep(s, uint64_t(e), t) != keep;
      }
      REQUIRE(wrong == 0);
      for (uint64_t e0 : {uint64_t(0), uint64_t(3), uint64_t(4), uint64_t(8), uint64_t(13)}) {
        bool k4[4], k8[8];
        attention_keep_run<4>(s, e0, t, k4);
        attention_keep_run<8>(s, e0, t, k8);
        for (int q = 0; q < 8; ++q) {
          if (q < 4) REQUIRE(k4[q] == want_keep(s, e0 + uint64_t(q)));
          REQUIRE(k8[q] == want_keep(s, e0 + uint64_t(q)));
        }
      }
    }
  const int64_t n = 100000;
  const Tensor y = Tensor::empty({n});
  attention_dropout_kernel(Device::cpu(), Tensor::ones({n}), y, p, PhiloxState{7, 0});
  int64_t kept = 0;
  for (const float v : y.to_vector<float>()) kept += v != 0.0f;
  REQUIRE(std::abs(double(kept) / double(n) - (1.0 - p)) < 0.005);
}
