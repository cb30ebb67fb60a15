// Fuzz target: a Hugging Face config.json as convert_from_hf reads it (models/hf_config.cpp):
// JSON, model_type / hidden_act / position_embedding_type, the sizes, dropouts and epsilon, and
// the engine's own validation of the BertConfig they make.
#include <cstdint>

#include "engine/error.h"
#include "models/hf_bert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const models::BertConfig c =
        models::bert_config_from_hf(std::string(fuzz::as_view(data, size)), "config.json");
    c.validate();  // what it returns is a valid config
  } catch (const engine::Error&) {
  }
  return 0;
}
