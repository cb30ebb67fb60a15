// The training step (see trainer.h).
#include "train/trainer.h"

#include <cmath>
#include <memory>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/gradients.h"

namespace engine {

LearningRate constant_lr(double lr) {
  ENGINE_CHECK(std::isfinite(lr) && lr >= 0,
               "[trainer] the learning rate must be finite and >= 0, got ", lr);
  return [lr](int64_t) { return lr; };
}

Trainer::Trainer(FlatParameters& params, const AdamWOptions& adam,
                 std::function<bool(const std::string&)> decay, LearningRate learning_rate,
                 const TrainerOptions& options, Communicator& comm)
    : params_(params),
      comm_(comm),
      options_(options),
      learning_rate_(std::move(learning_rate)),
      optimizer_(std::make_unique<AdamW>(params, adam, std::move(decay))),
      scaler_(options.loss_scale) {
  ENGINE_CHECK(std::isfinite(options.clip_norm) && options.clip_norm >= 0,
               "[trainer] clip_norm must be 0 (off) or positive, got ", options.clip_norm);
  ENGINE_CHECK(options.bucket_mb >= 1, "[trainer] bucket_mb must be at least 1, got ",
               options.bucket_mb);
  ENGINE_CHECK(learning_rate_ != nullptr, "[trainer] no learning rate given");
  reducer_ = std::make_unique<GradReducer>(params, comm, options.bucket_mb << 20);
}

Trainer::~Trainer() = default;

void Trainer::set_steps_taken(int64_t steps) {
  ENGINE_CHECK(steps >= 0, "[trainer] steps taken must be >= 0, got ", steps);
  steps_ = steps;
}

StepStats Trainer::step(int64_t micro_batches, const std::function<Tensor(int64_t)>& loss_of,
                        std::span<const double> weights) {
  ENGINE_CHECK(micro_batches >= 1, "[trainer] a step needs at least one micro-batch, got ",
               micro_batches);
  ENGINE_CHECK(int64_t(weights.size()) == micro_batches, "[trainer] ", weights.size(),
               " weights for ", micro_batches, " micro-batches");
  StepStats s;
  s.lr = learning_rate_(steps_);
  s.loss_scale = scaler_.scale();
  const Tensor& grad = params_.grad();
  params_.zero_grad();
  // sum_m weight_m * loss_m in double on the gradients' device: the number a host sum of the
  // losses read one by one would give, without reading any of them.
  Tensor loss_sum = Tensor::zeros({1}, DType::f64, grad.device());
  // Autocast's casts of the parameters read one 16-bit copy of the slab (engine/autocast.h),
  // made at the first of them and kept for every micro-batch; the slab changes only after them.
  auto cast_once = std::make_unique<AutocastSlab>(params_.data());
  for (int64_t m = 0; m < micro_batches; ++m) {
    const Tensor loss = loss_of(m);
    ENGINE_CHECK(loss.defined() && loss.numel() == 1, "[trainer] micro-batch ", m,
                 " gave no scalar loss (got ",
                 loss.defined() ? describe(loss) : std::string("undefined"), ")");
    const double w = weights[size_t(m)];
    {
      NoGrad ng;
      loss_sum.add_(loss.detach().to(DType::f64).reshape({1}), w);
    }
    if (m + 1 == micro_batches) reducer_->begin();  // only the last backward reduces
    (loss * (s.loss_scale * w)).backward();
  }
  cast_once.reset();  // before anything writes the slab
  reducer_->finish();
  s.comm_exposed_s = reducer_->last_exposed_s();

  // The one read-back of the step: [weighted loss, sum of squares, non-finite count], gathered on
  // the device with the backend's copies.
  Tensor stats = Tensor::empty({3}, DType::f64, grad.device());
  {
    NoGrad ng;
    stats.slice(0, 0, 1).copy_(loss_sum);
    stats.slice(0, 1, 3).copy_(unscale_and_check_(grad, 1.0 / s.loss_scale));
  }
  const std::vector<double> v = stats.to_vector<double>();
  s.loss = comm_.all_reduce(v[0]);  // the gradients are summed already; the loss on the host
  s.grad_norm = std::sqrt(v[1]);
  const bool nonfinite = v[2] > 0 || !std::isfinite(s.grad_norm);
  double clip = 1.0;
  if (!nonfinite && options_.clip_norm > 0) {
    // torch clamps the coefficient to 1 and always multiplies; multiplying by 1 changes nothing.
    // AdamW multiplies each gradient by it as it reads it: the bits of scale_(grad, coef) and
    // then the step, without a pass over the slab (the slab keeps the unclipped gradients).
    clip = clip_coefficient(s.grad_norm, options_.clip_norm);
  }
  s.applied = scaler_.update(nonfinite);
  if (s.applied) optimizer_->step(s.lr, clip);
  ++steps_;
  return s;
}

double clip_coefficient(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

double clip_grad_norm(FlatParameters& params, double max_norm) {
  ENGINE_CHECK(std::isfinite(max_norm) && max_norm > 0,
               "[clip_grad_norm] max_norm must be finite and > 0, got ", max_norm);
  const Tensor& grad = params.grad();
  const std::vector<double> stats = unscale_and_check_(grad, 1.0).to_vector<double>();
  const double norm = std::sqrt(stats[0]);
  if (!std::isfinite(norm)) return norm;
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) scale_(grad, coef);  // the step applies the same coefficient inside AdamW
  return norm;
}

}  // namespace engine
