// Checkpoints and MLM batch files (see checkpoint.h).
#include "models/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "engine/error.h"
#include "engine/file_io.h"
#include "models/objective.h"

namespace models {

using engine::DType;

void save_checkpoint(const std::string& path, const PretrainModel& model,
                     engine::SafetensorsMetadata extra, const engine::NamedTensors& extra_tensors) {
  extra[kConfigKey] = model.config().to_json();
  make_tokenizer_relative(extra, path);
  extra[kKindKey] = model.kind();
  for (auto& [key, value] : model.checkpoint_metadata()) extra[key] = value;
  extra["format"] = "pt";  // lets Hugging Face's safetensors tools open it
  engine::NamedTensors tensors;
  for (auto& [name, t] : model.named_parameters()) tensors.emplace_back(name, t.detach());
  tensors.insert(tensors.end(), extra_tensors.begin(), extra_tensors.end());
  engine::save_safetensors(path, tensors, extra);
}

BertConfig read_checkpoint_config(const std::string& path) {
  engine::SafetensorsMetadata meta = engine::read_safetensors_metadata(path);
  auto it = meta.find(kConfigKey);
  ENGINE_CHECK(it != meta.end(), "[checkpoint] ", path, ": no '", kConfigKey,
               "' in the metadata; not a checkpoint written by this engine");
  return BertConfig::from_json(it->second, path);
}

std::string read_checkpoint_kind(const std::string& path) {
  const engine::SafetensorsMetadata meta = engine::read_safetensors_metadata(path);
  auto it = meta.find(kKindKey);
  return it == meta.end() ? "" : it->second;
}

engine::SafetensorsContents load_checkpoint(const std::string& path, PretrainModel& model,
                                            bool with_state) {
  const std::string kind = read_checkpoint_kind(path);
  // A checkpoint of another objective (ELECTRA into a masked LM, MLM into MLM + SOP, ...): one
  // clear error (finetuning takes the encoder of any through load_bert_encoder).
  ENGINE_CHECK(kind.empty() || kind == model.kind(), "[checkpoint] ", path, " holds a '", kind,
               "' model, not a '", model.kind(),
               "' one (objective:); load it with the objective it was trained with");
  if (with_state)
    return engine::load_safetensors_into(path, model.named_parameters(),
                                         engine::ExtraTensors::read);
  engine::SafetensorsContents c =
      engine::load_safetensors_into(path, model.named_parameters(), engine::ExtraTensors::skip);
  for (const std::string& name : c.skipped)
    ENGINE_CHECK(name.rfind("hf.", 0) == 0, "[checkpoint] ", path, ": tensor '", name,
                 "' is in the file but not in the model (", model.config().position.preset,
                 "); the file holds more than a model");
  return c;
}

void make_tokenizer_relative(engine::SafetensorsMetadata& meta, const std::string& path) {
  auto tok = meta.find(kTokenizerKey);
  if (tok == meta.end() || !std::filesystem::path(tok->second).is_absolute()) return;
  const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
  tok->second = std::filesystem::path(tok->second).lexically_relative(dir).string();
}

std::string kept_tokenizer_path(const std::string& tokenizer, const std::string& dir) {
  return (std::filesystem::absolute(dir) / std::filesystem::path(tokenizer).filename()).string();
}

std::string keep_tokenizer(const std::string& tokenizer, const std::string& dir) {
  const std::string to = kept_tokenizer_path(tokenizer, dir);
  const std::string bytes = engine::read_file(tokenizer, "checkpoint");
  if (std::filesystem::exists(to)) {
    ENGINE_CHECK(engine::read_file(to, "checkpoint") == bytes, "[checkpoint] ", to,
                 " exists and differs from the tokenizer ", tokenizer,
                 " (the directory holds another run's tokenizer); use another output directory");
    return to;
  }
  std::filesystem::create_directories(dir);
  engine::write_file_atomic(to, bytes, "[checkpoint]");
  return to;
}

std::string checkpoint_tokenizer(const std::string& path, const engine::SafetensorsMetadata& meta) {
  auto it = meta.find(kTokenizerKey);
  if (it == meta.end() || it->second.empty()) return "";
  std::filesystem::path tok(it->second);
  if (tok.is_relative()) tok = std::filesystem::absolute(path).parent_path() / tok;
  tok = tok.lexically_normal();
  ENGINE_CHECK(std::filesystem::exists(tok), "[checkpoint] ", path, ": its tokenizer ",
               tok.string(), " (", kTokenizerKey, " = ", it->second,
               ") does not exist; keep the tokenizer beside the checkpoint or pass --tokenizer");
  return tok.string();
}

namespace {

Tensor batch_tensor(const engine::SafetensorsContents& c, const std::string& path,
                    const std::string& name, bool required) {
  for (auto& [n, t] : c.tensors) {
    if (n != name) continue;
    const DType dt = t.dtype();
    ENGINE_CHECK(dt == DType::i64 || dt == DType::i32 || dt == DType::u8, "[batch] ", path, ": '",
                 name, "' must hold integers (I64, I32 or U8), got ", engine::dtype_name(dt));
    ENGINE_CHECK(t.dim() == 2, "[batch] ", path, ": '", name, "' must be (B, T), got shape ",
                 engine::shape_str(t.shape()));
    return t.to(DType::i64);
  }
  ENGINE_CHECK(!required, "[batch] ", path, ": missing tensor '", name,
               "' (a batch holds input_ids, attention_mask, labels and optionally token_type_ids)");
  return Tensor();
}

void check_range(const Tensor& t, const std::string& path, const char* name, int64_t lo, int64_t hi,
                 int64_t also, const std::string& what) {
  std::vector<int64_t> v = t.to_vector<int64_t>();
  const int64_t cols = t.size(1);
  for (size_t i = 0; i < v.size(); ++i) {
    if ((v[i] >= lo && v[i] < hi) || v[i] == also) continue;
    ENGINE_FAIL("[batch] ", path, ": ", name, "[", int64_t(i) / cols, ", ", int64_t(i) % cols,
                "] = ", v[i], " is not ", what);
  }
}

}  // namespace

engine::SafetensorsContents load_bert_encoder(const std::string& path, BertModel& bert) {
  engine::NamedTensors encoder;
  for (auto& [name, t] : bert.named_parameters()) encoder.emplace_back("bert." + name, t);
  // Heads and optimizer state may be there and are not read; an encoder tensor the model lacks
  // means another architecture (e.g. TUPE's position tensors under a config that says bert_a).
  engine::SafetensorsContents rest =
      engine::load_safetensors_into(path, encoder, engine::ExtraTensors::skip);
  for (const std::string& name : rest.skipped)
    ENGINE_CHECK(name.rfind("bert.", 0) != 0, "[checkpoint] ", path, ": tensor '", name,
                 "' is not part of the model its config describes (preset ",
                 bert.config().position.preset, "); the config and the weights disagree");
  return rest;
}

data::MlmBatch load_mlm_batch(const std::string& path, const BertConfig& config) {
  engine::SafetensorsContents c = engine::load_safetensors(path);
  static const std::set<std::string> known = {
      "input_ids", "attention_mask", "labels", "token_type_ids", "replacements", "sentence_labels"};
  for (auto& [n, t] : c.tensors)
    ENGINE_CHECK(known.count(n), "[batch] ", path, ": unexpected tensor '", n,
                 "' (a batch holds input_ids, attention_mask, labels and optionally "
                 "token_type_ids, replacements and sentence_labels)");
  const Tensor ids = batch_tensor(c, path, "input_ids", true);
  const Tensor mask = batch_tensor(c, path, "attention_mask", true);
  const Tensor labels = batch_tensor(c, path, "labels", true);
  const Tensor types = batch_tensor(c, path, "token_type_ids", false);
  const engine::Shape& shape = ids.shape();
  auto same = [&](const Tensor& t, const char* name) {
    if (t.defined())
      ENGINE_CHECK(t.shape() == shape, "[batch] ", path, ": '", name, "' has shape ",
                   engine::shape_str(t.shape()), " but input_ids has ", engine::shape_str(shape));
  };
  same(mask, "attention_mask");
  same(labels, "labels");
  same(types, "token_type_ids");
  ENGINE_CHECK(shape[0] > 0 && shape[1] > 0, "[batch] ", path, ": empty batch ",
               engine::shape_str(shape));
  check_range(ids, path, "input_ids", 0, config.vocab_size, 0,
              "a token id in [0, vocab_size " + std::to_string(config.vocab_size) + ")");
  check_range(mask, path, "attention_mask", 0, 2, 0, "0 or 1");
  if (types.defined()) {
    ENGINE_CHECK(
        config.type_vocab_size > 0, "[batch] ", path,
        ": has token_type_ids but the model has no segment embeddings (model.type_vocab_size 0)");
    check_range(
        types, path, "token_type_ids", 0, config.type_vocab_size, 0,
        "a segment id in [0, type_vocab_size " + std::to_string(config.type_vocab_size) + ")");
  }
  Tensor order;
  for (auto& [n, t] : c.tensors) {
    if (n != "sentence_labels") continue;
    ENGINE_CHECK(t.dim() == 1 && t.size(0) == shape[0] &&
                     (t.dtype() == DType::i64 || t.dtype() == DType::i32),
                 "[batch] ", path, ": 'sentence_labels' must be (", shape[0],
                 ") integers, one per row, got ", engine::describe(t));
    order = t.to(DType::i64);
  }
  if (order.defined()) {
    const std::vector<int64_t> v = order.to_vector<int64_t>();
    for (size_t k = 0; k < v.size(); ++k)
      ENGINE_CHECK(v[k] == 0 || v[k] == 1 || v[k] == -100, "[batch] ", path, ": sentence_labels[",
                   k, "] = ", v[k], " (expected 1 swapped, 0 in order or -100 no pair)");
  }
  // Labels are checked where the batch is made (data::make_mlm_batch).
  data::MlmBatch b = data::make_mlm_batch(ids, mask, labels, types, config.vocab_size, path);
  b.sentence_labels = order;
  return b;
}

Tensor load_replacements(const std::string& path, const data::MlmBatch& batch,
                         const BertConfig& config) {
  engine::SafetensorsContents c = engine::load_safetensors(path);
  for (auto& [n, t] : c.tensors) {
    if (n != "replacements") continue;
    const int64_t m = batch.num_predicted();
    ENGINE_CHECK(
        t.dim() == 1 && t.size(0) == m && (t.dtype() == DType::i64 || t.dtype() == DType::i32),
        "[batch] ", path, ": 'replacements' must be (", m,
        ") integers, one per label other than -100 in row-major order, got ", engine::describe(t));
    const Tensor r = t.to(DType::i64);
    const std::vector<int64_t> v = r.to_vector<int64_t>();
    for (size_t k = 0; k < v.size(); ++k)
      ENGINE_CHECK(v[k] >= 0 && v[k] < config.vocab_size, "[batch] ", path, ": replacements[", k,
                   "] = ", v[k], " is not a token id in [0, vocab_size ", config.vocab_size, ")");
    return r;
  }
  return Tensor();
}

std::unique_ptr<PretrainModel> load_pretrain_model(const std::string& checkpoint) {
  const BertConfig config = read_checkpoint_config(checkpoint);
  const std::string kind = read_checkpoint_kind(checkpoint);
  // A finetuned checkpoint (bert_classification, ...) has no pretraining head to continue from.
  const Objective* o = kind.empty() ? &objectives().front() : objective_of_kind(kind);
  ENGINE_CHECK(o, "[checkpoint] ", checkpoint, " holds a finetuned '", kind,
               "' model, not a pretraining one (", pretraining_kinds_text(),
               "); pretraining starts from a pretraining checkpoint");
  ENGINE_CHECK(o->for_checkpoint, "[objective] ", o->name, " has no model linked");
  std::unique_ptr<PretrainModel> model =
      o->for_checkpoint(config, engine::read_safetensors_metadata(checkpoint), checkpoint);
  load_checkpoint(checkpoint, *model);
  return model;
}

}  // namespace models
