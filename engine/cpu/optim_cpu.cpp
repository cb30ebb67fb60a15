// The CPU kernel of the AdamW step (engine/optim.h): one OpenMP pass over the contiguous slabs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/cpu/parallel.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/optim.h"

// CMakeLists.txt compiles this file with -ffp-contract=off, so each float operation of the AdamW
// step rounds on its own, as PyTorch's sequence of tensor ops does (with -march=native the
// compiler would otherwise fuse a*b + c into FMAs where it likes, and the result would depend on
// the build flags), and with -fno-math-errno, so the sqrt (of v >= 0: errno never matters) does
// not keep the loop from vectorising.

namespace engine {
namespace {
namespace cpu {

constexpr int64_t kParallelMin = ::engine::cpu::kParallelMinElems;  // engine/cpu/parallel.h

void adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
           const Tensor& decay_mask, const AdamWStepScalars& s) {
  const int64_t n = param.numel();
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq, &decay_mask})
    ENGINE_ASSERT(t->is_contiguous() && t->numel() == n);
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const uint8_t* mask = decay_mask.data<uint8_t>();
  AdamWStepScalars r = s;  // with the device controls resolved (a graph's step)
  if (s.controls.defined() &&
      !resolve_adamw_controls(s.controls.data<double>(), s.clip_norm, r.decay_factor, r.step_size,
                              r.bias_correction2_sqrt, r.grad_scale))
    return;  // a gradient was not finite: the step is skipped
  // PyTorch passes each Python-float scalar to an f32 tensor op, which rounds it to f32 first;
  // 1 - beta is computed in double before rounding, as in Python.
  const float decay = static_cast<float>(r.decay_factor);
  const float beta1 = static_cast<float>(r.beta1),
              one_minus_beta1 = static_cast<float>(1.0 - r.beta1);
  const float beta2 = static_cast<float>(r.beta2),
              one_minus_beta2 = static_cast<float>(1.0 - r.beta2);
  const float bc2_sqrt = static_cast<float>(r.bias_correction2_sqrt);
  const float eps = static_cast<float>(r.eps);
  const float neg_step_size = static_cast<float>(-r.step_size);
  const float grad_scale = static_cast<float>(r.grad_scale);  // as scale_ rounds its factor
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    // Same operations, same order as torch.optim.AdamW's single-tensor path:
    // param.mul_(1 - lr*wd); exp_avg.mul_(b1).add_(g, alpha=1-b1);
    // exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2);
    // denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps); param.addcdiv_(exp_avg, denom, -step_size).
    // Entries without decay multiply by 1, which PyTorch's weight_decay=0 group does too (exact).
    const float gi = g[i] * grad_scale;                // exact when 1 (no clipping)
    const float factor = mask[i] != 0 ? decay : 1.0f;  // a select, so the loop vectorises
    const float pi = p[i] * factor;
    const float mi = m[i] * beta1 + one_minus_beta1 * gi;
    const float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + neg_step_size * mi / denom;
  }
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(adamw_kernel, DeviceType::CPU, cpu::adamw);

}  // namespace
}  // namespace engine
