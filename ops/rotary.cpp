// rotary: argument checks, autograd wiring (the backward is the inverse rotation) and the CPU
// kernel.
#include "ops/rotary.h"

#include "engine/autograd.h"
#include "engine/cpu/parallel.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

// x as the kernel's (A, B, T, D): read in place when its last dim is contiguous, it has at most
// four dims, and its strides and start keep pairs aligned (the layers' q / k views); otherwise
// one contiguous copy first.
Tensor kernel_view(const Tensor& x) {
  const int64_t t = x.shape()[x.dim() - 2], d = x.shape().back();
  Tensor v = x.detach();
  bool in_place = v.dim() <= 4 && v.stride(v.dim() - 1) == 1 && v.storage_offset() % 2 == 0;
  for (int64_t k = 0; in_place && k + 1 < v.dim(); ++k)
    in_place = v.shape()[k] == 1 || v.stride(k) % 2 == 0;
  if (!in_place) v = v.contiguous();
  if (v.dim() > 4) return v.view({v.numel() / (t * d), 1, t, d});
  while (v.dim() < 4) v = v.unsqueeze(0);
  return v;
}

Tensor rotate_raw(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const Tensor xv = kernel_view(x);
  rotary_kernel(x.device(), xv, cos, sin, out.view(xv.shape()), inverse);
  return out;
}

struct RotaryNode : Node {
  Tensor cos, sin;
  const char* name() const override { return "rotary"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {rotate_raw(grads[0], cos, sin, true)};
  }
  void release_saved() override { cos = sin = Tensor(); }
};

namespace cpu {

void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out,
            bool inverse) {
  const Shape& n = x.shape();
  const int64_t bdim = n[1], t = n[2], half = n[3] / 2, rows = n[0] * n[1] * n[2];
  const int64_t sa = x.stride(0), sb = x.stride(1), st = x.stride(2);
  const float* pc = cos.data<float>();
  const float* ps = sin.data<float>();
  const float sign = inverse ? -1.f : 1.f;
  dispatch_floating(x.dtype(), "rotary", [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
#pragma omp parallel for if (rows * half > ::engine::cpu::kParallelMinElems)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t r = row % t, slice = row / t;
      const float* c = pc + r * half;
      const float* s = ps + r * half;
      const T* xr = px + (slice / bdim) * sa + (slice % bdim) * sb + r * st;
      T* orow = po + row * 2 * half;
      for (int64_t i = 0; i < half; ++i) {
        const T a = xr[2 * i], b = xr[2 * i + 1], ci = T(c[i]), si = T(sign * s[i]);
        orow[2 * i] = a * ci - b * si;
        orow[2 * i + 1] = a * si + b * ci;
      }
    }
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(rotary_kernel, DeviceType::CPU, cpu::rotary);

}  // namespace

Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  ENGINE_CHECK(x.defined() && cos.defined() && sin.defined(), "[rotary] got an undefined input");
  ENGINE_CHECK(is_floating(x.dtype()), "[rotary] expects a floating x, got ", describe(x));
  ENGINE_CHECK(x.dim() >= 2 && x.shape().back() % 2 == 0,
               "[rotary] x must be (..., T, D) with D even, got ", describe(x));
  const int64_t t = x.shape()[x.dim() - 2], d = x.shape().back();
  const Shape angles{t, d / 2};
  for (const Tensor* a : {&cos, &sin}) {
    ENGINE_CHECK(a->dtype() == DType::f32 && a->shape() == angles,
                 "[rotary] cos and sin must be f32 (T, D / 2) = (", t, ", ", d / 2, ") for x ",
                 describe(x), ", got ", describe(*a));
    ENGINE_CHECK(a->device() == x.device(), "[rotary] x ", describe(x), " and its angles ",
                 describe(*a), " are on different devices");
    ENGINE_CHECK(!needs_grad(*a), "[rotary] the angles are constants; cos / sin need no gradient");
  }
  Tensor c = cos.detach().contiguous(), s = sin.detach().contiguous();
  Tensor out = rotate_raw(x, c, s, false);
  if (needs_grad(x)) {
    auto node = std::make_shared<RotaryNode>();
    node->cos = c;
    node->sin = s;
    record(node, {x}, {out});
  }
  return out;
}

}  // namespace engine
