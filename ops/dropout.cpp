// Dropout: argument checks, autograd wiring (mask regenerated from the saved stream state) and
// the CPU kernels.
#include "ops/dropout.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "engine/autograd.h"
#include "engine/cpu/philox.h"
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
  bool attention = false;  // attention's rule (attention_dropout)
  const char* name() const override { return attention ? "attention_dropout" : "dropout"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor dy = grads[0].contiguous();
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    // d(x * keep / (1 - p))/dx = keep / (1 - p): the forward kernel applied to dy.
    (attention ? attention_dropout_kernel : dropout_kernel)(dy.device(), dy, dx, p, state);
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

void dropout(const Tensor& x, const Tensor& y, double p, PhiloxState s) {
  dispatch_floating(x.dtype(), "dropout", [&]<class T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const uint32_t threshold = dropout_threshold(p);
    ::engine::cpu::philox::for_each_words(
        x.numel(), s, [&](int64_t base, const uint32_t* words, int64_t count) {
          // Locals, not the captures: read through the closure, scale might alias a store to yb,
          // so GCC reloaded it after every store and left the loop scalar with a branch per
          // element (half of dropout's time in the tiny model's step).
          const T sc = scale;
          const uint32_t th = threshold;
          const T* xb = px + base;
          T* yb = py + base;
          // The select before the multiply: a product used on one arm only is sunk into a branch,
          // and under -ftrapping-math GCC will not execute it unconditionally again to vectorise.
          for (int64_t k = 0; k < count; ++k)
            yb[k] = (dropout_keep(words[k], th) ? xb[k] : T(0)) * sc;
        });
  });
}

void dropout_mask(const Tensor& mask, double p, PhiloxState s) {
  const uint32_t threshold = dropout_threshold(p);
  auto fill = [&]<class T>() {
    T* pm = static_cast<T*>(mask.raw_data());
    ::engine::cpu::philox::for_each_words(
        mask.numel(), s, [&](int64_t base, const uint32_t* words, int64_t count) {
          const uint32_t th = threshold;  // a local: see dropout above
          T* m = pm + base;
          for (int64_t k = 0; k < count; ++k) m[k] = dropout_keep(words[k], th) ? T(1) : T(0);
        });
  };
  if (mask.dtype() == DType::u8) {
    fill.template operator()<uint8_t>();
  } else {
    dispatch_floating(mask.dtype(), "dropout_mask", fill);
  }
}

// Attention's rule (dropout.h): word w of the stream holds elements 2 w (its low half) and
// 2 w + 1 (its high half).
void attention_dropout(const Tensor& x, const Tensor& y, double p, PhiloxState s) {
  const int64_t n = x.numel();
  dispatch_floating(x.dtype(), "attention_dropout", [&]<class T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const uint32_t threshold = attention_dropout_threshold(p);
    ::engine::cpu::philox::for_each_words(
        static_cast<int64_t>(attention_dropout_words(static_cast<uint64_t>(n))), s,
        [&](int64_t base, const uint32_t* words, int64_t count) {
          const T sc = scale;  // locals: see dropout above
          const uint32_t th = threshold;
          const int64_t e0 = 2 * base, m = std::min<int64_t>(2 * count, n - e0);
          const T* xb = px + e0;
          T* yb = py + e0;
          // The halfwords in element order (little-endian: a word's low half first), so the loop
          // is dropout's, vectorised.
          static_assert(std::endian::native == std::endian::little);
          uint16_t halves[8 * ::engine::cpu::philox::kGroupBlocks];
          std::memcpy(halves, words, size_t((m + 1) / 2) * sizeof(uint32_t));
          for (int64_t k = 0; k < m; ++k) yb[k] = (uint32_t(halves[k]) >= th ? xb[k] : T(0)) * sc;
        });
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(dropout_kernel, DeviceType::CPU, cpu::dropout);
ENGINE_REGISTER_KERNEL(dropout_mask_kernel, DeviceType::CPU, cpu::dropout_mask);
ENGINE_REGISTER_KERNEL(attention_dropout_kernel, DeviceType::CPU, cpu::attention_dropout);

}  // namespace

namespace {

// dropout and attention_dropout: the same op under the two keep rules (dropout.h).
Tensor dropout_with_rule(const Tensor& x, double p, bool training, Generator& gen, bool attention) {
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
  const uint64_t n = static_cast<uint64_t>(x.numel());
  const PhiloxState s = gen.reserve_words(attention ? attention_dropout_words(n) : n);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  (attention ? attention_dropout_kernel : dropout_kernel)(x.device(), x.detach().contiguous(), y, p,
                                                          s);
  if (needs_grad(x)) {
    auto node = std::make_shared<DropoutNode>();
    node->state = s;
    node->p = p;
    node->attention = attention;
    record(node, {x}, {y});
  }
  return y;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  return dropout_with_rule(x, p, training, gen, false);
}

Tensor attention_dropout(const Tensor& x, double p, bool training, Generator& gen) {
  return dropout_with_rule(x, p, training, gen, true);
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
