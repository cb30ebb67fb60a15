// BERT's masked LM plus ALBERT's sentence-order prediction (Lan et al., 2020), `objective:
// mlm_sop`: the batches are segment pairs whose two segments are swapped in half the rows
// (data/batches.h, "Sentence order"), and a head on [CLS] tells which: BERT's pooler (dense ->
// tanh) then a 2-way classifier, no dropout (as BERT's pretraining heads). Loss = MLM + SOP (the
// mean cross-entropy over the rows that are pairs), as ALBERT.
//
// Why: segment pairs alone give the encoder a separator and a segment change but no reason to
// compare the two segments; the order of two spans of one text can only be told by reading them
// against each other. The pooler it trains is what finetuning's classifier starts from
// (models/heads.h, load_encoder), as BERT's finetuning starts from its NSP-trained pooler.
//
// Parameter names: those of BertForMaskedLM (bert.*, mlm.*), then
//   sop.dense.{weight (d, d), bias (d)}, sop.out.{weight (2, d), bias (2)}
// The MLM part is drawn exactly as a BertForMaskedLM's of the same seed, the head from a stream of
// its own.
#pragma once

#include <cstdint>

#include "data/batch.h"
#include "engine/module.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "models/bert.h"

namespace models {

struct MlmSopOutput {
  Tensor loss;        // scalar f32: mlm_loss + sop_loss
  Tensor mlm_loss;    // mean cross-entropy over the masked positions
  Tensor sop_loss;    // mean cross-entropy over the rows whose sentence label is not -100
  Tensor mlm_logits;  // (M, V) at the batch's positions
  Tensor sop_logits;  // (B, 2): class 1 = swapped
};

class BertForMlmSop : public BertForMaskedLM {
 public:
  BertForMlmSop(const BertConfig& config, uint64_t seed);

 private:
  Generator sop_init_;  // declared first among this class's members: the head draws from it
 public:
  // The batch on the model's device with its sentence_labels (B) (data::BatchOptions::
  // sentence_order, or a batch file's `sentence_labels`); dropout follows training().
  MlmSopOutput forward_sop(const data::MlmBatch& batch, Generator& gen) const;
  // Parts: mlm_loss, sop_loss, and in eval mode sop_accuracy (over the rows that are pairs, read
  // back: evaluation only).
  Output pretrain_forward(const data::MlmBatch& batch, Generator& gen) const override;
  const char* kind() const override { return "bert_mlm_sop"; }
  // forward_sop; the dump adds mlm_loss, sop_loss and sop_logits.
  Output batch_file_forward(const data::MlmBatch& batch, const Tensor& replacements, Generator& gen,
                            engine::NamedTensors* dump) const override;

  engine::Module sop;
  Linear sop_dense, sop_out;
};

}  // namespace models
