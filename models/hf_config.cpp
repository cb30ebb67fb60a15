// Hugging Face config.json -> the engine's BertConfig (see hf_bert.h): the reader on its own, so
// that it can be checked without the model (tests/fuzz/hf_config.cpp).
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "engine/error.h"
#include "models/hf_bert.h"

namespace models {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t get_int(const json& c, const fs::path& file, const char* key, int64_t fallback = -1) {
  if (!c.contains(key)) {
    ENGINE_CHECK(fallback >= 0, "[hf] ", file.string(), ": missing key '", key, "'");
    return fallback;
  }
  ENGINE_CHECK(c[key].is_number_integer() && c[key].get<int64_t>() >= 0, "[hf] ", file.string(),
               ": '", key, "' must be a non-negative integer, got ", c[key].dump());
  return c[key].get<int64_t>();
}

double get_double(const json& c, const fs::path& file, const char* key, double fallback) {
  if (!c.contains(key)) return fallback;
  ENGINE_CHECK(c[key].is_number(), "[hf] ", file.string(), ": '", key, "' must be a number, got ",
               c[key].dump());
  return c[key].get<double>();
}

// config.json -> the engine's BertConfig (bert_a, post-LN); anything HF BERT can express that
// this engine computes differently is an error naming the key.
BertConfig config_from_hf(const json& c, const fs::path& file) {
  ENGINE_CHECK(c.is_object(), "[hf] ", file.string(), ": not a JSON object");
  auto str = [&](const char* key, const std::string& fallback) {
    if (!c.contains(key) || c[key].is_null()) return fallback;
    ENGINE_CHECK(c[key].is_string(), "[hf] ", file.string(), ": '", key, "' must be a string, got ",
                 c[key].dump());
    return c[key].get<std::string>();
  };
  const std::string type = str("model_type", "bert");
  ENGINE_CHECK(type == "bert", "[hf] ", file.string(), ": model_type '", type,
               "' is not BERT (only model_type \"bert\" converts)");
  const std::string act = str("hidden_act", "gelu");
  ENGINE_CHECK(act == "gelu", "[hf] ", file.string(), ": hidden_act '", act,
               "' is not supported (this engine's BERT uses the exact erf GELU, HF's \"gelu\")");
  const std::string pos = str("position_embedding_type", "absolute");
  ENGINE_CHECK(pos == "absolute", "[hf] ", file.string(), ": position_embedding_type '", pos,
               "' is not supported (only \"absolute\", the bert_a preset, converts)");
  for (const char* key : {"is_decoder", "add_cross_attention"})
    ENGINE_CHECK(!c.contains(key) || !c[key].is_boolean() || !c[key].get<bool>(), "[hf] ",
                 file.string(), ": '", key, "' is true; only the BERT encoder converts");
  BertConfig b;
  b.vocab_size = get_int(c, file, "vocab_size");
  b.hidden_size = get_int(c, file, "hidden_size");
  b.num_layers = get_int(c, file, "num_hidden_layers");
  b.num_heads = get_int(c, file, "num_attention_heads");
  b.ffn_size = get_int(c, file, "intermediate_size");
  b.max_positions = get_int(c, file, "max_position_embeddings");
  b.type_vocab_size = get_int(c, file, "type_vocab_size", 2);
  b.layer_norm_eps = get_double(c, file, "layer_norm_eps", 1e-12);
  b.hidden_dropout = get_double(c, file, "hidden_dropout_prob", 0.1);
  b.attention_dropout = get_double(c, file, "attention_probs_dropout_prob", 0.1);
  b.init_std = get_double(c, file, "initializer_range", 0.02);
  b.pre_layer_norm = false;
  apply_position_preset(b.position, "bert_a");
  try {
    b.validate();
  } catch (const engine::Error& e) {
    ENGINE_FAIL("[hf] ", file.string(), ": ", e.what());
  }
  return b;
}

}  // namespace

BertConfig bert_config_from_hf(const std::string& text, const std::string& source) {
  json c;
  try {
    c = json::parse(text);
  } catch (const json::exception& e) {
    ENGINE_FAIL("[hf] ", source, ": not valid JSON: ", e.what());
  }
  return config_from_hf(c, source);
}

}  // namespace models
