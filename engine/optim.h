// Optimizer pieces over a FlatParameters: AdamW (torch.optim.AdamW's arithmetic, amsgrad off) and
// the linear warmup/decay learning rate schedule (transformers' get_linear_schedule_with_warmup).
// The update runs as one kernel launch over the contiguous slabs, so its cost does not grow with
// the number of parameters. Clipping, unscaling and the whole step: train/trainer.h.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "engine/hd.h"
#include "engine/kernel.h"
#include "engine/module.h"
#include "engine/tensor.h"

namespace engine {

// ---- AdamW ------------------------------------------------------------------------------------

struct AdamWOptions {
  double lr = 1e-4;  // the default for step(); a schedule usually passes its own lr each step
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
};

// True for parameters that conventionally get no weight decay: biases (the parameter's own name,
// after the last '.', ends in "bias": "qkv.bias", "mlm.decoder_bias") and normalisation weights
// (the parameter's name or its owning module's name, the component before it, contains "norm" in
// any case: "encoder.layer.0.attention_norm.weight", "embeddings.LayerNorm.weight"). Pass
// `[](const std::string& n) { return !default_no_decay(n); }` as AdamW's `decay`.
bool default_no_decay(const std::string& name);

class AdamW {
 public:
  // Keeps a reference to `params` (which must outlive it). `decay(entry name)` says whether weight
  // decay applies to that parameter; an empty function means all of them. The parameter slab must
  // be f32 (the master copy). The moment slabs are zero f32 slabs with the parameter slab's layout
  // and device.
  AdamW(FlatParameters& params, AdamWOptions options,
        std::function<bool(const std::string&)> decay = {});

  // One update with learning rate `lr` (from a schedule) from the gradients in the grad slab, each
  // multiplied by `grad_scale` first (rounded to f32: the bits scale_(grad, grad_scale) and then a
  // step would give, without the pass over the slab; the slab itself is left as it is). The
  // trainer's gradient clipping passes its coefficient here. Increments step_count() first, so the
  // first call is step 1, as in PyTorch.
  void step(double lr, double grad_scale = 1.0);
  void step() { step(options_.lr); }
  int64_t step_count() const { return step_; }

  // The step with its per-step numbers in device memory, for a step captured once and replayed as
  // a graph (train/trainer.h). `controls` is a contiguous (5) f64 tensor on the slab's device:
  //   [decay_factor, step_size, bias_correction2_sqrt, sum of squared gradients, non-finite count]
  // The first three are next_step_scalars(lr), written before each replay; the last two are
  // unscale_and_check_'s statistics, written by the step itself. The kernel reads them where it
  // runs: it changes nothing when the count is > 0 or the norm sqrt(sum) is not finite (the step
  // is skipped), and otherwise multiplies each gradient by clip_coefficient(norm, clip_norm)
  // (clip_norm 0: by 1), the bits of step(lr, that coefficient). It does not count the step: the
  // caller reads the statistics afterwards and calls count_step() when it was applied.
  void step_on_device(const Tensor& controls, double clip_norm);
  std::array<double, 3> next_step_scalars(double lr) const;
  void count_step() { ++step_; }
  const AdamWOptions& options() const { return options_; }

  // Checkpoint state: "optim.exp_avg" and "optim.exp_avg_sq" (the live f32 slabs, not copies:
  // write them out before the next step) and "optim.step" (a fresh i64 scalar).
  NamedTensors state() const;
  // Copies the three entries above into this optimizer (any device; the moments must be f32 of
  // the slab's shape, the step an i64 scalar >= 0). Names outside "optim." are ignored, so a whole
  // checkpoint can be passed; a missing, repeated or unknown "optim." name is an error.
  void load_state(const NamedTensors& state);

 private:
  FlatParameters& params_;
  AdamWOptions options_;
  Tensor exp_avg_, exp_avg_sq_;
  Tensor decay_mask_;  // u8, slab layout: 1 where weight decay applies
  int64_t step_ = 0;

  void check_slabs() const;
};

// The scalars of one AdamW step, computed on the host in double as PyTorch computes them in
// Python; kernels round them to f32 where PyTorch's tensor ops do.
struct AdamWStepScalars {
  double beta1 = 0, beta2 = 0, eps = 0;
  double decay_factor = 1;           // 1 - lr * weight_decay, applied where the mask is 1
  double step_size = 0;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1;  // sqrt(1 - beta2^t)
  double grad_scale = 1;             // g = grad * f32(grad_scale) (clipping), exact when 1
  // AdamW::step_on_device: when defined, the (5) f64 controls on the slab's device, which replace
  // decay_factor, step_size, bias_correction2_sqrt and grad_scale (resolve_adamw_controls).
  Tensor controls;
  double clip_norm = 0;
};

// The clipping rule, once: max_norm / (norm + 1e-6) when that is below 1, else 1 (torch clamps the
// coefficient to 1; multiplying by 1 changes nothing).
ENGINE_HD double clip_coefficient(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

// What the kernels make of the device controls (AdamW::step_on_device), on the host and on the
// device alike: false when the step is skipped, else the scalars with grad_scale the clipping
// coefficient, as the trainer computes them on the host from the same statistics.
ENGINE_HD bool resolve_adamw_controls(const double* c, double clip_norm, double& decay_factor,
                                      double& step_size, double& bias_correction2_sqrt,
                                      double& grad_scale) {
  const double norm = ::sqrt(c[3]);
  if (c[4] > 0 || !(norm <= 1.7976931348623157e308)) return false;  // inf or NaN: skipped
  decay_factor = c[0];
  step_size = c[1];
  bias_correction2_sqrt = c[2];
  grad_scale = clip_norm > 0 ? clip_coefficient(norm, clip_norm) : 1.0;
  return true;
}

// ---- learning-rate schedule -------------------------------------------------------------------

// Linear warmup from 0 to `peak_lr` over `warmup_steps`, then linear decay to 0 at `total_steps`.
//
// Convention: lr(s) takes s = the number of optimizer steps already taken (AdamW::step_count()
// before the step) and gives the lr of the next step; it is exactly
// peak_lr * lr_lambda(s) of transformers.get_linear_schedule_with_warmup, as LambdaLR applies it:
//   s < warmup:  peak * s / warmup
//   otherwise:   peak * max(0, (total - s) / max(1, total - warmup))
// so lr(0) = 0 (when warmup > 0), lr(1) = peak / warmup, lr(warmup) = peak, lr(total) = 0 and
// every s beyond total gives 0. A loop reproducing a Hugging Face run calls
//   optimizer.step(schedule.lr(optimizer.step_count()));
class LinearSchedule {
 public:
  LinearSchedule(double peak_lr, int64_t warmup_steps, int64_t total_steps);
  // warmup_steps = ceil(warmup_ratio * total_steps), as transformers' TrainingArguments computes
  // it; warmup_ratio in [0, 1].
  static LinearSchedule with_warmup_ratio(double peak_lr, double warmup_ratio, int64_t total_steps);

  double lr(int64_t steps_taken) const;
  double peak_lr() const { return peak_lr_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  double peak_lr_;
  int64_t warmup_steps_, total_steps_;
};

// ---- kernels (one table per launch; backends register implementations) ----------------------

// One AdamW step over whole slabs (all 1-D, contiguous, same numel): param, grad, exp_avg and
// exp_avg_sq f32, decay_mask u8. Per element, in f32 in this order (PyTorch's op order):
//   g = grad * f32(grad_scale)
//   p *= mask ? f32(decay_factor) : 1
//   m = m * f32(beta1) + f32(1 - beta1) * g
//   v = v * f32(beta2) + f32(1 - beta2) * g * g
//   p += f32(-step_size) * m / (sqrt(v) / f32(bias_correction2_sqrt) + f32(eps))
inline Kernel<void(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                   const Tensor& exp_avg_sq, const Tensor& decay_mask, const AdamWStepScalars& s)>
    adamw_kernel{"adamw"};

}  // namespace engine
