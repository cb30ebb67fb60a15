// Fuzz target: strict YAML configs (engine/config.cpp) and --set overrides, read the way
// pretrain_app reads them (models/pretrain_config.cpp: every section, every key typed, unknown
// keys refused). Input: the YAML text, then any number of "key.path=value" assignments, each
// after a separator line (tests/fuzz/fuzz_util.h).
#include <cstdint>

#include "engine/config.h"
#include "engine/error.h"
#include "models/pretrain_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts = fuzz::split_parts(fuzz::as_view(data, size));
  try {
    engine::Config cfg = engine::Config::parse(std::string(parts[0]), "fuzz.yaml");
    for (size_t i = 1; i < parts.size(); ++i) cfg.set_assignment(std::string(parts[i]));
    (void)cfg.dump();
    // A config that reads must read the same after a round trip through its YAML text.
    models::PretrainConfig first = models::PretrainConfig::read(cfg);
    models::PretrainConfig again = models::PretrainConfig::read(engine::Config::parse(cfg.dump()));
    if (!first.model.first_difference(again.model).empty() || first.seed != again.seed)
      std::abort();
  } catch (const engine::Error&) {
  }
  return 0;
}
