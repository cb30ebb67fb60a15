// The scaffolding every training loop rebuilds, once (models::pretrain, models::finetune, a loop
// of your own): the parameters moved into slabs on the device, the Trainer with BERT's decay
// rule (no weight decay on biases and LayerNorms unless asked) and a learning-rate schedule, the
// compute dtype of the precision, each micro-batch's forward under autocast, a metrics.jsonl
// writer, the progress line with the rate and ETA of each log window, and the loop itself with
// its cadences: when to log, evaluate and checkpoint. What differs between loops (where batches
// come from, what an evaluation computes, what a checkpoint holds) comes in as hooks:
//
//   engine::TrainingLoop loop(model.named_parameters(), adam, schedule_fn, options);
//   engine::LoopHooks hooks;
//   hooks.log.every = 10;
//   hooks.log_line = [&](int64_t step, const StepStats& s, const LoopWindow& w) {...};
//   hooks.eval.every = 200;
//   hooks.evaluate = [&](int64_t step) { return LoopReport{", \"valid_loss\": ...", "..."}; };
//   loop.run(steps, [&](int64_t) {
//     loop.count(tokens);
//     return loop.step(micro, [&](int64_t m) { return model(batch[m]).loss; }, w);
//   }, hooks);
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

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

// When a hook runs: every `every` steps (0: not periodically), at each step listed in `at`, and
// at the run's last step when `at_end`. Steps count from 1 (the number of steps taken).
struct Cadence {
  int64_t every = 0;
  std::vector<int64_t> at;
  bool at_end = true;
  bool due(int64_t step, bool last) const;
};

// What a hook reports: the fields it adds to a metrics.jsonl line (", \"name\": value" each, after
// the line's "{\"step\": N"), and a line for stdout ("": none).
struct LoopReport {
  std::string json, text;
};

// A closed log window (TrainingLoop::window).
struct LoopWindow {
  double rate = 0;       // units per second over the window
  double eta_s = 0;      // at the run's mean pace so far
  double elapsed_s = 0;  // since the loop was built
};

// A loop's own parts, which TrainingLoop::run calls at their cadences. After each step, in this
// order: the evaluation (when due, on every rank: it may be collective); the step's log line (rank
// 0, when due); the checkpoint (rank 0, when due). With `eval_in_step_line` the evaluation's
// fields join the step's metrics line and its text follows the progress line (a step that
// evaluates is logged whatever the log cadence); otherwise it runs after the step's line and
// writes a line of its own, so the log window's rate never includes it.
struct LoopHooks {
  Cadence log;
  bool log_skipped = false;  // also log every step the trainer skipped (inf/NaN gradients)
  // The step's metrics fields and progress line, from its stats and the log window just closed.
  std::function<LoopReport(int64_t step, const StepStats&, const LoopWindow&)> log_line;
  Cadence eval;
  std::function<LoopReport(int64_t step)> evaluate;  // none: no evaluation
  bool eval_in_step_line = false;
  Cadence checkpoint;
  std::function<void(int64_t step)> save;  // none: no checkpoints
};

class TrainingLoop {
 public:
  // Moves `params` into slabs on options.device (every handle re-pointed) and builds the Trainer
  // on `comm`; `lr(steps taken)` is the schedule.
  TrainingLoop(const NamedTensors& params, const OptimizerOptions& adam, LearningRate lr,
               const LoopOptions& options, Communicator& comm = world());

  // One optimizer step (Trainer::step), each micro-batch's forward under autocast(compute()).
  StepStats step(int64_t micro_batches, const std::function<Tensor(int64_t)>& loss_of,
                 std::span<const double> weights);

  // Restarts the clocks of the rate and the ETA (when the steps begin, after set-up and resuming).
  void start_clock();
  // Units (tokens, examples) trained in the current log window.
  void count(int64_t units) { window_units_ += units; }
  // Closes the log window: `done` steps run by this loop so far, `left` still to run.
  LoopWindow window(int64_t done, int64_t left);

  // Runs steps until the Trainer has taken `last_step`: `one_step(steps taken so far)` runs one
  // (its batches, count(), step()) and returns its stats; after each, the hooks at their
  // cadences. Starts the clock first and ends the progress line last; returns the steps run (0
  // for a resumed run that had already finished).
  int64_t run(int64_t last_step, const std::function<StepStats(int64_t)>& one_step,
              const LoopHooks& hooks);

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
