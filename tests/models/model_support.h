// Shared by the model tests (tests/models/, and tests/cuda/models/ on the device): a tiny BERT
// config per preset, a host MLM batch with padding, segments and predicted positions, the preset
// list (every preset plus TUPE-R's code reset), and a synthetic batch source for the pretraining
// loop.
#pragma once

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "data/batch.h"
#include "engine/optim.h"
#include "models/bert.h"
#include "models/pretrain.h"

namespace engine::testing {

inline models::BertConfig tiny_bert(const std::string& preset, const std::string& reset = "paper",
                                    double dropout = 0.0) {
  models::BertConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_size = 32;
  c.max_positions = 24;
  c.type_vocab_size = 2;
  c.hidden_dropout = c.attention_dropout = dropout;
  models::apply_position_preset(c.position, preset, reset);
  c.position.rpe_clip = 5;
  c.validate();
  return c;
}

// B x T on the host, the last row padded over its last 3 positions, segment ids, every fifth
// position predicted.
inline data::MlmBatch host_mlm_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> ids(size_t(b * t)), mask(ids.size(), 1), labels(ids.size(), -100),
      types(ids.size(), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = 1 + int64_t((i * 7 + seed * 13) % size_t(vocab - 1));
    if (i % 5 == uint64_t(seed % 5)) labels[i] = int64_t((i * 3 + seed) % size_t(vocab));
    types[i] = int64_t(i % size_t(t)) >= t / 2;
  }
  for (int64_t j = t - 3; j < t; ++j)
    mask[size_t((b - 1) * t + j)] = 0, labels[size_t((b - 1) * t + j)] = -100;
  return data::make_mlm_batch(Tensor::from_vector(ids, {b, t}), Tensor::from_vector(mask, {b, t}),
                              Tensor::from_vector(labels, {b, t}),
                              Tensor::from_vector(types, {b, t}), vocab, "test");
}

inline std::vector<std::pair<std::string, std::string>> all_presets() {
  std::vector<std::pair<std::string, std::string>> v;
  for (const std::string& p : models::position_presets()) v.emplace_back(p, "paper");
  v.emplace_back("tupe_r", "code");
  return v;
}

// Pretraining batches where batch k is a pure function of k: a repeating pattern the model can
// learn, masked at a few positions that depend on k (vocabulary 30, [MASK] = 29).
class SyntheticSource : public models::BatchSource {
 public:
  data::MlmBatch make(int64_t k) const {
    const int64_t b = 4, t = 12;
    std::vector<int64_t> ids(b * t), mask(b * t, 1), labels(b * t, -100);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < t; ++j) ids[i * t + j] = j == 0 ? 1 : 2 + (i + j + k) % 7;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 1 + (k + i) % 3; j < t; j += 3) {
        labels[i * t + j] = ids[i * t + j];
        ids[i * t + j] = 29;  // [MASK]
      }
    mask[b * t - 1] = 0;
    data::MlmBatch batch = data::make_mlm_batch(
        Tensor::from_vector<int64_t>(ids, {b, t}), Tensor::from_vector<int64_t>(mask, {b, t}),
        Tensor::from_vector<int64_t>(labels, {b, t}), {}, 30, "synthetic");
    if (sentence_order) {  // objective mlm_sop: a label per row, one row of four without a pair
      std::vector<int64_t> order(b);
      for (int64_t i = 0; i < b; ++i) order[i] = (i + k) % 4 == 3 ? -100 : (i * 5 + k) % 3 == 0;
      batch.sentence_labels = Tensor::from_vector<int64_t>(order, {b});
    }
    return batch;
  }
  data::MlmBatch next_train() override { return make(next_++); }
  std::string position() const override { return std::to_string(next_); }
  void seek(const std::string& p) override { next_ = std::stoll(p); }
  std::vector<data::MlmBatch> valid_batches(int64_t n) override {
    std::vector<data::MlmBatch> v;
    for (int64_t i = 0; i < std::min<int64_t>(n, 2); ++i) v.push_back(make(1000 + i));
    return v;
  }
  int64_t next_ = 0;
  bool sentence_order = false;
};

// The TUPE-R model SyntheticSource trains (width 16, 2 layers, dropout 0.1 left on).
inline models::BertConfig synthetic_bert() {
  models::BertConfig c;
  c.vocab_size = 30;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_size = 32;
  c.max_positions = 16;
  models::apply_position_preset(c.position, "tupe_r");
  return c;
}

// An empty directory under the system temp dir, unique to this process.
inline std::filesystem::path fresh_dir(const std::string& name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() /
                            ("engine_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p;
}

// The 12-step pretraining run the resume tests use: checkpoints every 4 steps, validation every
// 6, accumulation 2, on `device`.
inline models::PretrainOptions short_pretrain(const std::filesystem::path& dir,
                                              Device device = Device::cpu()) {
  models::PretrainOptions o;
  o.device = device;
  o.steps = 12;
  o.warmup_steps = 3;
  o.save_every = 4;
  o.valid_every = 6;
  o.log_every = 1;
  o.keep_last = 2;
  o.accumulation = 2;
  o.out_dir = dir.string();
  o.progress = false;
  return o;
}

inline OptimizerOptions short_pretrain_adam() {
  OptimizerOptions a;
  a.lr = 3e-3;
  return a;
}

}  // namespace engine::testing
