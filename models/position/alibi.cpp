// ALiBi (Press et al. 2022), bidirectional: no parameters and no input term; the scores of head h
// get the bias -m_h |j - i|, with the paper's slopes: for H a power of two, m_h = 2^(-8h / H),
// h = 1..H; otherwise the slopes of the largest power of two n below H, then every other slope of
// 2n until H are filled.
#include "models/position/alibi.h"

#include <cmath>

#include "models/bert.h"
#include "models/position/common.h"
#include "ops/ops.h"

namespace models {

std::vector<double> alibi_slopes(int64_t heads) {
  auto power_of_two = [](int64_t n) {
    std::vector<double> s;
    for (int64_t h = 1; h <= n; ++h) s.push_back(std::pow(2.0, -8.0 * double(h) / double(n)));
    return s;
  };
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  std::vector<double> s = power_of_two(n);
  const std::vector<double> twice = power_of_two(2 * n);
  for (size_t k = 0; int64_t(s.size()) < heads; k += 2) s.push_back(twice[k]);
  return s;
}

namespace {

class Alibi : public PositionComponent {
 public:
  explicit Alibi(PositionContext& ctx) : constants_(&ctx.constants) {
    const int64_t h = ctx.config.num_heads;
    const int distances = ctx.constants.add(2, [](int64_t t, engine::Device dev) {
      std::vector<float> v(size_t(t * t));
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j) v[size_t(i * t + j)] = -float(std::llabs(j - i));
      return Tensor::from_vector<float>(v, {t, t}).to(dev);
    });
    // (H, 1, 1) * (T, T): the (H, T, T) bias, a constant (no gradient), made once per length.
    bias_ = ctx.constants.add_derived(distances, [h](const Tensor& d) {
      std::vector<float> m;
      for (double s : alibi_slopes(h)) m.push_back(float(s));
      return Tensor::from_vector<float>(m, {h, 1, 1}).to(d.device()) * d;
    });
  }
  std::vector<Tensor> add_terms(int64_t t, engine::Device dev,
                                AttentionTerms& terms) const override {
    const Tensor& b = constants_->get(bias_, t, dev);
    terms.bias = terms.bias.defined() ? terms.bias + b : b;
    return {};
  }
  void correlations(const CorrelationContext& ctx,
                    std::vector<CorrelationMatrix>& out) const override {
    CorrelationMatrix m;
    m.name = "alibi_bias";
    m.title = ctx.prefix + "ALiBi bias -m_h |j - i| per head";
    m.description =
        "the fixed (H, T, T) bias added to every layer's attention logits: -m_h |j - i| with the "
        "paper's geometric slopes m_h";
    m.values = position::cpu_f32(ctx.terms.bias.select(0, 0));
    m.logits = true;
    out.push_back(m);
  }

 private:
  const LengthConstants* constants_;
  int bias_ = -1;
};

}  // namespace

ENGINE_POSITION_FAMILY(.name = "alibi", .hf_blocker = "ALiBi's linear attention bias",
                       .make = make_component<Alibi>);

}  // namespace models
