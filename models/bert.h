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
  Tensor weight, bias;  // (out, in), (out)
};

// gamma 1, beta 0.
class LayerNorm : public engine::Module {
 public:
  LayerNorm(int64_t width, double eps);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;
};

// T5's bidirectional bucket of the relative position r = j - i: `num_buckets / 2` per direction,
// exact below a quarter of num_buckets, then logarithmic up to max_distance; r > 0 adds
// num_buckets / 2. Boundaries are those of exact arithmetic (a float log can shift one by one).
int64_t t5_bucket(int64_t r, int64_t num_buckets = 32, int64_t max_distance = 128);

// The positional terms of one forward, computed once and shared by every layer.
struct AttentionTerms {
  Tensor bias;        // (1, H, T, T) additive logits (TUPE's term, T5 bias) or undefined
  Tensor shaw_table;  // (R, d_h) relative vectors a_r (Shaw presets) or undefined
  Tensor shaw_index;  // (T, T) i64: c(j - i) + clip
  Tensor pos_query;   // (1, H, T, d_h) p U^Q (bert_a_d) or undefined
  Tensor pos_key;     // (1, H, T, d_h) p U^K (bert_a_d)
};

// Every positional parameter of a preset ("bert.position.*"):
//   table (Tmax, d)                 learned positions (bert_a, bert_r, tupe_*, bert_a_d)
//   freq (d/2)                      learnable_sin_ape frequencies
//   norm.{weight,bias}              TUPE's LN on positions
//   query.{weight,bias}, key.{...}  U^Q, U^K (tupe_*, bert_a_d)
//   cls_theta (2, d)                p_theta1, p_theta2 (tupe_a, tupe_r)
//   relative_table (buckets[+2], H) T5 bias (bert_r, tupe_r; +2 [CLS] rows with cls_reset: code)
//   shaw_table (2 clip + 1, d_h)    learned_rpe;  shaw_freq (d_h / 2): learnable_sin_rpe
class PositionEncoding : public engine::Module {
 public:
  // With `shared`, the input-position parameters (table, freq) are that module's, not drawn or
  // registered here; the attention-side ones (norm, U^Q, U^K, theta, relative tables) are own.
  PositionEncoding(const BertConfig& config, Generator& gen,
                   const PositionEncoding* shared = nullptr);
  // (T, d) added to the token embeddings before the input LayerNorm, or undefined. `device` is the
  // model's (the token embedding's): where the constant tensors of length T are kept.
  Tensor input_term(int64_t seq_len, engine::Device device) const;
  AttentionTerms attention_terms(int64_t seq_len, engine::Device device) const;
  // TUPE's (1, H, T, T) term before adding the relative bias or the reset (for tests and dumps).
  Tensor untied_term(int64_t seq_len) const;
  // theta1, theta2 (each (H)) of TUPE's [CLS] reset.
  std::pair<Tensor, Tensor> cls_thetas() const;
  // The (T, T) bucket map used by the relative table (with [CLS] rows for cls_reset: code).
  std::vector<int64_t> relative_buckets(int64_t seq_len) const;
  // How many times the constant position tensors were built on the host (tests: once per new
  // longest length, not per forward).
  int64_t constant_builds() const { return constant_builds_; }

  Tensor table, freq, cls_theta, relative_table, shaw_table, shaw_freq;
  std::unique_ptr<LayerNorm> norm;
  std::unique_ptr<Linear> query, key;

 private:
  // The tensors of one length T that depend on T alone (never on the batch or the parameters):
  // index maps and masks the attention terms apply, the positions fed to sinusoids. Built on the
  // host once for the longest length so far and kept on the parameters' device; each depends
  // only on i, j or j - i, so a shorter length's are the leading block, copied on the device.
  struct Constants {
    int64_t length = 0;
    engine::Device device;
    Tensor relative_index;              // (T, T) i64: relative_buckets(T)
    Tensor relative_keys;               // its inverted index (sorted_index_keys), for the backward
    Tensor keep, row0, col0;            // (T, T) f32 masks of TUPE's [CLS] reset
    Tensor shaw_index;                  // (T, T) i64: clip(j - i, -c, c) + c
    Tensor positions;                   // (T) f32: 0 .. T-1
    Tensor input_sinusoid;              // (T, d) f32: sin_ape's fixed term
    Tensor shaw_positions, fixed_shaw;  // (2c+1) f32 -c .. c; (2c+1, d_h) sin_rpe's table
  };
  const Constants& constants(int64_t seq_len, engine::Device device) const;
  Constants build_constants(int64_t seq_len, engine::Device device) const;
  void check_length(int64_t seq_len) const;
  double untied_scale() const;                                    // 1 / sqrt(2 d_h)
  Tensor projected_positions(int64_t seq_len, Tensor* pk) const;  // (H, T+2?, d_h) pairs
  BertConfig config_;
  mutable Constants longest_, recent_;  // the longest length built; the last shorter one used
  mutable int64_t constant_builds_ = 0;
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
    Tensor q, k, v;  // (B, H, T, d_h); q, k include bert_a_d's p U^Q, p U^K
    double scale;    // of q.k: 1/sqrt(d_h), TUPE 1/sqrt(2 d_h), bert_a_d 1/sqrt(4 d_h)
  };
  Projected project(const Tensor& x, const AttentionTerms& terms) const;
  Tensor scaled_scores(const Projected& pr, const AttentionTerms& terms) const;
  Tensor self_attention(const Tensor& x, const Tensor& key_mask, const AttentionTerms& terms,
                        Generator& gen) const;
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

  // How many times the positional attention terms were computed (once per forward) and those of
  // the last forward: for tests and the positional dumps.
  int64_t attention_terms_computed() const { return terms_computed_; }
  const AttentionTerms& last_attention_terms() const { return last_terms_; }

  engine::Module embeddings, encoder, layer_list;
  Tensor token_embedding, segment_embedding;
  std::unique_ptr<LayerNorm> embedding_norm, final_norm;
  std::unique_ptr<Linear> embedding_project;  // embedding width -> hidden, when they differ
  std::unique_ptr<PositionEncoding> position;
  std::vector<std::unique_ptr<BertLayer>> layers;

 private:
  BertConfig config_;
  mutable int64_t terms_computed_ = 0;
  mutable AttentionTerms last_terms_;
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
