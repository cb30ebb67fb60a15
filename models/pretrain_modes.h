// pretrain_app's modes besides corpus pretraining, in the library (the app parses its command line
// into these options and calls them): the single-batch mode, a fixed batch from a file stepped at
// a constant learning rate for tests and the PyTorch reference (tools/reference/), with a dump of
// step 1's loss, logits, gradients and dropout masks; and the evaluation of a model on any
// prepared corpus. Both print what pretrain_app prints (rank 0 for the evaluation).
#pragma once

#include <cstdint>
#include <string>

#include "engine/device.h"
#include "engine/optim.h"
#include "models/pretrain.h"

namespace models {

struct SingleBatchOptions {
  // A batch file (load_mlm_batch; ELECTRA's optional replacements, MLM + SOP's sentence_labels).
  std::string batch_file;
  int64_t steps = 0;  // AdamW steps on the batch, each printing "step <k> loss <v>"; 0: evaluate
  std::string save;   // "": no model written after the last step
  // "": no dump; else step 1's forward and backward before any step: loss, logits, targets, the
  // objective's extras, grad.<name> of every parameter, dropout_mask.<k> with `dropout`.
  std::string dump;
  bool dropout = false;       // train mode, masks from the pretraining loop's stream of rank 0
  int64_t micro_batches = 1;  // each the batch file with masks of its own, weights 1/M
  bool timing = false;        // "timing: ..." over every step after the first (steps >= 2)
};

// Runs the single-batch mode on `model` (already initialised or loaded) with `train`'s device,
// precision and loss scaling: the library's training step (Trainer) at the constant learning rate
// adam.lr, without clipping (the PyTorch reference runs plain AdamW).
void run_single_batch(PretrainModel& model, const engine::OptimizerOptions& adam, uint64_t seed,
                      const PretrainOptions& train, const SingleBatchOptions& options);

struct CorpusEvalOptions {
  std::string init;             // a pretraining checkpoint
  std::string corpus;           // a directory made by pretrain_app prepare
  std::string split = "valid";  // valid | train
  int64_t batches = 0;          // 0: every batch of the split
  int64_t batch_size = 32;
  int64_t seq_len = 0;      // 0: the model's max_positions, at most 512
  std::string by_position;  // "": none; else a CSV of the mean loss at each position
  engine::Device device = engine::Device::cpu();
  std::string precision = "f32";
};

// The masked-LM loss, perplexity and accuracy of `options.init` on the corpus's split, masked as
// in validation (fixed seed), the batches shared by the ranks; rank 0 prints one line (and writes
// the CSV). A --seq-len beyond the model's position table is an engine::Error with exit code 2
// (a bad command line).
MlmEval evaluate_corpus(const CorpusEvalOptions& options);

}  // namespace models
