// TUPE's untied positional term (docs/positional-encodings.md): p^ = LN_pos(p), the term
// (p^ U^Q)(p^ U^K)^T / sqrt(2 d_h) of shape (H, T, T) added to every layer's logits (whose content
// scores are then scaled by 1/sqrt(2 d_h) too), and the [CLS] reset: row 0 = theta1, column 0
// below it = theta2, each the projection of a learned vector (cls_theta). With a relative bias b,
// cls_reset: paper is reset(v + b) and cls_reset: code is reset(v) + b' (b' with [CLS] buckets).
#include <cmath>

#include "engine/autocast.h"
#include "engine/error.h"
#include "models/bert.h"
#include "models/position/common.h"
#include "models/position/t5.h"
#include "models/position/untied.h"
#include "ops/ops.h"

namespace models {
namespace {

// (p^ U^Q)(p^ U^K)^T over every projected row: (H, rows, rows), unscaled. With the reset the
// rows are the T positions then theta1's and theta2's vectors, whose diagonal entries are the
// reset's values (untied_bias reads them there).
Tensor untied_product(const Tensor& pq, const Tensor& pk) {
  return engine::matmul(pq, pk.transpose(1, 2));
}

class Untied : public UntiedTerm {
 public:
  explicit Untied(PositionContext& ctx) : config_(ctx.config), table_(ctx.table) {
    const BertConfig& c = config_;
    const int64_t e = c.embedding_width(), d = c.hidden_size;
    norm_ = std::make_unique<LayerNorm>(e, c.layer_norm_eps);
    ctx.module.register_module("norm", *norm_);
    query_ = std::make_unique<Linear>(e, d, ctx.gen, c.init_std);  // U^Q: embedding width -> d
    key_ = std::make_unique<Linear>(e, d, ctx.gen, c.init_std);
    ctx.module.register_module("query", *query_);
    ctx.module.register_module("key", *key_);
    reset_ = c.position.cls_reset;
    if (reset_ == ClsReset::none) return;
    cls_theta_ =
        ctx.module.register_parameter("cls_theta", Tensor::randn({2, e}, ctx.gen, 0.0, c.init_std));
  }

  // The term in one pass (engine::untied_bias: scale, reset and the other components' bias), in
  // finish_terms, once every component has added its bias: cls_reset: paper resets the sum of
  // the terms; code resets the untied term, then adds the others (the relative bias with its
  // [CLS] buckets).
  std::vector<Tensor> add_terms(int64_t t, engine::Device dev,
                                AttentionTerms& terms) const override {
    Tensor pk;
    Tensor pq = projected_positions(t, &pk);
    terms.scale_factor = 2.0;
    return {untied_product(pq, pk)};  // (H, T[+2], T[+2])
  }
  void finish_terms(int64_t t, engine::Device dev, AttentionTerms& terms,
                    const std::vector<Tensor>& saved) const override {
    engine::UntiedBiasOptions o;
    o.scale = scale();
    o.reset = reset_ != ClsReset::none;
    o.add_at_reset = reset_ != ClsReset::paper;
    o.at_least_f32 = true;  // read by every layer, its gradient summed over them: in f32
    terms.bias = engine::untied_bias(saved.at(0), terms.bias, o);
  }

  Tensor untied_term(int64_t t) const override {
    Tensor pk;
    Tensor pq = projected_positions(t, &pk);
    engine::UntiedBiasOptions o;
    o.scale = scale();
    return engine::untied_bias(untied_product(pq.slice(1, 0, t), pk.slice(1, 0, t)), Tensor(), o)
        .unsqueeze(0);  // (1, H, T, T)
  }
  std::pair<Tensor, Tensor> cls_thetas() const override {
    ENGINE_CHECK(reset_ != ClsReset::none, "[bert] preset ", config_.position.preset,
                 " has no [CLS] reset");
    Tensor pk;
    Tensor pq = projected_positions(1, &pk);  // rows: position 0, theta1, theta2
    Tensor product = untied_product(pq, pk);
    auto theta = [&](int64_t r) { return product.select(1, r).select(1, r) * scale(); };
    return {theta(1), theta(2)};
  }

  void correlations(const CorrelationContext& ctx,
                    std::vector<CorrelationMatrix>& out) const override {
    const bool reset = reset_ != ClsReset::none;
    const bool relative = ctx.bert.position->component("t5_bias") != nullptr;
    CorrelationMatrix m;
    m.name = "tupe_term";
    m.title = ctx.prefix + "TUPE positional term" +
              (reset ? " after the [CLS] reset" : " (no [CLS] reset)") +
              (relative ? ", with the relative bias" : "");
    m.description =
        "the (H, T, T) term added to every layer's attention logits: (p^ U^Q)(p^ U^K)^T / sqrt(2 "
        "d_h)" +
        std::string(relative ? " + b[bucket(j - i)]" : "") +
        (reset ? std::string(", row 0 = theta1 and column 0 = theta2 (cls_reset ") +
                     cls_reset_name(reset_) + ")"
               : "");
    m.values = position::cpu_f32(ctx.terms.bias.select(0, 0));
    m.logits = true;
    m.first = reset ? 1 : 0;
    out.push_back(m);
  }

 private:
  double scale() const { return 1.0 / std::sqrt(2.0 * double(config_.head_size())); }

  // p^ = LN_pos(p) (rows 0..T-1, then theta1, theta2 when resetting). Returns p^ U^Q as
  // (H, rows, d_h) and p^ U^K likewise in *pk.
  // Under 16-bit autocast with the parameter slab's copy (engine::autocast_from_slab) the rows
  // are that copy's views, concatenated in 16 bits: no f32 concatenation converted after, and
  // their gradients go back converted straight into the f32 .grads. The table is sliced only when
  // T is shorter than it (a whole-table slice's backward would zero a gradient and add into it).
  Tensor projected_positions(int64_t t, Tensor* pk) const {
    Tensor rows = t == table_.size(0) ? table_ : table_.slice(0, 0, t);  // (T, e)
    const bool reset = reset_ != ClsReset::none;
    const Tensor rows16 = engine::autocast_from_slab(rows);
    const Tensor theta16 = reset ? engine::autocast_from_slab(cls_theta_) : Tensor();
    if (rows16.defined() && (!reset || theta16.defined())) {
      rows = reset ? engine::concat({rows16, theta16}, 0) : rows16;
    } else if (reset) {
      rows = engine::concat({rows, cls_theta_}, 0);
    }
    rows = norm_->forward(rows);
    *pk = position::heads_of(key_->forward(rows), config_.num_heads);
    return position::heads_of(query_->forward(rows), config_.num_heads);
  }

  BertConfig config_;
  Tensor table_, cls_theta_;
  std::unique_ptr<LayerNorm> norm_;
  std::unique_ptr<Linear> query_, key_;
  ClsReset reset_ = ClsReset::none;
};

}  // namespace

const UntiedTerm& untied_term_of(const PositionEncoding& encoding) {
  const auto* u = dynamic_cast<const UntiedTerm*>(encoding.component("untied"));
  ENGINE_CHECK(u, "[bert] preset ", encoding.config().position.preset,
               " has no untied positional term");
  return *u;
}

ENGINE_POSITION_FAMILY(.name = "untied", .uses_table = true,
                       .hf_blocker =
                           "TUPE's untied positional attention (bert.position.query / "
                           "key / norm, with cls_theta under the [CLS] reset)",
                       .make = make_component<Untied>);

}  // namespace models
