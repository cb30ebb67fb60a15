// AdamW and the linear warmup/decay schedule over FlatParameters: argument checks and the host-side
// scalars; the per-element work is in the kernel (engine/cpu/optim_cpu.cpp).
#include "engine/optim.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <vector>

#include "engine/autocast.h"
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

// ---- the optimizers' shared part --------------------------------------------------------------

Optimizer::Optimizer(const char* name, FlatParameters& params, OptimizerOptions options,
                     const std::function<bool(const std::string&)>& decay)
    : name_(name), params_(params), options_(std::move(options)) {
  const Tensor& data = params.data();
  const std::string tag = std::string("[") + name + "] ";
  ENGINE_CHECK(data.dtype() == DType::f32, tag, "parameters must be f32 (the master copy), got ",
               describe(data), "; keep f32 parameters and cast copies for compute");
  ENGINE_CHECK(std::isfinite(options_.lr) && options_.lr >= 0, tag, "lr must be >= 0, got ",
               options_.lr);
  ENGINE_CHECK(options_.beta1 >= 0 && options_.beta1 < 1, tag, "beta1 must be in [0, 1), got ",
               options_.beta1);
  ENGINE_CHECK(options_.beta2 >= 0 && options_.beta2 < 1, tag, "beta2 must be in [0, 1), got ",
               options_.beta2);
  ENGINE_CHECK(std::isfinite(options_.eps) && options_.eps >= 0, tag, "eps must be >= 0, got ",
               options_.eps);
  ENGINE_CHECK(std::isfinite(options_.weight_decay) && options_.weight_decay >= 0, tag,
               "weight_decay must be >= 0, got ", options_.weight_decay);
  options_.name = name;

  exp_avg_ = Tensor::zeros({params.numel()}, DType::f32, data.device());
  exp_avg_sq_ = Tensor::zeros({params.numel()}, DType::f32, data.device());
  // Decay is per parameter, but the kernels run once over the slab: a bit an element (decay_bit;
  // an eighth of a byte against the 30 bytes of p, g, m, v and the copy each element moves)
  // keeps every kernel a flat elementwise loop with no entry lookup. Padding is 0 (it holds
  // zeros either way).
  std::vector<uint8_t> bits(static_cast<size_t>(decay_bits_bytes(params.numel())), 0);
  for (const FlatParameters::Entry& e : params.entries()) {
    const bool on = !decay || decay(e.name);
    decayed_.push_back(on);
    if (on)
      for (int64_t i = e.offset; i < e.offset + e.numel; ++i)
        bits[static_cast<size_t>(i >> 3)] |= static_cast<uint8_t>(1u << (i & 7));
  }
  decay_bits_ = Tensor::from_vector(bits, {decay_bits_bytes(params.numel())}, data.device());
}

Optimizer::~Optimizer() = default;

void Optimizer::check_slabs() const {
  const Tensor& data = params_.data();
  const Tensor& grad = params_.grad();
  ENGINE_CHECK(
      grad.dtype() == DType::f32 && grad.numel() == data.numel() && grad.device() == data.device(),
      "[", name_, "] gradient slab ", describe(grad), " does not match the parameter slab ",
      describe(data));
}

namespace {

void check_lr(const char* name, double lr) {
  ENGINE_CHECK(std::isfinite(lr) && lr >= 0, "[", name,
               "] step lr must be a finite value >= 0, got ", lr);
}

}  // namespace

void Optimizer::step(double lr, double grad_scale) {
  check_lr(name_, lr);
  ENGINE_CHECK(std::isfinite(grad_scale) && grad_scale > 0, "[", name_,
               "] step grad_scale must be a finite value > 0, got ", grad_scale);
  check_slabs();
  ++step_;
  NoGrad ng;
  apply(lr, grad_scale, Tensor(), 0.0, Tensor());
}

void Optimizer::step_on_device(const Tensor& controls, double clip_norm, const Tensor& copy) {
  ENGINE_CHECK(std::isfinite(clip_norm) && clip_norm >= 0, "[", name_,
               "] clip_norm must be 0 (off) or positive, got ", clip_norm);
  check_slabs();
  const Tensor& data = params_.data();
  ENGINE_CHECK(controls.defined() && controls.dtype() == DType::f64 && controls.numel() == 5 &&
                   controls.is_contiguous() && controls.device() == data.device(),
               "[", name_, "] step_on_device: the controls must be a contiguous (5) f64 tensor on ",
               data.device().str(), ", got ",
               controls.defined() ? describe(controls) : std::string("an undefined tensor"));
  ENGINE_CHECK(!copy.defined() || is_16bit_copy_of(copy, data), "[", name_,
               "] step_on_device: the parameters' copy must be a contiguous bf16 or ",
               "f16 tensor of ", data.numel(), " elements on ", data.device().str(), ", got ",
               describe(copy));
  NoGrad ng;
  apply(0.0, 1.0, controls, clip_norm, copy.defined() ? copy.reshape({data.numel()}) : copy);
}

void add_work_cost(WorkCost& cost, const AdamWStepScalars& s) {
  add_work_cost(cost, s.controls);
  add_work_cost(cost, s.copy);
}

void add_work_cost(WorkCost& cost, const LambStepScalars& s) {
  add_work_cost(cost, s.controls);
  add_work_cost(cost, s.copy);
}

NamedTensors Optimizer::state() const {
  return {{"optim.exp_avg", exp_avg_},
          {"optim.exp_avg_sq", exp_avg_sq_},
          {"optim.step", Tensor::scalar(static_cast<double>(step_), DType::i64)}};
}

void Optimizer::load_state(const NamedTensors& state) {
  const Tensor* found[3] = {nullptr, nullptr, nullptr};
  const char* names[3] = {"optim.exp_avg", "optim.exp_avg_sq", "optim.step"};
  for (const auto& [name, t] : state) {
    if (name.rfind("optim.", 0) != 0) continue;  // model weights etc. of a whole checkpoint
    int k = 0;
    while (k < 3 && name != names[k]) ++k;
    ENGINE_CHECK(k < 3, "[", name_, "] load_state: unknown optimizer state '", name,
                 "' (expected optim.exp_avg, optim.exp_avg_sq, optim.step)");
    ENGINE_CHECK(found[k] == nullptr, "[", name_, "] load_state: '", name, "' is given twice");
    ENGINE_CHECK(t.defined(), "[", name_, "] load_state: '", name, "' is undefined");
    found[k] = &t;
  }
  for (int k = 0; k < 3; ++k)
    ENGINE_CHECK(found[k] != nullptr, "[", name_, "] load_state: '", names[k], "' is missing");
  for (int k = 0; k < 2; ++k) {
    const Tensor& t = *found[k];
    ENGINE_CHECK(t.dtype() == DType::f32 && t.shape() == Shape{params_.numel()}, "[", name_,
                 "] load_state: '", names[k], "' is ", describe(t), " but this optimizer's is (",
                 params_.numel(), ") f32 (saved for other parameters?)");
  }
  const Tensor& st = *found[2];
  ENGINE_CHECK(st.dtype() == DType::i64 && st.numel() == 1, "[", name_,
               "] load_state: 'optim.step' is ", describe(st), " but should be an i64 scalar");
  const double step = st.item();
  ENGINE_CHECK(step >= 0, "[", name_, "] load_state: 'optim.step' is ", step, ", expected >= 0");
  NoGrad ng;
  exp_avg_.copy_(*found[0]);
  exp_avg_sq_.copy_(*found[1]);
  step_ = static_cast<int64_t>(step);
}

// ---- AdamW ------------------------------------------------------------------------------------

AdamW::AdamW(FlatParameters& params, OptimizerOptions options,
             std::function<bool(const std::string&)> decay)
    : Optimizer("adamw", params, std::move(options), decay) {}

namespace {

// As torch.optim.AdamW computes them in Python (doubles): beta ** step with a float step.
AdamWStepScalars adamw_scalars(const OptimizerOptions& o, double lr, int64_t step) {
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

void AdamW::apply(double lr, double grad_scale, const Tensor& controls, double clip_norm,
                  const Tensor& copy) {
  const Tensor& data = params_.data();
  // With device controls: the betas and eps; the rest from `controls`.
  AdamWStepScalars s =
      adamw_scalars(options_, controls.defined() ? 0.0 : lr, controls.defined() ? 1 : step_);
  s.grad_scale = grad_scale;
  s.controls = controls;
  s.clip_norm = clip_norm;
  s.copy = copy;
  adamw_kernel(data.device(), data, params_.grad(), exp_avg_, exp_avg_sq_, decay_bits_, s);
}

std::array<double, 3> AdamW::next_step_scalars(double lr) const {
  check_lr(name_, lr);
  const AdamWStepScalars s = adamw_scalars(options_, lr, step_ + 1);
  return {s.decay_factor, s.step_size, s.bias_correction2_sqrt};
}

// ---- LAMB -------------------------------------------------------------------------------------

Lamb::Lamb(FlatParameters& params, OptimizerOptions options,
           std::function<bool(const std::string&)> decay)
    : Optimizer("lamb", params, std::move(options), decay) {
  // The chunks: each entry cut into kLambChunk pieces (entries start 16-aligned, so every chunk
  // starts on a 16-byte vector).
  std::vector<int64_t> chunks, first;
  std::vector<uint8_t> trust;
  const auto& entries = params.entries();
  for (size_t k = 0; k < entries.size(); ++k) {
    first.push_back(static_cast<int64_t>(chunks.size() / 3));
    for (int64_t at = 0; at < entries[k].numel; at += kLambChunk) {
      chunks.push_back(entries[k].offset + at);
      chunks.push_back(std::min(kLambChunk, entries[k].numel - at));
      chunks.push_back(static_cast<int64_t>(k));
    }
    // apex: the ratio where the group's decay is non-zero, or everywhere with use_nvlamb.
    trust.push_back(options_.trust_ratio_all || (decayed()[k] && options_.weight_decay != 0) ? 1
                                                                                             : 0);
  }
  layout_.num_chunks = static_cast<int64_t>(chunks.size() / 3);
  layout_.num_tensors = static_cast<int64_t>(entries.size());
  first.push_back(layout_.num_chunks);
  const Device dev = params.data().device();
  if (chunks.empty()) chunks.assign(3, 0);  // no elements at all: a placeholder, never read
  layout_.chunks = Tensor::from_vector(chunks, {int64_t(chunks.size())}, dev);
  layout_.tensor_chunks = Tensor::from_vector(first, {int64_t(first.size())}, dev);
  layout_.trust = Tensor::from_vector(trust, {int64_t(trust.size())}, dev);
  layout_.partials = Tensor::zeros({2 * std::max<int64_t>(1, layout_.num_chunks)}, DType::f64, dev);
  layout_.step_scales = Tensor::zeros({layout_.num_tensors}, DType::f32, dev);
  if (dev.is_cpu()) layout_.updates = Tensor::zeros({params.numel()}, DType::f32, dev);
}

namespace {

// As apex computes them on the host: 1 - beta^t (bias_correction=1).
LambStepScalars lamb_scalars(const OptimizerOptions& o, double lr, int64_t step) {
  const double t = static_cast<double>(step);
  LambStepScalars s;
  s.beta1 = o.beta1;
  s.beta2 = o.beta2;
  s.eps = o.eps;
  s.weight_decay = o.weight_decay;
  s.lr = lr;
  s.bias_correction1 = 1.0 - std::pow(o.beta1, t);
  s.bias_correction2 = 1.0 - std::pow(o.beta2, t);
  return s;
}

}  // namespace

std::array<double, 3> Lamb::next_step_scalars(double lr) const {
  check_lr(name_, lr);
  const LambStepScalars s = lamb_scalars(options_, lr, step_ + 1);
  return {s.lr, s.bias_correction1, s.bias_correction2};
}

void Lamb::apply(double lr, double grad_scale, const Tensor& controls, double clip_norm,
                 const Tensor& copy) {
  const Tensor& data = params_.data();
  LambStepScalars s =
      lamb_scalars(options_, controls.defined() ? 0.0 : lr, controls.defined() ? 1 : step_);
  s.grad_scale = grad_scale;
  s.controls = controls;
  s.clip_norm = clip_norm;
  s.copy = copy;
  lamb_kernel(data.device(), data, params_.grad(), exp_avg_, exp_avg_sq_, decay_bits_, layout_, s);
}

std::unique_ptr<Optimizer> make_optimizer(FlatParameters& params, const OptimizerOptions& options,
                                          std::function<bool(const std::string&)> decay) {
  if (options.name == "adamw") return std::make_unique<AdamW>(params, options, std::move(decay));
  if (options.name == "lamb") return std::make_unique<Lamb>(params, options, std::move(decay));
  ENGINE_FAIL("[optimizer] unknown optimizer '", options.name, "' (expected adamw or lamb)");
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
