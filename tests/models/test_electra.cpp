// ELECTRA (models/electra.h): the generator's sizes, the embeddings shared by handle and listed
// once, the discriminator's input and labels, draws from the dropout stream (reproducible, M x V
// words), the loss's parts, loading and config errors, and a pretraining run interrupted and
// resumed with bit-identical losses (the draws continue the saved stream). The values against
// PyTorch: tools/reference/check_electra.py (ctest reference_electra_*).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <set>

#include "engine/autograd.h"
#include "engine/config.h"
#include "engine/error.h"
#include "models/checkpoint.h"
#include "models/electra.h"
#include "models/model_support.h"
#include "models/pretrain.h"
#include "models/pretrain_config.h"
#include "ops/ops.h"

using namespace models;
using Catch::Contains;
using engine::Tensor;
namespace fs = std::filesystem;

namespace {

BertConfig small_disc() {
  BertConfig c = engine::testing::tiny_bert("tupe_r");
  c.hidden_size = 32;
  c.num_heads = 4;
  c.ffn_size = 64;
  c.embedding_size = 24;
  c.validate();
  return c;
}

ElectraConfig half() {
  ElectraConfig e;
  e.generator_size = 0.5;
  return e;
}

Tensor param(const engine::Module& m, const std::string& name) {
  for (auto& [n, t] : m.named_parameters())
    if (n == name) return t;
  FAIL("no parameter " << name);
  return Tensor();
}

}  // namespace

TEST_CASE("the generator's sizes are ELECTRA's fractions of the discriminator's", "[electra]") {
  BertConfig small = bert_base();  // ELECTRA-Small: 256 wide, 4 heads, FFN 1024, embeddings 128
  small.hidden_size = 256;
  small.num_heads = 4;
  small.ffn_size = 1024;
  small.embedding_size = 128;
  ElectraConfig e;  // generator_size 1/4
  const BertConfig g = generator_config(small, e);
  REQUIRE(g.hidden_size == 64);
  REQUIRE(g.num_heads == 1);
  REQUIRE(g.ffn_size == 256);
  REQUIRE(g.num_layers == 12);
  REQUIRE(g.embedding_width() == 128);
  e.generator_size = 1.0 / 3.0;  // ELECTRA-Base
  const BertConfig b = generator_config(bert_base(), e);
  REQUIRE(b.hidden_size == 256);
  REQUIRE(b.num_heads == 4);
  REQUIRE(b.ffn_size == 1024);
  REQUIRE(b.embedding_width() == 768);
  e.generator_layers = 3;
  REQUIRE(generator_config(bert_base(), e).num_layers == 3);
  BertConfig odd = bert_base();
  odd.num_heads = 8;
  odd.hidden_size = 64;
  e.generator_size = 0.3;  // 19 wide, 2 heads
  REQUIRE_THROWS_WITH(generator_config(odd, e), Contains("do not divide"));
}

TEST_CASE("ELECTRA shares the embeddings by handle and lists them once", "[electra]") {
  const BertConfig c = small_disc();
  ElectraForPretraining m(c, half(), 3);
  std::set<std::string> names;
  for (auto& [n, t] : m.named_parameters()) REQUIRE(names.insert(n).second);
  // The discriminator is a BertForMaskedLM's encoder with the same seed, name for name.
  BertForMaskedLM mlm(c, 3);
  for (auto& [n, t] : mlm.named_parameters()) {
    if (n.rfind("bert.", 0) != 0) continue;
    INFO(n);
    REQUIRE(names.count(n));
    REQUIRE(param(m, n).to_vector<float>() == t.to_vector<float>());
  }
  for (const char* own : {"generator.bert.embeddings.project.weight",
                          "bert.embeddings.project.weight", "generator.bert.position.query.weight",
                          "generator.mlm.decoder_bias", "rtd.dense.weight", "rtd.out.weight"})
    REQUIRE(names.count(own));
  for (const char* shared :
       {"generator.bert.embeddings.token", "generator.bert.position.table",
        "generator.bert.embeddings.norm.weight", "generator.bert.embeddings.segment"})
    REQUIRE_FALSE(names.count(shared));
  const BertModel& g = m.generator.bert;
  REQUIRE(g.token_embedding.raw_data() == m.bert.token_embedding.raw_data());
  REQUIRE(g.position->table.raw_data() == m.bert.position->table.raw_data());
  REQUIRE(g.embedding_norm->weight.raw_data() == m.bert.embedding_norm->weight.raw_data());
  REQUIRE(g.position->parameter("query.weight").size(0) == 16);  // U^Q: 24 -> the generator's 16
  REQUIRE(param(m, "rtd.out.weight").shape() == engine::Shape{1, 32});
}

TEST_CASE("ELECTRA's discriminator sees the draws and labels what changed", "[electra]") {
  const BertConfig c = small_disc();
  ElectraForPretraining m(c, half(), 4);
  m.train(false);
  const data::MlmBatch b = engine::testing::host_mlm_batch(3, 10, c.vocab_size, 2);
  const int64_t n = b.num_predicted(), v = c.vocab_size;
  const std::vector<int64_t> targets = b.targets.to_vector<int64_t>();
  std::vector<int64_t> draws;  // odd ones replace their token, even ones draw it back
  for (int64_t k = 0; k < n; ++k)
    draws.push_back(k % 2 ? (targets[size_t(k)] + 1) % v : targets[size_t(k)]);
  engine::Generator gen(1);
  const ElectraOutput out = m.forward(b, gen, Tensor::from_vector(draws, {n}));
  REQUIRE(gen.offset() == 0);  // replacements given: nothing drawn (and no dropout)
  const std::vector<int64_t> ids = out.discriminator_ids.to_vector<int64_t>(),
                             labels = out.rtd_labels.to_vector<int64_t>(),
                             in = b.inputs.input_ids.to_vector<int64_t>(),
                             mask = b.inputs.attention_mask.to_vector<int64_t>(),
                             pos = b.positions.to_vector<int64_t>();
  std::vector<int64_t> want_ids = in, want_labels(in.size(), 0);
  for (size_t i = 0; i < in.size(); ++i)
    if (!mask[i]) want_labels[i] = -100;
  for (int64_t k = 0; k < n; ++k) {
    want_ids[size_t(pos[size_t(k)])] = draws[size_t(k)];
    want_labels[size_t(pos[size_t(k)])] = k % 2;
  }
  REQUIRE(ids == want_ids);
  REQUIRE(labels == want_labels);
  // loss = MLM + 50 x RTD, RTD the mean BCE over the tokens, from the dumped logits.
  const std::vector<float> x = out.rtd_logits.to_vector<float>();
  double bce = 0, count = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (want_labels[i] < 0) continue;
    bce += std::log1p(std::exp(double(x[i]))) - double(want_labels[i]) * double(x[i]);
    count += 1;
  }
  REQUIRE(out.rtd_loss.item() == Approx(bce / count).epsilon(1e-5));
  REQUIRE(out.loss.item() ==
          Approx(out.mlm_loss.item() + 50.0 * out.rtd_loss.item()).epsilon(1e-6));
}

TEST_CASE("ELECTRA draws from the dropout stream: M x V words, reproducibly", "[electra]") {
  const BertConfig c = small_disc();
  ElectraForPretraining m(c, half(), 4);
  m.train(false);  // no dropout: the draws alone take words
  const data::MlmBatch b = engine::testing::host_mlm_batch(3, 10, c.vocab_size, 1);
  engine::Generator g1(9), g2(9);
  const ElectraOutput a = m.forward(b, g1), again = m.forward(b, g2);
  const uint64_t words = uint64_t(b.num_predicted() * c.vocab_size);
  REQUIRE(g1.offset() == (words + 3) / 4);
  REQUIRE(a.sampled.to_vector<int64_t>() == again.sampled.to_vector<int64_t>());
  REQUIRE(a.loss.item() == again.loss.item());
  const ElectraOutput next = m.forward(b, g1);  // the stream moved on
  REQUIRE(next.sampled.to_vector<int64_t>() != a.sampled.to_vector<int64_t>());
  // The draws are the generator's: sample_categorical of its logits from the same state.
  engine::Generator g3(9);
  REQUIRE(engine::sample_categorical(a.mlm_logits, 1.0, g3).to_vector<int64_t>() ==
          a.sampled.to_vector<int64_t>());
}

TEST_CASE("ELECTRA pretraining resumes with bit-identical losses", "[electra][pretrain]") {
  BertConfig c = engine::testing::synthetic_bert();
  c.hidden_dropout = c.attention_dropout = 0.1;  // dropout and draws share the stream
  ElectraConfig e = half();
  const fs::path a_dir = engine::testing::fresh_dir("electra_a"),
                 b_dir = engine::testing::fresh_dir("electra_b");
  const PretrainOptions o_a = engine::testing::short_pretrain(a_dir),
                        o_b = engine::testing::short_pretrain(b_dir);
  std::vector<double> full;
  {
    ElectraForPretraining m(c, e, 5);
    engine::testing::SyntheticSource data;
    full = pretrain(m, data, o_a, engine::testing::short_pretrain_adam(), 5, false).losses;
  }
  REQUIRE(full.size() == 12);
  REQUIRE(full.back() < full.front());
  {
    ElectraForPretraining m(c, e, 5);
    engine::testing::SyntheticSource data;
    REQUIRE_THROWS_WITH(pretrain(m, data, o_b, engine::testing::short_pretrain_adam(), 5, false, "",
                                 [](int64_t step, double) {
                                   if (step == 10) throw engine::Error("simulated crash");
                                 }),
                        Contains("simulated crash"));
  }
  std::vector<double> resumed;
  {
    ElectraForPretraining m(c, e, 77);  // everything comes from the checkpoint
    engine::testing::SyntheticSource data;
    PretrainResult r = pretrain(m, data, o_b, engine::testing::short_pretrain_adam(), 5, true);
    REQUIRE(r.start_step == 8);
    resumed = r.losses;
  }
  REQUIRE(resumed.size() == 4);
  for (size_t i = 0; i < 4; ++i) REQUIRE(resumed[i] == full[8 + i]);
  // The checkpoint says what it is; other ELECTRA settings refuse to resume from it.
  const std::string last = latest_checkpoint(b_dir.string());
  REQUIRE(read_checkpoint_kind(last) == "electra");
  {
    ElectraConfig other = e;
    other.rtd_weight = 10;
    ElectraForPretraining m(c, other, 5);
    engine::testing::SyntheticSource data;
    PretrainOptions more = o_b;
    more.steps = 16;
    REQUIRE_THROWS_WITH(pretrain(m, data, more, engine::testing::short_pretrain_adam(), 5, true),
                        Contains("engine.electra_config"));
  }
  // The weights-only model loads back as ELECTRA; a masked LM refuses it.
  const std::string model_file = (b_dir / "model.safetensors").string();
  std::unique_ptr<PretrainModel> loaded = load_pretrain_model(model_file);
  REQUIRE(std::string(loaded->kind()) == "electra");
  BertForMaskedLM mlm(c, 1);
  REQUIRE_THROWS_WITH(load_checkpoint(model_file, mlm), Contains("holds a 'electra' model"));
  // Its encoder is the discriminator's, for finetuning.
  BertModel enc(read_checkpoint_config(model_file), *std::make_unique<engine::Generator>(1));
  load_bert_encoder(model_file, enc);
  REQUIRE(enc.token_embedding.to_vector<float>() ==
          dynamic_cast<ElectraForPretraining&>(*loaded).bert.token_embedding.to_vector<float>());
  fs::remove_all(a_dir);
  fs::remove_all(b_dir);
}

TEST_CASE("train.cuda_graph refuses ELECTRA before any step, naming why", "[electra][pretrain]") {
  // Graph mode pads the predicted positions; ELECTRA writes its generator's samples there.
  ElectraForPretraining m(engine::testing::synthetic_bert(), half(), 5);
  engine::testing::SyntheticSource data;
  const fs::path dir = engine::testing::fresh_dir("electra_graph");
  PretrainOptions o = engine::testing::short_pretrain(dir);
  o.cuda_graph = true;
  REQUIRE_THROWS_WITH(pretrain(m, data, o, engine::testing::short_pretrain_adam(), 5, false),
                      Contains("[pretrain] train.cuda_graph: the electra objective writes its "
                               "generator's samples at the predicted positions"));
  fs::remove_all(dir);
}

TEST_CASE("the objective and electra sections of a pretraining config are checked",
          "[electra][config]") {
  auto read = [](const std::string& yaml) {
    return PretrainConfig::read(engine::Config::parse(yaml, "t.yaml"));
  };
  const PretrainConfig def = read("model:\n  size: custom\n");
  REQUIRE(def.objective == "mlm");
  REQUIRE(std::string(def.make_model(engine::testing::tiny_bert("bert_a"), 1)->kind()) ==
          "bert_mlm");
  const PretrainConfig el = read(
      "objective: electra\nelectra:\n  generator_size: 0.5\n  rtd_weight: 20\n"
      "model:\n  hidden_size: 32\n  num_heads: 4\n");
  REQUIRE(el.electra.generator_size == 0.5);
  REQUIRE(el.electra.rtd_weight == 20);
  REQUIRE(std::string(el.make_model(small_disc(), 1)->kind()) == "electra");
  REQUIRE_THROWS_WITH(read("objective: bert\n"), Contains("objective"));
  REQUIRE_THROWS_WITH(
      read("electra:\n  rtd_weight: 2\n"),
      Contains("electra: an electra section needs objective: electra (the objective is mlm)"));
  REQUIRE_THROWS_WITH(read("objective: electra\nelectra:\n  generator_size: 0\n"),
                      Contains("electra.generator_size: must be in (0, 1]"));
  REQUIRE_THROWS_WITH(read("objective: electra\nelectra:\n  temperature: -1\n"),
                      Contains("electra.temperature"));
  REQUIRE_THROWS_WITH(read("objective: electra\nelectra:\n  generator_sise: 0.5\n"),
                      Contains("generator_sise"));
}
