// One training step for any model whose parameters live in a FlatParameters, shared by the
// pretraining loop, the finetuning loop and pretrain_app's single-batch mode (and usable from a
// program of your own):
//
//   engine::Trainer trainer(flat, optim, decay, options);    // optimizer, scaler, reducer,
//   schedule for (...) {
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
// else clip to clip_norm and run the optimizer (optim.name: AdamW or LAMB, engine/optim.h) at the
// schedule's learning rate (the clipping coefficient applied by the optimizer as it reads each
// gradient: no pass of its own over the slab, which keeps the unclipped gradients); update the
// scaler.
//
// Weights: the step's loss is sum_m weight_m * loss_m, summed over the ranks. Pretraining weights
// each micro-batch's mean MLM loss by its share of the global count of predicted tokens, so n
// ranks x accumulation k train exactly like one rank with an n*k times larger batch; finetuning
// weights each rank's mean by its share of the global batch.
//
// Device-resident step numbers: everything a step needs that changes from step to step (the loss
// scale and its inverse, each micro-batch's weight, the optimizer's learning-rate-derived scalars,
// the dropout generator's offset) is written to one small f64 block on the gradients' device by one
// upload at the step's start; the statistics, the clipping coefficient and the decision to skip
// are computed on the device (Optimizer::step_on_device reads them where it runs). So the device
// work of a step is the same every step, and the step's one host read is at its end: the weighted
// loss, the squared norm and the non-finite count, after the optimizer. The loss is accumulated on
// the device in double, the number a host sum of the losses would give.
//
// Under autocast, the parameters' casts read one 16-bit copy of the slab (engine/autocast.h,
// AutocastSlab) that the optimizer writes as it updates the slab (Optimizer::step_on_device's
// copy), so a step converts nothing; the trainer keeps it while the slab's storage generation
// (engine/storage.h) is the one the optimizer left, and converts afresh after anything else
// touched the slab (a checkpoint load, an edit, an evaluation), by one kernel into the same copy
// before the step (graph mode: before the replay). Its 2 bytes a parameter stay held between steps.
//
// Graph mode (TrainerOptions::cuda_graph, CUDA, one rank): the first step runs eagerly (it builds
// the caches: position constants, autotuned kernels, the allocator's blocks); the second is
// captured as one CUDA graph (engine/graph.h) and replayed; every later step replays it: one
// launch for the forward, backward, statistics and optimizer step of all micro-batches. The
// contract is CUDA graphs': loss_of(m) must read device tensors that keep their addresses and
// shapes from step to step (the caller copies each new batch into them, in place, before step()),
// must not read a device tensor on the host, and must draw random numbers only from the generator
// given to set_graph_generator (its offset then lives in the block, so each replay draws new masks,
// the ones an eager step at that offset would). A different number of micro-batches, or
// drop_graph(), starts over: one eager step, then a new capture.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "engine/comm.h"
#include "engine/data_parallel.h"
#include "engine/graph.h"
#include "engine/loss_scaler.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "engine/rng.h"

namespace engine {

struct TrainerOptions {
  double clip_norm = 1.0;  // global L2 norm clipping (torch.nn.utils.clip_grad_norm_); 0 = off
  LossScalerOptions loss_scale;  // dynamic loss scaling (fp16); off by default
  int64_t bucket_mb = 25;        // data parallelism: gradient all-reduce bucket size (MiB)
  // The gradient all-reduce's dtype on the wire: f32, or bf16 (half the bytes; the slab stays
  // f32: engine/data_parallel.h).
  DType grad_reduce_dtype = DType::f32;
  bool cuda_graph = false;  // capture the step once, replay it (see above)
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
  // Keeps a reference to `params` and `comm` (both must outlive it). `optim.name` picks the
  // optimizer (make_optimizer); `decay(entry name)` says whether weight decay applies (empty =
  // everywhere).
  Trainer(FlatParameters& params, const OptimizerOptions& optim,
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

  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }
  const TrainerOptions& options() const { return options_; }
  FlatParameters& parameters() { return params_; }

  // Graph mode (see the top of the file): the generator loss_of draws from (null: none).
  void set_graph_generator(Generator* gen) { graph_gen_ = gen; }
  // Graph mode: the next step runs eagerly (refilling any cache), the one after captures afresh;
  // call it when the inputs moved or changed shape, or after other work may have replaced a
  // tensor the step reads (a model's cached constants).
  void drop_graph();
  // Launches one replay runs (kernels, copies, GEMMs); 0 before the capture.
  int64_t graph_launches() const;
  int64_t graph_captures() const { return graph_captures_; }  // so far

 private:
  void upload_block(int64_t micro_batches, std::span<const double> weights, const StepStats& s);
  void device_step(int64_t micro_batches, const std::function<Tensor(int64_t)>& loss_of,
                   bool in_graph);
  bool copy_current() const;  // copy_ holds the slab's values (its generation has not moved)
  void refresh_copy();        // converts the slab into copy_ unless copy_current()

  FlatParameters& params_;
  Communicator& comm_;
  TrainerOptions options_;
  LearningRate learning_rate_;
  std::unique_ptr<Optimizer> optimizer_;
  LossScaler scaler_;
  std::unique_ptr<GradReducer> reducer_;
  int64_t steps_ = 0;
  // The step's numbers on the gradients' device (layout: trainer.cpp) and the dropout offset's
  // device word (a graph reads it as a u64).
  Tensor block_, offset_word_;
  // The 16-bit copy of the parameter slab that autocast's casts read (engine/autocast.h) and the
  // optimizer writes beside the slab, and the slab storage's generation (engine/storage.h) when
  // it was last known to hold the slab's values: any access to the slab since (a checkpoint
  // load, an edit, a read) makes the next step convert it again.
  Tensor copy_;
  uint64_t copy_generation_ = 0;
  // Graph mode.
  Generator* graph_gen_ = nullptr;
  bool warmed_up_ = false;
  DeviceGraph graph_;
  int64_t graph_micro_batches_ = 0;
  uint64_t graph_blocks_ = 0;  // Philox blocks one replay draws
  int64_t graph_captures_ = 0;
};

// torch.nn.utils.clip_grad_norm_ over a whole gradient slab, on its device: returns the L2 norm
// before clipping (one read of the statistics) and scales the slab by max_norm / (norm + 1e-6)
// when that factor is below 1. A non-finite norm is returned with nothing scaled, so the caller
// can skip the step.
double clip_grad_norm(FlatParameters& params, double max_norm);

}  // namespace engine
