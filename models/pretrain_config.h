// A pretraining config file (configs/README.md lists every key): each section — seed, model,
// optim, data, train — read and validated in this one place, every error naming the file, the
// line and the key path; the cross-section rules (sequence length against the position table)
// are checked here too. pretrain_app parses its config through it; so can a program of yours.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/config.h"
#include "engine/optim.h"
#include "models/bert_config.h"
#include "models/electra_config.h"
#include "models/pretrain.h"

namespace models {

// The `data:` section.
struct DataOptions {
  std::string corpus;     // a directory made by `pretrain_app prepare` ("" = none given)
  std::string tokenizer;  // "" = the one the corpus was prepared with
  int64_t seq_len = 128;  // tokens per sequence, [CLS] and [SEP] included
  int64_t batch_size = 32;
  bool shuffle = true;
  bool lower_case = true;
  // [CLS] A [SEP] B [SEP] with token types 0 / 1, cut at a random point of each sequence
  // (data/batches.h, "Segment pairs"); needs model.type_vocab_size >= 2.
  bool segment_pairs = false;
};

struct PretrainConfig {
  uint64_t seed = 1;
  bool has_model = false;       // a `model:` section was given (else a checkpoint's may be used)
  bool has_vocab_size = false;  // model.vocab_size was given (else the corpus tokenizer's applies)
  BertConfig model;             // the model section (the defaults when absent)
  // `objective:` mlm (BERT), mlm_sop (+ sentence order, models/bert_sop.h; needs
  // data.segment_pairs) or electra (models/electra.h)
  std::string objective = "mlm";
  ElectraConfig electra;  // the `electra:` section (objective: electra only)
  engine::OptimizerOptions optim;
  DataOptions data;
  PretrainOptions train;

  // Reads every section of `cfg` and refuses a key nobody reads.
  static PretrainConfig read(const engine::Config& cfg);
  // Corpus pretraining with `model`: data.seq_len must fit a learned position table; `vocab` (the
  // tokenizer's size) must equal model.vocab_size. Errors name the config key.
  void check_for_corpus(const BertConfig& model, int64_t vocab, const std::string& tokenizer) const;
  // The objective's model with encoder `model` (the `model:` section, or a checkpoint's), its
  // parameters drawn from `seed` (models/objective.cpp).
  std::unique_ptr<PretrainModel> make_model(const BertConfig& model, uint64_t seed) const;

 private:
  std::string seq_len_where_, vocab_where_;  // "file.yaml:7: data.seq_len" for the errors
  std::string segment_pairs_where_;
};

// The pretraining model a checkpoint holds (its kind: BERT's masked LM or ELECTRA, with the
// config and ELECTRA settings it records), its weights loaded.
std::unique_ptr<PretrainModel> load_pretrain_model(const std::string& checkpoint);

// The sections on their own (each is what read() uses).
engine::OptimizerOptions read_optim_options(const engine::ConfigSection& optim);
DataOptions read_data_options(const engine::ConfigSection& data);
PretrainOptions read_train_options(const engine::ConfigSection& train);
// `key` of section `s` as a device ("cpu", "cuda", "cuda:N"); the error names file, line and key.
engine::Device read_device(const engine::ConfigSection& s, const std::string& key,
                           engine::Device fallback);

}  // namespace models
