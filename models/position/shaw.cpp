// Shaw et al.'s relative positions (learned_rpe, sin_rpe, learnable_sin_rpe): relative vectors
// a_r (2 clip + 1, d_h), shared by heads and layers, added to the keys (q_i . (k_j + a_c(j-i)))
// and to the values, c(r) = clip(r, -rpe_clip, rpe_clip). The vectors are learned
// ("bert.position.shaw_table"), fixed sinusoids, or sinusoids of learnable frequencies
// ("bert.position.shaw_freq"). The layer applies them (BertLayer, models/bert.cpp) without a (T, T,
// d_h) tensor: relative_gather / relative_scatter over (T, 2 clip + 1) rows.

#include "engine/error.h"
#include "models/bert.h"
#include "models/position/common.h"
#include "ops/ops.h"

namespace models {
namespace {

void check_even_head(const BertConfig& c) {
  ENGINE_CHECK(c.head_size() % 2 == 0,
               "[bert] sinusoidal relative positions need an even head size, got ", c.head_size());
}

enum class Kind { learned, sinusoid, learnable_sinusoid };

template <Kind K>
class Shaw : public PositionComponent {
 public:
  explicit Shaw(PositionContext& ctx) : constants_(&ctx.constants) {
    const BertConfig& c = ctx.config;
    const int64_t clip = c.position.rpe_clip, dh = c.head_size();
    if (K == Kind::learned)
      table_ = ctx.module.register_parameter(
          "shaw_table", Tensor::randn({2 * clip + 1, dh}, ctx.gen, 0.0, c.init_std));
    if (K == Kind::learnable_sinusoid)
      freq_ = ctx.module.register_parameter("shaw_freq", position::sinusoid_freqs(dh));
    index_ = ctx.constants.add(2, [clip](int64_t t, engine::Device dev) {
      return engine::relative_clip_index(t, t, clip, dev);
    });
    // its inverse for the scatters (the values' term, the keys' term's backward): made once
    inverse_ = ctx.constants.add_derived(index_, [clip](const Tensor& index) {
      return engine::relative_index_inverse(index, 2 * clip + 1);
    });
    if (K == Kind::sinusoid)
      fixed_ = ctx.constants.add(0, [clip, dh](int64_t, engine::Device dev) {
        return position::sinusoid(position::range_f32(-clip, clip + 1, engine::Device::cpu()),
                                  position::sinusoid_freqs(dh))
            .to(dev);
      });
    if (K == Kind::learnable_sinusoid)
      positions_ = ctx.constants.add(0, [clip](int64_t, engine::Device dev) {
        return position::range_f32(-clip, clip + 1, dev);
      });
  }

  std::vector<Tensor> add_terms(int64_t t, engine::Device dev,
                                AttentionTerms& terms) const override {
    if (K == Kind::learned)
      terms.shaw_table = table_;
    else if (K == Kind::sinusoid)
      terms.shaw_table = constants_->get(fixed_, t, dev);
    else
      terms.shaw_table = position::sinusoid(constants_->get(positions_, t, dev), freq_);
    terms.shaw_index = constants_->get(index_, t, dev);
    terms.shaw_inverse = constants_->get(inverse_, t, dev);
    return {};
  }
  void correlations(const CorrelationContext& ctx,
                    std::vector<CorrelationMatrix>& out) const override {
    const Tensor a = position::cpu_f32(ctx.terms.shaw_table);  // (2 clip + 1, d_h)
    CorrelationMatrix m;
    m.name = "rpe_dot";
    m.title = ctx.prefix + "a_r . a_s between relative position vectors";
    m.description =
        "dot products of Shaw's relative vectors a_r (shared by heads and layers), r and s from "
        "-clip to clip";
    m.values = engine::matmul(a, a.transpose(0, 1)).unsqueeze(0);
    m.per_head = false;
    const double clip = double(ctx.bert.config().position.rpe_clip);
    m.row_start = m.col_start = -clip;
    m.row_axis = "offset r";
    m.col_axis = "offset s";
    out.push_back(m);
  }

 private:
  const LengthConstants* constants_;
  Tensor table_, freq_;
  int index_ = -1, inverse_ = -1, fixed_ = -1, positions_ = -1;
};

}  // namespace

const char* const kShawBlocker = "relative positions inside attention (bert.position.shaw_*)";

ENGINE_POSITION_FAMILY(.name = "shaw_learned", .hf_blocker = kShawBlocker,
                       .make = make_component<Shaw<Kind::learned>>);
ENGINE_POSITION_FAMILY(.name = "shaw_sinusoid", .hf_blocker = kShawBlocker,
                       .validate = check_even_head, .make = make_component<Shaw<Kind::sinusoid>>);
ENGINE_POSITION_FAMILY(.name = "shaw_learnable_sinusoid", .hf_blocker = kShawBlocker,
                       .validate = check_even_head,
                       .make = make_component<Shaw<Kind::learnable_sinusoid>>);

}  // namespace models
