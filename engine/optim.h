// Optimizer pieces over a FlatParameters: AdamW (torch.optim.AdamW's arithmetic, amsgrad off),
// LAMB (You et al. 2019, as NVIDIA's BERT runs it: apex's FusedLAMB) and the linear warmup/decay
// learning rate schedule (transformers' get_linear_schedule_with_warmup). Each update runs over the
// contiguous slabs in a fixed number of kernel launches (AdamW one, LAMB three), so its cost does
// not grow with the number of parameters. Clipping, unscaling and the whole step:
// train/trainer.h.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/hd.h"
#include "engine/kernel.h"
#include "engine/module.h"
#include "engine/tensor.h"

namespace engine {

// ---- the optimizers -----------------------------------------------------------------------------

// The hyperparameters of both optimizers (AdamW's defaults; NVIDIA's BERT runs LAMB with the same
// betas, eps and decay).
struct OptimizerOptions {
  double lr = 1e-4;  // the default for step(); a schedule usually passes its own lr each step
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  std::string name = "adamw";  // make_optimizer: "adamw" | "lamb"
  // LAMB: false applies the trust ratio to the tensors weight decay applies to (apex FusedLAMB's
  // default, use_nvlamb=False, which NVIDIA's BERT pretraining uses: biases and LayerNorms step
  // at lr); true to every tensor (NVLAMB). AdamW ignores it.
  bool trust_ratio_all = false;
};
using AdamWOptions = OptimizerOptions;  // the name before LAMB; the same struct

// True for parameters that conventionally get no weight decay: biases (the parameter's own name,
// after the last '.', ends in "bias": "qkv.bias", "mlm.decoder_bias") and normalisation weights
// (the parameter's name or its owning module's name, the component before it, contains "norm" in
// any case: "encoder.layer.0.attention_norm.weight", "embeddings.LayerNorm.weight"). Pass
// `[](const std::string& n) { return !default_no_decay(n); }` as the optimizer's `decay`.
bool default_no_decay(const std::string& name);

// What AdamW and LAMB share: Adam's two moment slabs, the decay mask, the step count, checkpoint
// state and the step's entry points. The parameter slab must be f32 (the master copy); the
// moment slabs are zero f32 slabs with its layout and device.
class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const char* name() const { return name_; }  // "adamw" | "lamb": messages and checkpoints

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
  //   [s0, s1, s2, sum of squared gradients, non-finite count]
  // s0-s2 are next_step_scalars(lr), written before each replay; the last two are
  // unscale_and_check_'s statistics, written by the step itself. The kernels read them where they
  // run: they change nothing when the count is > 0 or the norm sqrt(sum) is not finite (the step
  // is skipped), and otherwise multiply each gradient by clip_coefficient(norm, clip_norm)
  // (clip_norm 0: by 1), the bits of step(lr, that coefficient). It does not count the step: the
  // caller reads the statistics afterwards and calls count_step() when it was applied.
  // `copy`, when defined (a contiguous bf16 or f16 tensor of the slab's numel on its device):
  // the 16-bit copy of the parameters that autocast's casts read (engine/autocast.h,
  // AutocastSlab), written by the same pass with the updated values, Tensor::to's bits, so the
  // next forward converts nothing; a skipped step leaves it as it is, as it leaves the slab.
  void step_on_device(const Tensor& controls, double clip_norm, const Tensor& copy = Tensor());
  // AdamW: [decay factor, step size, sqrt(bias correction 2)]; LAMB: [lr, bias correction 1,
  // bias correction 2], for the step after the ones taken.
  virtual std::array<double, 3> next_step_scalars(double lr) const = 0;
  void count_step() { ++step_; }
  const OptimizerOptions& options() const { return options_; }

  // Checkpoint state: "optim.exp_avg" and "optim.exp_avg_sq" (the live f32 slabs, not copies:
  // write them out before the next step) and "optim.step" (a fresh i64 scalar). Both optimizers
  // keep the same three: which one wrote them is the caller's to record (models/pretrain.cpp
  // keeps name() in the checkpoint's metadata).
  NamedTensors state() const;
  // Copies the three entries above into this optimizer (any device; the moments must be f32 of
  // the slab's shape, the step an i64 scalar >= 0). Names outside "optim." are ignored, so a whole
  // checkpoint can be passed; a missing, repeated or unknown "optim." name is an error.
  void load_state(const NamedTensors& state);

 protected:
  // `decay(entry name)` says whether weight decay applies to that parameter; an empty function
  // means all of them. Keeps a reference to `params` (which must outlive it).
  Optimizer(const char* name, FlatParameters& params, OptimizerOptions options,
            const std::function<bool(const std::string&)>& decay);
  // The update: host scalars from (lr, grad_scale) at step_count(), or with `controls` defined,
  // the device controls (step_on_device).
  // `copy`: step_on_device's 16-bit copy, or undefined.
  virtual void apply(double lr, double grad_scale, const Tensor& controls, double clip_norm,
                     const Tensor& copy) = 0;
  // Whether weight decay applies to each entry, in entry order.
  const std::vector<bool>& decayed() const { return decayed_; }

  const char* name_;
  FlatParameters& params_;
  OptimizerOptions options_;
  Tensor exp_avg_, exp_avg_sq_;
  Tensor decay_bits_;  // u8, a bit an element of the slab (decay_bit): 1 where weight decay applies
  std::vector<bool> decayed_;
  int64_t step_ = 0;

 private:
  void check_slabs() const;
};

// torch.optim.AdamW's update.
class AdamW final : public Optimizer {
 public:
  AdamW(FlatParameters& params, OptimizerOptions options,
        std::function<bool(const std::string&)> decay = {});
  std::array<double, 3> next_step_scalars(double lr) const override;

 private:
  void apply(double lr, double grad_scale, const Tensor& controls, double clip_norm,
             const Tensor& copy) override;
};

// LAMB's chunking of the slab, on the slab's device, built once (Lamb's constructor).
inline constexpr int64_t kLambChunk = 4096;  // elements; a chunk never crosses a tensor
inline constexpr int64_t kLambLanes = 256;   // the CUDA block's threads; the CPU sums as they do
struct LambLayout {
  Tensor chunks;         // i64 (3 x chunks): each chunk's start, length and tensor (entry) index
  Tensor tensor_chunks;  // i64 (tensors + 1): each tensor's first chunk, then the chunk count
  Tensor trust;          // u8 (tensors): 1 where the trust ratio applies
  Tensor partials;       // f64 (2 x chunks) scratch: each chunk's sums of p^2 and u^2
  Tensor step_scales;    // f32 (tensors) scratch: -(lr x ratio) of each tensor
  // CPU only: f32, slab layout: each element's u, kept from the first pass to the last (on the
  // CPU the update's divisions and square root cost more than the slab's bytes; the CUDA kernels
  // recompute u, the same bits, and need no slab).
  Tensor updates;
  int64_t num_chunks = 0, num_tensors = 0;
};

// LAMB as apex's FusedLAMB computes it (MOMENT_MODE_1, bias correction on, grad averaging on),
// NVIDIA's BERT pretraining optimizer. Per element, with g the (clipped) gradient:
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + wd p   (wd where decay applies)
// then per tensor, from that tensor's norms ||p|| and ||u|| (before the update):
//   ratio = ||p|| / ||u||, or 1 when either is 0 or the trust ratio does not apply to it
//   (options.trust_ratio_all; by default it applies where wd != 0 applies)
//   p -= lr * ratio * u
// Three launches, whatever the number of tensors: moments, u and per-chunk partial sums of p^2
// and u^2 (chunks of kLambChunk elements that never cross a tensor); one block per tensor adds
// its chunks and makes lr * ratio; the update (u recomputed from the stored moments on the device,
// kept in a slab on the CPU: the same bits either way). Every sum in f64 in a fixed order, the
// CPU's the CUDA blocks' own, so a step gives the same bits on either backend and from run to run.
class Lamb final : public Optimizer {
 public:
  Lamb(FlatParameters& params, OptimizerOptions options,
       std::function<bool(const std::string&)> decay = {});
  std::array<double, 3> next_step_scalars(double lr) const override;

 private:
  void apply(double lr, double grad_scale, const Tensor& controls, double clip_norm,
             const Tensor& copy) override;
  LambLayout layout_;
};

// options.name's optimizer: "adamw" or "lamb" (anything else is an error naming both).
std::unique_ptr<Optimizer> make_optimizer(FlatParameters& params, const OptimizerOptions& options,
                                          std::function<bool(const std::string&)> decay = {});

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
  // When defined: a contiguous bf16 or f16 slab of param's numel on its device, written with the
  // updated parameters converted as Tensor::to converts them (untouched when the step is skipped).
  Tensor copy;
};
void add_work_cost(WorkCost& cost, const AdamWStepScalars& s);  // the controls and the copy

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

// Whether weight decay applies to element i of the slab: bit i % 8 of byte i / 8 of the decay
// bits (Optimizer::decay_bits; a bit, not a byte, an element: 1 / 32 of AdamW's traffic was the
// u8 mask's, and 335 MB held at BERT-Large); and the 4 bits of elements i .. i + 3, i a multiple
// of 4 (one 16-byte vector of the slab).
ENGINE_HD bool decay_bit(const uint8_t* bits, int64_t i) {
  return ((bits[i >> 3] >> (i & 7)) & 1u) != 0;
}
ENGINE_HD unsigned decay_bits4(const uint8_t* bits, int64_t i) {
  return (static_cast<unsigned>(bits[i >> 3]) >> (i & 4)) & 15u;
}
// The bytes of decay bits a slab of n elements takes.
inline int64_t decay_bits_bytes(int64_t n) { return (n + 7) / 8; }

// LAMB's trust ratio from a tensor's sums of squares (of p and of its update u), on the host and on
// the device alike: ||p|| / ||u|| where it applies and both are non-zero, else 1.
ENGINE_HD double lamb_trust_ratio(double sum_p2, double sum_u2, bool applies) {
  const double wn = ::sqrt(sum_p2), un = ::sqrt(sum_u2);
  return applies && wn > 0 && un > 0 ? wn / un : 1.0;
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
// exp_avg_sq f32, and the decay bits (u8, decay_bits_bytes(numel): decay_bit). Per element, in
// f32 in this order (PyTorch's op order):
//   g = grad * f32(grad_scale)
//   p *= decay_bit ? f32(decay_factor) : 1
//   m = m * f32(beta1) + f32(1 - beta1) * g
//   v = v * f32(beta2) + f32(1 - beta2) * g * g
//   p += f32(-step_size) * m / (sqrt(v) / f32(bias_correction2_sqrt) + f32(eps))
// and, with s.copy, copy = p converted to its dtype.
inline Kernel<void(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                   const Tensor& exp_avg_sq, const Tensor& decay_bits, const AdamWStepScalars& s)>
    adamw_kernel{"adamw"};

// The scalars of one LAMB step, host doubles (the kernels round lr x ratio, the bias corrections,
// the betas, eps, weight decay and grad_scale to f32 where the update uses them).
struct LambStepScalars {
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  double lr = 0;
  double bias_correction1 = 1, bias_correction2 = 1;  // 1 - beta^t
  double grad_scale = 1;
  // Lamb::step_on_device: the (5) f64 controls [lr, bias correction 1, bias correction 2, sum of
  // squares, non-finite count], resolved by resolve_adamw_controls' rule (the first three in the
  // place of its decay factor, step size and sqrt(bias correction 2)).
  Tensor controls;
  double clip_norm = 0;
  Tensor copy;  // as AdamWStepScalars::copy
};
void add_work_cost(WorkCost& cost, const LambStepScalars& s);  // the controls and the copy

// One LAMB step over whole slabs (param, grad, exp_avg, exp_avg_sq f32, 1-D, contiguous, one
// numel, and the decay bits as adamw_kernel's) with the layout's chunks. Per element, in f32 in
// this order:
//   g = grad * f32(grad_scale)
//   m = m * f32(beta1) + f32(1 - beta1) * g
//   v = v * f32(beta2) + f32(1 - beta2) * g * g
//   u = (m / f32(bc1)) / (sqrt(v / f32(bc2)) + f32(eps)) + (decay_bit ? f32(wd) * p : 0)
//   p = p + f32(-(lr * ratio)) * u
// each chunk's sums of double(p)^2 and double(u)^2 in kLambLanes lanes (lane t: elements
// 4 (t + 256 k) + j, k then j ascending) added in block_sum's butterfly order; each tensor's sums
// over its chunks likewise (lane t: chunks t, t + 256, ...); ratio = sqrt(P) / sqrt(U) in f64.
// With s.copy, copy = p converted to its dtype.
inline Kernel<void(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                   const Tensor& exp_avg_sq, const Tensor& decay_bits, const LambLayout& layout,
                   const LambStepScalars& s)>
    lamb_kernel{"lamb"};

}  // namespace engine
