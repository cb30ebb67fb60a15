// Hugging Face BERT interop: a BERT directory (config.json, model.safetensors, vocab.txt, the
// names of `transformers`' BertForPreTraining / BertForMaskedLM / BertModel) to an engine
// checkpoint with the bert_a preset, and back (docs/hf-interop.md).
//
// Both directions are exact: every tensor keeps its bits (the fused qkv projection is the
// concatenation of HF's query, key and value rows), HF tensors without an engine counterpart
// (the pooler, the NSP head, a position_ids buffer) ride along in the checkpoint as `hf.<name>`
// and come back under their names, tied copies (cls.predictions.decoder.*) are checked equal and
// re-emitted, and config.json's other keys are kept in the checkpoint's metadata.
#pragma once

#include <string>
#include <vector>

#include "models/bert_config.h"

namespace models {

// Prefix of the HF tensors a converted checkpoint carries without using them.
inline constexpr const char* kHfExtraPrefix = "hf.";

struct HfConversion {
  std::string out;                 // the checkpoint or directory written
  std::string vocab;               // the vocabulary written beside it ("" if none)
  std::vector<std::string> notes;  // what a user should know (e.g. a missing MLM head)
};

// DIR/config.json + DIR/model.safetensors (+ DIR/vocab.txt, DIR/tokenizer_config.json's
// do_lower_case) -> OUT (an engine checkpoint; the vocabulary copied to OUT's stem + ".vocab.txt"
// and recorded relative to it). Every unsupported input is one clear error naming the file and
// key or tensor (a pytorch_model.bin only: how to convert it to safetensors).
HfConversion convert_from_hf(const std::string& dir, const std::string& out);

// The text of a config.json -> the engine's BertConfig (bert_a, post-LN), as convert_from_hf
// reads it: anything HF BERT can express that this engine computes differently is an error
// naming `source` and the key (models/hf_config.cpp).
BertConfig bert_config_from_hf(const std::string& text, const std::string& source);

// An engine checkpoint of a bert_a post-LN model -> DIR/config.json, DIR/model.safetensors,
// DIR/vocab.txt + DIR/tokenizer_config.json (when the checkpoint records a WordPiece
// vocabulary). Other presets and pre-LN: a clear error naming what has no HF BERT equivalent.
HfConversion convert_to_hf(const std::string& checkpoint, const std::string& dir);

}  // namespace models
