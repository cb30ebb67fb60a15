// The BERT encoder's configuration: sizes, dropout, post/pre-LN, and the positional encoding
// (a preset from docs/positional-encodings.md resolved into the parts it switches on). Read from
// the `model:` section of a YAML config, and stored as JSON in checkpoints so they describe
// themselves.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/config.h"
#include "models/position/component.h"

namespace models {

enum class ClsReset { none, paper, code };
const char* cls_reset_name(ClsReset r);  // "none", "paper", "code"

// The positional encoding: a preset (models/position/presets.cpp) and the families it combines
// (models/position/component.h), with the knobs some families read.
struct PositionConfig {
  std::string preset = "bert_a";
  std::vector<std::string> families{"learned"};  // the preset's family names, in order
  ClsReset cls_reset = ClsReset::none;  // TUPE's [CLS] reset; `paper` or `code` for tupe_a/tupe_r
  int64_t relative_buckets = 32;        // T5 buckets (both directions together)
  int64_t relative_max_distance = 128;  // T5 max distance
  int64_t rpe_clip = 64;                // Shaw: c(r) = clip(r, -rpe_clip, rpe_clip)

  bool has_position_table() const;  // a learned (max_positions, e) table exists
  bool has(std::string_view family) const;
  // The family that adds the input term ("learned", "sinusoid", "learnable_sinusoid") or "none".
  std::string input_name() const;
  void validate(const BertConfig& config) const;  // each family's checks; clear errors
  // Why the preset has no Hugging Face BERT equivalent ("" for bert_a).
  std::string hf_blocker() const;
  // The registered descriptors of `families` (component.h); empty in a program that links no
  // family (the config layer alone), where the checks and facts above are left to the model.
  std::vector<const PositionFamily*> linked_families() const;
};

// Every preset name a config accepts (the 13 rows of the second paper, TUPE's presets, rope and
// alibi), in the preset table's order.
const std::vector<std::string>& position_presets();
// Fills the parts of `pc` that `preset` switches on; `cls_reset` is "paper" or "code".
void apply_position_preset(PositionConfig& pc, const std::string& preset,
                           const std::string& cls_reset = "paper");

struct BertConfig {
  int64_t vocab_size = 32768;
  int64_t hidden_size = 768;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t ffn_size = 3072;
  // Width of the token, segment and input-position embeddings; 0 = hidden_size. Another width
  // (ELECTRA-Small: 128 under a hidden size of 256; ELECTRA's generator) adds a Linear from it to
  // hidden_size after the input LayerNorm, and the MLM head projects back to it.
  int64_t embedding_size = 0;
  int64_t max_positions = 512;  // rows of learned position tables
  int64_t type_vocab_size = 0;  // 0 (RoBERTa style, the papers' setting) or 2 (original BERT)
  double layer_norm_eps = 1e-12;
  double hidden_dropout = 0.1;     // embeddings and residual branches
  double attention_dropout = 0.1;  // attention probabilities
  bool pre_layer_norm = false;     // post-LN (BERT) by default
  double init_std = 0.02;
  PositionConfig position;

  int64_t head_size() const { return hidden_size / num_heads; }
  int64_t embedding_width() const { return embedding_size > 0 ? embedding_size : hidden_size; }
  void validate() const;  // sizes positive, heads divide width, preset consistent; clear errors

  // `size: base | large | custom` sets the sizes, and explicit keys override them; a missing
  // vocab_size is `default_vocab_size` when that is positive (e.g. the corpus tokenizer's).
  static BertConfig from_config(const engine::ConfigSection& model, int64_t default_vocab_size = 0);
  std::string to_json() const;
  static BertConfig from_json(const std::string& json, const std::string& source);
  bool operator==(const BertConfig& o) const { return to_json() == o.to_json(); }
  // The first key whose value differs, with both values ("position.preset: \"tupe_r\" vs
  // \"bert_a\"", this config first), or "" if equal.
  std::string first_difference(const BertConfig& other) const;
};

BertConfig bert_base();
BertConfig bert_large();

}  // namespace models
