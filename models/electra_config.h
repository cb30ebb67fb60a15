// ELECTRA's settings (the `electra:` section of a pretraining config) and the generator's sizes,
// apart from the model (models/electra.h) so that config readers need no model code.
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"
#include "models/bert_config.h"

namespace models {

// Checkpoint metadata key of the ELECTRA settings (ElectraConfig::to_json()); the model config
// (engine.model_config) is the discriminator's.
inline constexpr const char* kElectraConfigKey = "engine.electra_config";

// The `electra:` section of a pretraining config.
struct ElectraConfig {
  double generator_size = 0.25;  // the generator's hidden, FFN and heads over the discriminator's
  int64_t generator_layers = 0;  // 0: the discriminator's num_layers
  double rtd_weight = 50.0;      // lambda of loss = MLM + lambda x RTD
  double temperature = 1.0;      // the generator's samples come from softmax(logits / temperature)

  static ElectraConfig from_config(const engine::ConfigSection& section);  // errors name the key
  std::string to_json() const;
  static ElectraConfig from_json(const std::string& json, const std::string& source);
};

// The generator's BertConfig for `discriminator` (see the file comment): errors when the scaled
// sizes do not make a model (hidden size not divisible by the heads).
BertConfig generator_config(const BertConfig& discriminator, const ElectraConfig& electra);

}  // namespace models
