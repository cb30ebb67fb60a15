// Finetuning heads on the pretrained encoder (BertModel), as BERT and RoBERTa define them:
//   classification  [CLS] -> dense (d, d) -> tanh -> dropout -> out (C, d), cross-entropy
//   regression      the same with one output, mean squared error (STS-B)
//   span            every position -> out (2, d): start and end logits, the mean of the two
//                   cross-entropies over the sequence (SQuAD)
// (BERT's pooler + classifier; RoBERTa adds a dropout before the dense layer.) The head's dropout
// is the model config's hidden_dropout, as in HF (classifier_dropout unset).
//
// Parameter names: bert.* as the pretraining checkpoint (models/bert.h), then
//   classifier.dense.{weight, bias}, classifier.out.{weight, bias}   (classification, regression)
//   qa.out.{weight (2, d), bias (2)}                                  (span)
#pragma once

#include <cstdint>
#include <string>

#include "engine/module.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "models/bert.h"

namespace models {

// What the head predicts: a class, a score or a span; the batches' label layout follows it.
using HeadKind = data::TaskKind;
inline const char* head_kind_name(HeadKind kind) { return data::task_kind_name(kind); }

struct FinetuneOutput {
  Tensor loss;    // scalar f32, undefined when no labels were given
  Tensor logits;  // classification (B, C); regression (B); span (B, T, 2): start, end
};

class BertForFinetuning : public engine::Module {
 public:
  // The encoder is drawn from `seed` like BertForMaskedLM's (then usually replaced by
  // load_encoder); the head from a stream of its own keyed by `seed`, N(0, init_std) weights and
  // zero biases. num_labels: classes (classification), 1 (regression), 2 (span).
  BertForFinetuning(const BertConfig& config, HeadKind kind, int64_t num_labels, uint64_t seed);

 private:
  Generator init_;  // declared first: the encoder draws from it
 public:
  // labels: classification (B) i64 class indices; regression (B) f32 targets; span (B, 2) i64
  // start and end positions (< T). Undefined labels: logits only. Dropout follows training().
  FinetuneOutput forward(const BertInputs& inputs, const Tensor& labels, Generator& gen) const;
  const BertConfig& config() const { return bert.config(); }
  HeadKind kind() const { return kind_; }
  int64_t num_labels() const { return num_labels_; }

  BertModel bert;
  engine::Module classifier, qa;
  std::unique_ptr<Linear> dense, out;

 private:
  HeadKind kind_;
  int64_t num_labels_;
};

// Copies the encoder (every bert.* tensor) of a checkpoint written by pretrain_app or
// save_checkpoint into `model`; the checkpoint's MLM head (mlm.*) and training state are
// ignored. The stored model config must equal the model's (the first difference is named), and
// every encoder tensor must be there with its shape. A classification / regression head's dense
// layer starts from a pretrained pooler (dense + tanh, as BertForSequenceClassification) when the
// checkpoint carries one: the sentence-order head's (sop.dense.*, models/bert_sop.h) or a
// converted Hugging Face model's (hf.bert.pooler.dense.*). Returns how many tensors were loaded.
int64_t load_encoder(const std::string& path, BertForFinetuning& model);

}  // namespace models
