// A BERT encoder's positional encoding: the components of its preset (component.h), their
// parameters ("bert.position.*", docs/checkpoint.md), and the terms they add to one forward.
//   table (Tmax, e)                 learned positions (bert_a, bert_r, tupe_*, bert_a_d)
//   freq (e/2)                      learnable_sin_ape frequencies
//   norm.{weight,bias}              TUPE's LN on positions
//   query.{weight,bias}, key.{...}  U^Q, U^K (tupe_*, bert_a_d)
//   cls_theta (2, e)                p_theta1, p_theta2 (tupe_a, tupe_r)
//   relative_table (buckets[+2], H) T5 bias (bert_r, tupe_r; +2 [CLS] rows with cls_reset: code)
//   shaw_table (2 clip + 1, d_h)    learned_rpe;  shaw_freq (d_h / 2): learnable_sin_rpe
// (rope and alibi have no parameters.)
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/bert_config.h"
#include "models/position/component.h"

namespace models {

class PositionEncoding : public engine::Module {
 public:
  // With `shared`, the input-position parameters (table, freq) are that module's, not drawn or
  // registered here; the attention-side ones (norm, U^Q, U^K, theta, relative tables) are own.
  PositionEncoding(const BertConfig& config, Generator& gen,
                   const PositionEncoding* shared = nullptr);
  // (T, e) added to the token embeddings before the input LayerNorm, or undefined. `device` is
  // the model's (the token embedding's): where the constant tensors of length T are kept.
  Tensor input_term(int64_t seq_len, engine::Device device) const;
  // Every component's terms of length T, the bias as (1, H, T, T).
  AttentionTerms attention_terms(int64_t seq_len, engine::Device device) const;
  // Every component's poscorr matrices, in the preset's order.
  void correlations(const CorrelationContext& ctx, std::vector<CorrelationMatrix>& out) const;
  // Sequence lengths the learned tables cover (clear error otherwise).
  void check_length(int64_t seq_len) const;
  // How many times the constant position tensors were built on the host (tests: once per new
  // longest length, not per forward).
  int64_t constant_builds() const { return constants_.builds(); }
  // The component of the family named `family` ("t5_bias"), or null when the preset has none.
  const PositionComponent* component(std::string_view family) const;
  const BertConfig& config() const { return config_; }
  // A parameter of this module by name ("cls_theta", "query.weight"); fails when absent.
  Tensor parameter(const std::string& name) const;

  Tensor table;  // (max_positions, e) learned positions when a family uses them, else undefined

 private:
  BertConfig config_;
  bool uses_table_ = false;  // a family reads the learned table (its lengths are checked)
  LengthConstants constants_;
  std::vector<std::pair<const PositionFamily*, std::unique_ptr<PositionComponent>>> components_;
};

}  // namespace models
