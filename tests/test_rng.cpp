// The counter-based generator: Philox4x32-10 known answers, stream positions, distributions.
#include <catch2/catch.hpp>
#include <cmath>

#include "engine/engine.h"

using namespace engine;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[rng]") {
  struct Kat {
    uint32_t ctr[4];
    uint32_t key[2];
    uint32_t out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    uint32_t out[4];
    philox4x32_10(k.ctr, k.key, out);
    for (int i = 0; i < 4; ++i) REQUIRE(out[i] == k.out[i]);
  }
}

TEST_CASE("a (seed, offset) pair names a stream position", "[rng]") {
  Generator g(42);
  PhiloxState a = g.reserve_words(10);  // 3 blocks
  REQUIRE(a.offset == 0);
  REQUIRE(g.offset() == 3);
  PhiloxState b = g.reserve_words(4);
  REQUIRE(b.offset == 3);
  REQUIRE(g.offset() == 4);
  // Word 4 of stream a is word 0 of block offset+1.
  uint32_t blk[4];
  philox_block(42, 1, blk);
  REQUIRE(philox_word(a, 4) == blk[0]);
  REQUIRE(philox_word(a, 7) == blk[3]);
  // Resuming from a saved state reproduces the draws.
  Generator h(0);
  h.set_state(g.state());
  REQUIRE(Tensor::rand({5}, h).to_vector<float>() == Tensor::rand({5}, g).to_vector<float>());
  REQUIRE(uniform_from_word(0xffffffffu) < 1.0f);
  REQUIRE(uniform_from_word(0) == 0.0f);
}

TEST_CASE("device offsets: states relative to the capture's start, read from a device word",
          "[rng]") {
  Generator g(42);
  g.reserve_words(20);  // offset 5
  uint64_t word = 5;    // stands for the device word a replay sets to the generator's offset
  g.begin_device_offsets(&word);
  const PhiloxState a = g.reserve_words(10), b = g.reserve_words(4);
  CHECK(a.offset == 0);
  CHECK(b.offset == 3);
  CHECK(a.base == &word);
  CHECK(philox_offset(b) == 8);
  // The words a replay draws are the eager ones at the generator's position.
  CHECK(philox_word(b, 2) == philox_word(PhiloxState{42, 8}, 2));
  CHECK(g.end_device_offsets() == 4);
  CHECK(g.offset() == 5);  // the capture ran nothing
  CHECK(g.reserve_words(1).base == nullptr);
  CHECK_THROWS_WITH(g.end_device_offsets(), Catch::Contains("without begin_device_offsets"));
  // A CPU kernel refuses a state that names a device word.
  g.begin_device_offsets(&word);
  CHECK_THROWS_WITH(Tensor::randn({3}, g), Catch::Contains("[fill_normal] a CPU kernel"));
  CHECK_THROWS_WITH(g.begin_device_offsets(&word), Catch::Contains("already"));
  g.end_device_offsets();
}

TEST_CASE("normal and uniform draws have the right moments", "[rng]") {
  Generator g(7);
  const int64_t n = 200000;
  std::vector<double> v = Tensor::randn({n}, g, 1.0, 0.02, DType::f64).to_vector<double>();
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= n;
  for (double x : v) s += (x - m) * (x - m);
  s = std::sqrt(s / n);
  REQUIRE(std::abs(m - 1.0) < 4 * 0.02 / std::sqrt(double(n)));
  REQUIRE(std::abs(s - 0.02) < 0.02 * 0.01);
  std::vector<double> u = Tensor::rand({n}, g, DType::f64).to_vector<double>();
  double mu = 0;
  for (double x : u) {
    REQUIRE(x >= 0.0);
    REQUIRE(x < 1.0);
    mu += x;
  }
  REQUIRE(std::abs(mu / n - 0.5) < 0.005);
  // Different seeds differ; the same seed repeats.
  Generator a(1), b(1), c(2);
  REQUIRE(Tensor::randn({8}, a).to_vector<float>() == Tensor::randn({8}, b).to_vector<float>());
  REQUIRE(Tensor::randn({8}, a).to_vector<float>() != Tensor::randn({8}, c).to_vector<float>());
}
