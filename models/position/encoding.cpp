// PositionEncoding: builds the preset's components and assembles their terms (encoding.h).
#include "models/position/encoding.h"

#include "engine/error.h"
#include "ops/ops.h"

namespace models {

PositionEncoding::PositionEncoding(const BertConfig& c, Generator& gen,
                                   const PositionEncoding* shared)
    : config_(c) {
  const PositionConfig& p = c.position;
  // The learned positions first (their draw comes before every component's parameters).
  if (shared)  // the other model's position embeddings (checked alike by BertModel)
    table = shared->table;
  else if (p.has_position_table())
    table = register_parameter(
        "table", Tensor::randn({c.max_positions, c.embedding_width()}, gen, 0.0, c.init_std));
  for (const PositionFamily* f : p.linked_families()) {
    uses_table_ = uses_table_ || f->uses_table;
    const PositionComponent* other = shared ? shared->component(f->name) : nullptr;
    PositionContext ctx{c, gen, *this, constants_, table, other};
    components_.emplace_back(f, f->make(ctx));
  }
}

void PositionEncoding::check_length(int64_t seq_len) const {
  ENGINE_CHECK(seq_len >= 1, "[bert] empty sequence");
  if (uses_table_)
    ENGINE_CHECK(seq_len <= config_.max_positions, "[bert] sequence length ", seq_len,
                 " exceeds model.max_positions ", config_.max_positions,
                 " of the learned position table (preset ", config_.position.preset, ")");
}

Tensor PositionEncoding::input_term(int64_t seq_len, engine::Device device) const {
  check_length(seq_len);
  Tensor out;
  for (const auto& [family, c] : components_) {
    Tensor x = c->input_term(seq_len, device);
    if (x.defined()) out = out.defined() ? out + x : x;
  }
  return out;
}

AttentionTerms PositionEncoding::attention_terms(int64_t seq_len, engine::Device device) const {
  check_length(seq_len);
  AttentionTerms out;
  std::vector<std::vector<Tensor>> saved;
  for (const auto& [family, c] : components_) saved.push_back(c->add_terms(seq_len, device, out));
  for (size_t i = 0; i < components_.size(); ++i)
    components_[i].second->finish_terms(seq_len, device, out, saved[i]);
  if (out.bias.defined()) out.bias = out.bias.unsqueeze(0);  // (H, T, T) -> (1, H, T, T)
  return out;
}

void PositionEncoding::correlations(const CorrelationContext& ctx,
                                    std::vector<CorrelationMatrix>& out) const {
  for (const auto& [family, c] : components_) c->correlations(ctx, out);
}

const PositionComponent* PositionEncoding::component(std::string_view family) const {
  for (const auto& [f, c] : components_)
    if (family == f->name) return c.get();
  return nullptr;
}

Tensor PositionEncoding::parameter(const std::string& name) const {
  for (const auto& [n, t] : named_parameters())
    if (n == name) return t;
  ENGINE_FAIL("[bert] preset ", config_.position.preset, " has no parameter bert.position.", name);
}

}  // namespace models
