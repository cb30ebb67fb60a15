// The BERT encoder and the MLM head (see bert.h); the positional encodings are components
// (models/position/, docs/positional-encodings.md for the formulas).
#include "models/bert.h"

#include <algorithm>
#include <cmath>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "models/objective.h"
#include "ops/ops.h"

namespace models {

using engine::DType;
using engine::NoGrad;
using engine::Shape;

// ---- building blocks ---------------------------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, Generator& gen, double std, bool has_bias) {
  weight = register_parameter("weight", Tensor::randn({out, in}, gen, 0.0, std));
  if (has_bias) bias = register_parameter("bias", Tensor::zeros({out}));
}

Tensor Linear::forward(const Tensor& x) const { return engine::linear(x, weight, bias); }

namespace {

// Whether a linear's bias rides its GEMMs both ways (the forward's BIAS epilogue; the weight
// gradient's GEMM sums its gradient, linear's bias_grad epilogue) rather than the next op's pass:
// on a device under 16-bit autocast (forward_gelu, forward_for_join).
bool bias_on_gemm(const Tensor& x) { return !x.device().is_cpu() && engine::autocast_active(); }

}  // namespace

Tensor Linear::forward_for_join(const Tensor& x, Tensor& join_bias) const {
  if (bias.defined() && bias_on_gemm(x)) {
    join_bias = Tensor();
    return engine::linear(x, weight, bias);
  }
  join_bias = bias;
  return engine::linear(x, weight);
}

Tensor Linear::forward_gelu(const Tensor& x) const {
  if (!bias.defined()) return engine::gelu(engine::linear(x, weight));
  // Where the bias rides the GEMMs (bias_on_gemm) GELU's backward is elementwise; elsewhere
  // bias_gelu sums the bias's gradient in the pass that makes GELU's (the same passes over the
  // activations, no column sums of their own left).
  if (bias_on_gemm(x)) return engine::gelu(engine::linear(x, weight, bias));
  return engine::bias_gelu(engine::linear(x, weight), bias);
}

LayerNorm::LayerNorm(int64_t width, double eps_) : eps(eps_) {
  weight = register_parameter("weight", Tensor::ones({width}));
  bias = register_parameter("bias", Tensor::zeros({width}));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return engine::layer_norm(x, weight, bias, eps);
}

Tensor LayerNorm::forward_dropout(const Tensor& x, double p, bool training, Generator& gen) const {
  return engine::layer_norm_dropout(x, weight, bias, p, training, gen, eps);
}

engine::DropoutAddNorm LayerNorm::forward_residual(const Tensor& h, const Tensor& h_bias,
                                                   const Tensor& residual, double p, bool training,
                                                   Generator& gen) const {
  return engine::dropout_add_layer_norm(h, h_bias, residual, p, training, gen, weight, bias, eps);
}

// ---- the encoder layer -------------------------------------------------------------------------

BertLayer::BertLayer(const BertConfig& c, Generator& gen)
    : qkv(c.hidden_size, 3 * c.hidden_size, gen, c.init_std),
      out(c.hidden_size, c.hidden_size, gen, c.init_std),
      fc1(c.hidden_size, c.ffn_size, gen, c.init_std),
      fc2(c.ffn_size, c.hidden_size, gen, c.init_std),
      attention_norm(c.hidden_size, c.layer_norm_eps),
      ffn_norm(c.hidden_size, c.layer_norm_eps),
      config_(c) {
  attention.register_module("qkv", qkv);
  attention.register_module("out", out);
  ffn.register_module("fc1", fc1);
  ffn.register_module("fc2", fc2);
  register_module("attention", attention);
  register_module("attention_norm", attention_norm);
  register_module("ffn", ffn);
  register_module("ffn_norm", ffn_norm);
}

BertLayer::Projected BertLayer::project(const Tensor& x, const AttentionTerms& terms) const {
  const int64_t b = x.size(0), t = x.size(1), h = config_.num_heads, dh = config_.head_size();
  // (B, T, 3d) -> 3 x (B, H, T, d_h): views, no copies; their gradients go back into one
  // (B, T, 3d) tensor (unbind).
  std::vector<Tensor> qkv3 =
      qkv.forward(x).view({b, t, 3, h, dh}).permute({2, 0, 3, 1, 4}).unbind(0);
  Projected pr{qkv3[0], qkv3[1], qkv3[2], 1.0 / std::sqrt(terms.scale_factor * double(dh))};
  if (terms.pos_query.defined()) {
    // (q + pU^Q) . (k + pU^K) = q.k + q.pU^K + pU^Q.k + pU^Q.pU^K: the four terms in one
    // product of the usual width (the (1, H, T, d_h) terms broadcast over the batch).
    pr.q = pr.q + terms.pos_query;
    pr.k = pr.k + terms.pos_key;
  }
  if (terms.rotary_cos.defined()) {  // RoPE: q and k rotated pairwise by their positions' angles
    pr.q = engine::rotary(pr.q, terms.rotary_cos, terms.rotary_sin);
    pr.k = engine::rotary(pr.k, terms.rotary_cos, terms.rotary_sin);
  }
  return pr;
}

// Shaw: logits q_i.(k_j + a_c(j-i)) scale. The key term depends on q, so it is q A^T (B, H, T, R)
// gathered per (i, j), never a (T, T, d_h) tensor. Without Shaw: q_i.k_j scale.
Tensor BertLayer::scaled_scores(const Projected& pr, const AttentionTerms& terms) const {
  Tensor scores = engine::matmul(pr.q, pr.k.transpose(2, 3));
  if (terms.shaw_table.defined())
    scores =
        scores + engine::relative_gather(engine::matmul(pr.q, terms.shaw_table.transpose(0, 1)),
                                         terms.shaw_index, terms.shaw_inverse);
  return scores * pr.scale;
}

Tensor BertLayer::attention_logits(const Tensor& x, const AttentionTerms& terms) const {
  Projected pr = project(config_.pre_layer_norm ? attention_norm.forward(x) : x, terms);
  Tensor scores = scaled_scores(pr, terms);
  return terms.bias.defined() ? scores + terms.bias : scores;
}

Tensor BertLayer::self_attention(const Tensor& x, const Tensor& key_mask,
                                 const AttentionTerms& terms, Generator& gen,
                                 Tensor& join_bias) const {
  const int64_t b = x.size(0), t = x.size(1), h = config_.num_heads, dh = config_.head_size();
  Projected pr = project(x, terms);
  const Tensor &q = pr.q, &k = pr.k, &v = pr.v;
  const double scale = pr.scale;
  const bool training = this->training();
  const double p_drop = training ? config_.attention_dropout : 0.0;
  Tensor ctx;  // (B, H, T, d_h)
  engine::AttentionOptions opt;
  opt.scale = scale;
  opt.bias = terms.bias;
  opt.key_mask = key_mask;
  opt.dropout_p = p_drop;
  opt.training = training;
  opt.generator = &gen;
  if (!terms.shaw_table.defined()) {
    ctx = engine::attention(q, k, v, opt);
  } else {
    // Shaw: logits q_i.(k_j + a_c(j-i)) scale, values v_j + a_c(j-i), inside the op: never a
    // (T, T, d_h) tensor, and on a device in 16 bits never a (B, H, T, T) one (the fused
    // kernels make q A^T and the probabilities' sums per bucket themselves).
    engine::RelativeTerms rel;
    rel.table = terms.shaw_table;  // (2 clip + 1, d_h)
    rel.clip = (rel.table.size(0) - 1) / 2;
    rel.index = terms.shaw_index;
    rel.inverse = terms.shaw_inverse;
    ctx = engine::attention(q, k, v, opt, rel);
  }
  Tensor merged = ctx.permute({0, 2, 1, 3}).reshape({b, t, h * dh});  // (B, T, d)
  return out.forward_for_join(merged, join_bias);
}

Tensor BertLayer::forward(const Tensor& x, const Tensor& key_mask, const AttentionTerms& terms,
                          Generator& gen) const {
  const bool training = this->training();
  const double p = config_.hidden_dropout;
  // Each residual join is one op (bias + dropout + add + LayerNorm, one pass each way); the
  // sublayers' last GEMMs leave their biases to it, or carry them on a device under autocast
  // (Linear::forward_for_join).
  Tensor join_bias;
  if (config_.pre_layer_norm) {
    // y = x + dropout(attention(LN1(x))); LN2(y) from the same pass.
    const Tensor h = self_attention(attention_norm.forward(x), key_mask, terms, gen, join_bias);
    const engine::DropoutAddNorm y = ffn_norm.forward_residual(h, join_bias, x, p, training, gen);
    return y.sum + engine::dropout(fc2.forward(fc1.forward_gelu(y.normed)), p, training, gen);
  }
  const Tensor h = self_attention(x, key_mask, terms, gen, join_bias);
  const Tensor y = attention_norm.forward_residual(h, join_bias, x, p, training, gen).normed;
  const Tensor f = fc2.forward_for_join(fc1.forward_gelu(y), join_bias);
  return ffn_norm.forward_residual(f, join_bias, y, p, training, gen).normed;
}

// ---- the model ---------------------------------------------------------------------------------

BertModel::BertModel(const BertConfig& c, Generator& gen, const BertModel* shared) : config_(c) {
  c.validate();
  const int64_t d = c.hidden_size, e = c.embedding_width();
  embedding_norm = std::make_unique<LayerNorm>(e, c.layer_norm_eps);
  if (shared) {
    // The other model's embeddings, registered there only (so listed, saved and updated once).
    const BertConfig& o = shared->config();
    ENGINE_CHECK(o.vocab_size == c.vocab_size && o.embedding_width() == e &&
                     o.type_vocab_size == c.type_vocab_size && o.max_positions == c.max_positions &&
                     o.position.input_name() == c.position.input_name() &&
                     o.layer_norm_eps == c.layer_norm_eps,
                 "[bert] shared embeddings need the same vocab_size, embedding width, "
                 "type_vocab_size, max_positions, input positions and layer_norm_eps; got ",
                 c.to_json(), " and ", o.to_json());
    token_embedding = shared->token_embedding;
    segment_embedding = shared->segment_embedding;
    embedding_norm->weight = shared->embedding_norm->weight;
    embedding_norm->bias = shared->embedding_norm->bias;
  } else {
    token_embedding = embeddings.register_parameter(
        "token", Tensor::randn({c.vocab_size, e}, gen, 0.0, c.init_std));
    if (c.type_vocab_size > 0)
      segment_embedding = embeddings.register_parameter(
          "segment", Tensor::randn({c.type_vocab_size, e}, gen, 0.0, c.init_std));
    embeddings.register_module("norm", *embedding_norm);
  }
  if (e != d) {
    embedding_project = std::make_unique<Linear>(e, d, gen, c.init_std);
    embeddings.register_module("project", *embedding_project);
  }
  register_module("embeddings", embeddings);

  position = std::make_unique<PositionEncoding>(c, gen, shared ? shared->position.get() : nullptr);
  register_module("position", *position);

  for (int64_t l = 0; l < c.num_layers; ++l) {
    layers.push_back(std::make_unique<BertLayer>(c, gen));
    layer_list.register_module(std::to_string(l), *layers.back());
  }
  encoder.register_module("layer", layer_list);
  if (c.pre_layer_norm) {
    final_norm = std::make_unique<LayerNorm>(d, c.layer_norm_eps);
    encoder.register_module("final_norm", *final_norm);
  }
  register_module("encoder", encoder);
}

Tensor BertModel::embed(const BertInputs& in, Generator& gen) const {
  const Tensor& ids = in.input_ids;
  ENGINE_CHECK(ids.defined() && ids.dim() == 2, "[bert] input_ids must be (B, T), got ",
               engine::describe(ids));
  const int64_t b = ids.size(0), t = ids.size(1);
  if (in.attention_mask.defined())
    ENGINE_CHECK(in.attention_mask.shape() == ids.shape(), "[bert] attention_mask ",
                 engine::describe(in.attention_mask), " does not match input_ids ",
                 engine::describe(ids));
  if (in.token_type_ids.defined()) {
    ENGINE_CHECK(
        config_.type_vocab_size > 0,
        "[bert] token_type_ids given but the model has no segment embeddings (type_vocab_size 0)");
    ENGINE_CHECK(in.token_type_ids.shape() == ids.shape(), "[bert] token_type_ids ",
                 engine::describe(in.token_type_ids), " does not match input_ids ",
                 engine::describe(ids));
  }
  Tensor pos = position->input_term(t, ids.device());  // (T, e), broadcast over the batch
  // With the token rows the only term, on a device under autocast with the parameter slab's
  // 16-bit copy (engine::autocast_from_slab: a view, no kernel), they are gathered from that
  // copy: half the bytes, no conversion pass, the same bits as converting the f32 rows; their
  // gradient is scattered from 16 bits into the f32 .grad. With more terms (or no slab) the rows
  // stay f32 and are summed in f32, as before.
  Tensor table;
  if (!segment_embedding.defined() && !pos.defined() && !ids.device().is_cpu())
    table = engine::autocast_from_slab(token_embedding);
  Tensor x = engine::embedding(table.defined() ? table : token_embedding, ids);  // (B, T, e)
  if (segment_embedding.defined()) {
    Tensor types = in.token_type_ids.defined() ? in.token_type_ids
                                               : Tensor::zeros({b, t}, DType::i64, ids.device());
    x = x + engine::embedding(segment_embedding, types);
  }
  if (pos.defined()) x = x + pos;
  x = embedding_norm->forward_dropout(x, config_.hidden_dropout, training(), gen);
  if (embedding_project) x = embedding_project->forward(x);  // (B, T, d)
  return x;
}

Tensor BertModel::forward(const BertInputs& in, Generator& gen) const {
  Tensor x = embed(in, gen);
  const int64_t t = x.size(1);

  // Once per forward: every layer adds the same (1, H, T, T) term, so its gradient is summed
  // over layers and batch by the autograd graph, and it is never copied per example.
  const AttentionTerms terms = position->attention_terms(t, x.device());
  ++terms_computed_;
  // The key mask as the attention kernels read it (f32, nonzero = attend), converted once, not
  // by every layer.
  const Tensor key_mask =
      in.attention_mask.defined() ? in.attention_mask.to(engine::DType::f32) : Tensor();
  for (const auto& layer : layers) x = layer->forward(x, key_mask, terms, gen);
  if (final_norm) x = final_norm->forward(x);
  return x;
}

BertForMaskedLM::BertForMaskedLM(const BertConfig& c, uint64_t seed, const BertModel* shared)
    : init_(seed),
      bert(c, init_, shared),
      dense(c.hidden_size, c.embedding_width(), init_, c.init_std),
      norm(c.embedding_width(), c.layer_norm_eps) {
  register_module("bert", bert);
  mlm.register_module("dense", dense);
  mlm.register_module("norm", norm);
  decoder_bias = mlm.register_parameter("decoder_bias", Tensor::zeros({c.vocab_size}));
  register_module("mlm", mlm);
}

MlmOutput BertForMaskedLM::forward(const data::MlmBatch& batch, Generator& gen) const {
  check_predicted(batch);
  Tensor hidden = bert.forward(batch.inputs, gen);  // (B, T, d)
  return head(hidden.reshape({hidden.size(0) * hidden.size(1), hidden.size(2)}), batch);
}

void BertForMaskedLM::check_predicted(const data::MlmBatch& batch) const {
  const Tensor &positions = batch.positions, &targets = batch.targets;
  ENGINE_CHECK(positions.defined() && targets.defined() && positions.dim() == 1 &&
                   targets.shape() == positions.shape(),
               "[bert] the batch's positions and targets must be two (M) tensors, got ",
               positions.defined() ? engine::describe(positions) : std::string("none"), " and ",
               targets.defined() ? engine::describe(targets) : std::string("none"));
  ENGINE_CHECK(positions.numel() > 0, "[bert] no position to predict: every label is -100");
}

MlmOutput BertForMaskedLM::head(const Tensor& flat, const data::MlmBatch& batch) const {
  // The head and the (M, V) logits only at the predicted positions, gathered first (their
  // gradient rows added back one each where the batch knows its positions distinct).
  Tensor h = engine::index_select(flat, batch.positions, batch.positions_unique);  // (M, d)
  h = norm.forward(dense.forward_gelu(h));
  MlmOutput out;
  out.logits = engine::linear(h, bert.token_embedding, decoder_bias);  // (M, V), tied decoder
  out.loss = engine::cross_entropy(out.logits, batch.targets);
  return out;
}

PretrainModel::Output BertForMaskedLM::pretrain_forward(const data::MlmBatch& batch,
                                                        Generator& gen) const {
  MlmOutput out = forward(batch, gen);
  return {out.loss, out.logits, {}};
}

ENGINE_OBJECTIVE_MODEL("mlm", make_encoder_objective<BertForMaskedLM>,
                       encoder_objective_for_checkpoint<BertForMaskedLM>);

}  // namespace models
