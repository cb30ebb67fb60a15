// ELECTRA pretraining (Clark et al., 2020) with any positional preset, as the TUPE paper's
// appendix applies TUPE-R to ELECTRA: a small generator (a BERT with the MLM head) fills the masked
// positions by sampling from its softmax, and the discriminator (the encoder that is finetuned)
// tells, for every token, whether it was replaced. Loss = MLM(generator) + rtd_weight x RTD.
//
// The two share their embeddings (token, segment, the input LayerNorm and the input positions:
// a learned table or sinusoid frequencies), as ELECTRA does; what positions do inside attention
// (TUPE's LN_pos, U^Q, U^K and theta, relative tables) is each model's own, since the widths and
// head counts differ. The generator is ELECTRA's: the discriminator's depth, its hidden size,
// FFN size and heads times generator_size (1/4 for Small, 1/3 for Base), its embeddings at the
// discriminator's embedding width (projected in and out).
//
// Parameter names: bert.* is the discriminator exactly as a BertForMaskedLM's encoder
// (models/bert.h), so finetune_app loads it like any pretraining checkpoint; then
//   generator.bert.* (no embeddings of its own except embeddings.project), generator.mlm.*,
//   rtd.dense.{weight (d, d), bias}, rtd.out.{weight (1, d), bias (1)}.
#pragma once

#include <cstdint>
#include <string>

#include "data/batch.h"
#include "engine/module.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "models/bert.h"
#include "models/electra_config.h"

namespace models {

struct ElectraOutput {
  Tensor loss;               // scalar f32: mlm_loss + rtd_weight x rtd_loss
  Tensor mlm_loss;           // the generator's mean cross-entropy over the masked positions
  Tensor rtd_loss;           // the discriminator's mean binary cross-entropy over the tokens
  Tensor mlm_logits;         // (M, V) the generator's, at the batch's positions
  Tensor rtd_logits;         // (B, T) the discriminator's: > 0 means "replaced"
  Tensor sampled;            // (M) i64 the generator's draws (or the replacements given)
  Tensor discriminator_ids;  // (B, T) i64 its input: the original tokens, draws at the positions
  Tensor rtd_labels;         // (B, T) i64: 1 replaced (the draw differs), 0 original, -100 padding
};

class ElectraForPretraining : public PretrainModel {
 public:
  // The discriminator is drawn from `seed` (like a BertForMaskedLM's encoder), the generator
  // from a stream of its own keyed by `seed`, the RTD head after the discriminator.
  ElectraForPretraining(const BertConfig& discriminator, const ElectraConfig& electra,
                        uint64_t seed);

 private:
  Generator init_;  // declared first: the members below draw their initial values from it
 public:
  // The batch on the model's device, masked as for MLM (its targets are the original tokens).
  // Dropout follows training() and draws from `gen`: the generator's forward, then the draws
  // (M x V words of `gen`), then the discriminator's forward. `replacements` (M) i64 given:
  // used instead of drawing (no words taken), for checks against a reference.
  ElectraOutput forward(const data::MlmBatch& batch, Generator& gen,
                        const Tensor& replacements = Tensor()) const;
  Output pretrain_forward(const data::MlmBatch& batch, Generator& gen) const override;
  const BertConfig& config() const override { return bert.config(); }  // the discriminator's
  const char* kind() const override { return "electra"; }
  std::vector<std::pair<std::string, std::string>> checkpoint_metadata() const override;
  // forward with the batch file's replacements; the dump adds mlm_loss, rtd_loss, rtd_logits,
  // rtd_labels and sampled.
  Output batch_file_forward(const data::MlmBatch& batch, const Tensor& replacements, Generator& gen,
                            engine::NamedTensors* dump) const override;
  std::string describe() const override;  // the generator's sizes and the RTD weight
  const ElectraConfig& electra() const { return electra_; }

  BertModel bert;  // the discriminator's encoder
  BertForMaskedLM generator;
  engine::Module rtd;
  Linear rtd_dense, rtd_out;

 private:
  ElectraConfig electra_;
};

}  // namespace models
