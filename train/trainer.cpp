// The training step (see trainer.h).
#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/gradients.h"

namespace engine {

LearningRate constant_lr(double lr) {
  ENGINE_CHECK(std::isfinite(lr) && lr >= 0,
               "[trainer] the learning rate must be finite and >= 0, got ", lr);
  return [lr](int64_t) { return lr; };
}

Trainer::Trainer(FlatParameters& params, const OptimizerOptions& optim,
                 std::function<bool(const std::string&)> decay, LearningRate learning_rate,
                 const TrainerOptions& options, Communicator& comm)
    : params_(params),
      comm_(comm),
      options_(options),
      learning_rate_(std::move(learning_rate)),
      optimizer_(make_optimizer(params, optim, std::move(decay))),
      scaler_(options.loss_scale) {
  ENGINE_CHECK(std::isfinite(options.clip_norm) && options.clip_norm >= 0,
               "[trainer] clip_norm must be 0 (off) or positive, got ", options.clip_norm);
  ENGINE_CHECK(options.bucket_mb >= 1, "[trainer] bucket_mb must be at least 1, got ",
               options.bucket_mb);
  ENGINE_CHECK(learning_rate_ != nullptr, "[trainer] no learning rate given");
  reducer_ = std::make_unique<GradReducer>(params, comm, options.bucket_mb << 20, ReduceOp::sum,
                                           options.grad_reduce_dtype);
}

Trainer::~Trainer() = default;

void Trainer::set_steps_taken(int64_t steps) {
  ENGINE_CHECK(steps >= 0, "[trainer] steps taken must be >= 0, got ", steps);
  steps_ = steps;
}

// The step block (f64, on the gradients' device), uploaded whole at the step's start; the step
// writes [5, 8) (the upload's zeros there start the loss sum at 0):
//   0 1 / loss_scale           1 the generator's offset (graph mode)
//   2 3 4 the optimizer's three step scalars (Optimizer::next_step_scalars)
//   5 6 the gradients' sum of squares and non-finite count (with 2-4: the optimizer's controls)
//   7 sum_m weight_m * loss_m
//   8 .. 8+M  loss_scale * weight_m       8+M .. 8+2M  weight_m
namespace {
constexpr int64_t kInvScale = 0, kOffset = 1, kControls = 2, kStats = 5, kLoss = 7, kMicro = 8;
}  // namespace

void Trainer::upload_block(int64_t micro_batches, std::span<const double> weights,
                           const StepStats& s) {
  std::vector<double> h(size_t(kMicro + 2 * micro_batches), 0.0);
  h[kInvScale] = 1.0 / s.loss_scale;
  h[kOffset] = graph_gen_ != nullptr ? static_cast<double>(graph_gen_->offset()) : 0.0;
  const std::array<double, 3> adam = optimizer_->next_step_scalars(s.lr);
  std::copy(adam.begin(), adam.end(), h.begin() + kControls);
  for (int64_t m = 0; m < micro_batches; ++m) {
    h[size_t(kMicro + m)] = s.loss_scale * weights[size_t(m)];
    h[size_t(kMicro + micro_batches + m)] = weights[size_t(m)];
  }
  const Device device = params_.grad().device();
  if (!block_.defined() || block_.numel() != int64_t(h.size()))
    block_ = Tensor::empty(Shape{int64_t(h.size())}, DType::f64, device);
  // One counted host-to-device write into the block's fixed address (a graph reads it there).
  backend(device.type)
      .copy_from_host(block_.raw_data(), h.data(), h.size() * sizeof(double), device.index);
}

// The step's device work, the same every step: run eagerly, or recorded into a graph.
void Trainer::device_step(int64_t micro_batches, const std::function<Tensor(int64_t)>& loss_of,
                          bool in_graph) {
  const auto at = [&](int64_t i, int64_t n = 1) { return block_.slice(0, i, i + n); };
  {
    NoGrad ng;
    if (in_graph) offset_word_.copy_(at(kOffset));  // exact below 2^53 blocks
  }
  params_.zero_grad();
  Tensor loss_sum = at(kLoss);
  // Autocast's casts of the parameters read one 16-bit copy of the slab (engine/autocast.h): the
  // one the last optimizer step wrote, converted again in place when the slab was touched since
  // (a graph's: before each replay), or on the first step one made at the first cast; the slab
  // changes only after every micro-batch.
  if (!in_graph) refresh_copy();
  auto cast_once = std::make_unique<AutocastSlab>(params_.data(), copy_);
  for (int64_t m = 0; m < micro_batches; ++m) {
    const Tensor loss = loss_of(m);
    ENGINE_CHECK(loss.defined() && loss.numel() == 1, "[trainer] micro-batch ", m,
                 " gave no scalar loss (got ",
                 loss.defined() ? describe(loss) : std::string("undefined"), ")");
    // loss_scale * weight_m, rounded to the loss's dtype as a scalar factor would be.
    Tensor multiplier = at(kMicro + m);
    {
      NoGrad ng;
      loss_sum.add_(loss.detach().to(DType::f64).reshape({1}) * at(kMicro + micro_batches + m));
      // a tensor of its own (the backward's seed; never the block itself)
      multiplier = loss.dtype() != DType::f64 ? multiplier.to(loss.dtype()) : multiplier.clone();
    }
    if (m + 1 == micro_batches) reducer_->begin();  // only the last backward reduces
    // The multiplier as the backward's seed: the gradients of loss * multiplier, without the
    // product, a ones seed and the product's backward (three launches for one scalar).
    loss.backward(multiplier.reshape(loss.shape()));
  }
  const Tensor copy = cast_once->copy();
  cast_once.reset();  // before anything writes the slab
  reducer_->finish();
  NoGrad ng;
  // params_.grad(): what the backward left to a deferred zero is zeroed now (FlatParameters).
  unscale_and_check_(params_.grad(), at(kInvScale), at(kStats, 2));
  // The optimizer writes the copy with the new values: the next step converts nothing.
  optimizer_->step_on_device(at(kControls, 5), options_.clip_norm, copy);
  if (!in_graph) {
    copy_ = copy;
    copy_generation_ = params_.data().storage()->generation();
  } else if (copy.defined() && !(copy_.defined() && copy.shares_storage(copy_))) {
    copy_ = Tensor();  // made inside the capture: the graph converts it itself each replay
  }
}

bool Trainer::copy_current() const {
  return copy_.defined() && params_.data().storage()->generation() == copy_generation_;
}

void Trainer::refresh_copy() {
  if (!copy_.defined() || copy_current()) return;
  NoGrad ng;
  copy_.copy_(params_.data());  // written since the last step: one conversion
  copy_generation_ = params_.data().storage()->generation();
}

void Trainer::drop_graph() {
  graph_ = DeviceGraph();
  graph_micro_batches_ = 0;
  warmed_up_ = false;
}

int64_t Trainer::graph_launches() const { return graph_.launches(); }

StepStats Trainer::step(int64_t micro_batches, const std::function<Tensor(int64_t)>& loss_of,
                        std::span<const double> weights) {
  ENGINE_CHECK(micro_batches >= 1, "[trainer] a step needs at least one micro-batch, got ",
               micro_batches);
  ENGINE_CHECK(int64_t(weights.size()) == micro_batches, "[trainer] ", weights.size(),
               " weights for ", micro_batches, " micro-batches");
  StepStats s;
  s.lr = learning_rate_(steps_);
  s.loss_scale = scaler_.scale();
  const Device device = params_.grad().device();
  if (!options_.cuda_graph) {
    upload_block(micro_batches, weights, s);
    device_step(micro_batches, loss_of, false);
  } else {
    ENGINE_CHECK(device.type == DeviceType::CUDA,
                 "[trainer] cuda_graph needs the parameters on a CUDA device, got ", device.str());
    ENGINE_CHECK(comm_.size() == 1,
                 "[trainer] cuda_graph runs on one rank (the gradient "
                 "all-reduce is not captured), got ",
                 comm_.size(), " ranks");
    if (graph_.defined() && graph_micro_batches_ != micro_batches) drop_graph();
    if (!warmed_up_) {  // the first step eagerly: it fills the caches a capture must not build
      upload_block(micro_batches, weights, s);
      device_step(micro_batches, loss_of, false);
      warmed_up_ = true;
    } else {
      if (!graph_.defined()) {
        if (!offset_word_.defined()) offset_word_ = Tensor::zeros({1}, DType::i64, device);
        upload_block(micro_batches, weights, s);  // the block's address is the graph's
        if (graph_gen_ != nullptr)
          graph_gen_->begin_device_offsets(
              reinterpret_cast<const uint64_t*>(offset_word_.data<int64_t>()));
        const bool copy_was_current = copy_current();
        try {
          graph_ = DeviceGraph::capture(device, [&] { device_step(micro_batches, loss_of, true); });
        } catch (...) {
          if (graph_gen_ != nullptr) graph_gen_->end_device_offsets();
          throw;
        }
        // The capture ran nothing: the copy holds the slab's values if it held them before.
        if (copy_was_current) copy_generation_ = params_.data().storage()->generation();
        graph_blocks_ = graph_gen_ != nullptr ? graph_gen_->end_device_offsets() : 0;
        graph_micro_batches_ = micro_batches;
        ++graph_captures_;
      }
      upload_block(micro_batches, weights, s);
      refresh_copy();  // the graph reads the copy as the last replay's optimizer left it
      graph_.replay();
      if (graph_gen_ != nullptr) graph_gen_->skip_blocks(graph_blocks_);
    }
  }
  s.comm_exposed_s = reducer_->last_exposed_s();

  // The step's one read-back, after the optimizer: [sum of squares, non-finite count, weighted
  // loss].
  const std::vector<double> v = block_.slice(0, kStats, kLoss + 1).to_vector<double>();
  s.loss = comm_.all_reduce(v[2]);  // the gradients are summed already; the loss on the host
  s.grad_norm = std::sqrt(v[0]);
  // The rule the optimizer applied on the device (resolve_adamw_controls): skipped when not finite.
  const bool nonfinite = v[1] > 0 || !std::isfinite(s.grad_norm);
  s.applied = scaler_.update(nonfinite);
  if (s.applied) optimizer_->count_step();
  ++steps_;
  return s;
}

double clip_grad_norm(FlatParameters& params, double max_norm) {
  ENGINE_CHECK(std::isfinite(max_norm) && max_norm > 0,
               "[clip_grad_norm] max_norm must be finite and > 0, got ", max_norm);
  const Tensor& grad = params.grad();
  const std::vector<double> stats = unscale_and_check_(grad, 1.0).to_vector<double>();
  const double norm = std::sqrt(stats[0]);
  if (!std::isfinite(norm)) return norm;
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) scale_(grad, coef);  // the step applies the same coefficient inside the optimizer
  return norm;
}

}  // namespace engine
