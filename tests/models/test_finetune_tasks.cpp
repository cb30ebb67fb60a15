// The task runners and the sweep (models/finetune_tasks.h) as a library user calls them: GLUE
// (classification with test predictions, regression) and SQuAD v2.0 files written here in the
// official layouts, encoded with a tiny WordPiece vocabulary; a 1 x 2 sweep's outputs; the dump.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "engine/safetensors.h"
#include "models/checkpoint.h"
#include "models/finetune_tasks.h"
#include "test_support.h"

using namespace models;
using Catch::Contains;
using engine::testing::error_of;
using engine::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kWords = {"the",   "cat",  "dog",   "sat",   "on",
                                         "mat",   "yes",  "no",    "lives", "in",
                                         "paris", "rome", "where", "?",     "."};

struct Fixture {
  TempDir dir;
  std::unique_ptr<data::Tokenizer> tok;
  BertConfig config;
  std::string checkpoint;

  Fixture() {
    std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
    for (const auto& w : kWords) vocab += w + "\n";
    tok = data::load_wordpiece(dir.write("vocab.txt", vocab));
    config.vocab_size = tok->vocab_size();
    config.hidden_size = 16;
    config.num_layers = 1;
    config.num_heads = 2;
    config.ffn_size = 32;
    config.max_positions = 48;
    config.hidden_dropout = config.attention_dropout = 0.0;
    apply_position_preset(config.position, "tupe_r");
    BertForMaskedLM init(config, 3);
    checkpoint = dir / "init.safetensors";
    save_checkpoint(checkpoint, init);
    // RTE: entailment iff sentence2 holds "yes".
    std::string train = "index\tsentence1\tsentence2\tlabel\n", dev = train,
                test = "index\tsentence1\tsentence2\n";
    for (int i = 0; i < 24; ++i) {
      const std::string row = std::to_string(i) + "\tthe cat sat on the mat\tthe dog " +
                              (i % 2 ? "no" : "yes") + "\t" +
                              (i % 2 ? "not_entailment" : "entailment") + "\n";
      (i < 16 ? train : dev) += row;
      if (i < 5) test += std::to_string(i) + "\tthe cat\tthe dog yes\n";
    }
    dir.write("glue/RTE/train.tsv", train);
    dir.write("glue/RTE/dev.tsv", dev);
    dir.write("glue/RTE/test.tsv", test);
    // STS-B: a regression task with its own layout.
    std::string sts =
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n";
    for (int i = 0; i < 10; ++i)
      sts += std::to_string(i) + "\tmain\tf\t2012\t" + std::to_string(i) +
             "\tnone\tnone\tthe cat\tthe dog\t" + std::to_string(i % 5) + ".0\n";
    dir.write("glue/STS-B/train.tsv", sts);
    dir.write("glue/STS-B/dev.tsv", sts);
    // SQuAD v2.0: every third question has no answer.
    nlohmann::json paragraphs = nlohmann::json::array();
    for (int i = 0; i < 9; ++i) {
      const bool impossible = i % 3 == 2;
      const std::string city = i % 2 ? "rome" : "paris";
      const std::string ctx =
          impossible ? "the cat sat on the mat ." : "the cat lives in " + city + " .";
      nlohmann::json qa = {{"id", "q" + std::to_string(i)},
                           {"question", "where lives the cat ?"},
                           {"is_impossible", impossible},
                           {"answers", nlohmann::json::array()}};
      if (!impossible) qa["answers"].push_back({{"text", city}, {"answer_start", ctx.find(city)}});
      paragraphs.push_back({{"context", ctx}, {"qas", {qa}}});
    }
    const std::string squad =
        nlohmann::json{{"version", "v2.0"},
                       {"data", {{{"title", "t"}, {"paragraphs", paragraphs}}}}}
            .dump();
    dir.write("squad/train-v2.0.json", squad);
    dir.write("squad/dev-v2.0.json", squad);
  }
  std::string read(const std::string& rel) const {
    std::ifstream f(dir / rel);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

int count_lines(const std::string& text) { return int(std::count(text.begin(), text.end(), '\n')); }

}  // namespace

TEST_CASE("GLUE task runner: encoding, evaluation and prediction files", "[finetune][tasks]") {
  Fixture f;
  TaskDataOptions o;
  o.max_len = 24;
  o.verbose = false;
  auto rte = make_glue_task(data::glue_task("RTE"), f.dir / "glue", *f.tok, o);
  CHECK(rte->name() == "glue/RTE");
  CHECK(rte->head() == HeadKind::classification);
  CHECK(rte->num_labels() == 2);
  CHECK_FALSE(rte->is_squad());
  REQUIRE(rte->train().size() == 16);
  // [CLS] a [SEP] b [SEP] with segment ids, as data::encode_pair makes them.
  const data::EncodedPair p =
      data::encode_pair(*f.tok, "the cat sat on the mat", "the dog yes", 24);
  CHECK(std::vector<int32_t>(rte->train()[0].ids) == p.ids);
  CHECK(rte->train()[0].label == 0);  // entailment is label 0
  CHECK(rte->train()[1].label == 1);

  // The task's folder works as well as the GLUE folder; max_train / max_eval cut.
  o.max_train = 5;
  CHECK(make_glue_task(data::glue_task("RTE"), f.dir / "glue/RTE", *f.tok, o)->train().size() == 5);

  BertForFinetuning model(f.config, rte->head(), rte->num_labels(), 1);
  load_encoder(f.checkpoint, model);
  const EvalResult r = rte->evaluate(model, 4);
  REQUIRE(r.metrics.size() == 1);
  CHECK(r.metrics[0].first == "acc");
  CHECK(r.score >= 0.0);
  CHECK(r.score <= 1.0);
  const fs::path out = f.dir.path / "pred";
  fs::create_directories(out);
  rte->write_predictions(model, 4, out, true);
  CHECK(count_lines(f.read("pred/dev_predictions.tsv")) == 1 + 8);
  const std::string test = f.read("pred/RTE.tsv");
  CHECK(test.rfind("index\tprediction\n", 0) == 0);
  CHECK(count_lines(test) == 1 + 5);

  auto sts = make_glue_task(data::glue_task("STS-B"), f.dir / "glue", *f.tok, TaskDataOptions{});
  CHECK(sts->head() == HeadKind::regression);
  CHECK(sts->num_labels() == 1);
  CHECK(sts->train()[3].score == 3.0);

  CHECK_THAT(error_of([&] {
               make_glue_task(data::glue_task("MRPC"), f.dir / "glue", *f.tok, TaskDataOptions{});
             }),
             Contains("MRPC/train.tsv: no such file"));
  CHECK_THAT(error_of([&] {
               make_glue_task(data::glue_task("AX"), f.dir / "glue", *f.tok, TaskDataOptions{});
             }),
             Contains("has no training data"));
}

TEST_CASE("SQuAD task runner: windows, v2.0 metrics and prediction files", "[finetune][tasks]") {
  Fixture f;
  data::SquadFeatureOptions fo;
  fo.max_len = 32;
  fo.doc_stride = 8;
  fo.max_query_len = 8;
  data::SquadPredictOptions po;
  po.version_2 = true;
  TaskDataOptions o;
  o.verbose = false;
  auto squad = make_squad_task(true, f.dir / "squad", *f.tok, fo, po, o);
  CHECK(squad->name() == "squad/v2.0");
  CHECK(squad->is_squad());
  CHECK(squad->head() == HeadKind::span);
  REQUIRE(squad->train().size() == 9);  // one window per (short) question
  CHECK(squad->train()[2].label == 0);  // no answer: the span is [CLS]
  CHECK(squad->train()[2].end == 0);
  BertForFinetuning model(f.config, squad->head(), 2, 1);
  load_encoder(f.checkpoint, model);
  const EvalResult r = squad->evaluate(model, 4);
  std::vector<std::string> names;
  for (auto& [n, v] : r.metrics) names.push_back(n);
  CHECK(names == std::vector<std::string>{"exact", "f1", "has_ans_f1", "no_ans_exact", "best_f1",
                                          "best_f1_thresh"});
  const fs::path out = f.dir.path / "squad_pred";
  fs::create_directories(out);
  squad->write_predictions(model, 4, out, true);
  const auto preds = nlohmann::json::parse(f.read("squad_pred/predictions.json"));
  CHECK(preds.size() == 9);
  CHECK(nlohmann::json::parse(f.read("squad_pred/null_odds.json")).size() == 9);
  CHECK(nlohmann::json::parse(f.read("squad_pred/nbest_predictions.json")).contains("q0"));
  // v1.1 refuses v2.0 data.
  f.dir.write("squad/train-v1.1.json", f.read("squad/train-v2.0.json"));
  f.dir.write("squad/dev-v1.1.json", f.read("squad/dev-v2.0.json"));
  CHECK_THAT(error_of([&] { make_squad_task(false, f.dir / "squad", *f.tok, fo, po, o); }),
             Contains("that is SQuAD v2.0 data"));
}

TEST_CASE("run_sweep writes every run, results.json, results.md and the submission",
          "[finetune][tasks]") {
  Fixture f;
  TaskDataOptions o;
  o.max_len = 24;
  o.verbose = false;
  auto rte = make_glue_task(data::glue_task("RTE"), f.dir / "glue", *f.tok, o);
  SweepOptions s;
  s.lrs = {1e-3};
  s.seeds = {1, 2};
  s.loop.epochs = 1;
  s.loop.batch_size = 8;
  s.loop.verbose = false;
  s.eval_batch_size = 8;
  s.out_dir = f.dir / "sweep";
  s.max_len = 24;
  const SweepReport report = run_sweep(*rte, f.config, f.checkpoint, s);
  REQUIRE(report.runs.size() == 2);
  CHECK(report.runs[0].seed == 1);
  CHECK(report.runs[1].seed == 2);
  CHECK(report.runs[0].result.steps == 2);  // 16 examples / 8
  CHECK(report.summary.rows.size() == 1);
  CHECK(report.table.find("| 0.001 **(best)** |") != std::string::npos);
  const auto results = nlohmann::json::parse(f.read("sweep/results.json"));
  CHECK(results["task"] == "glue/RTE");
  CHECK(results["runs"].size() == 2);
  CHECK(results["protocol"]["batch_size"] == 8);
  CHECK(results["best_lr"] == 1e-3);
  CHECK(f.read("sweep/results.md").rfind("# glue/RTE\n", 0) == 0);
  CHECK(fs::exists(f.dir.path / "sweep/runs/lr0.001_seed1/metrics.jsonl"));
  CHECK(fs::exists(f.dir.path / "sweep/runs/lr0.001_seed2/dev_predictions.tsv"));
  CHECK(count_lines(f.read("sweep/submission/RTE.tsv")) == 1 + 5);
  s.lrs = {};
  CHECK_THAT(error_of([&] { run_sweep(*rte, f.config, f.checkpoint, s); }),
             Contains("at least one learning rate"));
}

TEST_CASE("dump_first_batch writes the batch, logits, loss and every gradient",
          "[finetune][tasks]") {
  Fixture f;
  auto rte = make_glue_task(data::glue_task("RTE"), f.dir / "glue", *f.tok, TaskDataOptions{});
  BertForFinetuning model(f.config, rte->head(), 2, 1);
  load_encoder(f.checkpoint, model);
  dump_first_batch(*rte, model, 3, f.dir / "dump.safetensors");
  const engine::SafetensorsContents c = engine::load_safetensors(f.dir / "dump.safetensors");
  std::map<std::string, engine::Tensor> t(c.tensors.begin(), c.tensors.end());
  CHECK(t.at("input_ids").size(0) == 3);
  CHECK(t.at("logits").shape() == engine::Shape{3, 2});
  CHECK(t.at("loss").numel() == 1);
  for (auto& [name, p] : model.named_parameters()) CHECK(t.count("grad." + name) == 1);
  CHECK(c.metadata.at("engine.head") == "classification");
}
