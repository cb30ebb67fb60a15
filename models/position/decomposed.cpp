// bert_a_d (TUPE's Table 2 ablation): the absolute positions enter attention only, through the
// four-term expansion (q + p U^Q) . (k + p U^K) / sqrt(4 d_h): q and k receive p U^Q and p U^K
// (1, H, T, d_h), broadcast over the batch, and the logits are scaled by 1/sqrt(4 d_h).
#include <cmath>

#include "models/bert.h"
#include "models/position/common.h"
#include "ops/ops.h"

namespace models {
namespace {

class Decomposed : public PositionComponent {
 public:
  explicit Decomposed(PositionContext& ctx) : config_(ctx.config), table_(ctx.table) {
    const BertConfig& c = config_;
    const int64_t e = c.embedding_width(), d = c.hidden_size;
    query_ = std::make_unique<Linear>(e, d, ctx.gen, c.init_std);  // U^Q: embedding width -> d
    key_ = std::make_unique<Linear>(e, d, ctx.gen, c.init_std);
    ctx.module.register_module("query", *query_);
    ctx.module.register_module("key", *key_);
  }

  std::vector<Tensor> add_terms(int64_t t, engine::Device, AttentionTerms& terms) const override {
    Tensor rows = table_.slice(0, 0, t);  // (T, e)
    const int64_t h = config_.num_heads;
    Tensor pk = position::heads_of(key_->forward(rows), h);
    Tensor pq = position::heads_of(query_->forward(rows), h);
    terms.pos_query = pq.unsqueeze(0);
    terms.pos_key = pk.unsqueeze(0);
    terms.scale_factor = 4.0;
    return {};
  }
  void correlations(const CorrelationContext& ctx,
                    std::vector<CorrelationMatrix>& out) const override {
    CorrelationMatrix m;
    m.name = "decomposed_term";
    m.title = ctx.prefix + "positional term (p U^Q)(p U^K) / sqrt(4 d_h)";
    m.description =
        "bert_a_d's position-to-position term of every layer's logits: (p_i U^Q)(p_j U^K) / sqrt(4 "
        "d_h)";
    m.values = engine::matmul(ctx.terms.pos_query.select(0, 0),
                              ctx.terms.pos_key.select(0, 0).transpose(1, 2)) *
               (1.0 / std::sqrt(4.0 * double(config_.head_size())));
    m.values = position::cpu_f32(m.values);
    m.logits = true;
    out.push_back(m);
    // Its positions enter through U^Q, U^K only; their P P^T is drawn all the same.
    out.push_back(position::ape_dot(table_.slice(0, 0, ctx.length), ctx));
  }

 private:
  BertConfig config_;
  Tensor table_;
  std::unique_ptr<Linear> query_, key_;
};

}  // namespace

ENGINE_POSITION_FAMILY(.name = "decomposed", .uses_table = true,
                       .hf_blocker =
                           "the decomposed positional attention "
                           "(bert.position.query / key)",
                       .make = make_component<Decomposed>);

}  // namespace models
