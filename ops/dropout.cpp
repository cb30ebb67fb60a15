// Dropout: argument checks, autograd wiring (mask regenerated from the saved stream state) and
// the CPU kernels.
#include "ops/dropout.h"

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

void check_p(double p) {
  ENGINE_CHECK(p >= 0.0 && p <= 1.0, "[dropout] p must be in [0, 1], got ", p);
}

struct DropoutNode : Node {
  // No tensors: the mask is a function of (state, element index), recomputed in the backward.
  PhiloxState state;
  double p = 0;
  const char* name() const override { return "dropout"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor dy = grads[0].contiguous();
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    // d(x * keep / (1 - p))/dx = keep / (1 - p): the forward kernel applied to dy.
    dropout_kernel(dy.device(), dy, dx, p, state);
    return {dx};
  }
};

struct ZeroNode : Node {  // p == 1: y = 0 whatever x is
  const char* name() const override { return "dropout"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {Tensor::zeros(inputs[0].shape, inputs[0].dtype, inputs[0].device)};
  }
};

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {

constexpr int64_t kParallelBlocks = 8192;

// Philox4x32-10 (engine/rng.h's philox4x32_10) for kLanes consecutive counters at once, in vector
// registers where the build has AVX-512 or AVX2 (32x32->64-bit multiplies of the even and the odd
// lanes, vpmuludq): bit for bit philox_block(seed, counter + j) for lane j (tests/test_dropout.cpp
// checks it against philox_word), ~10x faster than one block at a time.
constexpr int kLanes = 16;
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
using VecU = __m512i;  // 16 lanes
inline VecU vload(const uint32_t* p) { return _mm512_loadu_si512(p); }
inline void vstore(uint32_t* p, VecU v) { _mm512_storeu_si512(p, v); }
inline VecU vset1(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
inline VecU vxor(VecU a, VecU b) { return _mm512_xor_si512(a, b); }
// hi and lo 32 bits of m * c per lane.
inline void vmul_hilo(VecU c, VecU m, VecU& hi, VecU& lo) {
  const VecU even = _mm512_mul_epu32(c, m);                        // lanes 0, 2, ...: 64-bit
  const VecU odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);  // lanes 1, 3, ...
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}
#else
using VecU = __m256i;  // 8 lanes
inline VecU vload(const uint32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const VecU*>(p));
}
inline void vstore(uint32_t* p, VecU v) { _mm256_storeu_si256(reinterpret_cast<VecU*>(p), v); }
inline VecU vset1(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
inline VecU vxor(VecU a, VecU b) { return _mm256_xor_si256(a, b); }
inline void vmul_hilo(VecU c, VecU m, VecU& hi, VecU& lo) {
  const VecU even = _mm256_mul_epu32(c, m);
  const VecU odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
#endif
constexpr int kVecLanes = static_cast<int>(sizeof(VecU) / sizeof(uint32_t));

void philox_lanes(uint64_t seed, uint64_t counter, uint32_t out[4][kLanes]) {
  alignas(64) uint32_t lo[kLanes], hi[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    const uint64_t c = counter + static_cast<uint64_t>(j);
    lo[j] = static_cast<uint32_t>(c);
    hi[j] = static_cast<uint32_t>(c >> 32);
  }
  const VecU m0 = vset1(kM0), m1 = vset1(kM1);
  for (int v = 0; v < kLanes; v += kVecLanes) {
    VecU c0 = vload(lo + v), c1 = vload(hi + v), c2 = vset1(0), c3 = vset1(0);
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      if (r) {
        k0 += kW0;
        k1 += kW1;
      }
      VecU hi0, lo0, hi1, lo1;
      vmul_hilo(c0, m0, hi0, lo0);
      vmul_hilo(c2, m1, hi1, lo1);
      c0 = vxor(vxor(hi1, c1), vset1(k0));
      c1 = lo1;
      c2 = vxor(vxor(hi0, c3), vset1(k1));
      c3 = lo0;
    }
    vstore(out[0] + v, c0);
    vstore(out[1] + v, c1);
    vstore(out[2] + v, c2);
    vstore(out[3] + v, c3);
  }
}
#else
void philox_lanes(uint64_t seed, uint64_t counter, uint32_t out[4][kLanes]) {
  for (int j = 0; j < kLanes; ++j) {
    uint32_t w[4];
    philox_block(seed, counter + static_cast<uint64_t>(j), w);
    for (int k = 0; k < 4; ++k) out[k][j] = w[k];
  }
}
#endif

// Calls f(base, words, count) over i < n in runs of up to 4 kLanes elements: words[k] is the
// Philox word of element base + k (word i % 4 of block offset + i / 4), the blocks drawn kLanes at
// a time. f's loop over k is a plain loop the compiler vectorises.
template <class F>
void for_each_words(int64_t n, PhiloxState s, F&& f) {
  const int64_t blocks = (n + 3) / 4;
  const int64_t groups = (blocks + kLanes - 1) / kLanes;
#pragma omp parallel for schedule(static) if (blocks > kParallelBlocks)
  for (int64_t g = 0; g < groups; ++g) {
    uint32_t w[4][kLanes];
    alignas(64) uint32_t words[4 * kLanes];
    philox_lanes(s.seed, s.offset + static_cast<uint64_t>(g * kLanes), w);
    for (int j = 0; j < kLanes; ++j)
      for (int k = 0; k < 4; ++k) words[4 * j + k] = w[k][j];
    const int64_t base = g * kLanes * 4;
    f(base, words, std::min<int64_t>(kLanes * 4, n - base));
  }
}

void dropout(const Tensor& x, const Tensor& y, double p, PhiloxState s) {
  dispatch_floating(x.dtype(), "dropout", [&]<class T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const uint32_t threshold = dropout_threshold(p);
    for_each_words(x.numel(), s, [&](int64_t base, const uint32_t* words, int64_t count) {
      const T* xb = px + base;
      T* yb = py + base;
      for (int64_t k = 0; k < count; ++k) {
        const T v = xb[k] * scale;  // read unconditionally: the loop vectorises
        yb[k] = dropout_keep(words[k], threshold) ? v : T(0);
      }
    });
  });
}

void dropout_mask(const Tensor& mask, double p, PhiloxState s) {
  const uint32_t threshold = dropout_threshold(p);
  auto fill = [&]<class T>() {
    T* pm = static_cast<T*>(mask.raw_data());
    for_each_words(mask.numel(), s, [&](int64_t base, const uint32_t* words, int64_t count) {
      for (int64_t k = 0; k < count; ++k)
        pm[base + k] = dropout_keep(words[k], threshold) ? T(1) : T(0);
    });
  };
  if (mask.dtype() == DType::u8) {
    fill.template operator()<uint8_t>();
  } else {
    dispatch_floating(mask.dtype(), "dropout_mask", fill);
  }
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(dropout_kernel, DeviceType::CPU, cpu::dropout);
ENGINE_REGISTER_KERNEL(dropout_mask_kernel, DeviceType::CPU, cpu::dropout_mask);

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  ENGINE_CHECK(x.defined(), "[dropout] got an undefined input");
  ENGINE_CHECK(is_floating(x.dtype()), "[dropout] expects a floating input, got ", describe(x));
  check_p(p);
  if (!training || p == 0.0) return x;
  if (p == 1.0) {
    // Everything dropped: the 1 / (1 - p) scale is undefined, and no draw could change the
    // result, so none is taken.
    Tensor y = Tensor::zeros(x.shape(), x.dtype(), x.device());
    if (needs_grad(x)) record(std::make_shared<ZeroNode>(), {x}, {y});
    return y;
  }
  const PhiloxState s = gen.reserve_words(static_cast<uint64_t>(x.numel()));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dropout_kernel(x.device(), x.detach().contiguous(), y, p, s);
  if (needs_grad(x)) {
    auto n = std::make_shared<DropoutNode>();
    n->state = s;
    n->p = p;
    record(n, {x}, {y});
  }
  return y;
}

Tensor dropout_mask(const Shape& shape, double p, PhiloxState state, DType dtype, Device device) {
  check_p(p);
  ENGINE_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::u8,
               "[dropout_mask] mask dtype must be f32, f64 or u8, got ", dtype_name(dtype));
  Tensor m = Tensor::empty(shape, dtype, device);
  dropout_mask_kernel(device, m, p, state);
  return m;
}

}  // namespace engine
