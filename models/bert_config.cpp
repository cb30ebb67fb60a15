// BERT configuration: presets, YAML reading, JSON for checkpoint metadata.
#include "models/bert_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "engine/error.h"

namespace models {
namespace {

struct Single {
  const char* name;
  InputPosition input;
  RelativePosition relative;
  AttentionPosition attention;
};

// The single presets of docs/positional-encodings.md (TUPE's reset is set separately).
const Single kSingles[] = {
    {"no_pe", InputPosition::none, RelativePosition::none, AttentionPosition::none},
    {"bert_a", InputPosition::learned, RelativePosition::none, AttentionPosition::none},
    {"sin_ape", InputPosition::sinusoid, RelativePosition::none, AttentionPosition::none},
    {"learnable_sin_ape", InputPosition::learnable_sinusoid, RelativePosition::none,
     AttentionPosition::none},
    {"bert_r", InputPosition::learned, RelativePosition::t5_bias, AttentionPosition::none},
    {"learned_rpe", InputPosition::none, RelativePosition::shaw_learned, AttentionPosition::none},
    {"sin_rpe", InputPosition::none, RelativePosition::shaw_sinusoid, AttentionPosition::none},
    {"learnable_sin_rpe", InputPosition::none, RelativePosition::shaw_learnable_sinusoid,
     AttentionPosition::none},
    {"tupe_a", InputPosition::none, RelativePosition::none, AttentionPosition::untied},
    {"tupe_r", InputPosition::none, RelativePosition::t5_bias, AttentionPosition::untied},
    {"tupe_a_tie_cls", InputPosition::none, RelativePosition::none, AttentionPosition::untied},
    {"bert_a_d", InputPosition::none, RelativePosition::none, AttentionPosition::decomposed},
};

// APE + RPE combinations of the second paper.
const char* kCombos[] = {
    "bert_a+learned_rpe",        "bert_a+sin_rpe",
    "bert_a+learnable_sin_rpe",  "learnable_sin_ape+learned_rpe",
    "learnable_sin_ape+sin_rpe", "learnable_sin_ape+learnable_sin_rpe",
};

const Single* find_single(const std::string& name) {
  for (const Single& s : kSingles)
    if (name == s.name) return &s;
  return nullptr;
}

const char* input_name(InputPosition p) {
  switch (p) {
    case InputPosition::none:
      return "none";
    case InputPosition::learned:
      return "learned";
    case InputPosition::sinusoid:
      return "sinusoid";
    case InputPosition::learnable_sinusoid:
      return "learnable_sinusoid";
  }
  return "?";
}

}  // namespace

const std::vector<std::string>& position_presets() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Single& s : kSingles) v.push_back(s.name);
    for (const char* c : kCombos) v.push_back(c);
    return v;
  }();
  return names;
}

bool PositionConfig::has_position_table() const {
  return input == InputPosition::learned || attention != AttentionPosition::none;
}

int64_t PositionConfig::relative_bias_rows() const {
  if (relative != RelativePosition::t5_bias) return 0;
  return relative_buckets + (cls_reset == ClsReset::code ? 2 : 0);
}

void apply_position_preset(PositionConfig& pc, const std::string& preset,
                           const std::string& cls_reset) {
  const auto& all = position_presets();
  std::string list;
  for (auto& n : all) list += (list.empty() ? "" : ", ") + n;
  ENGINE_CHECK(std::find(all.begin(), all.end(), preset) != all.end(),
               "[bert] unknown position preset '", preset, "'; expected one of: ", list);
  ENGINE_CHECK(cls_reset == "paper" || cls_reset == "code",
               "[bert] cls_reset must be 'paper' or 'code', got '", cls_reset, "'");
  pc.preset = preset;
  const size_t plus = preset.find('+');
  if (plus == std::string::npos) {
    const Single* s = find_single(preset);
    pc.input = s->input;
    pc.relative = s->relative;
    pc.attention = s->attention;
  } else {
    const Single* a = find_single(preset.substr(0, plus));
    const Single* r = find_single(preset.substr(plus + 1));
    pc.input = a->input;
    pc.relative = r->relative;
    pc.attention = AttentionPosition::none;
  }
  pc.cls_reset = ClsReset::none;
  if (preset == "tupe_a" || preset == "tupe_r")
    pc.cls_reset = cls_reset == "code" ? ClsReset::code : ClsReset::paper;
}

BertConfig bert_base() { return BertConfig{}; }

BertConfig bert_large() {
  BertConfig c;
  c.hidden_size = 1024;
  c.num_layers = 24;
  c.num_heads = 16;
  c.ffn_size = 4096;
  return c;
}

void BertConfig::validate() const {
  auto positive = [](int64_t v, const char* key) {
    ENGINE_CHECK(v > 0, "[bert] model.", key, " must be positive, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_layers, "num_layers");
  positive(num_heads, "num_heads");
  positive(ffn_size, "ffn_size");
  positive(max_positions, "max_positions");
  ENGINE_CHECK(embedding_size >= 0,
               "[bert] model.embedding_size must be 0 (= hidden_size) or "
               "positive, got ",
               embedding_size);
  ENGINE_CHECK(hidden_size % num_heads == 0, "[bert] model.hidden_size ", hidden_size,
               " is not divisible by model.num_heads ", num_heads);
  ENGINE_CHECK(type_vocab_size >= 0, "[bert] model.type_vocab_size must be 0 or more, got ",
               type_vocab_size);
  ENGINE_CHECK(layer_norm_eps > 0, "[bert] model.layer_norm_eps must be positive");
  ENGINE_CHECK(
      hidden_dropout >= 0 && hidden_dropout < 1 && attention_dropout >= 0 && attention_dropout < 1,
      "[bert] model.hidden_dropout and model.attention_dropout must be in [0, 1)");
  ENGINE_CHECK(init_std > 0, "[bert] model.init_std must be positive");
  const PositionConfig& p = position;
  if (p.input == InputPosition::sinusoid || p.input == InputPosition::learnable_sinusoid)
    ENGINE_CHECK(embedding_width() % 2 == 0,
                 "[bert] sinusoidal positions need an even embedding width (model.embedding_size, "
                 "or hidden_size), got ",
                 embedding_width());
  if (p.relative == RelativePosition::shaw_sinusoid ||
      p.relative == RelativePosition::shaw_learnable_sinusoid)
    ENGINE_CHECK(head_size() % 2 == 0,
                 "[bert] sinusoidal relative positions need an even head size, got ", head_size());
  if (p.relative == RelativePosition::t5_bias) {
    ENGINE_CHECK(p.relative_buckets >= 4 && p.relative_buckets % 2 == 0,
                 "[bert] model.position.relative_buckets must be even and at least 4, got ",
                 p.relative_buckets);
    ENGINE_CHECK(p.relative_max_distance > p.relative_buckets / 4,
                 "[bert] model.position.relative_max_distance must exceed relative_buckets / 4 "
                 "(the exact range), got ",
                 p.relative_max_distance);
  }
  ENGINE_CHECK(p.rpe_clip >= 1, "[bert] model.position.rpe_clip must be at least 1, got ",
               p.rpe_clip);
}

BertConfig BertConfig::from_config(const engine::ConfigSection& m, int64_t default_vocab_size) {
  const std::string size = m.get_choice("size", "custom", {"base", "large", "custom"});
  BertConfig c = size == "large" ? bert_large() : bert_base();
  c.vocab_size =
      m.get_int("vocab_size", default_vocab_size > 0 ? default_vocab_size : c.vocab_size);
  c.hidden_size = m.get_int("hidden_size", c.hidden_size);
  c.num_layers = m.get_int("num_layers", c.num_layers);
  c.num_heads = m.get_int("num_heads", c.num_heads);
  c.ffn_size = m.get_int("ffn_size", c.ffn_size);
  c.embedding_size = m.get_int("embedding_size", c.embedding_size);
  c.max_positions = m.get_int("max_positions", c.max_positions);
  c.type_vocab_size = m.get_int("type_vocab_size", c.type_vocab_size);
  c.layer_norm_eps = m.get_double("layer_norm_eps", c.layer_norm_eps);
  c.hidden_dropout = m.get_double("hidden_dropout", c.hidden_dropout);
  c.attention_dropout = m.get_double("attention_dropout", c.attention_dropout);
  c.pre_layer_norm = m.get_bool("pre_layer_norm", c.pre_layer_norm);
  c.init_std = m.get_double("init_std", c.init_std);
  engine::ConfigSection p = m.section("position");
  const std::string preset = p.get_choice("preset", "bert_a", position_presets());
  const std::string reset = p.get_choice("cls_reset", "paper", {"paper", "code"});
  apply_position_preset(c.position, preset, reset);
  c.position.relative_buckets = p.get_int("relative_buckets", c.position.relative_buckets);
  c.position.relative_max_distance =
      p.get_int("relative_max_distance", c.position.relative_max_distance);
  c.position.rpe_clip = p.get_int("rpe_clip", c.position.rpe_clip);
  p.finish();
  m.finish();
  c.validate();
  return c;
}

const char* cls_reset_name(ClsReset r) {
  switch (r) {
    case ClsReset::none:
      return "none";
    case ClsReset::paper:
      return "paper";
    case ClsReset::code:
      return "code";
  }
  return "";
}

std::string BertConfig::to_json() const {
  nlohmann::ordered_json j;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_layers"] = num_layers;
  j["num_heads"] = num_heads;
  j["ffn_size"] = ffn_size;
  if (embedding_size > 0) j["embedding_size"] = embedding_size;  // absent: hidden_size
  j["max_positions"] = max_positions;
  j["type_vocab_size"] = type_vocab_size;
  j["layer_norm_eps"] = layer_norm_eps;
  j["hidden_dropout"] = hidden_dropout;
  j["attention_dropout"] = attention_dropout;
  j["pre_layer_norm"] = pre_layer_norm;
  j["init_std"] = init_std;
  nlohmann::ordered_json p;
  p["preset"] = position.preset;
  p["cls_reset"] = position.cls_reset == ClsReset::code ? "code" : "paper";
  p["relative_buckets"] = position.relative_buckets;
  p["relative_max_distance"] = position.relative_max_distance;
  p["rpe_clip"] = position.rpe_clip;
  // Derived, for readers that do not know the preset table (the PyTorch reference checks them).
  p["input"] = input_name(position.input);
  j["position"] = p;
  return j.dump();
}

std::string BertConfig::first_difference(const BertConfig& other) const {
  const nlohmann::json a = nlohmann::json::parse(to_json()),
                       b = nlohmann::json::parse(other.to_json());
  // A key either side lacks (embedding_size is written only when set) reads as "(unset)".
  auto at = [](const nlohmann::json& o, const std::string& key) {
    return o.contains(key) ? o.at(key) : nlohmann::json();
  };
  auto text = [](const nlohmann::json& v) { return v.is_null() ? "(unset)" : v.dump(); };
  for (const nlohmann::json* side : {&a, &b}) {
    for (auto it = side->begin(); it != side->end(); ++it) {
      const nlohmann::json x = at(a, it.key()), y = at(b, it.key());
      if (x.is_object() && y.is_object()) {
        for (auto jt = x.begin(); jt != x.end(); ++jt)
          if (at(y, jt.key()) != jt.value())
            return it.key() + "." + jt.key() + ": " + text(jt.value()) + " vs " +
                   text(at(y, jt.key()));
      } else if (x != y) {
        return it.key() + ": " + text(x) + " vs " + text(y);
      }
    }
  }
  return "";
}

BertConfig BertConfig::from_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ENGINE_FAIL("[bert] ", source, ": the model config is not valid JSON: ", e.what());
  }
  ENGINE_CHECK(j.is_object(), "[bert] ", source, ": the model config is not a JSON object");
  BertConfig c;
  auto get_int = [&](const nlohmann::json& o, const char* key, int64_t& out, const char* pre) {
    ENGINE_CHECK(o.contains(key) && o[key].is_number_integer(), "[bert] ", source,
                 ": model config key '", pre, key, "' is missing or not an integer");
    out = o[key].get<int64_t>();
  };
  auto get_num = [&](const char* key, double& out) {
    ENGINE_CHECK(j.contains(key) && j[key].is_number(), "[bert] ", source, ": model config key '",
                 key, "' is missing or not a number");
    out = j[key].get<double>();
  };
  get_int(j, "vocab_size", c.vocab_size, "");
  get_int(j, "hidden_size", c.hidden_size, "");
  get_int(j, "num_layers", c.num_layers, "");
  get_int(j, "num_heads", c.num_heads, "");
  get_int(j, "ffn_size", c.ffn_size, "");
  if (j.contains("embedding_size")) get_int(j, "embedding_size", c.embedding_size, "");
  get_int(j, "max_positions", c.max_positions, "");
  get_int(j, "type_vocab_size", c.type_vocab_size, "");
  get_num("layer_norm_eps", c.layer_norm_eps);
  get_num("hidden_dropout", c.hidden_dropout);
  get_num("attention_dropout", c.attention_dropout);
  get_num("init_std", c.init_std);
  ENGINE_CHECK(j.contains("pre_layer_norm") && j["pre_layer_norm"].is_boolean(), "[bert] ", source,
               ": model config key 'pre_layer_norm' is missing or not a boolean");
  c.pre_layer_norm = j["pre_layer_norm"].get<bool>();
  ENGINE_CHECK(j.contains("position") && j["position"].is_object(), "[bert] ", source,
               ": model config key 'position' is missing or not an object");
  const nlohmann::json& p = j["position"];
  ENGINE_CHECK(p.contains("preset") && p["preset"].is_string() && p.contains("cls_reset") &&
                   p["cls_reset"].is_string(),
               "[bert] ", source,
               ": model config keys 'position.preset' and 'position.cls_reset' must be strings");
  apply_position_preset(c.position, p["preset"].get<std::string>(),
                        p["cls_reset"].get<std::string>());
  get_int(p, "relative_buckets", c.position.relative_buckets, "position.");
  get_int(p, "relative_max_distance", c.position.relative_max_distance, "position.");
  get_int(p, "rpe_clip", c.position.rpe_clip, "position.");
  c.validate();
  return c;
}

}  // namespace models
