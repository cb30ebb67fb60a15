// A hand-written BERT encoder with every positional encoding of docs/positional-encodings.md,
// and the masked-LM head. Models call ops (ops/ops.h), never kernels.
//
// Parameter names (the checkpoint names, docs/checkpoint.md):
//   bert.embeddings.token (V, d), bert.embeddings.segment (S, d),
//   bert.embeddings.norm.{weight,bias} bert.embeddings.project.{weight (d, e), bias} (only when
//   model.embedding_size e differs from d) bert.position.*                      the positional
//   parameters of the preset (shared by layers) bert.encoder.layer.<l>.attention.qkv.{weight (3d,
//   d), bias}  rows: Q | K | V, heads contiguous bert.encoder.layer.<l>.attention.out.{weight,
//   bias} bert.encoder.layer.<l>.attention_norm.{weight, bias}
//   bert.encoder.layer.<l>.ffn.fc1.{weight (F, d), bias}, ffn.fc2.{weight (d, F), bias}
//   bert.encoder.layer.<l>.ffn_norm.{weight, bias}
//   bert.encoder.final_norm.{weight, bias}        (pre-LN only)
//   mlm.dense.{weight, bias}, mlm.norm.{weight, bias}, mlm.decoder_bias (V)  (decoder tied to the
//   token embedding)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/batch.h"
#include "engine/module.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "models/bert_config.h"
#include "models/position/encoding.h"
#include "models/position/t5.h"
#include "ops/dropout_add_layer_norm.h"

namespace models {

using engine::Generator;
using engine::Tensor;

// Weights N(0, std), bias 0.
class Linear : public engine::Module {
 public:
  Linear(int64_t in, int64_t out, Generator& gen, double std, bool bias = true);
  Tensor forward(const Tensor& x) const;  // (..., in) -> (..., out)
  // gelu(forward(x)), the bias added inside the GELU's pass (engine::bias_gelu).
  Tensor forward_gelu(const Tensor& x) const;
  // The product for a residual join and, in join_bias, the bias the join is to add: on a device
  // under 16-bit autocast the GEMMs carry it both ways (forward_gelu's rule) and join_bias is
  // undefined, so the join's backward sums two parameter gradients in its warps' shared memory,
  // not three (8 KiB a warp at width 1024, not 12: 20 warps an SM, not 16); elsewhere
  // x weight^T and `bias` (the join adds it in its f32 sum).
  Tensor forward_for_join(const Tensor& x, Tensor& join_bias) const;
  Tensor weight, bias;  // (out, in), (out)
};

// gamma 1, beta 0.
class LayerNorm : public engine::Module {
 public:
  LayerNorm(int64_t width, double eps);
  Tensor forward(const Tensor& x) const;
  // The residual join in one op each way (engine::dropout_add_layer_norm):
  // sum = residual + dropout(h + h_bias, p), normed = this norm of sum.
  engine::DropoutAddNorm forward_residual(const Tensor& h, const Tensor& h_bias,
                                          const Tensor& residual, double p, bool training,
                                          Generator& gen) const;
  // dropout(this norm of x, p) in one op each way (engine::layer_norm_dropout: the embeddings').
  Tensor forward_dropout(const Tensor& x, double p, bool training, Generator& gen) const;
  Tensor weight, bias;
  double eps;
};

class BertLayer : public engine::Module {
 public:
  BertLayer(const BertConfig& config, Generator& gen);
  // x (B, T, d); key_mask (B, T) or undefined.
  Tensor forward(const Tensor& x, const Tensor& key_mask, const AttentionTerms& terms,
                 Generator& gen) const;
  // The attention logits (B, H, T, T) this layer computes for input x (B, T, d), before the key
  // mask and the softmax: scaled content (and Shaw key) scores plus the positional bias. For the
  // positional dumps (identical-word probing).
  Tensor attention_logits(const Tensor& x, const AttentionTerms& terms) const;

  engine::Module attention, ffn;  // name scopes: attention.{qkv,out}, ffn.{fc1,fc2}
  Linear qkv, out, fc1, fc2;
  LayerNorm attention_norm, ffn_norm;

 private:
  struct Projected {
    Tensor q, k, v;  // (B, H, T, d_h); q, k with the terms' additions (bert_a_d) or rotation (rope)
    double scale;    // of q.k: 1/sqrt(scale_factor d_h) (TUPE 2, bert_a_d 4, else 1)
  };
  Projected project(const Tensor& x, const AttentionTerms& terms) const;
  Tensor scaled_scores(const Projected& pr, const AttentionTerms& terms) const;
  // The attention sublayer's output projection and, in join_bias, the bias the residual join is
  // to add (Linear::forward_for_join).
  Tensor self_attention(const Tensor& x, const Tensor& key_mask, const AttentionTerms& terms,
                        Generator& gen, Tensor& join_bias) const;
  BertConfig config_;
};

// input_ids (B, T) i64; attention_mask (B, T) 1 = token, 0 = padding (undefined: all tokens);
// token_type_ids (B, T) i64 or undefined (only with type_vocab_size > 0).
using BertInputs = data::EncoderInputs;

class BertModel : public engine::Module {
 public:
  // Parameters drawn from `init` in registration order (N(0, init_std) weights, zero biases,
  // LayerNorm 1/0, sinusoid frequencies at their formula).
  // With `shared`, the embeddings (token, segment, input LayerNorm, input-position table or
  // frequencies) are that model's, neither drawn nor registered here: ELECTRA's generator uses
  // its discriminator's. The configs must agree on them.
  BertModel(const BertConfig& config, Generator& init, const BertModel* shared = nullptr);
  // -> (B, T, d), the last layer's output. Dropout follows training() and draws from `gen`.
  Tensor forward(const BertInputs& inputs, Generator& gen) const;
  // The first layer's input x^0 = LN(token (+ segment) (+ position)), dropout as in forward.
  Tensor embed(const BertInputs& inputs, Generator& gen) const;
  const BertConfig& config() const { return config_; }

  // How many times the positional attention terms were computed (tests: once per forward).
  int64_t attention_terms_computed() const { return terms_computed_; }

  engine::Module embeddings, encoder, layer_list;
  Tensor token_embedding, segment_embedding;
  std::unique_ptr<LayerNorm> embedding_norm, final_norm;
  std::unique_ptr<Linear> embedding_project;  // embedding width -> hidden, when they differ
  std::unique_ptr<PositionEncoding> position;
  std::vector<std::unique_ptr<BertLayer>> layers;

 private:
  BertConfig config_;
  mutable int64_t terms_computed_ = 0;
};

struct MlmOutput {
  Tensor loss;    // scalar f32: mean cross-entropy over the predicted positions
  Tensor logits;  // (M, V) at the predicted positions, in the batch's order
};

// What the pretraining loop (models/pretrain.h) trains and checkpoints: BERT's masked LM
// (BertForMaskedLM) or ELECTRA (models/electra.h), behind one face.
class PretrainModel : public engine::Module {
 public:
  struct Output {
    Tensor loss;        // scalar f32: what a step minimises
    Tensor mlm_logits;  // (M, V) the MLM head's at the batch's positions (ELECTRA: the generator's)
    // Named parts of the loss for the logs (ELECTRA: mlm_loss, rtd_loss); empty for MLM.
    std::vector<std::pair<std::string, Tensor>> parts;
  };
  // The batch on the model's device; dropout follows training() and draws from `gen`.
  virtual Output pretrain_forward(const data::MlmBatch& batch, Generator& gen) const = 0;
  virtual const BertConfig& config() const = 0;  // the encoder finetuning takes
  virtual const char* kind() const = 0;          // checkpoint kind (engine.model): "bert_mlm", ...
  // Metadata a checkpoint of this model adds (ELECTRA: its own config).
  virtual std::vector<std::pair<std::string, std::string>> checkpoint_metadata() const {
    return {};
  }
  // pretrain_app's single-batch mode (--batch-file): the forward of `batch` with its file's
  // `replacements` (ELECTRA's draws; undefined otherwise), adding to *dump (when not null) the
  // named tensors its dump records beyond the loss, logits and gradients.
  virtual Output batch_file_forward(const data::MlmBatch& batch, const Tensor& replacements,
                                    Generator& gen, engine::NamedTensors* dump) const {
    return pretrain_forward(batch, gen);
  }
  // One line on the model beyond its encoder (ELECTRA: the generator) for the apps, or "".
  virtual std::string describe() const { return ""; }
};

// BERT + the masked-LM head: dense -> GELU -> LayerNorm -> decoder tied to the token embedding
// + bias, evaluated only at the batch's predicted positions (gathered first).
class BertForMaskedLM : public PretrainModel {
 public:
  BertForMaskedLM(const BertConfig& config, uint64_t seed, const BertModel* shared = nullptr);

 private:
  Generator init_;  // declared first: the members below draw their initial values from it
 public:
  // The batch on the model's device (data::MlmBatch::to): the encoder runs on batch.inputs and
  // the head on the rows batch.positions, scored against batch.targets. Nothing is read back.
  MlmOutput forward(const data::MlmBatch& batch, Generator& gen) const;
  Output pretrain_forward(const data::MlmBatch& batch, Generator& gen) const override;
  const BertConfig& config() const override { return bert.config(); }
  const char* kind() const override { return "bert_mlm"; }
  // The parts of forward, for objectives that add a head (models/bert_sop.h): the batch's
  // positions and targets checked; the MLM head on the encoder's output flattened to (B T, d).
  void check_predicted(const data::MlmBatch& batch) const;
  MlmOutput head(const Tensor& flat, const data::MlmBatch& batch) const;

  BertModel bert;
  engine::Module mlm;
  Linear dense;
  LayerNorm norm;
  Tensor decoder_bias;
};

}  // namespace models
