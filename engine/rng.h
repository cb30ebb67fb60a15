// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11). A (seed, offset) pair
// names a stream position; word i of a draw is word (i % 4) of the Philox block at counter
// offset + i / 4 under key seed. The same functions compile for host and device, so CPU and CUDA
// kernels derive identical dropout and masking decisions, and saving (seed, offset) is enough to
// resume a run exactly.
#pragma once

#include <cstdint>

#include "engine/hd.h"

namespace engine {

struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in 128-bit blocks (4 words)
  // Graph capture (Generator::begin_device_offsets): a device word added to `offset` when the
  // kernel runs, so each replay of a captured graph draws from where the generator stands then.
  // Null outside a capture; CPU kernels refuse a state that has one (check_host_state).
  const uint64_t* base = nullptr;
};

// The block counter of a state: `offset`, plus the device word `base` points to when set (read
// where the draw happens: a kernel of a captured graph).
ENGINE_HD uint64_t philox_offset(const PhiloxState& s) {
  return s.base ? s.offset + *s.base : s.offset;
}

ENGINE_HD void philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2], uint32_t out[4]) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
  uint32_t k0 = key_in[0], k1 = key_in[1];
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += kW0;
      k1 += kW1;
    }
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// The four words of block `counter` under key `seed`.
ENGINE_HD void philox_block(uint64_t seed, uint64_t counter, uint32_t out[4]) {
  const uint32_t ctr[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u,
                           0u};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  philox4x32_10(ctr, key, out);
}

// Word i of the stream that starts at `s`.
ENGINE_HD uint32_t philox_word(PhiloxState s, uint64_t i) {
  uint32_t w[4];
  philox_block(s.seed, philox_offset(s) + i / 4, w);
  return w[i % 4];
}

// Exact uniform in [0, 1) from the top 24 bits: identical on every device.
ENGINE_HD float uniform_from_word(uint32_t w) {
  return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
}

// A generator hands out disjoint stretches of the stream: reserve_words(n) returns the state for
// n words and advances the offset past them (rounded up to whole blocks).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5EEDull) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  void set_state(PhiloxState s) {
    seed_ = s.seed;
    offset_ = s.offset;
  }
  PhiloxState state() const { return {seed_, offset_}; }
  PhiloxState reserve_words(uint64_t n) {
    PhiloxState s{seed_, offset_ - capture_start_, base_};
    offset_ += (n + 3) / 4;
    return s;
  }
  // Advances the offset by `blocks` (4 words each), as reserving them would.
  void skip_blocks(uint64_t blocks) { offset_ += blocks; }

  // Graph capture (engine/graph.h). Between begin_device_offsets(base) and end_device_offsets(),
  // the states handed out are relative to the offset at begin, with `base` (a device u64) added
  // by the kernels when they run. Before each replay the caller sets *base to offset() (one
  // kernel: base_tensor.fill_(double(gen.offset())), exact below 2^53) and afterwards calls
  // skip_blocks(blocks_per_replay). end_device_offsets() returns the blocks the captured work
  // reserved and puts the offset back where it was at begin (the capture ran nothing).
  void begin_device_offsets(const uint64_t* base);
  uint64_t end_device_offsets();

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
  const uint64_t* base_ = nullptr;
  uint64_t capture_start_ = 0;
};

// CPU kernels: the state must not name a device word (a CPU op met a generator in its device-
// offset mode). Throws naming the op.
void check_host_state(const PhiloxState& s, const char* op);

// The process-wide generator used when an op is given none.
Generator& default_generator();

// n normals (Box-Muller on word pairs 2i, 2i+1, in double) written as double, for host-side
// initialisation; uses 2n words of the generator.
void fill_normal(Generator& gen, double mean, double std, double* out, int64_t n);
void fill_uniform(Generator& gen, double* out, int64_t n);

}  // namespace engine
