// The masked-LM pretraining loop, in the library so users can drive it from their own programs:
// AdamW with a linear warmup/decay schedule, gradient accumulation, global-norm clipping, loss
// scaling, periodic validation, atomic checkpoints (keep the last K) holding everything a run
// needs to continue bit for bit (weights, optimizer moments, scaler, RNG, schedule position, data
// position), metrics.jsonl and a progress display.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "data/batch.h"
#include "engine/comm.h"
#include "engine/config.h"
#include "engine/loss_scaler.h"
#include "engine/optim.h"
#include "models/bert.h"
#include "models/checkpoint.h"
#include "train/loop.h"
#include "train/trainer.h"

namespace models {

// Where batches come from (the app adapts data::BatchStream to it; tests use synthetic ones).
// Batches come on the host; the loop moves each to the model's device once.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual data::MlmBatch next_train() = 0;
  // The position of the next training batch, as text (stored in checkpoints) and back.
  virtual std::string position() const = 0;
  virtual void seek(const std::string& position) = 0;
  // The validation batches, the same ones every time (fixed masking); at most `max_batches`.
  virtual std::vector<data::MlmBatch> valid_batches(int64_t max_batches) = 0;
};

// Masked-LM evaluation: the loss (mean over predicted tokens), perplexity exp(loss) and top-1
// accuracy of `model` over `batches` (batch i on rank i % size, sums reduced over ranks), with
// dropout off under `compute` autocast; zeros when no token is predicted. With
// `by_position_too`, also the loss by position in the sequence (length generalisation): index t
// holds the summed loss and the count of the predicted tokens at position t, over every batch
// (T = the longest batch's length; a log-sum-exp per predicted token on the host).
struct MlmEval {
  double loss = 0, perplexity = 0, accuracy = 0;
  int64_t predicted = 0, batches = 0;
  std::vector<double> loss_sum_by_position;
  std::vector<int64_t> predicted_by_position;
  // The named parts of the objective's loss (ELECTRA: mlm_loss, rtd_loss), means like `loss`.
  std::vector<std::pair<std::string, double>> parts;
};
// `loss` is the model's objective (MLM; ELECTRA: MLM + rtd_weight x RTD, with the generator's
// draws from a fixed stream); perplexity, accuracy and the loss by position are its MLM head's.
MlmEval evaluate_mlm(PretrainModel& model, const std::vector<data::MlmBatch>& batches,
                     engine::Communicator& comm, engine::DType compute,
                     bool by_position_too = false);

struct PretrainOptions {
  int64_t steps = 1000;       // optimizer steps
  int64_t warmup_steps = -1;  // -1: use warmup_ratio
  double warmup_ratio = 0.06;
  int64_t accumulation = 1;                       // micro-batches per optimizer step
  double clip_norm = 1.0;                         // 0 = no clipping
  engine::Device device = engine::Device::cpu();  // where the model, batches and step run
  std::string precision = "f32";                  // f32 | bf16 | fp16
  engine::LossScalerOptions loss_scale;           // enabled by default for fp16 only
  // Without loss scaling (f32, bf16), a step whose loss or gradients are not finite: "stop" ends
  // the run with an error naming the step, the micro-batch and the last good checkpoint; "skip"
  // leaves the weights as they were and goes on (counted in skipped_steps). With loss scaling
  // (fp16) overflow is expected and the scaler skips the step.
  std::string on_nonfinite = "stop";
  bool decay_bias_and_norm = false;  // false: no weight decay on biases and LayerNorms
  int64_t log_every = 10;
  int64_t valid_every = 200;  // 0 = only at the end
  int64_t valid_batches = 20;
  int64_t save_every = 500;  // 0 = only at the end
  int64_t keep_last = 3;
  std::string out_dir = "runs/pretrain";
  bool progress = true;                   // a progress bar when stderr is a terminal
  int64_t bucket_mb = 25;                 // data parallelism: gradient all-reduce bucket size (MiB)
  std::string grad_reduce_dtype = "f32";  // f32 | bf16: the all-reduce's dtype on the wire
  // CUDA, one rank: each optimizer step replays one captured CUDA graph (train/trainer.h's graph
  // mode); the batches are staged into fixed device tensors, their predictions padded to a
  // capacity (data::StagedMlmBatch). Not for objectives with generator replacements (electra).
  bool cuda_graph = false;
  // Extra metadata for every checkpoint and model.safetensors (not from the config): pretrain_app
  // records the tokenizer ("engine.tokenizer", "engine.tokenizer_lower_case") for finetune_app.
  std::map<std::string, std::string> checkpoint_metadata;
  // Read from a config's `train:` section by models/pretrain_config.h.
};

// The compute dtype of train.precision on `device` (train/loop.h).
using engine::compute_dtype;

struct PretrainResult {
  int64_t start_step = 0, final_step = 0;
  std::vector<double> losses;  // per step run in this call
  double last_valid_loss =
      std::numeric_limits<double>::quiet_NaN();  // NaN: no validation in this call
  std::string final_checkpoint;
  int64_t graph_launches = 0;  // train.cuda_graph: the launches one replay runs (0: no graph)
};

// train.cuda_graph: when `trainer` captured its step since `captures` was last updated, prints
// "cuda graph: step <step> captured; each later step replays it (<n> launches)" and updates it.
void report_graph_capture(const engine::Trainer& trainer, int64_t step, int64_t& captures);

// Runs (or, with resume, continues) pretraining. `config_text` is stored in checkpoints for the
// record. `on_step` (optional) sees (step, loss) after each step.
//
// Data parallel over engine::world() when the job has several ranks: every rank runs this with
// the same options and a BatchSource serving its own shard of each global batch; parameters
// start (and resume) from rank 0's; gradients are summed over the ranks in buckets during the
// last micro-batch's backward, the loss is the mean over every masked token of the global batch;
// validation batches are spread over the ranks; only rank 0 writes checkpoints, metrics and logs.
PretrainResult pretrain(PretrainModel& model, BatchSource& data, const PretrainOptions& options,
                        const engine::OptimizerOptions& adam, uint64_t seed, bool resume,
                        const std::string& config_text = "",
                        const std::function<void(int64_t, double)>& on_step = {});

// The newest complete checkpoint in `<out_dir>/checkpoints`, or "" when there is none.
std::string latest_checkpoint(const std::string& out_dir);

// The pretraining dropout stream of `rank` in a run seeded `seed` (train/loop.h).
using engine::dropout_generator;

}  // namespace models
