// MLM + sentence-order prediction (models/bert_sop.h): the head's parameters, the MLM part drawn
// and computed exactly as BertForMaskedLM's, the SOP loss as a cross-entropy over the labelled
// rows, its gradient by finite differences, the parts and accuracy of evaluation, errors, a
// pretraining run resumed with bit-identical losses, the checkpoint's kind, and finetuning's
// classifier starting from the pretrained pooler. The values against PyTorch:
// tools/reference/check_model.py --sop (ctest reference_tupe_r_sop).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "engine/autograd.h"
#include "engine/config.h"
#include "engine/error.h"
#include "models/bert_sop.h"
#include "models/checkpoint.h"
#include "models/finetune_tasks.h"
#include "models/heads.h"
#include "models/model_support.h"
#include "models/pretrain.h"
#include "models/pretrain_config.h"
#include "ops/ops.h"

using namespace models;
using Catch::Contains;
using engine::Tensor;
namespace fs = std::filesystem;

namespace {

data::MlmBatch sop_batch(int64_t k) {
  engine::testing::SyntheticSource s;
  s.sentence_order = true;
  return s.make(k);
}

std::vector<float> values(const Tensor& t) { return t.to(engine::DType::f32).to_vector<float>(); }

}  // namespace

TEST_CASE("MLM + SOP: the MLM part is BertForMaskedLM's, the SOP part a cross-entropy on [CLS]",
          "[sop]") {
  const BertConfig c = engine::testing::synthetic_bert();
  BertForMlmSop m(c, 5);
  BertForMaskedLM plain(c, 5);
  m.train(false);
  plain.train(false);
  // The same initial encoder and MLM head; the head's own parameters after them.
  const auto named = m.named_parameters(), plain_named = plain.named_parameters();
  REQUIRE(named.size() == plain_named.size() + 4);
  for (size_t i = 0; i < plain_named.size(); ++i) {
    REQUIRE(named[i].first == plain_named[i].first);
    REQUIRE(values(named[i].second) == values(plain_named[i].second));
  }
  REQUIRE(named[plain_named.size()].first == "sop.dense.weight");
  REQUIRE(m.sop_dense.weight.shape() == engine::Shape{16, 16});
  REQUIRE(m.sop_out.weight.shape() == engine::Shape{2, 16});
  REQUIRE(std::string(m.kind()) == "bert_mlm_sop");

  const data::MlmBatch b = sop_batch(3);
  engine::Generator g(1), g2(1);
  const MlmSopOutput o = m.forward_sop(b, g);
  const MlmOutput p = plain.forward(b, g2);
  CHECK(values(o.mlm_loss) == values(p.loss));
  CHECK(values(o.mlm_logits) == values(p.logits));
  REQUIRE(o.sop_logits.shape() == engine::Shape{4, 2});
  // The SOP loss by hand: the rows whose label is not -100.
  const std::vector<float> lg = values(o.sop_logits);
  const std::vector<int64_t> labels = b.sentence_labels.to_vector<int64_t>();
  double sum = 0;
  int rows = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (labels[r] == -100) continue;
    const double a = lg[2 * r], z = lg[2 * r + 1], mx = std::max(a, z);
    sum += mx + std::log(std::exp(a - mx) + std::exp(z - mx)) - (labels[r] ? z : a);
    ++rows;
  }
  REQUIRE(rows == 3);
  CHECK(o.sop_loss.item() == Approx(sum / rows).epsilon(1e-6));
  CHECK(o.loss.item() == Approx(o.mlm_loss.item() + o.sop_loss.item()).epsilon(1e-6));
}

TEST_CASE("MLM + SOP: the SOP head's gradient matches finite differences", "[sop][gradcheck]") {
  BertConfig c = engine::testing::synthetic_bert();
  BertForMlmSop m(c, 2);
  m.train(false);
  const data::MlmBatch b = sop_batch(1);
  engine::Generator g(0);
  Tensor loss = m.forward_sop(b, g).sop_loss;
  loss.backward();
  // The pooler's bias and the [CLS]-row input through the encoder: a few coordinates, central
  // differences in f32 with a step that keeps the rounding small.
  auto probe = [&](Tensor param, int64_t i) {
    const Tensor grad = param.grad().to(engine::DType::f32);
    const float analytic = grad.to_vector<float>()[size_t(i)];
    engine::NoGrad ng;
    float* x = param.data<float>() + i;
    const float keep = *x, h = 1e-2f;
    *x = keep + h;
    const double up = m.forward_sop(b, g).sop_loss.item();
    *x = keep - h;
    const double down = m.forward_sop(b, g).sop_loss.item();
    *x = keep;
    CHECK(analytic == Approx((up - down) / (2 * h)).margin(2e-4).epsilon(2e-2));
  };
  for (int64_t i : {0, 5, 15}) probe(m.sop_dense.bias, i);
  for (int64_t i : {0, 17, 31}) probe(m.sop_out.weight, i);
  probe(m.sop_out.bias, 1);
  for (int64_t i : {3, 100}) probe(m.sop_dense.weight, i);
  for (int64_t i : {1, 40}) probe(m.bert.token_embedding, i);  // token 0..: via the encoder
}

TEST_CASE("MLM + SOP: evaluation parts, and a batch without sentence labels", "[sop]") {
  const BertConfig c = engine::testing::synthetic_bert();
  BertForMlmSop m(c, 5);
  std::vector<data::MlmBatch> batches = {sop_batch(1), sop_batch(2)};
  engine::Communicator& comm = engine::world();
  const MlmEval e = evaluate_mlm(m, batches, comm, engine::DType::f32);
  REQUIRE(e.parts.size() == 3);
  CHECK(e.parts[0].first == "mlm_loss");
  CHECK(e.parts[1].first == "sop_loss");
  CHECK(e.parts[2].first == "sop_accuracy");
  CHECK(e.loss == Approx(e.parts[0].second + e.parts[1].second).epsilon(1e-6));
  CHECK(e.perplexity == Approx(std::exp(e.parts[0].second)).epsilon(1e-9));
  CHECK(e.parts[2].second >= 0.0);
  CHECK(e.parts[2].second <= 1.0);
  // Accuracy by hand on one batch: the rows with a label, logit 1 > logit 0 meaning "swapped".
  {
    m.train(false);
    engine::Generator g(0);
    const data::MlmBatch b = sop_batch(1);
    PretrainModel::Output o = m.pretrain_forward(b, g);
    const std::vector<float> lg = values(m.forward_sop(b, g).sop_logits);
    const std::vector<int64_t> labels = b.sentence_labels.to_vector<int64_t>();
    int right = 0, rows = 0;
    for (size_t r = 0; r < labels.size(); ++r)
      if (labels[r] != -100) ++rows, right += (lg[2 * r + 1] > lg[2 * r]) == (labels[r] == 1);
    REQUIRE(o.parts.size() == 3);
    CHECK(o.parts[2].second.item() == Approx(double(right) / rows));
    m.train(true);
    CHECK(m.pretrain_forward(b, g).parts.size() == 2);  // training reads nothing back
  }
  data::MlmBatch no_labels = sop_batch(1);
  no_labels.sentence_labels = Tensor();
  engine::Generator g(0);
  REQUIRE_THROWS_WITH(m.forward_sop(no_labels, g),
                      Contains("objective mlm_sop needs the batch's sentence_labels (4)"));
}

TEST_CASE("MLM + SOP pretraining resumes with bit-identical losses, finetuning takes the pooler",
          "[sop][pretrain]") {
  BertConfig c = engine::testing::synthetic_bert();
  c.hidden_dropout = c.attention_dropout = 0.1;
  const fs::path a_dir = engine::testing::fresh_dir("sop_a"),
                 b_dir = engine::testing::fresh_dir("sop_b");
  const PretrainOptions o_a = engine::testing::short_pretrain(a_dir),
                        o_b = engine::testing::short_pretrain(b_dir);
  auto source = [] {
    engine::testing::SyntheticSource s;
    s.sentence_order = true;
    return s;
  };
  std::vector<double> full;
  {
    BertForMlmSop m(c, 5);
    engine::testing::SyntheticSource data = source();
    full = pretrain(m, data, o_a, engine::testing::short_pretrain_adam(), 5, false).losses;
  }
  REQUIRE(full.size() == 12);
  REQUIRE(full.back() < full.front());
  {
    BertForMlmSop m(c, 5);
    engine::testing::SyntheticSource data = source();
    REQUIRE_THROWS_WITH(pretrain(m, data, o_b, engine::testing::short_pretrain_adam(), 5, false, "",
                                 [](int64_t step, double) {
                                   if (step == 10) throw engine::Error("simulated crash");
                                 }),
                        Contains("simulated crash"));
  }
  std::vector<double> resumed;
  {
    BertForMlmSop m(c, 77);  // everything comes from the checkpoint
    engine::testing::SyntheticSource data = source();
    PretrainResult r = pretrain(m, data, o_b, engine::testing::short_pretrain_adam(), 5, true);
    REQUIRE(r.start_step == 8);
    resumed = r.losses;
  }
  REQUIRE(resumed.size() == 4);
  for (size_t i = 0; i < 4; ++i) REQUIRE(resumed[i] == full[8 + i]);

  const std::string model_file = (b_dir / "model.safetensors").string();
  REQUIRE(read_checkpoint_kind(model_file) == "bert_mlm_sop");
  std::unique_ptr<PretrainModel> loaded = load_pretrain_model(model_file);
  REQUIRE(std::string(loaded->kind()) == "bert_mlm_sop");
  // A plain masked LM refuses it, and an MLM + SOP model refuses a plain MLM checkpoint.
  BertForMaskedLM mlm(c, 1);
  REQUIRE_THROWS_WITH(load_checkpoint(model_file, mlm), Contains("holds a 'bert_mlm_sop' model"));
  const std::string mlm_file = (a_dir / "plain.safetensors").string();
  save_checkpoint(mlm_file, mlm);
  BertForMlmSop sop(c, 1);
  REQUIRE_THROWS_WITH(load_checkpoint(mlm_file, sop), Contains("holds a 'bert_mlm' model"));
  // Finetuning: the encoder, and the classifier's dense layer from the SOP pooler.
  const auto& trained = dynamic_cast<BertForMlmSop&>(*loaded);
  BertForFinetuning ft(c, HeadKind::classification, 3, 9);
  const int64_t n = load_encoder(model_file, ft);
  CHECK(n == int64_t(ft.bert.named_parameters().size()) + 2);
  CHECK(values(ft.dense->weight) == values(trained.sop_dense.weight));
  CHECK(values(ft.dense->bias) == values(trained.sop_dense.bias));
  CHECK(values(ft.bert.token_embedding) == values(trained.bert.token_embedding));
  // A finetuned checkpoint is not something pretraining continues from: one clear error.
  const std::string ft_file = (a_dir / "finetuned.safetensors").string();
  save_finetuned(ft_file, ft, "glue/MNLI", 16);
  REQUIRE(read_checkpoint_kind(ft_file) == "bert_classification");
  REQUIRE(check_finetuned(ft_file, "glue/MNLI", HeadKind::classification).at(kMaxLenKey) == "16");
  REQUIRE_THROWS_WITH(load_pretrain_model(ft_file),
                      Contains("holds a finetuned 'bert_classification' model"));
  fs::remove_all(a_dir);
  fs::remove_all(b_dir);
}

TEST_CASE("the mlm_sop objective makes the MLM + SOP model", "[sop][config]") {
  const PretrainConfig p = PretrainConfig::read(engine::Config::parse(
      "objective: mlm_sop\nmodel:\n  size: custom\ndata:\n  segment_pairs: true\n", "t.yaml"));
  REQUIRE(std::string(p.make_model(engine::testing::tiny_bert("tupe_r"), 1)->kind()) ==
          "bert_mlm_sop");
}

TEST_CASE("every objective's model kind is a pretraining kind, a finetuned one is not",
          "[sop][config]") {
  for (const char* objective : {"mlm", "mlm_sop", "electra"}) {
    const PretrainConfig p = PretrainConfig::read(
        engine::Config::parse(std::string("objective: ") + objective +
                                  "\nmodel:\n  size: custom\ndata:\n  segment_pairs: true\n",
                              "t.yaml"));
    const std::string kind = p.make_model(engine::testing::tiny_bert("tupe_r"), 1)->kind();
    INFO(objective << " -> " << kind);
    CHECK(is_pretraining_kind(kind));
  }
  for (HeadKind head : {HeadKind::classification, HeadKind::regression, HeadKind::span})
    CHECK_FALSE(is_pretraining_kind(std::string("bert_") + head_kind_name(head)));
  CHECK_FALSE(is_pretraining_kind(""));
}
