// The finetuning loop, in the library so users can drive it from their own programs (finetune_app
// is one such program): AdamW (or LAMB) with a linear warmup then linear decay to 0, shuffled
// batches padded to their longest row, gradient clipping, evaluation on dev during training and the
// best weights by the task's score kept (restored into the model at the end). Data parallel over
// engine::world() like the pretraining loop.
//
// Also: batched prediction (sharded over the ranks, gathered on every rank) and the summary of a
// learning-rate x seed sweep (median over seeds per learning rate, the best learning rate).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "data/batch.h"
#include "engine/optim.h"
#include "models/heads.h"

namespace models {

using data::EncodedExample;

struct FinetuneOptions {
  double lr = 2e-5;
  int64_t epochs = 10;
  int64_t batch_size = 32;     // global: split over the ranks
  double warmup_ratio = 0.06;  // of the total steps, then linear decay to 0
  double weight_decay = 0.01;  // not on biases and LayerNorms
  double beta1 = 0.9, beta2 = 0.98, eps = 1e-6;
  std::string optimizer = "adamw";  // adamw | lamb (engine::make_optimizer)
  double clip_norm = 1.0;           // 0 = off; a step with inf/NaN gradients is skipped
  int64_t evals_per_epoch =
      1;  // dev evaluations per epoch (at evenly spaced steps, the last at its end)
  int64_t max_steps =
      0;  // > 0: stop after this many steps (smoke tests); the schedule still spans the epochs
  int64_t eval_batch_size = 64;
  uint64_t seed = 1;         // batch order and dropout (the head's init is the model's)
  int64_t log_every = 50;    // steps between train-loss lines
  std::string metrics_path;  // "": no metrics.jsonl
  bool verbose = true;       // progress lines on stdout (rank 0)
  bool progress = true;      // on a terminal, the step line rewrites itself (stderr)
  int64_t bucket_mb = 25;
  engine::Device device = engine::Device::cpu();  // where the model and its batches live
  std::string precision = "f32";  // f32 | bf16 | fp16: the forward's compute dtype (autocast)
};

// One evaluation: the task's metrics (name, value), and `score`, the number that ranks
// evaluations (higher is better).
struct EvalResult {
  std::vector<std::pair<std::string, double>> metrics;
  double score = 0;
  // Non-empty when every dev prediction (of the first dev split) is the same class: that label
  // ("\"\"" for SQuAD v2.0 answering nothing) — a model no better than a constant.
  std::string one_class;
};
// Evaluates the model (in eval mode) on dev; called on every rank (it may call predict()).
using Evaluator = std::function<EvalResult(BertForFinetuning&)>;

struct FinetuneResult {
  EvalResult best;  // the best evaluation
  int64_t best_step = 0;
  double best_epoch = 0;                                // fractional: step / steps per epoch
  std::vector<std::pair<int64_t, EvalResult>> history;  // (step, evaluation)
  int64_t steps = 0;
  double last_loss = 0;  // mean training loss over the last log window
};

// Trains `model` on `train` and leaves the best evaluated weights in it. The batch order is a
// shuffle per epoch drawn from options.seed; the last batch of an epoch may be smaller (when it
// has fewer examples than ranks, it is dropped). The loss of a batch is the mean over its
// examples across the ranks.
FinetuneResult finetune(BertForFinetuning& model, const std::vector<EncodedExample>& train,
                        const FinetuneOptions& options, const Evaluator& evaluate);

// The model's outputs (eval mode, no dropout) for each example, in order: the logits row
// (classification C values; regression 1; span 2·len values, start then end logits of each of
// the example's len positions). Examples are batched by length; the batches are shared over the
// ranks and the result gathered on every rank.
std::vector<std::vector<float>> predict(BertForFinetuning& model,
                                        const std::vector<EncodedExample>& examples,
                                        int64_t batch_size);

// A sweep: one run per (learning rate, seed) and its best dev evaluation.
struct SweepRun {
  double lr = 0;
  uint64_t seed = 0;
  FinetuneResult result;
};
struct SweepRow {
  double lr = 0;
  std::vector<double> scores;                                  // per seed, in run order
  std::vector<std::pair<std::string, double>> median_metrics;  // each metric's median over seeds
  double median_score = 0;
};
struct SweepSummary {
  std::vector<SweepRow> rows;  // in learning-rate order of first appearance
  size_t best_row = 0;         // the highest median score (the first on ties)
  size_t best_run = 0;         // index into the runs: the best single run of the best row
};
// The median of an even count is the mean of the middle two.
double median(std::vector<double> values);
SweepSummary summarize_sweep(const std::vector<SweepRun>& runs);

}  // namespace models
