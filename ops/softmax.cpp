// Softmax / log-softmax: argument checks, autograd wiring and the CPU kernels.
#include "ops/softmax.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/vmath.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"

namespace engine {
namespace {

void check_input(const Tensor& x, const char* op) {
  ENGINE_CHECK(x.defined(), "[", op, "] got an undefined input");
  ENGINE_CHECK(is_floating(x.dtype()), "[", op, "] expects a floating input, got ", describe(x));
  ENGINE_CHECK(x.dim() >= 1, "[", op, "] expects at least one dim (the softmax axis), got ",
               describe(x));
}

void check_bias_mask(const Tensor& x, const Tensor& bias, const Tensor& mask) {
  if (bias.defined()) {
    ENGINE_CHECK(bias.device() == x.device(), "[softmax] bias ", describe(bias),
                 " is not on the input's device: input ", describe(x));
    ENGINE_CHECK(bias.dtype() == x.dtype(), "[softmax] bias ", describe(bias),
                 " does not match the input's dtype: input ", describe(x),
                 " (convert one with .to())");
    ENGINE_CHECK(is_broadcastable_to(bias.shape(), x.shape()), "[softmax] bias ", describe(bias),
                 " is not broadcastable to input ", describe(x));
  }
  if (mask.defined()) {
    ENGINE_CHECK(mask.device() == x.device(), "[softmax] mask ", describe(mask),
                 " is not on the input's device: input ", describe(x));
    ENGINE_CHECK(is_broadcastable_to(mask.shape(), x.shape()), "[softmax] mask ", describe(mask),
                 " is not broadcastable to input ", describe(x));
  }
}

void check_out(const Tensor& ref, const Tensor& out, const char* op, const char* what) {
  ENGINE_CHECK(out.defined() && out.shape() == ref.shape() && out.dtype() == ref.dtype() &&
                   out.device() == ref.device() && out.is_contiguous(),
               "[", op, "] ", what, " must be contiguous ", describe(ref), ", got ",
               out.defined() ? describe(out) : std::string("undefined"));
}

struct SoftmaxNode : Node {
  Tensor y;  // (..., N) contiguous output: the only thing the backward needs
  const char* name() const override { return "softmax"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
    softmax_backward_kernel(y.device(), y, grads[0].contiguous(), dx);
    Tensor gx, gb;
    if (needs_input_grad(0)) gx = dx;
    if (needs_input_grad(1)) {
      // d(x + bias)/dbias is the broadcast: sum dx over the dims bias was expanded along.
      gb = sum_to_shape(dx, inputs[1].shape);
    }
    return {gx, gb};
  }
  void release_saved() override { y = Tensor(); }
};

struct LogSoftmaxNode : Node {
  Tensor y;  // (..., N) contiguous output (log-probabilities)
  const char* name() const override { return "log_softmax"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
    log_softmax_backward_kernel(y.device(), y, grads[0].contiguous(), dx);
    return {dx};
  }
  void release_saved() override { y = Tensor(); }
};

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {

// Rows are every dim but the last; a row is parallel work once the tensor is this large.
constexpr int64_t kParallelElems = ::engine::cpu::kParallelMinElems;  // engine/cpu/parallel.h

// Element offset of row r's first element in a view of `shape` with `strides` (the view's own
// storage offset is already in its data pointer).
int64_t row_offset(const Shape& shape, const std::vector<int64_t>& strides, int64_t r) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    off += (r % shape[d]) * strides[d];
    r /= shape[d];
  }
  return off;
}

// Nonzero test per mask storage type; 16-bit floats are bit patterns where +-0 means "masked".
template <class M>
bool kept(M v) {
  if constexpr (std::is_same_v<M, bf16_t> || std::is_same_v<M, f16_t>)
    return (v.bits & 0x7FFFu) != 0;
  else
    return v != M(0);
}

// M = std::nullptr_t: no mask.
template <class T, class M>
void softmax_rows(const Tensor& x, const Tensor& bias, const Tensor& mask, const Tensor& y) {
  const Shape& shape = x.shape();
  const int64_t n = shape.back();
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const T* pb = bias.defined() ? bias.data<T>() : nullptr;
  const int64_t bstep = bias.defined() ? bias.strides().back() : 0;
  const M* pm = nullptr;
  int64_t mstep = 0;
  if constexpr (!std::is_same_v<M, std::nullptr_t>) {
    pm = static_cast<const M*>(mask.raw_data());
    mstep = mask.strides().back();
  }
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for if (rows * n > kParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * n;
    T* yr = py + r * n;
    // Pass 1: logits z = x + bias into y (masked ones as -inf, so exp gives exactly 0) and the
    // row max over kept positions. Each element is read before it is written: y may alias x.
    const T* br = pb ? pb + row_offset(shape, bias.strides(), r) : nullptr;
    if (br) {
      for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] + br[j * bstep];
    } else if (yr != xr) {
      std::memcpy(yr, xr, static_cast<size_t>(n) * sizeof(T));
    }
    if constexpr (!std::is_same_v<M, std::nullptr_t>) {
      const M* mr = pm + row_offset(shape, mask.strides(), r);
      for (int64_t j = 0; j < n; ++j)
        if (!kept(mr[j * mstep])) yr[j] = kNegInf;
    }
    const T mx = engine::cpu::row_max(yr, n);
    if (mx == kNegInf) {  // nothing kept: zeros, not exp(-inf - -inf) = NaN
      for (int64_t j = 0; j < n; ++j) yr[j] = T(0);
      continue;
    }
    // Pass 2: subtract the max so the largest exponent is 0 (no overflow), and normalise.
    const T sum = engine::cpu::exp_shifted(yr, mx, yr, n);
    const T inv = T(1) / sum;
    for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
  }
}

void softmax_forward(const Tensor& x, const Tensor& bias, const Tensor& mask, const Tensor& y) {
  dispatch_floating(x.dtype(), "softmax", [&]<class T>() {
    if (!mask.defined()) {
      softmax_rows<T, std::nullptr_t>(x, bias, mask, y);
    } else {
      dispatch_any(mask.dtype(), [&]<class M>() { softmax_rows<T, M>(x, bias, mask, y); });
    }
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  dispatch_floating(y.dtype(), "softmax_backward", [&]<class T>() {
    const int64_t n = y.shape().back();
    if (n == 0) return;
    const int64_t rows = y.numel() / n;
    const T* py = y.data<T>();
    const T* pg = dy.data<T>();
    T* po = dx.data<T>();
#pragma omp parallel for if (rows * n > kParallelElems)
    for (int64_t r = 0; r < rows; ++r) {
      const T* yr = py + r * n;
      const T* gr = pg + r * n;
      T* orow = po + r * n;
      T dot = 0;
      for (int64_t j = 0; j < n; ++j) dot += gr[j] * yr[j];
      // Masked positions have y = 0, hence dx = 0 there without looking at the mask.
      for (int64_t j = 0; j < n; ++j) orow[j] = yr[j] * (gr[j] - dot);
    }
  });
}

void log_softmax_forward(const Tensor& x, const Tensor& y) {
  dispatch_floating(x.dtype(), "log_softmax", [&]<class T>() {
    const int64_t n = x.shape().back();
    if (n == 0) return;
    const int64_t rows = x.numel() / n;
    const T* px = x.data<T>();
    T* py = y.data<T>();
#pragma omp parallel for if (rows * n > kParallelElems)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = px + r * n;
      T* yr = py + r * n;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < n; ++j) mx = xr[j] > mx ? xr[j] : mx;
      T sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(xr[j] - mx);
      const T lse = mx + std::log(sum);
      for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] - lse;
    }
  });
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  dispatch_floating(y.dtype(), "log_softmax_backward", [&]<class T>() {
    const int64_t n = y.shape().back();
    if (n == 0) return;
    const int64_t rows = y.numel() / n;
    const T* py = y.data<T>();
    const T* pg = dy.data<T>();
    T* po = dx.data<T>();
#pragma omp parallel for if (rows * n > kParallelElems)
    for (int64_t r = 0; r < rows; ++r) {
      const T* yr = py + r * n;
      const T* gr = pg + r * n;
      T* orow = po + r * n;
      T sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += gr[j];
      for (int64_t j = 0; j < n; ++j) orow[j] = gr[j] - std::exp(yr[j]) * sum;
    }
  });
}

// The attention form as the CPU's own kernels in sequence (the CUDA kernel fuses them): scale
// (affine), softmax with bias and mask in place, dropout into `dropped`.
void attention_softmax_forward(const Tensor& x, double scale, const Tensor& bias,
                               const Tensor& mask, double p, PhiloxState state, const Tensor& probs,
                               const Tensor& dropped) {
  if (scale != 1.0) {
    affine_kernel(Device::cpu(), x, scale, 0.0, probs);
    softmax_forward(probs, bias, mask, probs);
  } else {
    softmax_forward(x, bias, mask, probs);
  }
  if (dropped.defined()) attention_dropout_kernel(Device::cpu(), probs, dropped, p, state);
}

void attention_softmax_backward(const Tensor& probs, const Tensor& dpd, double p, PhiloxState state,
                                const Tensor& ds, const Tensor& /*dropped*/) {
  if (p > 0) {
    attention_dropout_kernel(Device::cpu(), dpd, ds, p, state);
    softmax_backward(probs, ds, ds);
  } else {
    softmax_backward(probs, dpd, ds);
  }
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(attention_softmax_forward_kernel, DeviceType::CPU,
                       cpu::attention_softmax_forward);
ENGINE_REGISTER_KERNEL(attention_softmax_backward_kernel, DeviceType::CPU,
                       cpu::attention_softmax_backward);
ENGINE_REGISTER_KERNEL(softmax_forward_kernel, DeviceType::CPU, cpu::softmax_forward);
ENGINE_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::CPU, cpu::softmax_backward);
ENGINE_REGISTER_KERNEL(log_softmax_forward_kernel, DeviceType::CPU, cpu::log_softmax_forward);
ENGINE_REGISTER_KERNEL(log_softmax_backward_kernel, DeviceType::CPU, cpu::log_softmax_backward);

}  // namespace

void softmax_forward_raw(const Tensor& x, const Tensor& bias, const Tensor& mask, const Tensor& y) {
  check_input(x, "softmax");
  check_bias_mask(x, bias, mask);
  check_out(x, y, "softmax", "output");
  // Stride-0 views: a (1, H, T, T) bias is read once per batch element, never copied B times.
  Tensor b = bias.defined() ? bias.detach().expand(x.shape()) : Tensor();
  Tensor m = mask.defined() ? mask.detach().expand(x.shape()) : Tensor();
  softmax_forward_kernel(x.device(), x.detach().contiguous(), b, m, y);
}

void attention_softmax_raw(const Tensor& x, double scale, const Tensor& bias, const Tensor& mask,
                           double p, PhiloxState state, const Tensor& probs,
                           const Tensor& dropped) {
  check_input(x, "attention_softmax");
  check_bias_mask(x, bias, mask);
  check_out(x, probs, "attention_softmax", "probs");
  if (dropped.defined()) check_out(x, dropped, "attention_softmax", "dropped");
  ENGINE_CHECK(std::isfinite(scale), "[attention_softmax] scale must be finite, got ", scale);
  ENGINE_CHECK(p >= 0.0 && p < 1.0, "[attention_softmax] p must be in [0, 1), got ", p);
  Tensor b = bias.defined() ? bias.detach().expand(x.shape()) : Tensor();
  Tensor m = mask.defined() ? mask.detach().expand(x.shape()) : Tensor();
  attention_softmax_forward_kernel(x.device(), x.detach().contiguous(), scale, b, m, p, state,
                                   probs, dropped);
}

void attention_softmax_backward_raw(const Tensor& probs, const Tensor& dpd, double p,
                                    PhiloxState state, const Tensor& ds, const Tensor& dropped) {
  ENGINE_CHECK(probs.defined() && probs.is_contiguous(),
               "[attention_softmax_backward] probs must be contiguous");
  ENGINE_CHECK(dpd.defined() && dpd.shape() == probs.shape() && dpd.dtype() == probs.dtype() &&
                   dpd.device() == probs.device(),
               "[attention_softmax_backward] dpd ",
               dpd.defined() ? describe(dpd) : std::string("undefined"), " does not match probs ",
               describe(probs));
  check_out(probs, ds, "attention_softmax_backward", "ds");
  if (dropped.defined())
    ENGINE_CHECK(dropped.is_contiguous() && dropped.shape() == probs.shape() &&
                     dropped.dtype() == probs.dtype() && dropped.device() == probs.device(),
                 "[attention_softmax_backward] dropped ", describe(dropped),
                 " does not match probs ", describe(probs));
  attention_softmax_backward_kernel(probs.device(), probs, dpd.detach().contiguous(), p, state, ds,
                                    p > 0 ? dropped : Tensor());
}

void softmax_backward_raw(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  ENGINE_CHECK(y.defined() && y.is_contiguous(), "[softmax_backward] y must be contiguous");
  ENGINE_CHECK(dy.defined() && dy.shape() == y.shape() && dy.dtype() == y.dtype() &&
                   dy.device() == y.device(),
               "[softmax_backward] dy ", dy.defined() ? describe(dy) : std::string("undefined"),
               " does not match y ", describe(y));
  check_out(y, dx, "softmax_backward", "dx");
  softmax_backward_kernel(y.device(), y, dy.detach().contiguous(), dx);
}

Tensor softmax(const Tensor& x, const Tensor& bias_in, const Tensor& mask) {
  check_input(x, "softmax");
  // Autocast: a bias of another floating dtype is taken in x's.
  const Tensor bias = autocast_active() && bias_in.defined() && is_floating(bias_in.dtype())
                          ? bias_in.to(x.dtype())
                          : bias_in;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  softmax_forward_raw(x, bias, mask, y);
  if (needs_grad(x, bias)) {
    auto n = std::make_shared<SoftmaxNode>();
    n->y = y.detach();
    record(n, {x, bias}, {y});  // the mask is not an input: it gets no gradient
  }
  return y;
}

Tensor log_softmax(const Tensor& x) {
  check_input(x, "log_softmax");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  log_softmax_forward_kernel(x.device(), x.detach().contiguous(), y);
  if (needs_grad(x)) {
    auto n = std::make_shared<LogSoftmaxNode>();
    n->y = y.detach();
    record(n, {x}, {y});
  }
  return y;
}

}  // namespace engine
