// The pretraining loop with a synthetic batch source: the loss falls, a run interrupted after a
// checkpoint resumes with bit-identical losses (AdamW and LAMB), keep_last prunes old checkpoints,
// metrics.jsonl holds one object per log step, and bad options are clear errors.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/autograd.h"
#include "engine/config.h"
#include "engine/error.h"
#include "models/model_support.h"
#include "models/pretrain.h"
#include "models/pretrain_config.h"

using namespace models;
using Catch::Contains;
using engine::Tensor;
namespace fs = std::filesystem;

namespace {

BertConfig tiny() { return engine::testing::synthetic_bert(); }
using Synthetic = engine::testing::SyntheticSource;

fs::path fresh_dir(const std::string& name) {
  return engine::testing::fresh_dir("pretrain_" + name);
}
PretrainOptions options(const fs::path& dir) { return engine::testing::short_pretrain(dir); }
engine::OptimizerOptions adam() { return engine::testing::short_pretrain_adam(); }

}  // namespace

TEST_CASE("pretraining resumes with bit-identical losses, with AdamW and with LAMB", "[pretrain]") {
  std::vector<double> adamw_losses;
  for (const std::string optim : {"adamw", "lamb"}) {
    INFO(optim);
    engine::OptimizerOptions opt = adam();
    opt.name = optim;
    const fs::path a_dir = fresh_dir("a"), b_dir = fresh_dir("b");
    std::vector<double> full;
    {
      BertForMaskedLM model(tiny(), 5);
      Synthetic data;
      full = pretrain(model, data, options(a_dir), opt, 5, false).losses;
    }
    REQUIRE(full.size() == 12);
    REQUIRE(full.back() < full.front());  // it learns
    if (optim == "adamw")
      adamw_losses = full;
    else
      REQUIRE(full[2] != adamw_losses[2]);  // step 1 has lr 0; then LAMB is not AdamW

    // Interrupted after step 10 (the last checkpoint is step 8), then resumed in a new "process".
    {
      BertForMaskedLM model(tiny(), 5);
      Synthetic data;
      REQUIRE_THROWS_WITH(pretrain(model, data, options(b_dir), opt, 5, false, "",
                                   [](int64_t step, double) {
                                     if (step == 10) throw engine::Error("simulated crash");
                                   }),
                          Contains("simulated crash"));
    }
    REQUIRE(latest_checkpoint(b_dir.string()).find("step_00000008") != std::string::npos);
    std::vector<double> resumed;
    {
      BertForMaskedLM model(tiny(), 999);  // a different init: everything comes from the checkpoint
      Synthetic data;
      PretrainResult r = pretrain(model, data, options(b_dir), opt, 5, true);
      REQUIRE(r.start_step == 8);
      resumed = r.losses;
    }
    REQUIRE(resumed.size() == 4);
    for (size_t i = 0; i < 4; ++i) {
      INFO("step " << 9 + i);
      REQUIRE(resumed[i] == full[8 + i]);  // bit for bit
    }
    // keep_last 2: steps 8 and 12 remain.
    int n = 0;
    for (auto& e : fs::directory_iterator(b_dir / "checkpoints"))
      n += e.path().extension() == ".safetensors";
    REQUIRE(n == 2);
    // metrics.jsonl: one line per step 1..12 (steps 9, 10 of the crashed run re-logged once).
    std::ifstream in(b_dir / "metrics.jsonl");
    std::string line;
    std::vector<std::string> lines;
    while (std::getline(in, line)) lines.push_back(line);
    REQUIRE(lines.size() == 12);
    REQUIRE(lines[5].find("\"valid_loss\"") != std::string::npos);
    REQUIRE(lines[11].find("\"step\": 12,") != std::string::npos);
    REQUIRE(fs::exists(b_dir / "model.safetensors"));
    if (optim == "lamb") {  // its checkpoint refuses AdamW, naming both
      BertForMaskedLM model(tiny(), 5);
      Synthetic data;
      PretrainOptions o = options(b_dir);
      o.steps = 16;
      REQUIRE_THROWS_WITH(pretrain(model, data, o, adam(), 5, true),
                          Contains("the checkpoint was trained with optim.name lamb but the config "
                                   "says adamw"));
    }
    fs::remove_all(a_dir);
    fs::remove_all(b_dir);
  }
}

TEST_CASE("pretraining refuses to overwrite a run and to resume nothing", "[pretrain][errors]") {
  const fs::path dir = fresh_dir("guard");
  BertForMaskedLM model(tiny(), 1);
  Synthetic data;
  PretrainOptions o = options(dir);
  o.steps = 4;
  REQUIRE_THROWS_WITH(pretrain(model, data, o, adam(), 1, true),
                      Contains("--resume: no checkpoint in"));
  pretrain(model, data, o, adam(), 1, false);
  REQUIRE_THROWS_WITH(pretrain(model, data, o, adam(), 1, false),
                      Contains("already holds checkpoints"));
  // A checkpoint of another model.
  BertConfig other = tiny();
  other.num_layers = 1;
  BertForMaskedLM small(other, 1);
  REQUIRE_THROWS_WITH(pretrain(small, data, o, adam(), 1, true),
                      Contains("model.num_layers: 2 vs 1"));
  o.precision = "fp16";
  REQUIRE_THROWS_WITH(
      pretrain(model, data, o, adam(), 1, true),
      Contains("whose kernels compute in f32 and f64 only; set train.device: cuda"));
  fs::remove_all(dir);
}

TEST_CASE("a NaN in f32 training stops the run naming the step, micro-batch and checkpoint",
          "[pretrain]") {
  const fs::path dir = fresh_dir("nonfinite");
  Synthetic data;
  BertForMaskedLM model(tiny(), 5);
  PretrainOptions o = options(dir);  // checkpoints every 4 steps, accumulation 2
  // A weight becomes NaN after step 6 (as a diverging run's would): step 7 must not train on.
  auto inject = [&](int64_t step, double) {
    if (step != 6) return;
    engine::NoGrad ng;
    model.named_parameters()[0].second.fill_(std::nan(""));
  };
  REQUIRE_THROWS_WITH(pretrain(model, data, o, adam(), 5, false, "", inject),
                      Contains("[pretrain] step 7: the loss or the gradients are not finite") &&
                          Contains("on micro-batch 1 of 2") &&
                          Contains("Last good checkpoint: " +
                                   (dir / "checkpoints" / "step_00000004.safetensors").string()) &&
                          Contains("train.on_nonfinite: skip"));
  // --resume continues from that checkpoint.
  BertForMaskedLM again(tiny(), 5);
  Synthetic data2;
  PretrainResult r = pretrain(again, data2, o, adam(), 5, true);
  REQUIRE(r.start_step == 4);
  REQUIRE(r.final_step == 12);

  // on_nonfinite: skip goes on without the bad steps' updates.
  const fs::path dir2 = fresh_dir("nonfinite_skip");
  BertForMaskedLM m2(tiny(), 5);
  Synthetic data3;
  PretrainOptions o2 = options(dir2);
  o2.on_nonfinite = "skip";
  std::vector<double> seen;
  auto spoil = [&](int64_t step, double loss) {
    seen.push_back(loss);
    if (step != 6) return;
    engine::NoGrad ng;
    m2.named_parameters()[0].second.fill_(std::nan(""));
  };
  const PretrainResult r2 = pretrain(m2, data3, o2, adam(), 5, false, "", spoil);
  REQUIRE(r2.final_step == 12);
  REQUIRE(std::isnan(seen.back()));  // every later step skipped: the weight stays NaN
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

TEST_CASE("train options from YAML are checked", "[pretrain][config]") {
  auto parse = [](const std::string& yaml) {
    engine::Config c = engine::Config::parse(yaml, "t.yaml");
    return read_train_options(c.root().section("train"));
  };
  PretrainOptions o =
      parse("train:\n  steps: 50\n  precision: fp16\n  loss_scale:\n    init: 1024\n");
  REQUIRE(o.steps == 50);
  REQUIRE(o.loss_scale.enabled);  // on by default for fp16
  REQUIRE(o.loss_scale.init_scale == 1024);
  REQUIRE_FALSE(parse("train:\n  steps: 5\n").loss_scale.enabled);
  REQUIRE_THROWS_WITH(parse("train:\n  step: 5\n"),
                      Contains("unknown key 'train.step'") && Contains("steps"));
  REQUIRE_THROWS_WITH(parse("train:\n  steps: 0\n"),
                      Contains("t.yaml:2: train.steps: must be positive"));
  REQUIRE_THROWS_WITH(parse("train:\n  precision: fp8\n"),
                      Contains("'fp8' is not one of: f32, bf16, fp16"));
  REQUIRE(parse("train:\n  on_nonfinite: skip\n").on_nonfinite == "skip");
  REQUIRE_THROWS_WITH(parse("train:\n  on_nonfinite: ignore\n"),
                      Contains("'ignore' is not one of: stop, skip"));
  REQUIRE_THROWS_WITH(parse("train:\n  loss_scale:\n    grow: 3\n"),
                      Contains("unknown key 'train.loss_scale.grow'"));
  REQUIRE_FALSE(parse("train:\n  steps: 5\n").cuda_graph);
  REQUIRE_THROWS_WITH(parse("train:\n  cuda_graph: true\n"),
                      Contains("t.yaml:2: train.cuda_graph: needs train.device: cuda") &&
                          Contains("got train.device: cpu"));
}

TEST_CASE("a pretraining config: every section read and checked in one place, errors at the key",
          "[pretrain][config]") {
  auto read = [](const std::string& yaml) {
    return PretrainConfig::read(engine::Config::parse(yaml, "p.yaml"));
  };
  const PretrainConfig c = read(
      "seed: 9\nmodel:\n  hidden_size: 32\n  num_layers: 1\n  num_heads: 2\n  ffn_size: 64\n  "
      "max_positions: 16\n"
      "optim:\n  lr: 0.002\n  beta2: 0.98\ndata:\n  corpus: somewhere\n  seq_len: 16\ntrain:\n  "
      "steps: 7\n");
  CHECK(c.seed == 9);
  CHECK(c.has_model);
  CHECK_FALSE(c.has_vocab_size);
  CHECK(c.model.hidden_size == 32);
  CHECK(c.optim.lr == 0.002);
  CHECK(c.optim.beta2 == 0.98);
  CHECK(c.data.corpus == "somewhere");
  CHECK(c.train.steps == 7);
  CHECK_FALSE(read("train:\n  steps: 3\n").has_model);

  REQUIRE_THROWS_WITH(read("optim:\n  lr: -1\n"),
                      Contains("p.yaml:2: optim.lr: must be a finite value >= 0"));
  REQUIRE_THROWS_WITH(read("optim:\n  beta1: 1.0\n"),
                      Contains("p.yaml:2: optim.beta1: must be in [0, 1)"));
  REQUIRE_THROWS_WITH(read("optim:\n  weight_decay: -0.1\n"), Contains("optim.weight_decay"));
  REQUIRE_THROWS_WITH(read("optim:\n  momentum: 0.9\n"), Contains("unknown key 'optim.momentum'"));
  CHECK(c.optim.name == "adamw");
  const PretrainConfig lamb = read("optim:\n  name: lamb\n  trust_ratio: all\n");
  CHECK(lamb.optim.name == "lamb");
  CHECK(lamb.optim.trust_ratio_all);
  CHECK_FALSE(read("optim:\n  name: lamb\n").optim.trust_ratio_all);
  REQUIRE_THROWS_WITH(read("optim:\n  name: sgd\n"),
                      Contains("p.yaml:2: optim.name: must be adamw or lamb, got 'sgd'"));
  REQUIRE_THROWS_WITH(read("optim:\n  trust_ratio: some\n"),
                      Contains("p.yaml:2: optim.trust_ratio: must be decayed"));
  REQUIRE_THROWS_WITH(read("data:\n  seq_len: 2\n"),
                      Contains("p.yaml:2: data.seq_len: must be at least 3"));
  REQUIRE_THROWS_WITH(read("data:\n  batch_size: 0\n"),
                      Contains("data.batch_size: must be at least 1"));
  REQUIRE_THROWS_WITH(read("train:\n  loss_scale:\n    backoff_factor: 1.5\n"),
                      Contains("p.yaml:3: train.loss_scale.backoff_factor: must be in (0, 1)"));
  REQUIRE_THROWS_WITH(read("train:\n  loss_scale:\n    growth_factor: 1\n"),
                      Contains("growth_factor: must be > 1"));
  REQUIRE_THROWS_WITH(read("train:\n  loss_scale:\n    init: 4\n    min: 8\n"),
                      Contains("train.loss_scale.min"));
  REQUIRE_THROWS_WITH(read("seed: -2\n"), Contains("p.yaml:1: seed: must be >= 0"));
  REQUIRE_THROWS_WITH(read("sead: 2\n"), Contains("unknown key 'sead'"));

  // Corpus pretraining: the sequence length against a learned table, the vocabulary against the
  // tokenizer's.
  const PretrainConfig long_seq = read("model:\n  max_positions: 64\ndata:\n  seq_len: 128\n");
  BertConfig m = long_seq.model;
  m.vocab_size = 100;
  REQUIRE_THROWS_WITH(long_seq.check_for_corpus(m, 100, "vocab.txt"),
                      Contains("p.yaml:4: data.seq_len: 128 exceeds model.max_positions 64"));
  REQUIRE_THROWS_WITH(
      long_seq.check_for_corpus(m, 99, "vocab.txt"),
      Contains("model.vocab_size: 100 does not match the tokenizer vocab.txt (99 tokens)"));
  apply_position_preset(m.position, "sin_ape");  // no table: any length
  long_seq.check_for_corpus(m, 100, "vocab.txt");

  // Segment pairs need segment embeddings and room for [CLS] a [SEP] b [SEP].
  const PretrainConfig pairs = read("model:\n  type_vocab_size: 0\ndata:\n  segment_pairs: true\n");
  CHECK(pairs.data.segment_pairs);
  BertConfig pm = pairs.model;
  pm.vocab_size = 100;
  REQUIRE_THROWS_WITH(pairs.check_for_corpus(pm, 100, "vocab.txt"),
                      Contains("p.yaml:4: data.segment_pairs: segment pairs need segment "
                               "embeddings, but model.type_vocab_size is 0 (expected >= 2)"));
  pm.type_vocab_size = 2;
  pairs.check_for_corpus(pm, 100, "vocab.txt");
  REQUIRE_THROWS_WITH(read("data:\n  seq_len: 4\n  segment_pairs: true\n"),
                      Contains("p.yaml:2: data.seq_len: 4 is too short for data.segment_pairs"));
  REQUIRE_THROWS_WITH(read("data:\n  segment_pairs: maybe\n"), Contains("data.segment_pairs"));

  // Sentence-order prediction swaps the two segments: it needs them.
  const PretrainConfig sop = read("objective: mlm_sop\ndata:\n  segment_pairs: true\n");
  CHECK(sop.objective == "mlm_sop");
  REQUIRE_THROWS_WITH(read("objective: mlm_sop\n"),
                      Contains("p.yaml:1: objective: mlm_sop (sentence-order prediction) needs "
                               "data.segment_pairs: true"));
  REQUIRE_THROWS_WITH(read("objective: mlm_sop\ndata:\n  segment_pairs: false\n"),
                      Contains("p.yaml:3: data.segment_pairs is false"));
  REQUIRE_THROWS_WITH(read("objective: nsp\n"), Contains("objective"));
}
