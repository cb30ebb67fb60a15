// The pretraining objectives, one entry each (docs/architecture.md): the `objective:` name a
// config gives, the kind its checkpoints record (engine.model), how its model is made for a run
// and for a checkpoint, what its batches carry, and its config section. The config reader, the
// checkpoints, load_pretrain_model and pretrain_app ask this table; adding an objective is a
// model class (a PretrainModel) and one entry here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
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
  // The model of a run: encoder `model`, parameters drawn from `seed`.
  std::unique_ptr<PretrainModel> (*make)(const BertConfig& model, const PretrainConfig& config,
                                         uint64_t seed);
  // A model to load the checkpoint `path` into (its metadata gives what the kind needs).
  std::unique_ptr<PretrainModel> (*for_checkpoint)(const BertConfig& model,
                                                   const engine::SafetensorsMetadata& metadata,
                                                   const std::string& path);
};

// Every objective, in the order --help lists them.
const std::vector<Objective>& objectives();
std::vector<std::string> objective_names();
// The entry of `name` (a config's objective); fails listing the names.
const Objective& objective_named(const std::string& name);
// The entry whose checkpoint kind is `kind`, or null (a finetuned kind, or none).
const Objective* objective_of_kind(const std::string& kind);

}  // namespace models
