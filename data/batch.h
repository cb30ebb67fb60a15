// The batch types a training step consumes, made by the data pipeline with everything the step
// needs as tensors: model inputs, and for masked-LM the flat positions of the predicted tokens
// and their targets (so the forward never looks at labels on the host), plus the counts the loop
// weights micro-batches by (known when the batch is built, never read back from a device).
// Built on the host; `to(device)` moves what the model reads once per micro-batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace data {

// What the encoder reads.
struct EncoderInputs {
  engine::Tensor input_ids;       // (B, T) i64
  engine::Tensor attention_mask;  // (B, T) i64: 1 = token, 0 = padding; undefined = all tokens
  engine::Tensor token_type_ids;  // (B, T) i64 or undefined (only with segment embeddings)
  EncoderInputs to(engine::Device device) const;
};

// A masked-LM batch.
struct MlmBatch {
  EncoderInputs inputs;
  engine::Tensor positions;  // (M) i64: b * T + t of each predicted token, ascending
  engine::Tensor targets;    // (M) i64: the token to predict there
  // (B, T) i64 on the host: the target at each predicted position, -100 elsewhere. For batch
  // files, tests and inspection; the model reads positions and targets.
  engine::Tensor labels;
  // (B) i64, with sentence order only (data/batches.h): 1 = the row's segments swapped, 0 = in
  // order, -100 = a row with no pair; undefined otherwise.
  engine::Tensor sentence_labels;
  int64_t num_tokens = 0;  // non-padding tokens
  // No value of positions repeats: set by the makers that build them in order (make_mlm_batch,
  // the corpus batches) and by a staged batch that pads with unpredicted positions; the model's
  // head then scatters its gradient as one row add each (engine::index_select's `unique`).
  // False for a batch made by hand: the general scatter, correct for any positions.
  bool positions_unique = false;

  int64_t num_predicted() const { return positions.numel(); }
  // inputs, positions, targets and sentence_labels on `device` (labels stays on the host).
  MlmBatch to(engine::Device device) const;
};

// A masked-LM batch kept in fixed device tensors and refilled in place, for a training step
// captured as a graph (train/trainer.h's graph mode), which reads its inputs at the capture's
// addresses. The predicted positions are padded to a capacity (target -100, which the MLM loss
// ignores: its mean divides by the targets not ignored; at the smallest positions no prediction
// takes when the host's positions are unique and enough are left, so the padded ones are unique
// too, else at position 0), so the (M) tensors keep
// their shape from batch to batch: the capacity starts at the first batch's count plus an eighth
// (at least 8, rounded up to 8) and grows the same way past it. batch().num_predicted() is the
// capacity; weight micro-batches by the host batch's count.
class StagedMlmBatch {
 public:
  // Copies the host batch `host` in (one upload per tensor, as to(device) makes). Returns true
  // when the device tensors were (re)allocated — the first batch, another shape, a tensor present
  // or absent where it was not, more predictions than the capacity — or the padded positions'
  // uniqueness changed (the head's backward takes another path): a graph that read the old ones
  // must be captured afresh.
  bool stage(const MlmBatch& host, engine::Device device);
  const MlmBatch& batch() const { return batch_; }

 private:
  MlmBatch batch_;
  engine::Tensor positions_, targets_;  // the padded (capacity) host tensors
};

// An MlmBatch from host (B, T) tensors (any integer dtype; converted to i64): ids, the attention
// mask (undefined: every position is a token), labels (-100 = not predicted) and optionally
// segment ids. Labels are checked here, where batches are made: each must be -100 or an id in
// [0, vocab_size); the error names `source`, the position and the value.
MlmBatch make_mlm_batch(const engine::Tensor& input_ids, const engine::Tensor& attention_mask,
                        const engine::Tensor& labels, const engine::Tensor& token_type_ids,
                        int64_t vocab_size, const std::string& source);

// ---- finetuning --------------------------------------------------------------------------------

// What a task's head predicts: a class, a score, or a span (start and end positions).
enum class TaskKind { classification, regression, span };
const char* task_kind_name(TaskKind kind);  // "classification", "regression", "span"

// One encoded input and its target.
struct EncodedExample {
  std::vector<int32_t> ids;   // [CLS] ... [SEP] (no padding)
  std::vector<int8_t> types;  // segment of each token (ignored when the model has no segments)
  int64_t label = -1;         // classification: the class; span: the start position
  int64_t end = -1;           // span: the end position
  double score = 0;           // regression target
};

// A finetuning batch: rows padded to the longest (ids 0, attention 0 after each row's end; segment
// ids only `with_types`), and labels: classification (B) i64 classes, regression (B) f32 scores,
// span (B, 2) i64 start/end positions (checked to lie inside their example).
struct TaskBatch {
  EncoderInputs inputs;
  engine::Tensor labels;
  TaskBatch to(engine::Device device) const;
};
TaskBatch make_task_batch(const std::vector<EncodedExample>& examples,
                          const std::vector<int64_t>& rows, TaskKind kind, bool with_types);

}  // namespace data
