// The BERT encoder, its positional encodings and the MLM head (see bert.h and
// docs/positional-encodings.md for the formulas).
#include "models/bert.h"

#include <algorithm>
#include <cmath>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/ops.h"
#include "ops/relative.h"

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

Tensor Linear::forward_gelu(const Tensor& x) const {
  if (!bias.defined()) return engine::gelu(engine::linear(x, weight));
  return engine::bias_gelu(engine::linear(x, weight), bias);
}

LayerNorm::LayerNorm(int64_t width, double eps_) : eps(eps_) {
  weight = register_parameter("weight", Tensor::ones({width}));
  bias = register_parameter("bias", Tensor::zeros({width}));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return engine::layer_norm(x, weight, bias, eps);
}

int64_t t5_bucket(int64_t r, int64_t num_buckets, int64_t max_distance) {
  const int64_t half = num_buckets / 2;  // per direction
  int64_t bucket = r > 0 ? half : 0;
  const int64_t n = std::llabs(r);
  const int64_t max_exact = half / 2;
  if (n < max_exact) return bucket + n;
  // max_exact + floor(log(n / max_exact) / log(max_distance / max_exact) * (half - max_exact)).
  // The small epsilon puts values that are integers in exact arithmetic (n = 16, 32, 64 for the
  // defaults) on the side exact arithmetic puts them; elsewhere the value is far from an integer.
  const double v = std::log(double(n) / max_exact) / std::log(double(max_distance) / max_exact) *
                   double(half - max_exact);
  int64_t large = max_exact + static_cast<int64_t>(std::floor(v + 1e-9));
  return bucket + std::min(large, half - 1);
}

namespace {

// (N, 2K) rows [sin(w_0 x), cos(w_0 x), sin(w_1 x), ...] for positions x (N) and frequencies
// w (K); differentiable in w.
Tensor sinusoid(const Tensor& positions, const Tensor& freqs) {
  // Always f32, also under mixed precision: a bf16 angle of position 300 is off by a whole radian.
  engine::Autocast f32(DType::f32);
  Tensor angles = engine::matmul(positions.unsqueeze(1), freqs.unsqueeze(0));  // (N, K)
  Tensor pair =
      engine::concat({engine::sin(angles).unsqueeze(2), engine::cos(angles).unsqueeze(2)}, 2);
  return pair.reshape({positions.size(0), 2 * freqs.size(0)});
}

// w_k = 10000^(-2k / width), k < width / 2.
Tensor sinusoid_freqs(int64_t width) {
  std::vector<float> w(static_cast<size_t>(width / 2));
  for (int64_t k = 0; k < width / 2; ++k)
    w[size_t(k)] = static_cast<float>(std::pow(10000.0, -2.0 * double(k) / double(width)));
  return Tensor::from_vector<float>(w, {width / 2});
}

Tensor range_f32(int64_t start, int64_t end, engine::Device device) {
  std::vector<float> v;
  for (int64_t i = start; i < end; ++i) v.push_back(float(i));
  return Tensor::from_vector<float>(v, {end - start}).to(device);
}

}  // namespace

// ---- positional encodings ----------------------------------------------------------------------

PositionEncoding::PositionEncoding(const BertConfig& c, Generator& gen,
                                   const PositionEncoding* shared)
    : config_(c) {
  const PositionConfig& p = c.position;
  const int64_t d = c.hidden_size, e = c.embedding_width(), dh = c.head_size();
  if (shared) {  // the other model's position embeddings (checked alike by BertModel)
    table = shared->table;
    freq = shared->freq;
  } else {
    if (p.has_position_table())
      table =
          register_parameter("table", Tensor::randn({c.max_positions, e}, gen, 0.0, c.init_std));
    if (p.input == InputPosition::learnable_sinusoid)
      freq = register_parameter("freq", sinusoid_freqs(e));
  }
  if (p.attention == AttentionPosition::untied) {
    norm = std::make_unique<LayerNorm>(e, c.layer_norm_eps);
    register_module("norm", *norm);
  }
  if (p.attention != AttentionPosition::none) {  // U^Q, U^K: embedding width -> hidden
    query = std::make_unique<Linear>(e, d, gen, c.init_std);
    key = std::make_unique<Linear>(e, d, gen, c.init_std);
    register_module("query", *query);
    register_module("key", *key);
  }
  if (p.cls_reset != ClsReset::none)
    cls_theta = register_parameter("cls_theta", Tensor::randn({2, e}, gen, 0.0, c.init_std));
  if (p.relative == RelativePosition::t5_bias)
    relative_table = register_parameter(
        "relative_table",
        Tensor::randn({p.relative_bias_rows(), c.num_heads}, gen, 0.0, c.init_std));
  const int64_t rows = 2 * p.rpe_clip + 1;
  if (p.relative == RelativePosition::shaw_learned)
    shaw_table = register_parameter("shaw_table", Tensor::randn({rows, dh}, gen, 0.0, c.init_std));
  if (p.relative == RelativePosition::shaw_learnable_sinusoid)
    shaw_freq = register_parameter("shaw_freq", sinusoid_freqs(dh));
}

PositionEncoding::Constants PositionEncoding::build_constants(int64_t t, engine::Device dev) const {
  engine::Autocast f32(DType::f32);  // constants are built in f32 whatever the compute dtype
  const PositionConfig& p = config_.position;
  NoGrad ng;
  ++constant_builds_;
  Constants k;
  k.length = t;
  k.device = dev;
  auto upload_f32 = [&](const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_vector<float>(v, shape).to(dev);
  };
  if (p.relative == RelativePosition::t5_bias) {
    k.relative_index = Tensor::from_vector<int64_t>(relative_buckets(t), {t, t}).to(dev);
    k.relative_keys = engine::sorted_index_keys(k.relative_index, p.relative_bias_rows());
  }
  if (p.cls_reset != ClsReset::none) {
    // reset_theta: row 0 (from [CLS], including itself) = theta1, column 0 below it = theta2.
    std::vector<float> keep(size_t(t * t), 1.f), row0(size_t(t * t), 0.f), col0(size_t(t * t), 0.f);
    for (int64_t j = 0; j < t; ++j) keep[size_t(j)] = 0.f, row0[size_t(j)] = 1.f;
    for (int64_t i = 1; i < t; ++i) keep[size_t(i * t)] = 0.f, col0[size_t(i * t)] = 1.f;
    k.keep = upload_f32(keep, {t, t});
    k.row0 = upload_f32(row0, {t, t});
    k.col0 = upload_f32(col0, {t, t});
  }
  const bool shaw = p.relative == RelativePosition::shaw_learned ||
                    p.relative == RelativePosition::shaw_sinusoid ||
                    p.relative == RelativePosition::shaw_learnable_sinusoid;
  const int64_t c = p.rpe_clip;
  if (shaw) {
    std::vector<int64_t> idx(size_t(t * t));
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j) idx[size_t(i * t + j)] = std::clamp(j - i, -c, c) + c;
    k.shaw_index = Tensor::from_vector<int64_t>(idx, {t, t}).to(dev);
  }
  if (p.input == InputPosition::learnable_sinusoid) k.positions = range_f32(0, t, dev);
  if (p.input == InputPosition::sinusoid)
    k.input_sinusoid =
        sinusoid(range_f32(0, t, engine::Device::cpu()), sinusoid_freqs(config_.embedding_width()))
            .to(dev);
  if (p.relative == RelativePosition::shaw_learnable_sinusoid)
    k.shaw_positions = range_f32(-c, c + 1, dev);
  if (p.relative == RelativePosition::shaw_sinusoid)
    k.fixed_shaw =
        sinusoid(range_f32(-c, c + 1, engine::Device::cpu()), sinusoid_freqs(config_.head_size()))
            .to(dev);
  return k;
}

const PositionEncoding::Constants& PositionEncoding::constants(int64_t t,
                                                               engine::Device dev) const {
  if (longest_.device != dev) longest_ = recent_ = Constants{};
  if (longest_.length < t) longest_ = build_constants(t, dev);
  if (t == longest_.length) return longest_;
  if (recent_.length != t || recent_.device != dev) {
    // The leading block of the longest length's tensors, copied on the device (no host work).
    NoGrad ng;
    auto lead = [&](const Tensor& x, int dims) {
      if (!x.defined()) return x;
      Tensor y = x.slice(0, 0, t);
      if (dims == 2) y = y.slice(1, 0, t);
      return y.contiguous();
    };
    Constants k = longest_;
    k.length = t;
    k.relative_index = lead(longest_.relative_index, 2);
    if (k.relative_index.defined())
      k.relative_keys =
          engine::sorted_index_keys(k.relative_index, config_.position.relative_bias_rows());
    k.keep = lead(longest_.keep, 2);
    k.row0 = lead(longest_.row0, 2);
    k.col0 = lead(longest_.col0, 2);
    k.shaw_index = lead(longest_.shaw_index, 2);
    k.positions = lead(longest_.positions, 1);
    k.input_sinusoid = lead(longest_.input_sinusoid, 1);
    recent_ = std::move(k);
  }
  return recent_;
}

void PositionEncoding::check_length(int64_t seq_len) const {
  ENGINE_CHECK(seq_len >= 1, "[bert] empty sequence");
  if (config_.position.has_position_table())
    ENGINE_CHECK(seq_len <= config_.max_positions, "[bert] sequence length ", seq_len,
                 " exceeds model.max_positions ", config_.max_positions,
                 " of the learned position table (preset ", config_.position.preset, ")");
}

Tensor PositionEncoding::input_term(int64_t seq_len, engine::Device device) const {
  check_length(seq_len);
  switch (config_.position.input) {
    case InputPosition::none:
      return Tensor();
    case InputPosition::learned:
      return table.slice(0, 0, seq_len);
    case InputPosition::sinusoid:
      return constants(seq_len, device).input_sinusoid;
    case InputPosition::learnable_sinusoid:
      return sinusoid(constants(seq_len, device).positions, freq);
  }
  return Tensor();
}

std::vector<int64_t> PositionEncoding::relative_buckets(int64_t t) const {
  const PositionConfig& p = config_.position;
  std::vector<int64_t> b(static_cast<size_t>(t * t));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j)
      b[size_t(i * t + j)] = t5_bucket(j - i, p.relative_buckets, p.relative_max_distance);
  if (p.cls_reset == ClsReset::code) {
    // The public TUPE code: two spare buckets for [CLS] -> others (row 0, including (0, 0)) and
    // others -> [CLS] (column 0 below it).
    for (int64_t i = 1; i < t; ++i) b[size_t(i * t)] = p.relative_buckets + 1;
    for (int64_t j = 0; j < t; ++j) b[size_t(j)] = p.relative_buckets;
  }
  return b;
}

// p^ = LN_pos(p) for TUPE (rows 0..T-1, then theta1, theta2 when resetting); p for bert_a_d.
// Returns p^ U^Q as (H, rows, d_h) and p^ U^K likewise in *pk.
Tensor PositionEncoding::projected_positions(int64_t t, Tensor* pk) const {
  const int64_t h = config_.num_heads, dh = config_.head_size();
  Tensor rows = table.slice(0, 0, t);  // (T, d)
  if (config_.position.cls_reset != ClsReset::none) rows = engine::concat({rows, cls_theta}, 0);
  if (config_.position.attention == AttentionPosition::untied) rows = norm->forward(rows);
  const int64_t n = rows.size(0);
  auto heads = [&](const Tensor& x) { return x.view({n, h, dh}).permute({1, 0, 2}); };
  *pk = heads(key->forward(rows));
  return heads(query->forward(rows));
}

namespace {

// TUPE's v = (p^ U^Q)(p^ U^K)^T / sqrt(2 d_h) over the first t rows: (H, t, t).
Tensor untied_scores(const Tensor& pq, const Tensor& pk, int64_t t, double scale) {
  return engine::matmul(pq.slice(1, 0, t), pk.slice(1, 0, t).transpose(1, 2)) * scale;
}

// theta of the [CLS] reset from one projected row (p_theta1 or p_theta2): (H).
Tensor cls_theta_of(const Tensor& pq, const Tensor& pk, int64_t row, double scale) {
  return engine::sum(pq.select(1, row) * pk.select(1, row), {1}) * scale;
}

}  // namespace

double PositionEncoding::untied_scale() const {
  return 1.0 / std::sqrt(2.0 * double(config_.head_size()));
}

Tensor PositionEncoding::untied_term(int64_t t) const {
  ENGINE_CHECK(config_.position.attention == AttentionPosition::untied, "[bert] preset ",
               config_.position.preset, " has no untied positional term");
  check_length(t);
  Tensor pk;
  Tensor pq = projected_positions(t, &pk);
  return untied_scores(pq, pk, t, untied_scale()).unsqueeze(0);  // (1, H, T, T)
}

std::pair<Tensor, Tensor> PositionEncoding::cls_thetas() const {
  ENGINE_CHECK(config_.position.cls_reset != ClsReset::none, "[bert] preset ",
               config_.position.preset, " has no [CLS] reset");
  Tensor pk;
  Tensor pq = projected_positions(1, &pk);  // rows: position 0, theta1, theta2
  return {cls_theta_of(pq, pk, 1, untied_scale()), cls_theta_of(pq, pk, 2, untied_scale())};
}

AttentionTerms PositionEncoding::attention_terms(int64_t t, engine::Device device) const {
  check_length(t);
  const PositionConfig& p = config_.position;
  const int64_t h = config_.num_heads;
  const Constants& k = constants(t, device);
  AttentionTerms out;
  Tensor relative;  // (H, T, T)
  if (p.relative == RelativePosition::t5_bias)
    relative = engine::embedding(relative_table, k.relative_index, k.relative_keys)
                   .permute({2, 0, 1});  // (T, T, H) -> (H, T, T)
  if (p.attention == AttentionPosition::untied) {
    Tensor pk;
    Tensor pq = projected_positions(t, &pk);  // (H, T[+2], d_h)
    Tensor v = untied_scores(pq, pk, t, untied_scale());
    if (relative.defined() && p.cls_reset != ClsReset::code)
      v = v + relative;  // paper: reset(v + b)
    if (p.cls_reset != ClsReset::none) {
      // reset_theta: row 0 (from [CLS], including itself) = theta1, column 0 below it = theta2.
      auto theta = [&](int64_t r) {
        return cls_theta_of(pq, pk, t + r, untied_scale()).view({h, 1, 1});
      };
      v = v * k.keep + theta(0) * k.row0 + theta(1) * k.col0;
    }
    if (relative.defined() && p.cls_reset == ClsReset::code)
      v = v + relative;  // code: reset(v) + b'
    out.bias = v.unsqueeze(0);
  } else if (relative.defined()) {
    out.bias = relative.unsqueeze(0);
  }
  if (p.attention == AttentionPosition::decomposed) {
    Tensor pk;
    Tensor pq = projected_positions(t, &pk);
    out.pos_query = pq.unsqueeze(0);
    out.pos_key = pk.unsqueeze(0);
  }
  if (k.shaw_index.defined()) {
    if (p.relative == RelativePosition::shaw_learned)
      out.shaw_table = shaw_table;
    else if (p.relative == RelativePosition::shaw_sinusoid)
      out.shaw_table = k.fixed_shaw;
    else
      out.shaw_table = sinusoid(k.shaw_positions, shaw_freq);
    out.shaw_index = k.shaw_index;
  }
  return out;
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
  Projected pr{qkv3[0], qkv3[1], qkv3[2], 1.0 / std::sqrt(double(dh))};
  const PositionConfig& p = config_.position;
  if (p.attention == AttentionPosition::untied) pr.scale = 1.0 / std::sqrt(2.0 * double(dh));
  if (p.attention == AttentionPosition::decomposed) {
    // (q + pU^Q) . (k + pU^K) = q.k + q.pU^K + pU^Q.k + pU^Q.pU^K: the four terms in one
    // product of the usual width (the (1, H, T, d_h) terms broadcast over the batch).
    pr.q = pr.q + terms.pos_query;
    pr.k = pr.k + terms.pos_key;
    pr.scale = 1.0 / std::sqrt(4.0 * double(dh));
  }
  return pr;
}

// Shaw: logits q_i.(k_j + a_c(j-i)) scale. The key term depends on q, so it is q A^T (B, H, T, R)
// gathered per (i, j), never a (T, T, d_h) tensor. Without Shaw: q_i.k_j scale.
Tensor BertLayer::scaled_scores(const Projected& pr, const AttentionTerms& terms) const {
  Tensor scores = engine::matmul(pr.q, pr.k.transpose(2, 3));
  if (terms.shaw_table.defined())
    scores = scores + engine::relative_gather(
                          engine::matmul(pr.q, terms.shaw_table.transpose(0, 1)), terms.shaw_index);
  return scores * pr.scale;
}

Tensor BertLayer::attention_logits(const Tensor& x, const AttentionTerms& terms) const {
  Projected pr = project(config_.pre_layer_norm ? attention_norm.forward(x) : x, terms);
  Tensor scores = scaled_scores(pr, terms);
  return terms.bias.defined() ? scores + terms.bias : scores;
}

Tensor BertLayer::self_attention(const Tensor& x, const Tensor& key_mask,
                                 const AttentionTerms& terms, Generator& gen) const {
  const int64_t b = x.size(0), t = x.size(1), h = config_.num_heads, dh = config_.head_size();
  Projected pr = project(x, terms);
  const Tensor &q = pr.q, &k = pr.k, &v = pr.v;
  const double scale = pr.scale;
  const bool training = this->training();
  const double p_drop = training ? config_.attention_dropout : 0.0;
  Tensor ctx;  // (B, H, T, d_h)
  if (!terms.shaw_table.defined()) {
    engine::AttentionOptions opt;
    opt.scale = scale;
    opt.bias = terms.bias;
    opt.key_mask = key_mask;
    opt.dropout_p = p_drop;
    opt.training = training;
    opt.generator = &gen;
    ctx = engine::attention(q, k, v, opt);
  } else {
    // Shaw: values v_j + a_c(j-i), scattered back per (i, j) like the key term is gathered.
    const Tensor& a = terms.shaw_table;  // (R, d_h)
    const int64_t r = a.size(0);
    Tensor scores = scaled_scores(pr, terms);
    Tensor mask4 = key_mask.defined() ? key_mask.view({b, 1, 1, t}) : Tensor();
    Tensor probs = engine::softmax(scores, terms.bias, mask4);
    probs = engine::dropout(probs, p_drop, training, gen);
    ctx = engine::matmul(probs, v) +
          engine::matmul(engine::relative_scatter(probs, terms.shaw_index, r), a);
  }
  Tensor merged = ctx.permute({0, 2, 1, 3}).reshape({b, t, h * dh});  // (B, T, d)
  return out.forward(merged);
}

Tensor BertLayer::forward(const Tensor& x, const Tensor& key_mask, const AttentionTerms& terms,
                          Generator& gen) const {
  const bool training = this->training();
  const double p = config_.hidden_dropout;
  auto ffn_branch = [&](const Tensor& y) { return fc2.forward(fc1.forward_gelu(y)); };
  if (config_.pre_layer_norm) {
    Tensor y = x + engine::dropout(self_attention(attention_norm.forward(x), key_mask, terms, gen),
                                   p, training, gen);
    return y + engine::dropout(ffn_branch(ffn_norm.forward(y)), p, training, gen);
  }
  Tensor y = attention_norm.forward(
      x + engine::dropout(self_attention(x, key_mask, terms, gen), p, training, gen));
  return ffn_norm.forward(y + engine::dropout(ffn_branch(y), p, training, gen));
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
                     o.position.input == c.position.input && o.layer_norm_eps == c.layer_norm_eps,
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
  Tensor x = engine::embedding(token_embedding, ids);  // (B, T, e)
  if (segment_embedding.defined()) {
    Tensor types = in.token_type_ids.defined() ? in.token_type_ids
                                               : Tensor::zeros({b, t}, DType::i64, ids.device());
    x = x + engine::embedding(segment_embedding, types);
  }
  Tensor pos = position->input_term(t, x.device());  // (T, e), broadcast over the batch
  if (pos.defined()) x = x + pos;
  x = engine::dropout(embedding_norm->forward(x), config_.hidden_dropout, training(), gen);
  if (embedding_project) x = embedding_project->forward(x);  // (B, T, d)
  return x;
}

Tensor BertModel::forward(const BertInputs& in, Generator& gen) const {
  Tensor x = embed(in, gen);
  const int64_t t = x.size(1);

  // Once per forward: every layer adds the same (1, H, T, T) term, so its gradient is summed
  // over layers and batch by the autograd graph, and it is never copied per example.
  last_terms_ = position->attention_terms(t, x.device());
  ++terms_computed_;
  for (const auto& layer : layers) x = layer->forward(x, in.attention_mask, last_terms_, gen);
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
  // The head and the (M, V) logits only at the predicted positions, gathered first.
  Tensor h = engine::index_select(flat, batch.positions);  // (M, d)
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

}  // namespace models
