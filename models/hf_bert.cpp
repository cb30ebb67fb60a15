// Hugging Face BERT interop (see hf_bert.h).
#include "models/hf_bert.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/safetensors.h"
#include "models/bert.h"
#include "models/checkpoint.h"
#include "ops/ops.h"

namespace models {

namespace fs = std::filesystem;
using engine::DType;
using engine::Tensor;
using json = nlohmann::json;

namespace {

// Checkpoint metadata that lets --to-hf give back exactly what --from-hf read.
constexpr const char* kHfConfigKey = "engine.hf_config";  // the original config.json text
constexpr const char* kHfPrefixKey = "engine.hf_prefix";  // "bert." or "" (a BertModel file)
constexpr const char* kHfDtypeKey = "engine.hf_dtype";    // F32, F16 or BF16
constexpr const char* kHfTiedKey = "engine.hf_tied";      // tied copies present, comma-separated
// A config.json key this engine adds when it writes a model without segment embeddings (HF BERT
// needs at least one: it gets one row of zeros, which adds nothing).
constexpr const char* kNoSegmentsKey = "engine_type_vocab_size";

std::string read_text(const fs::path& p) { return engine::read_file(p.string(), "hf"); }

json parse_json(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    ENGINE_FAIL("[hf] ", p.string(), ": not valid JSON: ", e.what());
  }
}

void write_text(const fs::path& p, const std::string& text) {
  engine::write_file_atomic(p.string(), text, "[hf]");
}

DType dtype_from_name(const std::string& s) {
  return s == "F16" ? DType::f16 : s == "BF16" ? DType::bf16 : DType::f32;
}
std::string dtype_label(DType d) {
  return d == DType::f16 ? "F16" : d == DType::bf16 ? "BF16" : "F32";
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to(DType::f32).to_vector<float>(),
                           y = b.to(DType::f32).to_vector<float>();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// The HF name of every engine parameter of a bert_a post-LN model; the fused qkv projection maps
// to three (query, key, value rows in that order). `p` is the encoder prefix ("bert." or "").
std::vector<std::string> hf_names(const std::string& name, const std::string& p) {
  auto rest = [&](const std::string& head) { return name.substr(head.size()); };
  static const std::map<std::string, std::string> fixed = {
      {"bert.embeddings.token", "embeddings.word_embeddings.weight"},
      {"bert.embeddings.segment", "embeddings.token_type_embeddings.weight"},
      {"bert.embeddings.norm.weight", "embeddings.LayerNorm.weight"},
      {"bert.embeddings.norm.bias", "embeddings.LayerNorm.bias"},
      {"bert.position.table", "embeddings.position_embeddings.weight"},
  };
  if (auto it = fixed.find(name); it != fixed.end()) return {p + it->second};
  if (name == "mlm.dense.weight" || name == "mlm.dense.bias")
    return {"cls.predictions.transform.dense." + rest("mlm.dense.")};
  if (name == "mlm.norm.weight" || name == "mlm.norm.bias")
    return {"cls.predictions.transform.LayerNorm." + rest("mlm.norm.")};
  if (name == "mlm.decoder_bias") return {"cls.predictions.bias"};
  const std::string layer = "bert.encoder.layer.";
  if (name.rfind(layer, 0) == 0) {
    const size_t dot = name.find('.', layer.size());
    const std::string l = name.substr(layer.size(), dot - layer.size());
    const std::string part = name.substr(dot + 1);  // e.g. attention.qkv.weight
    const std::string hl = p + "encoder.layer." + l + ".";
    const std::string wb = part.substr(part.rfind('.') + 1);  // weight or bias
    if (part.rfind("attention.qkv.", 0) == 0)
      return {hl + "attention.self.query." + wb, hl + "attention.self.key." + wb,
              hl + "attention.self.value." + wb};
    if (part.rfind("attention.out.", 0) == 0) return {hl + "attention.output.dense." + wb};
    if (part.rfind("attention_norm.", 0) == 0) return {hl + "attention.output.LayerNorm." + wb};
    if (part.rfind("ffn.fc1.", 0) == 0) return {hl + "intermediate.dense." + wb};
    if (part.rfind("ffn.fc2.", 0) == 0) return {hl + "output.dense." + wb};
    if (part.rfind("ffn_norm.", 0) == 0) return {hl + "output.LayerNorm." + wb};
  }
  return {};
}

// HF tensors with no engine counterpart that a checkpoint carries along (as hf.<name>).
bool carried(const std::string& n, const std::string& p) {
  return n == p + "pooler.dense.weight" || n == p + "pooler.dense.bias" ||
         n == "cls.seq_relationship.weight" || n == "cls.seq_relationship.bias" ||
         n == p + "embeddings.position_ids";
}

json config_to_hf(const BertConfig& b, json c) {
  if (!c.is_object()) c = json::object();
  if (!c.contains("architectures")) c["architectures"] = {"BertForMaskedLM"};
  c["model_type"] = "bert";
  c["vocab_size"] = b.vocab_size;
  c["hidden_size"] = b.hidden_size;
  c["num_hidden_layers"] = b.num_layers;
  c["num_attention_heads"] = b.num_heads;
  c["intermediate_size"] = b.ffn_size;
  c["hidden_act"] = "gelu";
  c["hidden_dropout_prob"] = b.hidden_dropout;
  c["attention_probs_dropout_prob"] = b.attention_dropout;
  c["max_position_embeddings"] = b.max_positions;
  c["type_vocab_size"] = std::max<int64_t>(b.type_vocab_size, 1);
  if (b.type_vocab_size == 0)
    c[kNoSegmentsKey] = 0;
  else
    c.erase(kNoSegmentsKey);
  c["initializer_range"] = b.init_std;
  c["layer_norm_eps"] = b.layer_norm_eps;
  c["position_embedding_type"] = "absolute";
  return c;
}

void refuse_existing(const fs::path& p) {
  ENGINE_CHECK(!fs::exists(p), "[hf] ", p.string(),
               " already exists; remove it or choose another --out");
}

}  // namespace

HfConversion convert_from_hf(const std::string& dir_s, const std::string& out) {
  const fs::path dir(dir_s);
  ENGINE_CHECK(fs::is_directory(dir), "[hf] ", dir_s,
               " is not a directory (expected a Hugging Face BERT directory with config.json, "
               "model.safetensors and vocab.txt)");
  const fs::path cfg_file = dir / "config.json", weights = dir / "model.safetensors";
  ENGINE_CHECK(fs::exists(cfg_file), "[hf] ", dir_s,
               ": no config.json (a Hugging Face model "
               "directory has config.json and "
               "model.safetensors)");
  if (!fs::exists(weights)) {
    ENGINE_CHECK(!fs::exists(dir / "model.safetensors.index.json"), "[hf] ", dir_s,
                 ": sharded weights (model.safetensors.index.json) are not supported; merge the "
                 "shards into one model.safetensors");
    ENGINE_CHECK(!fs::exists(dir / "pytorch_model.bin"), "[hf] ", dir_s,
                 ": has pytorch_model.bin (a pickled PyTorch file, not read here) but no "
                 "model.safetensors; convert it once with PyTorch: python3 -c \"import torch; "
                 "from safetensors.torch import save_file; sd = torch.load('",
                 (dir / "pytorch_model.bin").string(),
                 "', map_location='cpu'); save_file({k: v.contiguous().clone() for k, v in "
                 "sd.items()}, '",
                 weights.string(), "', metadata={'format': 'pt'})\"");
    ENGINE_FAIL("[hf] ", dir_s, ": no model.safetensors");
  }
  refuse_existing(out);
  const std::string hf_config_text = read_text(cfg_file);
  BertConfig config = bert_config_from_hf(hf_config_text, cfg_file.string());
  const json hf_config = json::parse(hf_config_text);  // valid: bert_config_from_hf parsed it
  const bool no_segments = hf_config.contains(kNoSegmentsKey);

  engine::SafetensorsContents file = engine::load_safetensors(weights.string());
  std::map<std::string, Tensor> in;
  for (auto& [n, t] : file.tensors) in[n] = t;
  std::string p;
  if (in.count("bert.embeddings.word_embeddings.weight"))
    p = "bert.";
  else
    ENGINE_CHECK(in.count("embeddings.word_embeddings.weight"), "[hf] ", weights.string(),
                 ": no bert.embeddings.word_embeddings.weight (nor embeddings.word_embeddings."
                 "weight): not a BERT checkpoint");
  // Old TensorFlow-converted files name LayerNorm parameters gamma and beta.
  for (auto it = in.begin(); it != in.end();) {
    const std::string& n = it->first;
    const bool g = n.size() > 6 && n.compare(n.size() - 6, 6, ".gamma") == 0;
    const bool be = n.size() > 5 && n.compare(n.size() - 5, 5, ".beta") == 0;
    if (n.find("LayerNorm") != std::string::npos && (g || be)) {
      const std::string renamed = n.substr(0, n.rfind('.')) + (g ? ".weight" : ".bias");
      ENGINE_CHECK(!in.count(renamed), "[hf] ", weights.string(), ": both ", n, " and ", renamed);
      in[renamed] = it->second;
      it = in.erase(it);
    } else {
      ++it;
    }
  }
  const DType hf_dtype = in.at(p + "embeddings.word_embeddings.weight").dtype();
  ENGINE_CHECK(hf_dtype == DType::f32 || hf_dtype == DType::f16 || hf_dtype == DType::bf16, "[hf] ",
               weights.string(), ": weights must be F32, F16 or BF16, got ",
               engine::dtype_name(hf_dtype));

  HfConversion result;
  result.out = out;
  const bool has_head = in.count("cls.predictions.bias") > 0;
  if (no_segments) {
    const std::string seg = p + "embeddings.token_type_embeddings.weight";
    ENGINE_CHECK(in.count(seg) && config.type_vocab_size == 1, "[hf] ", cfg_file.string(), ": '",
                 kNoSegmentsKey, "' needs type_vocab_size 1 and ", seg);
    const std::vector<float> zeros = in[seg].to(DType::f32).to_vector<float>();
    ENGINE_CHECK(std::all_of(zeros.begin(), zeros.end(), [](float v) { return v == 0.f; }), "[hf] ",
                 weights.string(), ": ", seg, " must be zeros when config.json has '",
                 kNoSegmentsKey, "'");
    config.type_vocab_size = 0;
    in.erase(seg);
  }

  BertForMaskedLM model(config, 0);
  std::set<std::string> used;
  {
    engine::NoGrad ng;
    for (auto& [name, param] : model.named_parameters()) {
      const std::vector<std::string> names = hf_names(name, p);
      ENGINE_CHECK(!names.empty(), "[hf] internal: no HF name for ", name);
      if (name.rfind("mlm.", 0) == 0 && !has_head) continue;  // initialised; noted below
      std::vector<Tensor> parts;
      for (const std::string& n : names) {
        auto it = in.find(n);
        ENGINE_CHECK(it != in.end(), "[hf] ", weights.string(), ": missing tensor '", n, "'");
        ENGINE_CHECK(it->second.dtype() == hf_dtype, "[hf] ", weights.string(), ": tensor '", n,
                     "' is ", engine::dtype_name(it->second.dtype()), " but the others are ",
                     engine::dtype_name(hf_dtype));
        parts.push_back(it->second.to(DType::f32));
        used.insert(n);
      }
      Tensor value = parts.size() == 1 ? parts[0] : engine::concat(parts, 0);
      ENGINE_CHECK(value.shape() == param.shape(), "[hf] ", weights.string(), ": '", names[0], "'",
                   names.size() > 1 ? " (with key and value)" : "", " gives shape ",
                   engine::shape_str(value.shape()), " but config.json's sizes need ",
                   engine::shape_str(param.shape()), " (", name, ")");
      param.copy_(value);
    }
  }
  if (!has_head)
    result.notes.push_back(
        "no MLM head (cls.predictions.*) in the file: mlm.* initialised at random (fine for "
        "finetuning; pretrain before reading MLM logits)");

  // The rest: tied copies (checked equal), carried tensors, or an error.
  std::vector<std::string> tied;
  engine::NamedTensors extras;
  for (auto& [n, t] : in) {
    if (used.count(n)) continue;
    if (n == "cls.predictions.decoder.weight") {
      ENGINE_CHECK(bitwise_equal(t, in.at(p + "embeddings.word_embeddings.weight")), "[hf] ",
                   weights.string(),
                   ": cls.predictions.decoder.weight differs from the word embeddings; this "
                   "engine's MLM decoder is tied to them");
      tied.push_back(n);
    } else if (n == "cls.predictions.decoder.bias") {
      ENGINE_CHECK(has_head && bitwise_equal(t, in.at("cls.predictions.bias")), "[hf] ",
                   weights.string(),
                   ": cls.predictions.decoder.bias differs from cls.predictions.bias (they are "
                   "one tensor in HF BERT)");
      tied.push_back(n);
    } else if (carried(n, p)) {
      extras.emplace_back(kHfExtraPrefix + n, t);
    } else {
      ENGINE_FAIL("[hf] ", weights.string(), ": tensor '", n,
                  "' is not part of a HF BERT encoder with its MLM / NSP heads (preset bert_a)");
    }
  }

  engine::SafetensorsMetadata meta;
  meta[kHfConfigKey] = hf_config.dump();
  meta[kHfPrefixKey] = p;
  meta[kHfDtypeKey] = dtype_label(hf_dtype);
  std::string tied_list;
  for (const std::string& n : tied) tied_list += (tied_list.empty() ? "" : ",") + n;
  meta[kHfTiedKey] = tied_list;

  // The vocabulary beside the checkpoint, recorded relative to it.
  const fs::path vocab = dir / "vocab.txt";
  if (fs::exists(vocab)) {
    bool lower_case = true;
    const fs::path tc = dir / "tokenizer_config.json";
    if (fs::exists(tc)) {
      const json t = parse_json(tc);
      if (t.is_object() && t.contains("do_lower_case")) {
        ENGINE_CHECK(t["do_lower_case"].is_boolean(), "[hf] ", tc.string(),
                     ": 'do_lower_case' must be true or false, got ", t["do_lower_case"].dump());
        lower_case = t["do_lower_case"].get<bool>();
      }
    }
    fs::path copy = fs::path(out);
    copy.replace_extension(".vocab.txt");
    refuse_existing(copy);
    if (!copy.parent_path().empty()) fs::create_directories(copy.parent_path());
    write_text(copy, read_text(vocab));
    meta[kTokenizerKey] = fs::absolute(copy).string();
    meta[kLowerCaseKey] = lower_case ? "true" : "false";
    result.vocab = copy.string();
  } else {
    result.notes.push_back("no vocab.txt in " + dir_s +
                           ": finetune_app will need --tokenizer with this model's vocabulary");
  }
  if (!fs::path(out).parent_path().empty()) fs::create_directories(fs::path(out).parent_path());
  save_checkpoint(out, model, meta, extras);
  return result;
}

HfConversion convert_to_hf(const std::string& checkpoint, const std::string& dir_s) {
  const BertConfig config = read_checkpoint_config(checkpoint);
  const PositionConfig& pos = config.position;
  if (pos.preset != "bert_a") {
    const std::string what = pos.hf_blocker();
    ENGINE_FAIL("[hf] ", checkpoint, ": preset ", pos.preset,
                " has no Hugging Face BERT equivalent (", what,
                "); only bert_a models convert to HF BERT");
  }
  ENGINE_CHECK(config.embedding_width() == config.hidden_size, "[hf] ", checkpoint,
               ": model.embedding_size ", config.embedding_size, " differs from hidden_size ",
               config.hidden_size, "; HF BERT has no embedding projection (that is ELECTRA's)");
  ENGINE_CHECK(!config.pre_layer_norm, "[hf] ", checkpoint,
               ": a pre-LN model (model.pre_layer_norm) has no Hugging Face BERT equivalent "
               "(BERT is post-LN); only post-LN bert_a models convert");

  const fs::path dir(dir_s);
  refuse_existing(dir / "config.json");
  refuse_existing(dir / "model.safetensors");
  engine::SafetensorsContents file = engine::load_safetensors(checkpoint);
  std::map<std::string, Tensor> in;
  for (auto& [n, t] : file.tensors) in[n] = t;
  auto meta_or = [&](const char* key, const std::string& fallback) {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? fallback : it->second;
  };
  const std::string p = meta_or(kHfPrefixKey, "bert.");
  const DType out_dtype = dtype_from_name(meta_or(kHfDtypeKey, "F32"));
  json hf_config;
  if (file.metadata.count(kHfConfigKey)) {
    hf_config = json::parse(file.metadata.at(kHfConfigKey), nullptr, /*allow_exceptions=*/false);
    ENGINE_CHECK(!hf_config.is_discarded(), "[hf] ", checkpoint, ": metadata '", kHfConfigKey,
                 "' is not valid JSON");
  }
  hf_config = config_to_hf(config, hf_config);

  HfConversion result;
  result.out = dir_s;
  engine::NamedTensors out;
  BertForMaskedLM shape_model(config, 0);  // names and order of the engine's parameters
  std::set<std::string> used;
  for (auto& [name, param] : shape_model.named_parameters()) {
    auto it = in.find(name);
    ENGINE_CHECK(it != in.end(), "[hf] ", checkpoint, ": missing tensor '", name, "'");
    used.insert(name);
    const std::vector<std::string> names = hf_names(name, p);
    const Tensor& t = it->second;
    if (names.size() == 1) {
      out.emplace_back(names[0], t.to(out_dtype));
    } else {
      const int64_t rows = t.size(0) / 3;
      for (int k = 0; k < 3; ++k)
        out.emplace_back(names[size_t(k)],
                         t.slice(0, k * rows, (k + 1) * rows).contiguous().to(out_dtype));
    }
  }
  if (config.type_vocab_size == 0)
    out.emplace_back(p + "embeddings.token_type_embeddings.weight",
                     Tensor::zeros({1, config.hidden_size}).to(out_dtype));
  // Tied copies the original file had, then the carried tensors under their own names.
  const std::string tied = meta_or(kHfTiedKey, "");
  std::stringstream ts(tied);
  for (std::string n; std::getline(ts, n, ',');) {
    if (n == "cls.predictions.decoder.weight")
      out.emplace_back(n, in.at("bert.embeddings.token").to(out_dtype));
    else if (n == "cls.predictions.decoder.bias")
      out.emplace_back(n, in.at("mlm.decoder_bias").to(out_dtype));
  }
  std::vector<std::string> dropped;
  for (auto& [n, t] : file.tensors) {
    if (used.count(n)) continue;
    if (n.rfind(kHfExtraPrefix, 0) == 0)
      out.emplace_back(n.substr(std::string(kHfExtraPrefix).size()), t);
    else if (n.rfind("classifier.", 0) == 0 || n.rfind("qa.", 0) == 0)
      dropped.push_back(n);
  }
  if (!dropped.empty())
    result.notes.push_back(
        "finetuning head tensors not written (no BertForMaskedLM "
        "equivalent): " +
        std::to_string(dropped.size()) + ", e.g. " + dropped.front());

  fs::create_directories(dir);
  engine::save_safetensors((dir / "model.safetensors").string(), out, {{"format", "pt"}});
  write_text(dir / "config.json", hf_config.dump(2) + "\n");

  // The vocabulary, when it is WordPiece (HF BERT's tokenizer).
  const std::string tok = checkpoint_tokenizer(checkpoint, file.metadata);
  if (tok.empty()) {
    result.notes.push_back("the checkpoint records no tokenizer: no vocab.txt written");
  } else if (fs::path(tok).extension() == ".model") {
    result.notes.push_back("the checkpoint's tokenizer " + tok +
                           " is SentencePiece, not WordPiece: no vocab.txt written (HF's "
                           "BertTokenizer reads WordPiece vocabularies only)");
  } else {
    refuse_existing(dir / "vocab.txt");
    write_text(dir / "vocab.txt", read_text(tok));
    json tc = {{"tokenizer_class", "BertTokenizer"},
               {"do_lower_case", meta_or(kLowerCaseKey, "true") != "false"}};
    write_text(dir / "tokenizer_config.json", tc.dump(2) + "\n");
    result.vocab = (dir / "vocab.txt").string();
  }
  return result;
}

}  // namespace models
