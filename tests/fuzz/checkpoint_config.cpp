// Fuzz target: the model config a checkpoint carries in its metadata (models/checkpoint.cpp
// read_checkpoint_config -> BertConfig::from_json, models/bert_config.cpp: keys, types, the
// position preset and cls_reset, validation). A config that reads must survive to_json and read
// back identical.
#include <cstdint>

#include "engine/error.h"
#include "models/bert_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  models::BertConfig c;
  try {
    c = models::BertConfig::from_json(std::string(fuzz::as_view(data, size)), "checkpoint");
  } catch (const engine::Error&) {
    return 0;
  }
  // Past this point nothing may fail: the checkpoint writer's JSON must read back the same.
  const models::BertConfig again = models::BertConfig::from_json(c.to_json(), "to_json");
  if (!c.first_difference(again).empty()) std::abort();
  return 0;
}
