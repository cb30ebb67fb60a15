// ELECTRA's settings and the generator's sizes (see electra_config.h).
#include "models/electra_config.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/error.h"

namespace models {

ElectraConfig ElectraConfig::from_config(const engine::ConfigSection& s) {
  ElectraConfig e;
  e.generator_size = s.get_double("generator_size", e.generator_size);
  e.generator_layers = s.get_int("generator_layers", e.generator_layers);
  e.rtd_weight = s.get_double("rtd_weight", e.rtd_weight);
  e.temperature = s.get_double("temperature", e.temperature);
  s.finish();
  ENGINE_CHECK(e.generator_size > 0 && e.generator_size <= 1, "[config] ",
               s.where("generator_size"), ": must be in (0, 1], got ", e.generator_size);
  ENGINE_CHECK(e.generator_layers >= 0, "[config] ", s.where("generator_layers"),
               ": must be 0 (the discriminator's) or positive, got ", e.generator_layers);
  ENGINE_CHECK(std::isfinite(e.rtd_weight) && e.rtd_weight >= 0, "[config] ", s.where("rtd_weight"),
               ": must be a finite value >= 0, got ", e.rtd_weight);
  ENGINE_CHECK(std::isfinite(e.temperature) && e.temperature > 0, "[config] ",
               s.where("temperature"), ": must be positive, got ", e.temperature);
  return e;
}

std::string ElectraConfig::to_json() const {
  nlohmann::ordered_json j;
  j["generator_size"] = generator_size;
  j["generator_layers"] = generator_layers;
  j["rtd_weight"] = rtd_weight;
  j["temperature"] = temperature;
  return j.dump();
}

ElectraConfig ElectraConfig::from_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ENGINE_FAIL("[electra] ", source, ": the ELECTRA config is not valid JSON: ", e.what());
  }
  auto num = [&](const char* key) {
    ENGINE_CHECK(j.is_object() && j.contains(key) && j[key].is_number(), "[electra] ", source,
                 ": ELECTRA config key '", key, "' is missing or not a number");
    return j[key].get<double>();
  };
  ElectraConfig e;
  e.generator_size = num("generator_size");
  e.generator_layers = static_cast<int64_t>(num("generator_layers"));
  e.rtd_weight = num("rtd_weight");
  e.temperature = num("temperature");
  return e;
}

BertConfig generator_config(const BertConfig& d, const ElectraConfig& e) {
  BertConfig g = d;
  auto scaled = [&](int64_t v) {
    return std::max<int64_t>(1, std::llround(double(v) * e.generator_size));
  };
  g.hidden_size = scaled(d.hidden_size);
  g.num_heads = scaled(d.num_heads);
  g.ffn_size = scaled(d.ffn_size);
  g.num_layers = e.generator_layers > 0 ? e.generator_layers : d.num_layers;
  g.embedding_size = d.embedding_width();
  if (g.embedding_size == g.hidden_size) g.embedding_size = 0;
  ENGINE_CHECK(g.hidden_size % g.num_heads == 0, "[electra] electra.generator_size ",
               e.generator_size, " gives the generator a hidden size of ", g.hidden_size, " and ",
               g.num_heads, " heads (", d.hidden_size, " and ", d.num_heads,
               " scaled), which do not divide; choose a size that keeps the head size whole");
  g.validate();
  return g;
}

}  // namespace models
