// RoPE (RoFormer, Su et al. 2021): no parameters and no input term; in every layer, after the q and
// k projections and per head, each pair of dimensions (2i, 2i+1) of q and k at position t is
// rotated by theta_{t,i} = t * 10000^(-2i / d_h) (position 0 is [CLS]), so q_i . k_j depends on
// the positions through j - i only. The layer applies engine::rotary (ops/rotary.h) with the
// cosines and sines this component keeps per length.
#include <cmath>

#include "engine/error.h"
#include "models/bert.h"
#include "models/position/common.h"
#include "ops/ops.h"

namespace models {
namespace {

void check_rope(const BertConfig& c) {
  ENGINE_CHECK(c.head_size() % 2 == 0,
               "[bert] rope rotates pairs of dimensions: it needs an even head size "
               "(hidden_size / num_heads), got ",
               c.head_size());
}

// theta_{t,i} = t * 10000^(-2i / d_h), computed in double and stored as cos / sin (T, d_h / 2) f32.
Tensor angles(int64_t t, int64_t dh, bool sine, engine::Device dev) {
  const int64_t half = dh / 2;
  std::vector<float> v(size_t(t * half));
  for (int64_t p = 0; p < t; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(p) * std::pow(10000.0, -2.0 * double(i) / double(dh));
      v[size_t(p * half + i)] = float(sine ? std::sin(a) : std::cos(a));
    }
  return Tensor::from_vector<float>(v, {t, half}).to(dev);
}

class Rotary : public PositionComponent {
 public:
  explicit Rotary(PositionContext& ctx) : constants_(&ctx.constants), dh_(ctx.config.head_size()) {
    const int64_t dh = dh_;
    cos_ = ctx.constants.add(
        1, [dh](int64_t t, engine::Device dev) { return angles(t, dh, false, dev); });
    sin_ = ctx.constants.add(
        1, [dh](int64_t t, engine::Device dev) { return angles(t, dh, true, dev); });
  }
  std::vector<Tensor> add_terms(int64_t t, engine::Device dev,
                                AttentionTerms& terms) const override {
    terms.rotary_cos = constants_->get(cos_, t, dev);
    terms.rotary_sin = constants_->get(sin_, t, dev);
    return {};
  }
  // What a rotation does to the logit of two equal unit-norm vectors at positions i and j:
  // mean_i cos((j - i) theta_i), RoFormer's decay with distance (the same for every head).
  void correlations(const CorrelationContext& ctx,
                    std::vector<CorrelationMatrix>& out) const override {
    const int64_t t = ctx.length, half = dh_ / 2;
    std::vector<double> freq(static_cast<size_t>(half)), by_offset(static_cast<size_t>(2 * t - 1));
    for (int64_t k = 0; k < half; ++k)
      freq[size_t(k)] = std::pow(10000.0, -2.0 * double(k) / double(dh_));
    for (int64_t r = 1 - t; r < t; ++r) {  // the matrix is Toeplitz: one value per offset
      double s = 0;
      for (int64_t k = 0; k < half; ++k) s += std::cos(double(r) * freq[size_t(k)]);
      by_offset[size_t(r + t - 1)] = s / double(half);
    }
    std::vector<float> v(size_t(t * t));
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j)
        v[size_t(i * t + j)] = float(by_offset[size_t(j - i + t - 1)]);
    CorrelationMatrix m;
    m.name = "rope_decay";
    m.title = ctx.prefix + "RoPE: mean_k cos((j - i) theta_k), the rotation's decay with distance";
    m.description =
        "for two equal vectors with equal energy in every rotated pair, the factor the rotation "
        "puts on q_i . k_j: the mean over pairs k of cos((j - i) 10000^(-2k / d_h))";
    m.values = Tensor::from_vector<float>(v, {1, t, t});
    m.per_head = false;
    out.push_back(m);
  }

 private:
  const LengthConstants* constants_;
  int64_t dh_;
  int cos_ = -1, sin_ = -1;
};

}  // namespace

ENGINE_POSITION_FAMILY(.name = "rope", .hf_blocker = "rotary positions (RoPE) inside attention",
                       .validate = check_rope, .make = make_component<Rotary>);

}  // namespace models
