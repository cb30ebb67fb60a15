// AdamW and the linear warmup/decay schedule over FlatParameters: argument checks and the host-side
// scalars; the per-element work is in the kernel (engine/cpu/optim_cpu.cpp).
#include "engine/optim.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"

namespace engine {

namespace {

bool contains_norm(const std::string& s) {
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find("norm") != std::string::npos;
}

}  // namespace

bool default_no_decay(const std::string& name) {
  // "a.b.owner.leaf": the parameter's own name and the module that holds it.
  const size_t dot = name.rfind('.');
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  std::string owner;
  if (dot != std::string::npos) {
    const std::string path = name.substr(0, dot);
    const size_t prev = path.rfind('.');
    owner = prev == std::string::npos ? path : path.substr(prev + 1);
  }
  if (leaf.size() >= 4 && leaf.compare(leaf.size() - 4, 4, "bias") == 0) return true;
  return contains_norm(leaf) || contains_norm(owner);
}

// ---- AdamW ------------------------------------------------------------------------------------

AdamW::AdamW(FlatParameters& params, AdamWOptions options,
             std::function<bool(const std::string&)> decay)
    : params_(params), options_(options) {
  const Tensor& data = params.data();
  ENGINE_CHECK(data.dtype() == DType::f32, "[adamw] parameters must be f32 (the master copy), got ",
               describe(data), "; keep f32 parameters and cast copies for compute");
  ENGINE_CHECK(std::isfinite(options.lr) && options.lr >= 0, "[adamw] lr must be >= 0, got ",
               options.lr);
  ENGINE_CHECK(options.beta1 >= 0 && options.beta1 < 1, "[adamw] beta1 must be in [0, 1), got ",
               options.beta1);
  ENGINE_CHECK(options.beta2 >= 0 && options.beta2 < 1, "[adamw] beta2 must be in [0, 1), got ",
               options.beta2);
  ENGINE_CHECK(std::isfinite(options.eps) && options.eps >= 0, "[adamw] eps must be >= 0, got ",
               options.eps);
  ENGINE_CHECK(std::isfinite(options.weight_decay) && options.weight_decay >= 0,
               "[adamw] weight_decay must be >= 0, got ", options.weight_decay);

  exp_avg_ = Tensor::zeros({params.numel()}, DType::f32, data.device());
  exp_avg_sq_ = Tensor::zeros({params.numel()}, DType::f32, data.device());
  // Decay is per parameter, but the kernel runs once over the slab: a u8 mask (one byte against
  // the 28 bytes of p, g, m and v each element already moves) keeps every kernel a flat
  // elementwise loop with no entry lookup, on the CPU and in a future CUDA kernel alike. Padding
  // is 0 (it holds zeros either way).
  std::vector<uint8_t> mask(static_cast<size_t>(params.numel()), 0);
  for (const FlatParameters::Entry& e : params.entries()) {
    const bool on = !decay || decay(e.name);
    std::fill_n(mask.begin() + e.offset, e.numel, static_cast<uint8_t>(on ? 1 : 0));
  }
  decay_mask_ = Tensor::from_vector(mask, {params.numel()}, data.device());
}

void AdamW::check_slabs() const {
  const Tensor& data = params_.data();
  const Tensor& grad = params_.grad();
  ENGINE_CHECK(
      grad.dtype() == DType::f32 && grad.numel() == data.numel() && grad.device() == data.device(),
      "[adamw] gradient slab ", describe(grad), " does not match the parameter slab ",
      describe(data));
}

namespace {

void check_lr(double lr) {
  ENGINE_CHECK(std::isfinite(lr) && lr >= 0, "[adamw] step lr must be a finite value >= 0, got ",
               lr);
}

// As torch.optim.AdamW computes them in Python (doubles): beta ** step with a float step.
AdamWStepScalars scalars_of(const AdamWOptions& o, double lr, int64_t step) {
  const double t = static_cast<double>(step);
  AdamWStepScalars s;
  s.beta1 = o.beta1;
  s.beta2 = o.beta2;
  s.eps = o.eps;
  s.decay_factor = 1.0 - lr * o.weight_decay;
  s.step_size = lr / (1.0 - std::pow(o.beta1, t));
  s.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));
  return s;
}

}  // namespace

void AdamW::step(double lr, double grad_scale) {
  check_lr(lr);
  ENGINE_CHECK(std::isfinite(grad_scale) && grad_scale > 0,
               "[adamw] step grad_scale must be a finite value > 0, got ", grad_scale);
  check_slabs();
  ++step_;
  AdamWStepScalars s = scalars_of(options_, lr, step_);
  s.grad_scale = grad_scale;
  NoGrad ng;
  const Tensor& data = params_.data();
  adamw_kernel(data.device(), data, params_.grad(), exp_avg_, exp_avg_sq_, decay_mask_, s);
}

std::array<double, 3> AdamW::next_step_scalars(double lr) const {
  check_lr(lr);
  const AdamWStepScalars s = scalars_of(options_, lr, step_ + 1);
  return {s.decay_factor, s.step_size, s.bias_correction2_sqrt};
}

void AdamW::step_on_device(const Tensor& controls, double clip_norm) {
  ENGINE_CHECK(std::isfinite(clip_norm) && clip_norm >= 0,
               "[adamw] clip_norm must be 0 (off) or positive, got ", clip_norm);
  check_slabs();
  const Tensor& data = params_.data();
  ENGINE_CHECK(controls.defined() && controls.dtype() == DType::f64 && controls.numel() == 5 &&
                   controls.is_contiguous() && controls.device() == data.device(),
               "[adamw] step_on_device: the controls must be a contiguous (5) f64 tensor on ",
               data.device().str(), ", got ",
               controls.defined() ? describe(controls) : std::string("an undefined tensor"));
  AdamWStepScalars s = scalars_of(options_, 0.0, 1);  // betas and eps; the rest from `controls`
  s.controls = controls;
  s.clip_norm = clip_norm;
  NoGrad ng;
  adamw_kernel(data.device(), data, params_.grad(), exp_avg_, exp_avg_sq_, decay_mask_, s);
}

NamedTensors AdamW::state() const {
  return {{"optim.exp_avg", exp_avg_},
          {"optim.exp_avg_sq", exp_avg_sq_},
          {"optim.step", Tensor::scalar(static_cast<double>(step_), DType::i64)}};
}

void AdamW::load_state(const NamedTensors& state) {
  const Tensor* found[3] = {nullptr, nullptr, nullptr};
  const char* names[3] = {"optim.exp_avg", "optim.exp_avg_sq", "optim.step"};
  for (const auto& [name, t] : state) {
    if (name.rfind("optim.", 0) != 0) continue;  // model weights etc. of a whole checkpoint
    int k = 0;
    while (k < 3 && name != names[k]) ++k;
    ENGINE_CHECK(k < 3, "[adamw] load_state: unknown optimizer state '", name,
                 "' (expected optim.exp_avg, optim.exp_avg_sq, optim.step)");
    ENGINE_CHECK(found[k] == nullptr, "[adamw] load_state: '", name, "' is given twice");
    ENGINE_CHECK(t.defined(), "[adamw] load_state: '", name, "' is undefined");
    found[k] = &t;
  }
  for (int k = 0; k < 3; ++k)
    ENGINE_CHECK(found[k] != nullptr, "[adamw] load_state: '", names[k], "' is missing");
  for (int k = 0; k < 2; ++k) {
    const Tensor& t = *found[k];
    ENGINE_CHECK(t.dtype() == DType::f32 && t.shape() == Shape{params_.numel()},
                 "[adamw] load_state: '", names[k], "' is ", describe(t),
                 " but this optimizer's is (", params_.numel(),
                 ") f32 (saved for other parameters?)");
  }
  const Tensor& st = *found[2];
  ENGINE_CHECK(st.dtype() == DType::i64 && st.numel() == 1, "[adamw] load_state: 'optim.step' is ",
               describe(st), " but should be an i64 scalar");
  const double step = st.item();
  ENGINE_CHECK(step >= 0, "[adamw] load_state: 'optim.step' is ", step, ", expected >= 0");
  NoGrad ng;
  exp_avg_.copy_(*found[0]);
  exp_avg_sq_.copy_(*found[1]);
  step_ = static_cast<int64_t>(step);
}

// ---- learning-rate schedule -------------------------------------------------------------------

LinearSchedule::LinearSchedule(double peak_lr, int64_t warmup_steps, int64_t total_steps)
    : peak_lr_(peak_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  ENGINE_CHECK(std::isfinite(peak_lr) && peak_lr >= 0,
               "[linear_schedule] peak_lr must be finite and >= 0, got ", peak_lr);
  ENGINE_CHECK(total_steps > 0, "[linear_schedule] total_steps must be > 0, got ", total_steps);
  ENGINE_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
               "[linear_schedule] warmup_steps must be in [0, total_steps = ", total_steps,
               "], got ", warmup_steps);
}

LinearSchedule LinearSchedule::with_warmup_ratio(double peak_lr, double warmup_ratio,
                                                 int64_t total_steps) {
  ENGINE_CHECK(warmup_ratio >= 0 && warmup_ratio <= 1,
               "[linear_schedule] warmup_ratio must be in [0, 1], got ", warmup_ratio);
  ENGINE_CHECK(total_steps > 0, "[linear_schedule] total_steps must be > 0, got ", total_steps);
  const auto warmup =
      static_cast<int64_t>(std::ceil(static_cast<double>(total_steps) * warmup_ratio));
  return LinearSchedule(peak_lr, warmup, total_steps);
}

double LinearSchedule::lr(int64_t steps_taken) const {
  ENGINE_CHECK(steps_taken >= 0, "[linear_schedule] steps_taken must be >= 0, got ", steps_taken);
  // transformers' lr_lambda (Python floats), then LambdaLR's base_lr * lambda.
  double factor;
  if (steps_taken < warmup_steps_) {
    factor =
        static_cast<double>(steps_taken) / static_cast<double>(std::max<int64_t>(1, warmup_steps_));
  } else {
    factor =
        std::max(0.0, static_cast<double>(total_steps_ - steps_taken) /
                          static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup_steps_)));
  }
  return peak_lr_ * factor;
}

}  // namespace engine
