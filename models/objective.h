// The pretraining objectives, one entry each (docs/architecture.md): the `objective:` name a
// config gives, the kind its checkpoints record (engine.model), what its batches carry, its config
// section, and how its model is made for a run and for a checkpoint. The config reader, the
// checkpoints, load_pretrain_model and pretrain_app ask this table; adding an objective is a
// model class (a PretrainModel) that attaches its factories (ENGINE_OBJECTIVE_MODEL) and one
// entry here. The table itself is config-level: it links without the models (the parsers' fuzz
// targets), which fill in the factories when they are linked.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/macros.h"
#include "engine/safetensors.h"
#include "models/bert.h"

namespace models {

struct PretrainConfig;

struct Objective {
  const char* name;     // objective: mlm | mlm_sop | electra
  const char* kind;     // the checkpoint kind: bert_mlm | bert_mlm_sop | electra
  const char* summary;  // one line for --help and errors
  // Its batches are segment pairs with sentence-order labels (data.segment_pairs required).
  bool sentence_order;
  // Its batch files may carry `replacements` (M) i64: the generator's draws (ELECTRA).
  bool replacements;
  // The config section of its own ("" for none) and its reader (fills the PretrainConfig and
  // checks it against the model section).
  const char* section;
  void (*read_section)(const engine::ConfigSection& section, PretrainConfig& config);
  // Attached by the model's file: the model of a run (encoder `model`, parameters drawn from
  // `seed`), and a model to load the checkpoint `path` into (its metadata gives what the kind
  // needs).
  using Make = std::unique_ptr<PretrainModel> (*)(const BertConfig& model,
                                                  const PretrainConfig& config, uint64_t seed);
  using ForCheckpoint = std::unique_ptr<PretrainModel> (*)(
      const BertConfig& model, const engine::SafetensorsMetadata& metadata,
      const std::string& path);
  Make make = nullptr;
  ForCheckpoint for_checkpoint = nullptr;
};

// Every objective, in the order --help lists them.
const std::vector<Objective>& objectives();
std::vector<std::string> objective_names();
// The entry of `name` (a config's objective); fails listing the names.
const Objective& objective_named(const std::string& name);
// The entry whose checkpoint kind is `kind`, or null (a finetuned kind, or none).
const Objective* objective_of_kind(const std::string& kind);
// Called by ENGINE_OBJECTIVE_MODEL: attaches the factories to the entry named `name`.
bool attach_objective_model(const char* name, Objective::Make make,
                            Objective::ForCheckpoint for_checkpoint);

// The factories of a model built from its encoder's config and a seed alone (mlm, mlm_sop): a new
// one drawn from `seed`, and one for a checkpoint (seed 0: its weights are loaded after).
template <class M>
std::unique_ptr<PretrainModel> make_encoder_objective(const BertConfig& model,
                                                      const PretrainConfig&, uint64_t seed) {
  return std::make_unique<M>(model, seed);
}
template <class M>
std::unique_ptr<PretrainModel> encoder_objective_for_checkpoint(const BertConfig& model,
                                                                const engine::SafetensorsMetadata&,
                                                                const std::string&) {
  return std::make_unique<M>(model, 0);
}

}  // namespace models

// In the model's file: attaches its factories to the objective `name`.
#define ENGINE_OBJECTIVE_MODEL(name, make, for_checkpoint)                       \
  [[maybe_unused]] static const bool ENGINE_CONCAT(objective_model_, __LINE__) = \
      ::models::attach_objective_model(name, make, for_checkpoint)
