// Host-side draws from the Philox stream (initialisation, tests).
#include "engine/rng.h"

#include <cmath>

#include "engine/error.h"

namespace engine {

Generator& default_generator() {
  static Generator g;
  return g;
}

void Generator::begin_device_offsets(const uint64_t* base) {
  ENGINE_CHECK(base != nullptr, "[rng] begin_device_offsets needs the device word of the offset");
  ENGINE_CHECK(base_ == nullptr,
               "[rng] the generator hands out device offsets already "
               "(end_device_offsets first)");
  base_ = base;
  capture_start_ = offset_;
}

uint64_t Generator::end_device_offsets() {
  ENGINE_CHECK(base_ != nullptr, "[rng] end_device_offsets without begin_device_offsets");
  const uint64_t blocks = offset_ - capture_start_;
  offset_ = capture_start_;
  base_ = nullptr;
  capture_start_ = 0;
  return blocks;
}

void check_host_state(const PhiloxState& s, const char* op) {
  ENGINE_CHECK(s.base == nullptr, "[", op,
               "] a CPU kernel was given a Philox state whose offset "
               "lives in device memory (its generator is in begin_device_offsets' mode, for a "
               "graph capture on a GPU): draw CPU randomness from another generator");
}

// Both fills draw word k of the stream for value k (uniform) or words 2k and 2k + 1 (normal), as
// philox_word would, but compute each Philox block once for the values it serves (4 uniforms, 2
// normals; philox_word computes a block per word) and, above kHeavyMin values, share the blocks
// out over the OpenMP threads: every value depends on its own words only, so the values are the
// same on any number of threads. Building two BERT-Base models (~220 M normals; the [bert]
// parameter-count test) took a third less time on one thread than a block per word, and less
// again on two (docs/benchmarks.md, "Figures behind the code"): the rest is libm's log and cos,
// whose double results the stream's values are defined by.
namespace {
// A value here costs a Philox block (or half of one) and, for normals, a log, a sqrt and a cos
// in double: heavy enough to split from 4K values on (engine/cpu/parallel.h).
constexpr int64_t kHeavyMin = 4096;
}  // namespace

void fill_normal(Generator& gen, double mean, double std, double* out, int64_t n) {
  const PhiloxState s = gen.reserve_words(2 * static_cast<uint64_t>(n));
  check_host_state(s, "fill_normal");
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  auto normal = [&](uint32_t w0, uint32_t w1) {
    const double u1 = (static_cast<double>(w0) + 1.0) / 4294967296.0;  // (0, 1]: log is finite
    const double u2 = static_cast<double>(w1) / 4294967296.0;
    return mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  };
  const int64_t blocks = (n + 1) / 2;  // block b: values 2b (words 0, 1) and 2b + 1 (words 2, 3)
#pragma omp parallel for schedule(static) if (n >= kHeavyMin)
  for (int64_t b = 0; b < blocks; ++b) {
    uint32_t w[4];
    philox_block(s.seed, s.offset + static_cast<uint64_t>(b), w);
    out[2 * b] = normal(w[0], w[1]);
    if (2 * b + 1 < n) out[2 * b + 1] = normal(w[2], w[3]);
  }
}

void fill_uniform(Generator& gen, double* out, int64_t n) {
  const PhiloxState s = gen.reserve_words(static_cast<uint64_t>(n));
  check_host_state(s, "fill_uniform");
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n >= 4 * kHeavyMin)
  for (int64_t b = 0; b < blocks; ++b) {
    uint32_t w[4];
    philox_block(s.seed, s.offset + static_cast<uint64_t>(b), w);
    for (int64_t k = 0; k < 4 && 4 * b + k < n; ++k)
      out[4 * b + k] = static_cast<double>(w[k]) / 4294967296.0;
  }
}

}  // namespace engine
