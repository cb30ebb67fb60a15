// T5's bucketed relative bias (t5.h, docs/positional-encodings.md): the (buckets[+2], H) table
// "bert.position.relative_table", looked up through a constant (T, T) bucket map.
#include "models/position/t5.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "models/position/common.h"
#include "ops/ops.h"

namespace models {

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

std::vector<int64_t> relative_bucket_map(const PositionConfig& p, int64_t t) {
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

int64_t relative_bias_rows(const PositionConfig& p) {
  return p.relative_buckets + (p.cls_reset == ClsReset::code ? 2 : 0);
}

namespace {

void check_t5(const BertConfig& c) {
  const PositionConfig& p = c.position;
  ENGINE_CHECK(p.relative_buckets >= 4 && p.relative_buckets % 2 == 0,
               "[bert] model.position.relative_buckets must be even and at least 4, got ",
               p.relative_buckets);
  ENGINE_CHECK(p.relative_max_distance > p.relative_buckets / 4,
               "[bert] model.position.relative_max_distance must exceed relative_buckets / 4 "
               "(the exact range), got ",
               p.relative_max_distance);
}

class T5Bias : public PositionComponent {
 public:
  explicit T5Bias(PositionContext& ctx) : config_(ctx.config), constants_(&ctx.constants) {
    const PositionConfig& p = config_.position;
    const int64_t rows = relative_bias_rows(p);
    table_ = ctx.module.register_parameter(
        "relative_table", Tensor::randn({rows, config_.num_heads}, ctx.gen, 0.0, config_.init_std));
    index_ = ctx.constants.add(2, [p](int64_t t, engine::Device dev) {
      return Tensor::from_vector<int64_t>(relative_bucket_map(p, t), {t, t}).to(dev);
    });
  }
  std::vector<Tensor> add_terms(int64_t t, engine::Device dev,
                                AttentionTerms& terms) const override {
    // (H, T, T) straight from the (rows, H) table: one pass each way (ops/position_bias.h)
    Tensor relative = engine::bucket_lookup(table_, constants_->get(index_, t, dev));
    terms.bias = terms.bias.defined() ? terms.bias + relative : relative;
    return {};
  }
  void correlations(const CorrelationContext& ctx,
                    std::vector<CorrelationMatrix>& out) const override {
    const PositionConfig& p = config_.position;
    const int64_t h = config_.num_heads, t = ctx.length;
    const std::vector<float> table = position::cpu_f32(table_).to_vector<float>();  // (rows, H)
    std::vector<float> v(size_t(h * (2 * t - 1)));
    for (int64_t r = -(t - 1); r <= t - 1; ++r) {
      const int64_t b = t5_bucket(r, p.relative_buckets, p.relative_max_distance);
      for (int64_t k = 0; k < h; ++k)
        v[size_t(k * (2 * t - 1) + r + t - 1)] = table[size_t(b * h + k)];
    }
    CorrelationMatrix m;
    m.name = "relative_bias";
    m.title = ctx.prefix + "relative bias b[bucket(j - i)] per head and offset";
    m.description =
        "the T5 bias per head at every offset r = j - i from -(T-1) to T-1 (shared by all layers)";
    m.values = Tensor::from_vector<float>(v, {h, 1, 2 * t - 1});
    m.logits = true;
    m.per_offset = true;
    m.col_start = double(-(t - 1));
    m.row_axis = "head";
    m.col_axis = "offset j - i";
    out.push_back(m);
  }

 private:
  BertConfig config_;
  const LengthConstants* constants_;
  Tensor table_;
  int index_;
};

}  // namespace

ENGINE_POSITION_FAMILY(.name = "t5_bias",
                       .hf_blocker =
                           "relative positions inside attention "
                           "(bert.position.relative_table)",
                       .validate = check_t5, .make = make_component<T5Bias>);

}  // namespace models
