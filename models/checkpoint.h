// Model checkpoints and MLM batch files, both safetensors (engine/safetensors.h). A checkpoint
// holds every parameter in f32 under its model name (docs/checkpoint.md) and the model config as
// JSON in the header's metadata, so it describes itself.
#pragma once

#include <string>

#include "engine/safetensors.h"
#include "models/bert.h"

namespace models {

// Metadata keys.
inline constexpr const char* kConfigKey = "engine.model_config";  // BertConfig::to_json()
inline constexpr const char* kKindKey = "engine.model";  // "bert_mlm", "bert_classification", ...
inline constexpr const char* kTaskKey = "engine.task";   // a finetuned model's task, "glue/RTE"
// The tokenizer the model was trained with, relative to the checkpoint's directory (so a run
// directory can move), and whether WordPiece lower-cases ("true" / "false").
inline constexpr const char* kTokenizerKey = "engine.tokenizer";
inline constexpr const char* kLowerCaseKey = "engine.tokenizer_lower_case";

// Writes the weights (and `extra_tensors`, e.g. optimizer state) with the model config and
// `extra` in the metadata, atomically. An absolute tokenizer path in `extra` (kTokenizerKey) is
// stored relative to `path`'s directory.
void save_checkpoint(const std::string& path, const PretrainModel& model,
                     engine::SafetensorsMetadata extra = {},
                     const engine::NamedTensors& extra_tensors = {});
// The config stored in a checkpoint; a clear error when it has none or it is invalid.
BertConfig read_checkpoint_config(const std::string& path);
// The kind a checkpoint records (kKindKey: "bert_mlm", "electra", "bert_classification", ...);
// "" when it records none.
std::string read_checkpoint_kind(const std::string& path);
// Whether `kind` is one that pretraining writes (an objective's, models/objective.h), which
// load_pretrain_model loads and which carries no finetuned head.
bool is_pretraining_kind(const std::string& kind);
// The objectives' kinds for an error message: "bert_mlm, bert_mlm_sop or electra".
std::string pretraining_kinds_text();
// Loads the parameters (names, shapes and dtypes checked; the first mismatch is named). A file
// with tensors beyond the model's is an error unless `with_state` (then those tensors — optimizer,
// scaler, trainer state — and the metadata are returned from the same read) or they are the
// hf.* tensors of a converted Hugging Face model (models/hf_bert.h), which are not read.
engine::SafetensorsContents load_checkpoint(const std::string& path, PretrainModel& model,
                                            bool with_state = false);

// Loads the encoder (every bert.* tensor) of any checkpoint of this engine (pretraining, training
// state, finetuned) into `bert`, checked like load_checkpoint. The heads (mlm.*, classifier.*,
// qa.*) and training state are not read: their names come back in `skipped`, with the metadata.
// A bert.* tensor the model lacks is an error. The caller checks the stored config
// (read_checkpoint_config) against the model's.
engine::SafetensorsContents load_bert_encoder(const std::string& path, BertModel& bert);

// Rewrites an absolute kTokenizerKey in `meta` relative to the directory of `path` (the file the
// metadata is written to); save_checkpoint does this itself.
void make_tokenizer_relative(engine::SafetensorsMetadata& meta, const std::string& path);

// A copy of the tokenizer file `tokenizer` in `dir` (created if needed), under its file name, for
// the checkpoints written there to record (kTokenizerKey). An identical copy is kept; a different
// file of that name is an error rather than replaced. Returns the copy's absolute path
// (kept_tokenizer_path: that path without copying, for ranks that do not write).
std::string keep_tokenizer(const std::string& tokenizer, const std::string& dir);
std::string kept_tokenizer_path(const std::string& tokenizer, const std::string& dir);

// The tokenizer a checkpoint records (kTokenizerKey in `meta`, its metadata), resolved against
// the checkpoint's directory when relative; "" when it records none. A recorded file that does
// not exist is an error naming both.
std::string checkpoint_tokenizer(const std::string& path, const engine::SafetensorsMetadata& meta);

// A batch file: a safetensors file with input_ids (B, T), attention_mask (B, T) of 0/1, labels
// (B, T) with -100 for unpredicted positions, and optionally token_type_ids (B, T); any integer
// dtype. Values are checked against the config (ids < vocab_size, types < type_vocab_size, labels
// -100 or an id) with errors naming the file, the tensor and the first bad position. The batch
// comes back on the host with its predicted positions and targets (data/batch.h).
data::MlmBatch load_mlm_batch(const std::string& path, const BertConfig& config);
// The optional `replacements` (M) tensor of a batch file: ELECTRA's generator draws to use instead
// of sampling, one per predicted position in row-major order (checks against a reference);
// undefined when the file has none. Errors name the file, the length or the first bad id.
Tensor load_replacements(const std::string& path, const data::MlmBatch& batch,
                         const BertConfig& config);

}  // namespace models
