// The pretraining objectives' table (objective.h), config-level: the models attach their
// factories from the model library (bert.cpp, bert_sop.cpp, electra.cpp).
#include "models/objective.h"

#include "engine/error.h"
#include "models/electra_config.h"
#include "models/pretrain_config.h"

namespace models {
namespace {

void read_electra(const engine::ConfigSection& s, PretrainConfig& c) {
  c.electra = ElectraConfig::from_config(s);
  generator_config(c.model, c.electra);  // the generator's sizes must make a model
}

std::vector<Objective>& table() {
  static std::vector<Objective> rows = {
      {"mlm", "bert_mlm", "BERT's masked LM", false, false, "", nullptr},
      {"mlm_sop", "bert_mlm_sop",
       "masked LM + ALBERT's sentence-order prediction over segment pairs", true, false, "",
       nullptr},
      {"electra", "electra",
       "ELECTRA: a generator's masked LM + the discriminator's replaced-token detection", false,
       true, "electra", read_electra},
  };
  return rows;
}

}  // namespace

const std::vector<Objective>& objectives() { return table(); }

bool attach_objective_model(const char* name, Objective::Make make,
                            Objective::ForCheckpoint for_checkpoint) {
  for (Objective& o : table())
    if (std::string(name) == o.name) {
      o.make = make;
      o.for_checkpoint = for_checkpoint;
      return true;
    }
  ENGINE_FAIL("[objective] no objective named '", name, "' to attach a model to");
}

std::vector<std::string> objective_names() {
  std::vector<std::string> v;
  for (const Objective& o : objectives()) v.push_back(o.name);
  return v;
}

const Objective& objective_named(const std::string& name) {
  std::string list;
  for (const Objective& o : objectives()) {
    if (name == o.name) return o;
    list += (list.empty() ? "" : ", ") + std::string(o.name);
  }
  ENGINE_FAIL("[config] unknown objective '", name, "'; expected one of: ", list);
}

const Objective* objective_of_kind(const std::string& kind) {
  for (const Objective& o : objectives())
    if (kind == o.kind) return &o;
  return nullptr;
}

bool is_pretraining_kind(const std::string& kind) { return objective_of_kind(kind) != nullptr; }

std::string pretraining_kinds_text() {
  std::string text;
  const std::vector<Objective>& all = objectives();
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) text += i + 1 == all.size() ? " or " : ", ";
    text += all[i].kind;
  }
  return text;
}

std::unique_ptr<PretrainModel> PretrainConfig::make_model(const BertConfig& m,
                                                          uint64_t seed) const {
  const Objective& o = objective_named(objective);
  ENGINE_CHECK(o.make, "[objective] ", o.name, " has no model linked (libengine_models)");
  return o.make(m, *this, seed);
}

}  // namespace models
