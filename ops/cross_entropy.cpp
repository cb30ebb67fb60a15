// Cross-entropy: shape and target checks, autograd wiring and the CPU kernels.
#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/vmath.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

// Half-precision logits keep their logsumexp in f32: it is subtracted from every logit in the
// backward, and a bf16 lse would shift every probability by up to ~0.4%.
DType lse_dtype(DType logits) { return logits == DType::f64 ? DType::f64 : DType::f32; }

// Host-side target check for CPU tensors (for other devices it would cost a synchronisation per
// call, so it is the device kernel's job).
void check_targets(const Tensor& targets, int64_t classes, int64_t ignore_index) {
  if (!targets.device().is_cpu()) return;
  dispatch_index(targets.dtype(), "cross_entropy", [&]<class I>() {
    const I* p = targets.data<I>();
    for (int64_t i = 0; i < targets.numel(); ++i) {
      const int64_t v = static_cast<int64_t>(p[i]);
      ENGINE_CHECK(v == ignore_index || (v >= 0 && v < classes), "[cross_entropy] target ", v,
                   " at row ", i, " is out of range for ", classes,
                   " classes (expected 0 <= target < ", classes, ", or ignore_index ", ignore_index,
                   ")");
    }
  });
}

struct CrossEntropyNode : Node {
  Tensor logits, targets, lse, count;  // detached; (N, C), (N), (N), (): no softmax kept
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
  const char* name() const override { return "cross_entropy"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor grad_logits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    cross_entropy_backward_kernel(logits.device(), logits, targets, lse, count,
                                  grads[0].contiguous(), ignore_index, reduction, grad_logits);
    return {grad_logits};
  }
  void release_saved() override { logits = targets = lse = count = Tensor(); }
};

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {

bool ignored(int64_t target, int64_t ignore_index) { return target == ignore_index; }

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           Reduction reduction, const Tensor& lse, const Tensor& count,
                           const Tensor& out) {
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  dispatch_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
    dispatch_index(targets.dtype(), "cross_entropy", [&]<class I>() {
      const T* x = logits.data<T>();
      const I* t = targets.data<I>();
      T* l = lse.data<T>();
      // Per-row losses in double so the sum below is accurate and formed in row order
      // (deterministic whatever the thread count).
      std::vector<double> row(static_cast<size_t>(n), 0.0);
#pragma omp parallel for if (n * c > ::engine::cpu::kParallelMinElems)
      for (int64_t i = 0; i < n; ++i) {
        const T* xi = x + i * c;
        // Max-shifted logsumexp: exp() sees values <= 0, so it cannot overflow.
        const T mx = engine::cpu::row_max(xi, c);
        const double s = engine::cpu::sum_exp_shifted(xi, mx, c);
        const double lse_i = static_cast<double>(mx) + std::log(s);
        l[i] = static_cast<T>(lse_i);
        const int64_t ti = static_cast<int64_t>(t[i]);
        if (!ignored(ti, ignore_index)) row[i] = lse_i - static_cast<double>(xi[ti]);
      }
      int64_t valid = 0;
      for (int64_t i = 0; i < n; ++i) valid += !ignored(static_cast<int64_t>(t[i]), ignore_index);
      *count.data<int64_t>() = valid;
      T* o = out.data<T>();
      if (reduction == Reduction::none) {
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(row[i]);
        return;
      }
      double total = 0;
      for (int64_t i = 0; i < n; ++i) total += row[i];
      // Mean over no rows is defined as 0 (a batch of padding), not 0/0.
      if (reduction == Reduction::mean) total = valid > 0 ? total / static_cast<double>(valid) : 0;
      *o = static_cast<T>(total);
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& count, const Tensor& grad_out, int64_t ignore_index,
                            Reduction reduction, const Tensor& grad_logits) {
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
    dispatch_index(targets.dtype(), "cross_entropy_backward", [&]<class I>() {
      const T* x = logits.data<T>();
      const I* t = targets.data<I>();
      const T* l = lse.data<T>();
      const T* g = grad_out.data<T>();
      T* gx = grad_logits.data<T>();
      const int64_t valid = *count.data<int64_t>();
      // One weight for every row unless the loss was per row.
      T shared = T(0);
      if (reduction == Reduction::sum) shared = g[0];
      if (reduction == Reduction::mean && valid > 0) shared = g[0] / static_cast<T>(valid);
#pragma omp parallel for if (n * c > ::engine::cpu::kParallelMinElems)
      for (int64_t i = 0; i < n; ++i) {
        const T* xi = x + i * c;
        T* gi = gx + i * c;
        const int64_t ti = static_cast<int64_t>(t[i]);
        if (ignored(ti, ignore_index)) {
          std::fill(gi, gi + c, T(0));
          continue;
        }
        const T w = reduction == Reduction::none ? g[i] : shared;
        engine::cpu::exp_shifted_scaled(xi, l[i], w, gi, c);  // softmax * w
        gi[ti] -= w;
      }
    });
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(cross_entropy_forward_kernel, DeviceType::CPU, cpu::cross_entropy_forward);
ENGINE_REGISTER_KERNEL(cross_entropy_backward_kernel, DeviceType::CPU, cpu::cross_entropy_backward);

}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets, int64_t ignore_index,
                     Reduction reduction) {
  ENGINE_CHECK(logits_in.defined() && targets.defined(), "[cross_entropy] got an undefined input");
  // Autocast: the loss in f32. On a device, 16-bit logits go to the kernels as they are: they
  // compute in f32 from the exactly converted logits, write the loss in f32 and its gradient in
  // the logits' dtype, the bits of casting the logits first, without that (N, C) conversion each
  // way or the f32 copy kept for the backward. The CPU kernels compute in f32: cast there.
  const bool half_logits = logits_in.defined() && autocast_active() &&
                           !logits_in.device().is_cpu() &&
                           (logits_in.dtype() == DType::bf16 || logits_in.dtype() == DType::f16);
  const Tensor logits = half_logits ? logits_in : autocast_to_f32(logits_in);
  ENGINE_CHECK(logits.dim() == 2, "[cross_entropy] logits must be (N, C), got ", describe(logits));
  ENGINE_CHECK(is_floating(logits.dtype()), "[cross_entropy] logits must be floating, got ",
               describe(logits));
  ENGINE_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64,
               "[cross_entropy] targets must be i32 or i64 class indices, got ", describe(targets));
  ENGINE_CHECK(targets.dim() == 1 && targets.shape()[0] == logits.shape()[0],
               "[cross_entropy] targets ", describe(targets), " do not match logits ",
               describe(logits), " (expected (", logits.shape()[0], "))");
  ENGINE_CHECK(logits.device() == targets.device(), "[cross_entropy] logits ", describe(logits),
               " and targets ", describe(targets), " are on different devices");
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  Tensor x = logits.detach().contiguous();   // (N, C)
  Tensor t = targets.detach().contiguous();  // (N)
  check_targets(t, c, ignore_index);

  const Device dev = logits.device();
  Tensor lse = Tensor::empty({n}, lse_dtype(logits.dtype()), dev);
  Tensor count = Tensor::empty({}, DType::i64, dev);
  Tensor out = Tensor::empty(reduction == Reduction::none ? Shape{n} : Shape{},
                             half_logits ? DType::f32 : logits.dtype(), dev);
  cross_entropy_forward_kernel(dev, x, t, ignore_index, reduction, lse, count, out);
  if (needs_grad(logits)) {
    auto node = std::make_shared<CrossEntropyNode>();
    node->logits = x;
    node->targets = t;
    node->lse = lse;
    node->count = count;
    node->ignore_index = ignore_index;
    node->reduction = reduction;
    record(node, {logits}, {out});
  }
  return out;
}

}  // namespace engine
