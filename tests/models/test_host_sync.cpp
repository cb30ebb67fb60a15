// What a training step costs the host: for every positional preset, the forward, the backward and
// the optimizer read no tensor back and build no tensor from host values (batches arrive made,
// position constants are cached), and the trainer uploads one small block (its per-step numbers)
// and reads one small tensor per optimizer step —
// counted in the backends' transfer path (engine/backend.h, transfer_counts). Also: the position
// constants are built once per new longest length, and a shorter length computes bit for bit what
// a fresh model computes.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "models/bert.h"
#include "models/model_support.h"
#include "models/pretrain.h"
#include "test_support.h"
#include "train/trainer.h"

using namespace models;
using engine::DType;
using engine::Tensor;
namespace fs = std::filesystem;

namespace {

// The shared tiny model with dropout on (its stream must not cost reads either).
BertConfig tiny(const std::string& preset, const std::string& reset = "paper") {
  return engine::testing::tiny_bert(preset, reset, 0.1);
}
using engine::testing::host_mlm_batch;
std::vector<std::pair<std::string, std::string>> presets() {
  return engine::testing::all_presets();
}

}  // namespace

TEST_CASE(
    "host_sync: a step with 3 micro-batches reads back one tensor and uploads one, every preset",
    "[host_sync]") {
  for (const auto& [preset, reset] : presets()) {
    INFO(preset << " cls_reset " << reset);
    BertForMaskedLM model(tiny(preset, reset), 3);
    model.train(true);
    engine::FlatParameters flat(model.named_parameters());
    engine::OptimizerOptions adam;
    engine::Trainer trainer(flat, adam, {}, engine::constant_lr(1e-3));
    engine::Generator gen(5);
    std::vector<data::MlmBatch> micro;
    for (uint64_t m = 0; m < 3; ++m)
      micro.push_back(host_mlm_batch(3, 12, 40, m).to(flat.data().device()));
    const std::vector<double> weights = {0.3, 0.3, 0.4};
    auto loss_of = [&](int64_t m) { return model.forward(micro[size_t(m)], gen).loss; };
    trainer.step(3, loss_of, weights);  // the first step builds the position constants
    const engine::TransferCounts before = engine::transfer_counts();
    const int steps = 3;
    for (int s = 0; s < steps; ++s) REQUIRE(trainer.step(3, loss_of, weights).applied);
    const engine::TransferCounts after = engine::transfer_counts();
    CHECK(after.to_host - before.to_host == steps);  // one read per optimizer step
    // One upload, the trainer's step block (lr, loss scale, weights); nothing else from the host.
    CHECK(after.from_host - before.from_host == steps);
  }
}

TEST_CASE("host_sync: the pretraining loop reads back one tensor per step",
          "[host_sync][pretrain]") {
  // Batches made by the source, accumulation 3; no validation or checkpoint before the last step.
  class Source : public BatchSource {
   public:
    data::MlmBatch next_train() override { return host_mlm_batch(2, 10, 40, uint64_t(next_++)); }
    std::string position() const override { return std::to_string(next_); }
    void seek(const std::string& p) override { next_ = std::stoll(p); }
    std::vector<data::MlmBatch> valid_batches(int64_t) override {
      return {host_mlm_batch(2, 10, 40, 99)};
    }
    int64_t next_ = 0;
  };
  engine::testing::TempDir dir;
  PretrainOptions o;
  o.steps = 6;
  o.warmup_steps = 1;
  o.accumulation = 3;
  o.valid_every = 0;
  o.save_every = 0;
  o.log_every = 1000;
  o.progress = false;
  o.out_dir = dir / "run";
  BertForMaskedLM model(tiny("tupe_r"), 1);
  Source source;
  std::vector<int64_t> reads;
  pretrain(model, source, o, engine::OptimizerOptions{}, 1, false, "",
           [&](int64_t, double) { reads.push_back(engine::transfer_counts().to_host); });
  REQUIRE(reads.size() == 6);
  for (size_t s = 2; s + 1 < reads.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(reads[s] - reads[s - 1] == 1);
  }
}

TEST_CASE(
    "position constants: built once per longest length, shorter lengths match a fresh model bit "
    "for bit",
    "[bert][host_sync]") {
  for (const auto& [preset, reset] : presets()) {
    INFO(preset << " cls_reset " << reset);
    BertConfig c = tiny(preset, reset);
    c.hidden_dropout = c.attention_dropout = 0.0;
    engine::Generator init_a(4), init_b(4), gen(1);
    BertModel a(c, init_a), b(c, init_b);
    a.train(false);
    b.train(false);
    engine::NoGrad ng;
    auto inputs = [&](int64_t t) { return host_mlm_batch(2, t, c.vocab_size, 1).inputs; };
    a.forward(inputs(12), gen);
    a.forward(inputs(12), gen);
    a.forward(inputs(20), gen);
    // Presets whose components keep no length constant (bert_a, no_pe, TUPE-A: its [CLS] reset
    // is a pass of its own, not masks) build nothing.
    const int64_t builds = a.position->constant_builds();
    const bool none = preset == "no_pe" || preset == "bert_a" || preset == "tupe_a" ||
                      preset == "tupe_a_tie_cls" || preset == "bert_a_d";
    CHECK(builds == (none ? 0 : 2));
    const Tensor ya = a.forward(inputs(7), gen), ya2 = a.forward(inputs(7), gen);
    CHECK(a.position->constant_builds() == builds);  // 7 is the leading block of 20
    const Tensor yb = b.forward(inputs(7), gen);
    CHECK(b.position->constant_builds() == (none ? 0 : 1));
    CHECK(ya.to_vector<float>() == yb.to_vector<float>());
    CHECK(ya2.to_vector<float>() == yb.to_vector<float>());
  }
}
