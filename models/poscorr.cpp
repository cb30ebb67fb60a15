// Positional correlations: extraction from a model, and their measures (poscorr.h).
#include "models/poscorr.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/ops.h"

namespace models {

using engine::NoGrad;

namespace {

// (n, d) rows -> (H, n, d_h).
Tensor heads_of(const Tensor& x, int64_t h) {
  const int64_t n = x.size(0);
  return x.view({n, h, x.size(1) / h}).permute({1, 0, 2});
}

Tensor cpu_f32(const Tensor& x) { return x.to(engine::Device::cpu()).contiguous(); }

}  // namespace

std::vector<CorrelationMatrix> extract_correlations(BertModel& bert, int64_t t,
                                                    const ProbeOptions& probe,
                                                    std::vector<int64_t>* probe_ids) {
  NoGrad ng;
  bert.train(false);
  const BertConfig& c = bert.config();
  const PositionConfig& p = c.position;
  const PositionEncoding& pos = *bert.position;
  const int64_t h = c.num_heads, d = c.hidden_size, dh = c.head_size();
  const bool reset = p.cls_reset != ClsReset::none;
  const AttentionTerms terms =
      pos.attention_terms(t, bert.token_embedding.device());  // checks t against learned tables
  std::vector<CorrelationMatrix> out;
  auto add = [&](CorrelationMatrix m) { out.push_back(std::move(m)); };
  const std::string preset = p.preset + ": ";

  if (p.attention == AttentionPosition::untied) {
    CorrelationMatrix m;
    m.name = "tupe_term";
    m.title = preset + "TUPE positional term" +
              (reset ? " after the [CLS] reset" : " (no [CLS] reset)") +
              (p.relative == RelativePosition::t5_bias ? ", with the relative bias" : "");
    m.description =
        "the (H, T, T) term added to every layer's attention logits: (p^ U^Q)(p^ U^K)^T / sqrt(2 "
        "d_h)" +
        std::string(p.relative == RelativePosition::t5_bias ? " + b[bucket(j - i)]" : "") +
        (reset ? std::string(", row 0 = theta1 and column 0 = theta2 (cls_reset ") +
                     cls_reset_name(p.cls_reset) + ")"
               : "");
    m.values = cpu_f32(terms.bias.select(0, 0));
    m.logits = true;
    m.first = reset ? 1 : 0;
    add(m);
  }
  if (p.attention == AttentionPosition::decomposed) {
    CorrelationMatrix m;
    m.name = "decomposed_term";
    m.title = preset + "positional term (p U^Q)(p U^K) / sqrt(4 d_h)";
    m.description =
        "bert_a_d's position-to-position term of every layer's logits: (p_i U^Q)(p_j U^K) / sqrt(4 "
        "d_h)";
    m.values = cpu_f32(
        engine::matmul(terms.pos_query.select(0, 0), terms.pos_key.select(0, 0).transpose(1, 2)) *
        (1.0 / std::sqrt(4.0 * double(dh))));
    m.logits = true;
    add(m);
  }
  const Tensor input = pos.input_term(t, bert.token_embedding.device());
  // bert_a_d's positions enter through U^Q, U^K only; their P P^T is drawn all the same.
  Tensor positions = input;
  if (!positions.defined() && p.attention == AttentionPosition::decomposed)
    positions = pos.table.slice(0, 0, t);
  if (positions.defined()) {
    const Tensor pe = cpu_f32(positions);
    CorrelationMatrix dot;
    dot.name = "ape_dot";
    dot.title = preset + "P P^T between absolute position vectors";
    dot.description = "p_i . p_j of the input position vectors (before the input LayerNorm)";
    dot.values = engine::matmul(pe, pe.transpose(0, 1)).unsqueeze(0);
    dot.per_head = false;
    add(dot);
  }
  if (input.defined()) {
    Tensor pe = cpu_f32(input);
    if (bert.embedding_project)  // an embedding width of its own: into the layers' width first
      pe = engine::matmul(pe, cpu_f32(bert.embedding_project->weight).transpose(0, 1));
    // The first layer's per-head (p_i W^Q)(p_j W^K), in logit units (/ sqrt(d_h)); no biases.
    const Tensor w = cpu_f32(bert.layers.at(0)->qkv.weight);  // (3d, d): Q | K | V rows
    Tensor q = heads_of(engine::matmul(pe, w.slice(0, 0, d).transpose(0, 1)), h);
    Tensor k = heads_of(engine::matmul(pe, w.slice(0, d, 2 * d).transpose(0, 1)), h);
    CorrelationMatrix qk;
    qk.name = "ape_qk";
    qk.title = preset + "first layer (p_i W^Q)(p_j W^K) / sqrt(d_h)";
    qk.description =
        "per head, the first layer's query and key projections (no biases) of the absolute "
        "position "
        "vectors, divided by sqrt(d_h) as the layer scales its logits";
    qk.values = engine::matmul(q, k.transpose(1, 2)) * (1.0 / std::sqrt(double(dh)));
    qk.logits = true;
    add(qk);
  }
  if (p.relative == RelativePosition::t5_bias) {
    const std::vector<float> table = cpu_f32(pos.relative_table).to_vector<float>();  // (rows, H)
    std::vector<float> v(size_t(h * (2 * t - 1)));
    for (int64_t r = -(t - 1); r <= t - 1; ++r) {
      const int64_t b = t5_bucket(r, p.relative_buckets, p.relative_max_distance);
      for (int64_t k = 0; k < h; ++k)
        v[size_t(k * (2 * t - 1) + r + t - 1)] = table[size_t(b * h + k)];
    }
    CorrelationMatrix m;
    m.name = "relative_bias";
    m.title = preset + "relative bias b[bucket(j - i)] per head and offset";
    m.description =
        "the T5 bias per head at every offset r = j - i from -(T-1) to T-1 (shared by all layers)";
    m.values = Tensor::from_vector<float>(v, {h, 1, 2 * t - 1});
    m.logits = true;
    m.per_offset = true;
    m.col_start = double(-(t - 1));
    m.row_axis = "head";
    m.col_axis = "offset j - i";
    add(m);
  }
  if (terms.shaw_table.defined()) {
    const Tensor a = cpu_f32(terms.shaw_table);  // (2 clip + 1, d_h)
    CorrelationMatrix m;
    m.name = "rpe_dot";
    m.title = preset + "a_r . a_s between relative position vectors";
    m.description =
        "dot products of Shaw's relative vectors a_r (shared by heads and layers), r and s from "
        "-clip to clip";
    m.values = engine::matmul(a, a.transpose(0, 1)).unsqueeze(0);
    m.per_head = false;
    m.row_start = m.col_start = double(-p.rpe_clip);
    m.row_axis = "offset r";
    m.col_axis = "offset s";
    add(m);
  }

  // Identical-word probing: one token repeated over the whole sequence, the first layer's
  // logits averaged over the tokens.
  std::vector<int64_t> ids = probe.ids;
  if (ids.empty()) {
    ENGINE_CHECK(probe.tokens >= 1, "[poscorr] the probe needs at least one token, got ",
                 probe.tokens);
    std::mt19937_64 rng(probe.seed);
    for (int64_t i = 0; i < probe.tokens; ++i)
      ids.push_back(1 + int64_t(rng() % uint64_t(std::max<int64_t>(c.vocab_size - 1, 1))));
  }
  for (int64_t id : ids)
    ENGINE_CHECK(id >= 0 && id < c.vocab_size, "[poscorr] probe token id ", id,
                 " is outside the vocabulary [0, ", c.vocab_size, ")");
  if (probe_ids) *probe_ids = ids;
  const int64_t n = int64_t(ids.size());
  std::vector<int64_t> rows(size_t(n * t));
  for (int64_t b = 0; b < n; ++b) std::fill_n(rows.begin() + b * t, t, ids[size_t(b)]);
  BertInputs in;
  in.input_ids = Tensor::from_vector<int64_t>(rows, {n, t}).to(bert.token_embedding.device());
  engine::Generator unused(0);
  Tensor logits =
      bert.layers.at(0)->attention_logits(bert.embed(in, unused), terms);  // (n, H, T, T)
  CorrelationMatrix m;
  m.name = "probe_logits";
  m.title = preset + "identical-word probe: first-layer logits, mean over " + std::to_string(n) +
            " tokens";
  m.description =
      "the first layer's attention logits for a sequence of one repeated token, averaged over the "
      "probe "
      "tokens (the second paper's identical-word probing)";
  m.values = cpu_f32(engine::mean(logits, {0}));
  m.logits = true;
  m.first = reset ? 1 : 0;
  add(m);
  return out;
}

std::vector<float> toeplitz_of_offsets(const float* offsets, int64_t t) {
  std::vector<float> m(size_t(t * t));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) m[size_t(i * t + j)] = offsets[j - i + t - 1];
  return m;
}

namespace {

// Checks the shape and returns the body size n - first.
int64_t body_size(int64_t n, int64_t first) {
  ENGINE_CHECK(n >= 1 && first >= 0 && first < n, "[poscorr] cannot measure a ", n, " x ", n,
               " matrix from index ", first);
  return n - first;
}

}  // namespace

Properties measure(const float* m, int64_t n, int64_t first) {
  const int64_t s = body_size(n, first);
  auto at = [&](int64_t i, int64_t j) { return double(m[(i + first) * n + j + first]); };
  Properties pr;
  pr.min = std::numeric_limits<double>::infinity();
  pr.max = -pr.min;
  double mean = 0;
  std::vector<double> diag(size_t(2 * s - 1), 0.0);  // mean of diagonal r = j - i, at r + s - 1
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < s; ++j) {
      const double v = at(i, j);
      mean += v;
      diag[size_t(j - i + s - 1)] += v;
      pr.min = std::min(pr.min, v);
      pr.max = std::max(pr.max, v);
    }
  mean /= double(s * s);
  for (int64_t r = -(s - 1); r <= s - 1; ++r) diag[size_t(r + s - 1)] /= double(s - std::abs(r));
  double total = 0, within = 0, sym = 0;
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < s; ++j) {
      const double v = at(i, j) - mean;
      total += v * v;
      const double w = at(i, j) - diag[size_t(j - i + s - 1)];
      within += w * w;
      const double y = 0.5 * (v + at(j, i) - mean);
      sym += y * y;
    }
  // A constant matrix is Toeplitz and symmetric; relative tolerance for float noise.
  const double scale = std::max(1.0, std::abs(mean));
  const bool flat = total <= 1e-20 * scale * scale * double(s * s);
  pr.translation_invariance = flat ? 1.0 : std::clamp(1.0 - within / total, 0.0, 1.0);
  pr.symmetry = flat ? 1.0 : std::clamp(sym / total, 0.0, 1.0);
  // Walk outward from the profile's peak among offsets -1, 0, +1 while it keeps strictly falling.
  auto f = [&](int64_t r) { return diag[size_t(r + s - 1)]; };
  int64_t peak = 0;
  for (int64_t r : {-1, 1})
    if (std::abs(r) < s && f(r) > f(peak)) peak = r;
  pr.profile_peak = peak;
  int64_t hi = peak, lo = peak;
  while (hi + 1 < s && f(hi + 1) < f(hi)) ++hi;
  while (lo - 1 > -s && f(lo - 1) < f(lo)) --lo;
  pr.window_forward = std::max<int64_t>(hi, 0);
  pr.window_backward = std::max<int64_t>(-lo, 0);
  return pr;
}

Pattern classify_pattern(const float* m, int64_t n, int64_t first) {
  const int64_t s = body_size(n, first);
  Pattern pt;
  std::vector<double> by_offset(size_t(2 * s - 1), 0.0), rows_at(size_t(2 * s - 1), 0.0);
  std::vector<double> prob(static_cast<size_t>(s));
  double entropy = 0, local = 0;
  for (int64_t i = 0; i < s; ++i) {
    const float* row = m + (i + first) * n + first;
    const double top = *std::max_element(row, row + s);
    double z = 0;
    for (int64_t j = 0; j < s; ++j) z += prob[size_t(j)] = std::exp(double(row[j]) - top);
    double hrow = 0;
    for (int64_t j = 0; j < s; ++j) {
      const double q = prob[size_t(j)] / z;
      if (q > 0) hrow -= q * std::log(q);
      by_offset[size_t(j - i + s - 1)] += q;
      rows_at[size_t(j - i + s - 1)] += 1;
      if (std::abs(j - i) <= 2) local += q;
    }
    entropy += s > 1 ? hrow / std::log(double(s)) : 1.0;
  }
  pt.entropy = entropy / double(s);
  pt.local_mass = local / double(s);
  double best = -1;
  for (int64_t r = -(s - 1); r <= s - 1; ++r) {
    if (2 * std::abs(r) >= std::max<int64_t>(s, 2)) continue;
    const double a = by_offset[size_t(r + s - 1)] / rows_at[size_t(r + s - 1)];
    if (a > best + 1e-12) best = a, pt.peak_offset = r;
  }
  if (pt.entropy >= 0.9)
    pt.name = "global";
  else if (pt.peak_offset == -1)
    pt.name = "previous";
  else if (pt.peak_offset == 1)
    pt.name = "next";
  else if (pt.local_mass >= 0.5)
    pt.name = "local";
  else
    pt.name = "broad";
  return pt;
}

}  // namespace models
