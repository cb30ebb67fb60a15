// Finetuning: the heads (names, shapes, losses), loading a pretrained encoder, batch padding, the
// loop on small synthetic tasks a tiny model can learn (classification, regression, span), the
// best evaluation's weights restored, and the sweep summary (medians, best learning rate).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "data/metrics.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "models/checkpoint.h"
#include "models/finetune.h"
#include "test_support.h"

using namespace models;
using Catch::Contains;
using engine::Tensor;
using engine::testing::error_of;
using engine::testing::TempDir;

namespace {

BertConfig tiny(const std::string& preset = "tupe_r") {
  BertConfig c;
  c.vocab_size = 24;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_size = 64;
  c.max_positions = 32;
  c.type_vocab_size = 2;
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
  apply_position_preset(c.position, preset);
  return c;
}

std::map<std::string, engine::Shape> shapes(const engine::Module& m) {
  std::map<std::string, engine::Shape> s;
  for (auto& [n, t] : m.named_parameters()) s[n] = t.shape();
  return s;
}

// [CLS]=1 x... [SEP]=2: label 1 when token 7 occurs, else 0. Lengths vary (padding matters).
std::vector<EncodedExample> marker_task(int64_t n, uint64_t seed) {
  std::vector<EncodedExample> v;
  uint64_t x = seed * 2654435761u + 1;
  auto next = [&]() { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int64_t i = 0; i < n; ++i) {
    EncodedExample e;
    const int64_t len = 4 + int64_t(next() % 8);
    e.ids.push_back(1);
    for (int64_t j = 0; j < len; ++j) e.ids.push_back(int32_t(8 + next() % 12));
    e.label = int64_t(i % 2);
    if (e.label) e.ids[size_t(1 + next() % size_t(len))] = 7;
    e.ids.push_back(2);
    e.types.assign(e.ids.size(), 0);
    // Regression target: +1 with the marker, -1 without.
    e.score = e.label ? 1.0 : -1.0;
    v.push_back(e);
  }
  return v;
}

}  // namespace

TEST_CASE("heads: parameter names and shapes, outputs and losses", "[finetune][heads]") {
  const BertConfig c = tiny();
  BertForFinetuning cls(c, HeadKind::classification, 3, 1);
  auto s = shapes(cls);
  CHECK(s.at("classifier.dense.weight") == engine::Shape{32, 32});
  CHECK(s.at("classifier.out.weight") == engine::Shape{3, 32});
  CHECK(s.at("classifier.out.bias") == engine::Shape{3});
  CHECK(s.count("bert.embeddings.token") == 1);
  CHECK(s.count("qa.out.weight") == 0);
  BertForFinetuning span(c, HeadKind::span, 2, 1);
  CHECK(shapes(span).at("qa.out.weight") == engine::Shape{2, 32});
  CHECK(shapes(span).count("classifier.dense.weight") == 0);

  std::vector<EncodedExample> ex = marker_task(3, 1);
  ex[0].end = ex[0].label = 1;
  ex[1].label = 2, ex[1].end = 3;
  ex[2].label = 0, ex[2].end = 0;
  for (auto& e : ex) e.label = std::min<int64_t>(e.label, 2);
  engine::Generator gen(0);
  data::TaskBatch b = data::make_task_batch(ex, {0, 1, 2}, HeadKind::span, true);
  FinetuneOutput o = span.forward(b.inputs, b.labels, gen);
  REQUIRE(o.logits.shape() == engine::Shape{3, b.inputs.input_ids.size(1), 2});
  // The span loss is the mean of the start and end cross-entropies.
  std::vector<float> lg = o.logits.to_vector<float>();
  const int64_t t = b.inputs.input_ids.size(1);
  double expect = 0;
  const int64_t targets[3][2] = {{1, 1}, {2, 3}, {0, 0}};
  for (int64_t i = 0; i < 3; ++i)
    for (int k = 0; k < 2; ++k) {
      double mx = -1e30, sum = 0;
      for (int64_t j = 0; j < t; ++j) mx = std::max(mx, double(lg[size_t((i * t + j) * 2 + k)]));
      for (int64_t j = 0; j < t; ++j) sum += std::exp(double(lg[size_t((i * t + j) * 2 + k)]) - mx);
      expect += (std::log(sum) + mx - lg[size_t((i * t + targets[i][k]) * 2 + k)]) / 6.0;
    }
  CHECK(o.loss.item() == Approx(expect).epsilon(1e-5));

  BertForFinetuning reg(c, HeadKind::regression, 1, 1);
  data::TaskBatch rb = data::make_task_batch(ex, {0, 1, 2}, HeadKind::regression, true);
  FinetuneOutput ro = reg.forward(rb.inputs, rb.labels, gen);
  REQUIRE(ro.logits.shape() == engine::Shape{3});
  std::vector<float> pred = ro.logits.to_vector<float>();
  double mse = 0;
  for (size_t i = 0; i < 3; ++i) mse += std::pow(double(pred[i]) - ex[i].score, 2) / 3.0;
  CHECK(ro.loss.item() == Approx(mse).epsilon(1e-5));

  CHECK_THAT(error_of([&] { BertForFinetuning bad(c, HeadKind::regression, 2, 1); }),
             Contains("1 output"));
  CHECK_THAT(error_of([&] { BertForFinetuning bad(c, HeadKind::classification, 1, 1); }),
             Contains("at least 2"));
}

TEST_CASE("make_task_batch pads to the longest row with attention 0 and keeps labels",
          "[finetune]") {
  std::vector<EncodedExample> ex(2);
  ex[0].ids = {1, 5, 6, 2};
  ex[0].types = {0, 0, 0, 0};
  ex[0].label = 1;
  ex[1].ids = {1, 9, 2, 10, 11, 2};
  ex[1].types = {0, 0, 0, 1, 1, 1};
  ex[1].label = 0;
  data::TaskBatch b = data::make_task_batch(ex, {1, 0}, HeadKind::classification, true);
  CHECK(b.inputs.input_ids.to_vector<int64_t>() ==
        std::vector<int64_t>{1, 9, 2, 10, 11, 2, 1, 5, 6, 2, 0, 0});
  CHECK(b.inputs.attention_mask.to_vector<int64_t>() ==
        std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
  CHECK(b.inputs.token_type_ids.to_vector<int64_t>() ==
        std::vector<int64_t>{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0});
  CHECK(b.labels.to_vector<int64_t>() == std::vector<int64_t>{0, 1});
  CHECK_FALSE(data::make_task_batch(ex, {0}, HeadKind::classification, false)
                  .inputs.token_type_ids.defined());
  ex[0].label = 2, ex[0].end = 9;  // beyond the row
  CHECK_THAT(error_of([&] { data::make_task_batch(ex, {0}, HeadKind::span, true); }),
             Contains("outside"));
}

TEST_CASE("load_encoder takes bert.* from a pretraining checkpoint and checks the config",
          "[finetune][checkpoint]") {
  TempDir dir;
  BertConfig c = tiny();
  BertForMaskedLM mlm(c, 42);
  save_checkpoint(dir.file("pre.safetensors"), mlm);
  c.hidden_dropout = 0.3;  // dropout may differ
  BertForFinetuning ft(c, HeadKind::classification, 2, 7);
  CHECK(load_encoder(dir.file("pre.safetensors"), ft) ==
        int64_t(mlm.bert.named_parameters().size()));
  auto src = mlm.named_parameters();
  for (auto& [name, t] : ft.named_parameters()) {
    if (name.rfind("bert.", 0) != 0) continue;
    for (auto& [n2, t2] : src)
      if (n2 == name) CHECK(t.to_vector<float>() == t2.to_vector<float>());
  }
  // Another architecture is refused with the key that differs.
  BertConfig other = tiny("bert_a");
  BertForFinetuning wrong(other, HeadKind::classification, 2, 7);
  CHECK_THAT(error_of([&] { load_encoder(dir.file("pre.safetensors"), wrong); }),
             Contains("differs at model.position"));
  CHECK_THAT(error_of([&] { load_encoder(dir.file("missing.safetensors"), ft); }),
             Contains("missing.safetensors"));
}

TEST_CASE("finetuning learns small tasks and keeps the best evaluation's weights",
          "[finetune][loop]") {
  const std::vector<EncodedExample> train = marker_task(96, 1), dev = marker_task(48, 2);
  FinetuneOptions o;
  o.lr = 2e-3;
  o.epochs = 12;
  o.batch_size = 16;
  o.evals_per_epoch = 2;
  o.verbose = false;

  SECTION("classification: accuracy on dev") {
    BertForFinetuning model(tiny(), HeadKind::classification, 2, 3);
    std::vector<double> seen;
    auto eval = [&](BertForFinetuning& m) {
      auto logits = predict(m, dev, 7);
      std::vector<int64_t> pred, gold;
      for (size_t i = 0; i < dev.size(); ++i) {
        pred.push_back(logits[i][1] > logits[i][0]);
        gold.push_back(dev[i].label);
      }
      EvalResult r;
      r.score = data::metrics::accuracy(pred, gold);
      r.metrics = {{"acc", r.score}};
      seen.push_back(r.score);
      return r;
    };
    FinetuneResult r = finetune(model, train, o, eval);
    CHECK(r.steps == 12 * 6);
    CHECK(r.history.size() == 24);
    CHECK(r.history.front().first == 3);
    CHECK(r.history.back().first == 72);
    CHECK(r.best.score >= 0.95);
    CHECK(r.best.score == *std::max_element(seen.begin(), seen.end()));
    // The model holds the best evaluation's weights: evaluating again gives its score.
    CHECK(eval(model).score == r.best.score);
    CHECK(r.best_epoch == Approx(double(r.best_step) / 6.0));
  }
  SECTION("regression: Pearson correlation on dev") {
    BertForFinetuning model(tiny("bert_a"), HeadKind::regression, 1, 3);
    auto eval = [&](BertForFinetuning& m) {
      auto logits = predict(m, dev, 64);
      std::vector<double> pred, gold;
      for (size_t i = 0; i < dev.size(); ++i)
        pred.push_back(logits[i][0]), gold.push_back(dev[i].score);
      EvalResult r;
      r.score = data::metrics::pearson(pred, gold);
      return r;
    };
    CHECK(finetune(model, train, o, eval).best.score > 0.9);
  }
  SECTION("span: start and end at the marker") {
    auto with_span = [](std::vector<EncodedExample> v) {
      for (auto& e : v) {
        e.label = e.end = 0;  // [CLS] when there is no marker
        for (size_t j = 0; j < e.ids.size(); ++j)
          if (e.ids[j] == 7) e.label = e.end = int64_t(j);
      }
      return v;
    };
    const auto strain = with_span(train), sdev = with_span(dev);
    BertForFinetuning model(tiny(), HeadKind::span, 2, 3);
    auto eval = [&](BertForFinetuning& m) {
      auto logits = predict(m, sdev, 5);
      int64_t right = 0;
      for (size_t i = 0; i < sdev.size(); ++i) {
        const size_t len = sdev[i].ids.size();
        REQUIRE(logits[i].size() == 2 * len);
        auto s = std::max_element(logits[i].begin(), logits[i].begin() + int64_t(len)) -
                 logits[i].begin();
        auto e = std::max_element(logits[i].begin() + int64_t(len), logits[i].end()) -
                 logits[i].begin() - int64_t(len);
        right += s == sdev[i].label && e == sdev[i].end;
      }
      EvalResult r;
      r.score = double(right) / double(sdev.size());
      return r;
    };
    CHECK(finetune(model, strain, o, eval).best.score >= 0.9);
  }
}

TEST_CASE("finetuning refuses what cannot run", "[finetune][errors]") {
  BertForFinetuning model(tiny(), HeadKind::classification, 2, 3);
  FinetuneOptions o;
  o.verbose = false;
  auto eval = [](BertForFinetuning&) { return EvalResult{}; };
  CHECK_THAT(error_of([&] { finetune(model, {}, o, eval); }), Contains("no training example"));
  o.epochs = 0;
  CHECK_THAT(error_of([&] { finetune(model, marker_task(4, 1), o, eval); }),
             Contains("at least 1"));
}

TEST_CASE("sweep summary: median over seeds per learning rate, the best learning rate",
          "[finetune][sweep]") {
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 2, 3}) == 2.5);
  CHECK(median({5}) == 5);
  CHECK_THAT(error_of([] { median({}); }), Contains("median"));
  auto run = [](double lr, uint64_t seed, double acc, double f1) {
    SweepRun r;
    r.lr = lr;
    r.seed = seed;
    r.result.best.metrics = {{"acc", acc}, {"f1", f1}};
    r.result.best.score = (acc + f1) / 2;
    return r;
  };
  // lr 1e-5: scores 0.6, 0.7, 0.95 (median 0.7); lr 2e-5: 0.8, 0.8, 0.5 (median 0.8, best).
  std::vector<SweepRun> runs = {run(1e-5, 1, 0.6, 0.6), run(1e-5, 2, 0.7, 0.7),
                                run(1e-5, 3, 0.9, 1.0), run(2e-5, 1, 0.8, 0.8),
                                run(2e-5, 2, 0.7, 0.9), run(2e-5, 3, 0.5, 0.5)};
  SweepSummary s = summarize_sweep(runs);
  REQUIRE(s.rows.size() == 2);
  CHECK(s.rows[0].lr == 1e-5);
  CHECK(s.rows[0].median_score == Approx(0.7));
  CHECK(s.rows[0].median_metrics[0].first == "acc");
  CHECK(s.rows[0].median_metrics[0].second == Approx(0.7));
  CHECK(s.rows[0].median_metrics[1].second == Approx(0.7));
  CHECK(s.rows[1].median_score == Approx(0.8));
  CHECK(s.rows[1].median_metrics[0].second == Approx(0.7));  // acc 0.8, 0.7, 0.5
  CHECK(s.rows[1].median_metrics[1].second == Approx(0.8));  // f1 0.8, 0.9, 0.5
  CHECK(s.best_row == 1);
  CHECK(s.best_run == 3);  // seed 1 of 2e-5 (0.8 = seed 2's 0.8: the first wins)
  CHECK(s.rows[1].scores == std::vector<double>{0.8, 0.8, 0.5});
}
