// Positional correlations: extraction from a model, and their measures (poscorr.h).
#include "models/poscorr.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "engine/autograd.h"
#include "engine/error.h"
#include "models/position/common.h"
#include "ops/ops.h"

namespace models {

using engine::NoGrad;

std::vector<CorrelationMatrix> extract_correlations(BertModel& bert, int64_t t,
                                                    const ProbeOptions& probe,
                                                    std::vector<int64_t>* probe_ids) {
  NoGrad ng;
  bert.train(false);
  const BertConfig& c = bert.config();
  const PositionConfig& p = c.position;
  const PositionEncoding& pos = *bert.position;
  const bool reset = p.cls_reset != ClsReset::none;
  const AttentionTerms terms =
      pos.attention_terms(t, bert.token_embedding.device());  // checks t against learned tables
  std::vector<CorrelationMatrix> out;
  pos.correlations(CorrelationContext{bert, t, terms, p.preset + ": "}, out);
  auto add = [&](CorrelationMatrix m) { out.push_back(std::move(m)); };
  const std::string preset = p.preset + ": ";

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
  m.values = position::cpu_f32(engine::mean(logits, {0}));
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
