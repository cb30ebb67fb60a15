// The CPU kernels of the AdamW step (one OpenMP pass over the contiguous slabs) and of the LAMB
// step (three passes, its sums in the CUDA kernels' order: engine/optim.h).
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

// The optimizers' 16-bit copy of the updated slab (AdamWStepScalars::copy): Tensor::to's
// conversion, the backend's own.
void write_copy(const Tensor& param, const Tensor& copy) {
  if (copy.defined()) copy.copy_(param);
}

void adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
           const Tensor& decay_bits, const AdamWStepScalars& s) {
  const int64_t n = param.numel();
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq})
    ENGINE_ASSERT(t->is_contiguous() && t->numel() == n);
  ENGINE_ASSERT(decay_bits.is_contiguous() && decay_bits.numel() == decay_bits_bytes(n));
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const uint8_t* bits = decay_bits.data<uint8_t>();
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
    const float gi = g[i] * grad_scale;                      // exact when 1 (no clipping)
    const float factor = decay_bit(bits, i) ? decay : 1.0f;  // a select
    const float pi = p[i] * factor;
    const float mi = m[i] * beta1 + one_minus_beta1 * gi;
    const float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + neg_step_size * mi / denom;
  }
  write_copy(param, s.copy);
}

// ---- LAMB -------------------------------------------------------------------------------------

// block_sum's order (engine/cuda/kernels.cuh) for kLambLanes values: a butterfly within each warp
// of 32 (lane l adds lane l ^ o for o = 16, 8, 4, 2, 1; all lanes end equal, addition commutes),
// then the same over the warps' results padded with zeros. Exact zeros added change nothing.
double butterfly32(double* w) {
  double next[32];
  for (int o = 16; o > 0; o /= 2) {
    for (int l = 0; l < 32; ++l) next[l] = w[l] + w[l ^ o];
    std::copy(next, next + 32, w);
  }
  return w[0];
}

double block_sum_order(double* lanes) {
  static_assert(kLambLanes % 32 == 0 && kLambLanes <= 1024);
  double warps[32] = {};
  for (int w = 0; w < int(kLambLanes / 32); ++w) warps[w] = butterfly32(lanes + 32 * w);
  return butterfly32(warps);
}

struct LambFloats {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bc1, bc2, eps, wd, grad_scale;
};

// One element's moments (updated in place when `store`) and its update u, every operation rounded
// on its own in the order of engine/optim.h (this file has no FMA contraction).
inline float lamb_update(float p, float g, float& m, float& v, uint8_t decay, const LambFloats& f) {
  const float gi = g * f.grad_scale;
  const float mi = m * f.beta1 + f.one_minus_beta1 * gi;
  const float vi = v * f.beta2 + f.one_minus_beta2 * gi * gi;
  m = mi;
  v = vi;
  const float adam = (mi / f.bc1) / (std::sqrt(vi / f.bc2) + f.eps);
  return decay != 0 ? adam + f.wd * p : adam;
}

void lamb(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
          const Tensor& decay_bits, const LambLayout& layout, const LambStepScalars& s) {
  const int64_t n = param.numel();
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq})
    ENGINE_ASSERT(t->is_contiguous() && t->numel() == n);
  ENGINE_ASSERT(decay_bits.is_contiguous() && decay_bits.numel() == decay_bits_bytes(n));
  double lr = s.lr, bc1 = s.bias_correction1, bc2 = s.bias_correction2, grad_scale = s.grad_scale;
  if (s.controls.defined() &&
      !resolve_adamw_controls(s.controls.data<double>(), s.clip_norm, lr, bc1, bc2, grad_scale))
    return;  // a gradient was not finite: the step is skipped
  const LambFloats f{static_cast<float>(s.beta1),   static_cast<float>(1.0 - s.beta1),
                     static_cast<float>(s.beta2),   static_cast<float>(1.0 - s.beta2),
                     static_cast<float>(bc1),       static_cast<float>(bc2),
                     static_cast<float>(s.eps),     static_cast<float>(s.weight_decay),
                     static_cast<float>(grad_scale)};
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const uint8_t* bits = decay_bits.data<uint8_t>();
  const int64_t* chunks = layout.chunks.data<int64_t>();
  const int64_t* first = layout.tensor_chunks.data<int64_t>();
  const uint8_t* trust = layout.trust.data<uint8_t>();
  double* partials = layout.partials.data<double>();
  float* step_scales = layout.step_scales.data<float>();
  ENGINE_ASSERT(layout.updates.defined() && layout.updates.numel() == n);
  float* updates = layout.updates.data<float>();
  const int64_t num_chunks = layout.num_chunks;
  const bool threaded = n > kParallelMin;

  // 1. Moments and each element's u into the updates slab (a flat loop that vectorises), then the
  // chunk's sums of p^2 and u^2 as the CUDA block adds them: lane t takes elements
  // 4 (t + kLambLanes k) + j, k then j ascending (its 16-byte vectors in turn), then block_sum's
  // order. The lanes are independent, so the loops run over t innermost (vectorised) and each
  // lane still adds in its own order.
#pragma omp parallel for schedule(static) if (threaded)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t start = chunks[3 * c], len = chunks[3 * c + 1];
    float* ub = updates + start;
    float* pc = p + start;
    const float* gc = g + start;
    float* mc = m + start;
    float* vc = v + start;
#pragma omp simd
    for (int64_t e = 0; e < len; ++e)
      ub[e] = lamb_update(pc[e], gc[e], mc[e], vc[e], decay_bit(bits, start + e), f);
    alignas(64) double sp[kLambLanes] = {}, su[kLambLanes] = {};
    for (int64_t k = 0; k < kLambChunk / (4 * kLambLanes); ++k)
      for (int64_t j = 0; j < 4; ++j) {
        const int64_t first_e = 4 * kLambLanes * k + j;
        if (first_e + 4 * (kLambLanes - 1) < len) {  // every lane has its element
#pragma omp simd
          for (int64_t t = 0; t < kLambLanes; ++t) {
            const double pd = pc[first_e + 4 * t], ud = ub[first_e + 4 * t];
            sp[t] += pd * pd;
            su[t] += ud * ud;
          }
        } else {
          for (int64_t t = 0; t < kLambLanes && first_e + 4 * t < len; ++t) {
            const double pd = pc[first_e + 4 * t], ud = ub[first_e + 4 * t];
            sp[t] += pd * pd;
            su[t] += ud * ud;
          }
        }
      }
    partials[2 * c] = block_sum_order(sp);
    partials[2 * c + 1] = block_sum_order(su);
  }
  // 2. Each tensor's norms from its chunks (lane t: chunks t, t + kLambLanes, ...) and its step
  // scale -(lr x ratio).
  for (int64_t k = 0; k < layout.num_tensors; ++k) {
    double sp[kLambLanes], su[kLambLanes];
    for (int64_t t = 0; t < kLambLanes; ++t) {
      double a = 0, b = 0;
      for (int64_t c = first[k] + t; c < first[k + 1]; c += kLambLanes) {
        a += partials[2 * c];
        b += partials[2 * c + 1];
      }
      sp[t] = a;
      su[t] = b;
    }
    step_scales[k] = static_cast<float>(
        -(lr * lamb_trust_ratio(block_sum_order(sp), block_sum_order(su), trust[k] != 0)));
  }
  // 3. The update.
#pragma omp parallel for schedule(static) if (threaded)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t start = chunks[3 * c], len = chunks[3 * c + 1];
    const float scale = step_scales[chunks[3 * c + 2]];
    float* pc = p + start;
    const float* uc = updates + start;
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) pc[e] = pc[e] + scale * uc[e];
  }
  write_copy(param, s.copy);
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(adamw_kernel, DeviceType::CPU, cpu::adamw);
ENGINE_REGISTER_KERNEL(lamb_kernel, DeviceType::CPU, cpu::lamb);

}  // namespace
}  // namespace engine
