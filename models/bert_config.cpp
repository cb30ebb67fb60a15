// BERT configuration: presets, YAML reading, JSON for checkpoint metadata.
#include "models/bert_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "engine/error.h"

namespace models {

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
  position.validate(*this);
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
  p["input"] = position.input_name();
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
