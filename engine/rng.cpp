// Host-side draws from the Philox stream (initialisation, tests).
#include "engine/rng.h"

#include <cmath>

namespace engine {

Generator& default_generator() {
  static Generator g;
  return g;
}

void fill_normal(Generator& gen, double mean, double std, double* out, int64_t n) {
  PhiloxState s = gen.reserve_words(2 * static_cast<uint64_t>(n));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w0 = philox_word(s, 2 * static_cast<uint64_t>(i));
    uint32_t w1 = philox_word(s, 2 * static_cast<uint64_t>(i) + 1);
    double u1 = (static_cast<double>(w0) + 1.0) / 4294967296.0;  // (0, 1]: log is finite
    double u2 = static_cast<double>(w1) / 4294967296.0;
    out[i] = mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  }
}

void fill_uniform(Generator& gen, double* out, int64_t n) {
  PhiloxState s = gen.reserve_words(static_cast<uint64_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<double>(philox_word(s, static_cast<uint64_t>(i))) / 4294967296.0;
}

}  // namespace engine
