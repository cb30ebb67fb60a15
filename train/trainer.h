// One training step for any model whose parameters live in a FlatParameters, shared by the
// pretraining loop, the finetuning loop and pretrain_app's single-batch mode (and usable from a
// program of your own):
//
//   engine::Trainer trainer(flat, adam, decay, options);     // AdamW, scaler, reducer, schedule
//   for (...) {
//     engine::StepStats s = trainer.step(micro_batches, [&](int64_t m) { return loss_of(m); },
//     weights); log(s.loss, s.grad_norm, s.lr, s.applied);
//   }
//
// A step: zero the gradient slab; for each micro-batch m, loss_m = loss_of(m) and a backward of
// loss_m * weight_m * loss_scale (the last backward installs the data-parallel reducer's hook, so
// the gradient all-reduce runs in buckets overlapped with it); unscale the gradients and count
// their non-finite elements with their squared norm in one pass (ops/gradients.h, on the
// gradients' device); read back ONE small tensor (the weighted loss, the squared norm, the
// non-finite count); skip the step when a gradient is not finite (the loss scaler backs off),
// else clip to clip_norm and run AdamW at the schedule's learning rate (the clipping coefficient
// applied by AdamW as it reads each gradient: no pass of its own over the slab, which keeps the
// unclipped gradients); update the scaler.
//
// Weights: the step's loss is sum_m weight_m * loss_m, summed over the ranks. Pretraining weights
// each micro-batch's mean MLM loss by its share of the global count of predicted tokens, so n
// ranks x accumulation k train exactly like one rank with an n*k times larger batch; finetuning
// weights each rank's mean by its share of the global batch.
//
// Host synchronisation: nothing in a step reads a tensor on the host but that one read of three
// numbers, between backward and the optimizer (a GPU waits for one kernel launch there). The
// loss is accumulated on the device in double, so it is the same number a host sum would give.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "engine/comm.h"
#include "engine/data_parallel.h"
#include "engine/loss_scaler.h"
#include "engine/module.h"
#include "engine/optim.h"

namespace engine {

struct TrainerOptions {
  double clip_norm = 1.0;  // global L2 norm clipping (torch.nn.utils.clip_grad_norm_); 0 = off
  LossScalerOptions loss_scale;  // dynamic loss scaling (fp16); off by default
  int64_t bucket_mb = 25;        // data parallelism: gradient all-reduce bucket size (MiB)
};

// The learning rate of the next step, given the optimizer steps already taken (including skipped
// ones). LinearSchedule::lr fits; constant_lr(x) for a fixed rate.
using LearningRate = std::function<double(int64_t steps_taken)>;
LearningRate constant_lr(double lr);

// What a step did (from its one read-back).
struct StepStats {
  double loss = 0;        // sum over micro-batches and ranks of weight_m * loss_m
  double grad_norm = 0;   // global L2 norm of the unscaled, all-reduced gradients, before clipping
  bool applied = true;    // false: a gradient was inf/NaN; the step was skipped
  double lr = 0;          // the learning rate this step used
  double loss_scale = 1;  // the scale this step's backward used
  double comm_exposed_s = 0;  // gradient all-reduce time that backward did not hide
};

class Trainer {
 public:
  // Keeps a reference to `params` and `comm` (both must outlive it). `decay(entry name)` says
  // whether weight decay applies (AdamW's rule; empty = everywhere).
  Trainer(FlatParameters& params, const AdamWOptions& adam,
          std::function<bool(const std::string&)> decay, LearningRate learning_rate,
          const TrainerOptions& options = {}, Communicator& comm = world());
  ~Trainer();

  // One optimizer step over `micro_batches` micro-batches; loss_of(m) runs micro-batch m's forward
  // and returns its scalar loss (recorded by autograd); weights has one entry per micro-batch.
  StepStats step(int64_t micro_batches, const std::function<Tensor(int64_t)>& loss_of,
                 std::span<const double> weights);

  // Optimizer steps taken, including skipped ones: the schedule's position. Checkpoints save it;
  // set it when resuming.
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps);

  AdamW& optimizer() { return *optimizer_; }
  const AdamW& optimizer() const { return *optimizer_; }
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }
  const TrainerOptions& options() const { return options_; }
  FlatParameters& parameters() { return params_; }

 private:
  FlatParameters& params_;
  Communicator& comm_;
  TrainerOptions options_;
  LearningRate learning_rate_;
  std::unique_ptr<AdamW> optimizer_;
  LossScaler scaler_;
  std::unique_ptr<GradReducer> reducer_;
  int64_t steps_ = 0;
};

// The clipping rule, once: max_norm / (norm + 1e-6) when that is below 1, else 1 (torch clamps the
// coefficient to 1; multiplying by 1 changes nothing).
double clip_coefficient(double norm, double max_norm);

// torch.nn.utils.clip_grad_norm_ over a whole gradient slab, on its device: returns the L2 norm
// before clipping (one read of the statistics) and scales the slab by max_norm / (norm + 1e-6)
// when that factor is below 1. A non-finite norm is returned with nothing scaled, so the caller
// can skip the step.
double clip_grad_norm(FlatParameters& params, double max_norm);

}  // namespace engine
