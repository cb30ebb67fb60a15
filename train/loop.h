// The scaffolding every training loop rebuilds, once (models::pretrain, models::finetune, a loop
// of your own): the parameters moved into slabs on the device, the Trainer with BERT's decay
// rule (no weight decay on biases and LayerNorms unless asked) and a learning-rate schedule, the
// compute dtype of the precision, each micro-batch's forward under autocast, a metrics.jsonl
// writer, and the progress line with the rate and ETA of each log window. What differs between
// loops (where batches come from, evaluation, checkpoints, early stopping) stays with them:
//
//   engine::TrainingLoop loop(model.named_parameters(), adam, schedule_fn, options);
//   while (...) {
//     engine::StepStats s = loop.step(micro, [&](int64_t m) { return model(batch[m]).loss; }, w);
//     loop.count(tokens);
//     if (log_now) { auto w = loop.window(steps_done, steps_left); loop.progress().print(...); }
//   }
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <span>
#include <string>

#include "engine/comm.h"
#include "engine/dtype.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "engine/progress.h"
#include "engine/rng.h"
#include "train/trainer.h"

namespace engine {

// The compute dtype of a precision on `device`: f32, or bf16 / f16 under engine::Autocast (f32
// master weights, optimizer state and gradient slab). 16-bit precisions need a CUDA device: on
// the CPU the error says so instead of training in f32 silently.
DType compute_dtype(Device device, const std::string& precision);

// The dropout stream of `rank` in a run seeded `seed`, each rank its own. Pretraining's (whose
// initialisation draws from `seed` itself): Philox key seed ^ 0x9E3779B97F4A7C15 ^ rank *
// 0xD1B54A32D192ED03, offset 0; every dropout site of a training forward reserves ceil(n / 4)
// blocks of it in forward order (docs/models.md, "Dropout"). Finetuning's: key seed *
// 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019 + rank. (Two formulas, kept so that recorded runs
// reproduce.)
enum class RunKind { pretraining, finetuning };
Generator dropout_generator(uint64_t seed, int rank, RunKind kind = RunKind::pretraining);

struct LoopOptions {
  Device device = Device::cpu();  // where the parameters, batches and steps live
  std::string precision = "f32";  // f32 | bf16 | fp16
  TrainerOptions trainer;         // clipping, loss scaling, the all-reduce buckets
  bool decay_bias_and_norm = false;
  bool progress = true;  // a progress line on rank 0 (rewritten when stderr is a terminal)
};

class TrainingLoop {
 public:
  // Moves `params` into slabs on options.device (every handle re-pointed) and builds the Trainer
  // on `comm`; `lr(steps taken)` is the schedule.
  TrainingLoop(const NamedTensors& params, const AdamWOptions& adam, LearningRate lr,
               const LoopOptions& options, Communicator& comm = world());

  // One optimizer step (Trainer::step), each micro-batch's forward under autocast(compute()).
  StepStats step(int64_t micro_batches, const std::function<Tensor(int64_t)>& loss_of,
                 std::span<const double> weights);

  // Restarts the clocks of the rate and the ETA (when the steps begin, after set-up and resuming).
  void start_clock();
  // Units (tokens, examples) trained in the current log window.
  void count(int64_t units) { window_units_ += units; }
  struct Window {
    double rate = 0;       // units per second over the window
    double eta_s = 0;      // at the run's mean pace so far
    double elapsed_s = 0;  // since the loop was built
  };
  // Closes the log window: `done` steps run by this loop so far, `left` still to run.
  Window window(int64_t done, int64_t left);

  // metrics.jsonl on rank 0: `append` keeps what the file holds (a resumed run), else it starts
  // empty. Lines are flushed as written; a failed write is an error naming the file.
  void open_metrics(const std::string& path, bool append);
  void write_metrics(const std::string& json_line);

  FlatParameters& flat() { return flat_; }
  Trainer& trainer() { return trainer_; }
  const Trainer& trainer() const { return trainer_; }
  DType compute() const { return compute_; }
  Device device() const { return flat_.data().device(); }
  Communicator& comm() { return comm_; }
  bool root() const { return comm_.is_root(); }
  ProgressLine& progress() { return progress_; }

 private:
  Communicator& comm_;
  DType compute_;
  FlatParameters flat_;
  Trainer trainer_;
  ProgressLine progress_;
  std::ofstream metrics_;
  std::string metrics_path_;
  std::chrono::steady_clock::time_point start_, window_start_;
  int64_t window_units_ = 0;
};

}  // namespace engine
