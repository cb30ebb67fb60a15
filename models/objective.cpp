// The pretraining objectives' table (objective.h) and what the library builds from it: the models
// of a config and of a checkpoint.
#include "models/objective.h"

#include "engine/error.h"
#include "models/bert_sop.h"
#include "models/checkpoint.h"
#include "models/electra.h"
#include "models/pretrain_config.h"

namespace models {
namespace {

std::unique_ptr<PretrainModel> make_mlm(const BertConfig& m, const PretrainConfig&, uint64_t seed) {
  return std::make_unique<BertForMaskedLM>(m, seed);
}
std::unique_ptr<PretrainModel> load_mlm(const BertConfig& m, const engine::SafetensorsMetadata&,
                                        const std::string&) {
  return std::make_unique<BertForMaskedLM>(m, 0);
}

std::unique_ptr<PretrainModel> make_sop(const BertConfig& m, const PretrainConfig&, uint64_t seed) {
  return std::make_unique<BertForMlmSop>(m, seed);
}
std::unique_ptr<PretrainModel> load_sop(const BertConfig& m, const engine::SafetensorsMetadata&,
                                        const std::string&) {
  return std::make_unique<BertForMlmSop>(m, 0);
}

void read_electra(const engine::ConfigSection& s, PretrainConfig& c) {
  c.electra = ElectraConfig::from_config(s);
  generator_config(c.model, c.electra);  // the generator's sizes must make a model
}
std::unique_ptr<PretrainModel> make_electra(const BertConfig& m, const PretrainConfig& c,
                                            uint64_t seed) {
  return std::make_unique<ElectraForPretraining>(m, c.electra, seed);
}
std::unique_ptr<PretrainModel> load_electra(const BertConfig& m,
                                            const engine::SafetensorsMetadata& meta,
                                            const std::string& path) {
  auto it = meta.find(kElectraConfigKey);
  ENGINE_CHECK(it != meta.end(), "[checkpoint] ", path, ": an ELECTRA checkpoint without '",
               kElectraConfigKey, "' in its metadata");
  return std::make_unique<ElectraForPretraining>(m, ElectraConfig::from_json(it->second, path), 0);
}

}  // namespace

const std::vector<Objective>& objectives() {
  static const std::vector<Objective> table = {
      {"mlm", "bert_mlm", "BERT's masked LM", false, false, "", nullptr, make_mlm, load_mlm},
      {"mlm_sop", "bert_mlm_sop",
       "masked LM + ALBERT's sentence-order prediction over segment pairs", true, false, "",
       nullptr, make_sop, load_sop},
      {"electra", "electra",
       "ELECTRA: a generator's masked LM + the discriminator's replaced-token detection", false,
       true, "electra", read_electra, make_electra, load_electra},
  };
  return table;
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
  return objective_named(objective).make(m, *this, seed);
}

std::unique_ptr<PretrainModel> load_pretrain_model(const std::string& checkpoint) {
  const BertConfig config = read_checkpoint_config(checkpoint);
  const std::string kind = read_checkpoint_kind(checkpoint);
  // A finetuned checkpoint (bert_classification, ...) has no pretraining head to continue from.
  const Objective* o = kind.empty() ? &objectives().front() : objective_of_kind(kind);
  ENGINE_CHECK(o, "[checkpoint] ", checkpoint, " holds a finetuned '", kind,
               "' model, not a pretraining one (", pretraining_kinds_text(),
               "); pretraining starts from a pretraining checkpoint");
  std::unique_ptr<PretrainModel> model =
      o->for_checkpoint(config, engine::read_safetensors_metadata(checkpoint), checkpoint);
  load_checkpoint(checkpoint, *model);
  return model;
}

}  // namespace models
