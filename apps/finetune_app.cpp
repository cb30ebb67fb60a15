// finetune_app: finetunes a pretrained encoder on a GLUE task or SQuAD with the papers' protocol
// and reports the official metrics; a learning-rate x seed sweep gives, per learning rate, the
// median over seeds, as a markdown table and results.json. The loop is models::finetune; the
// task readers and metrics are data/glue.h, data/squad.h, data/squad_features.h.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "data/glue.h"
#include "data/metrics.h"
#include "data/squad.h"
#include "data/squad_features.h"
#include "data/tokenizer.h"
#include "engine/autograd.h"
#include "engine/comm.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/safetensors.h"
#include "models/checkpoint.h"
#include "models/finetune.h"
#include "models/heads.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kUsage = R"(usage: finetune_app TASK --checkpoint CKPT --data-dir DIR [options]

Finetunes the encoder of a pretraining checkpoint on one task and reports the official dev
metrics. TASK is glue/<name> (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI) or squad/v1.1,
squad/v2.0.

Data:
  --checkpoint CKPT    a checkpoint of pretrain_app (model.safetensors or a training checkpoint;
                       the MLM head and optimizer state are ignored)
  --data-dir DIR       GLUE: the GLUE download (DIR/<task>/train.tsv, ...) or the task's folder;
                       SQuAD: the folder of train-v1.1.json and dev-v1.1.json (v2.0 likewise)
  --tokenizer TOK      the pretraining vocabulary (.model or vocab.txt); default: the one the
                       checkpoint records (pretrain_app writes it into its checkpoints)
  --cased              WordPiece: keep case (default: lower-case, BERT-uncased)
  --out DIR            where results, logs and predictions go (default runs/finetune/<task>)

Protocol (defaults: the TUPE / BERT papers'):
  --lr LIST            peak learning rates, comma-separated (default 2e-5,3e-5,4e-5,5e-5)
  --seeds N            seeds 1..N per learning rate (default 5); --seed S runs seed S only
  --epochs N           default 10; 5 for MNLI, QNLI, QQP; 2 for SQuAD
  --batch-size N       global batch (split over MPI ranks), default 32
  --max-len N          default 128 (GLUE), 384 (SQuAD)
  --doc-stride N       SQuAD window stride, default 128; --max-query-len N (default 64)
  --warmup-ratio R     linear warmup over this share of the steps, then linear decay (0.06)
  --weight-decay W     AdamW (betas 0.9, 0.98, eps 1e-6), not on biases and LayerNorms (0.01)
  --clip-norm C        gradient clipping (default 1.0; 0 = off)
  --dropout P          encoder and head dropout (default: the checkpoint's hidden/attention)
  --evals-per-epoch N  dev evaluations per epoch (default 1); the best one is kept
  --log-every N        training-loss lines (stdout, metrics.jsonl) every N steps (default 50)
  --n-best N           SQuAD candidates per question (20); --max-answer-len N (30 tokens)
  --null-threshold X   SQuAD v2.0: answer "" when null score - best span > X (default 0)

Smaller runs:
  --max-train N        use the first N training examples
  --max-eval N         use the first N examples of each dev split
  --max-steps N        stop each run after N steps (the schedule still spans the epochs)
  --no-test            do not write test-set predictions

Outputs in --out: results.md (the table, also printed) and results.json (every run, the median
over seeds per learning rate, the best learning rate); runs/lr<lr>_seed<s>/{metrics.jsonl,
dev predictions, test predictions}; submission/ with the GLUE test predictions of the best run
of the best learning rate (GLUE's file names; AX.tsv from an MNLI model); --save-model writes
each run's best weights (runs/.../model.safetensors).

Single-batch check (for the PyTorch reference, tools/reference/check_heads.py):
  --dump FILE          with dropout off, the first --batch-size training examples in file order:
                       write inputs, labels, logits, loss, every parameter and its gradient, exit

Data parallel: `mpirun -np N finetune_app ...`; the batch is shared by the ranks, rank 0 writes.

Exit status: 0 on success, 1 on an error (one message naming the file, line or key), 2 on a bad
command line.
)";

[[noreturn]] void usage_error(const std::string& msg) { cli::usage_error("finetune_app", msg); }

struct Args {
  std::string task, checkpoint, data_dir, tokenizer, out, dump;
  std::vector<double> lrs = {2e-5, 3e-5, 4e-5, 5e-5};
  std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  int64_t epochs = -1, batch_size = 32, max_len = -1, doc_stride = 128, max_query_len = 64;
  double warmup_ratio = 0.06, weight_decay = 0.01, clip_norm = 1.0, dropout = -1, null_threshold = 0;
  int64_t evals_per_epoch = 1, log_every = 50, n_best = 20, max_answer_len = 30;
  int64_t max_train = 0, max_eval = 0, max_steps = 0;
  bool cased = false, no_test = false, save_model = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  cli::ArgParser p("finetune_app", kUsage, argc, argv);
  while (p.next()) {
    const std::string& arg = p.arg();
    if (!p.is_flag()) {
      if (!a.task.empty()) usage_error("one TASK only (got '" + a.task + "' and '" + arg + "')");
      a.task = arg;
    } else if (arg == "--checkpoint") a.checkpoint = p.value();
    else if (arg == "--data-dir") a.data_dir = p.value();
    else if (arg == "--tokenizer") a.tokenizer = p.value();
    else if (arg == "--out") a.out = p.value();
    else if (arg == "--dump") a.dump = p.value();
    else if (arg == "--cased") a.cased = true;
    else if (arg == "--no-test") a.no_test = true;
    else if (arg == "--save-model") a.save_model = true;
    else if (arg == "--lr") {
      const std::string v = p.value();
      a.lrs.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) a.lrs.push_back(p.to_double("--lr", item, 1e-12, 1.0));
      if (a.lrs.empty()) usage_error("--lr expects a comma-separated list of learning rates, got '" + v + "'");
    } else if (arg == "--seeds") {
      const int64_t n = p.int_value(1);
      a.seeds.clear();
      for (int64_t s = 1; s <= n; ++s) a.seeds.push_back(uint64_t(s));
    } else if (arg == "--seed") {
      a.seeds = {uint64_t(p.int_value(0))};
    } else if (arg == "--epochs") a.epochs = p.int_value(1);
    else if (arg == "--batch-size") a.batch_size = p.int_value(1);
    else if (arg == "--max-len") a.max_len = p.int_value(3);
    else if (arg == "--doc-stride") a.doc_stride = p.int_value(1);
    else if (arg == "--max-query-len") a.max_query_len = p.int_value(1);
    else if (arg == "--warmup-ratio") a.warmup_ratio = p.double_value(0, 1);
    else if (arg == "--weight-decay") a.weight_decay = p.double_value(0, 1);
    else if (arg == "--clip-norm") a.clip_norm = p.double_value(0, 1e9);
    else if (arg == "--dropout") a.dropout = p.double_value(0, 0.99);
    else if (arg == "--null-threshold") a.null_threshold = p.double_value(-1e9, 1e9);
    else if (arg == "--evals-per-epoch") a.evals_per_epoch = p.int_value(1);
    else if (arg == "--log-every") a.log_every = p.int_value(1);
    else if (arg == "--n-best") a.n_best = p.int_value(1);
    else if (arg == "--max-answer-len") a.max_answer_len = p.int_value(1);
    else if (arg == "--max-train") a.max_train = p.int_value(1);
    else if (arg == "--max-eval") a.max_eval = p.int_value(1);
    else if (arg == "--max-steps") a.max_steps = p.int_value(1);
    else usage_error("unknown argument '" + arg + "'");
  }
  if (a.task.empty()) usage_error("TASK is required (glue/RTE, glue/MNLI, squad/v1.1, ...)");
  if (a.checkpoint.empty()) usage_error("--checkpoint is required");
  if (a.data_dir.empty()) usage_error("--data-dir is required");
  return a;
}

// ---- tasks ---------------------------------------------------------------------------------

// A task prepared for the loop: its head, training inputs, and how to evaluate and predict.
class Task {
 public:
  virtual ~Task() = default;
  virtual models::HeadKind head() const = 0;
  virtual int64_t num_labels() const = 0;
  virtual const std::vector<models::EncodedExample>& train() const = 0;
  virtual models::EvalResult evaluate(models::BertForFinetuning& model, int64_t batch_size) = 0;
  // After a run: dev predictions and (unless disabled) test predictions into `dir` (rank 0 writes).
  virtual void write_predictions(models::BertForFinetuning& model, int64_t batch_size, const fs::path& dir,
                                 bool test, bool root) = 0;
  virtual std::string describe() const = 0;
};

std::vector<int64_t> argmax_rows(const std::vector<std::vector<float>>& logits) {
  std::vector<int64_t> out;
  for (const auto& row : logits) out.push_back(std::max_element(row.begin(), row.end()) - row.begin());
  return out;
}

class GlueTaskRunner : public Task {
 public:
  GlueTaskRunner(const data::GlueTask& task, const std::string& dir_arg, const data::Tokenizer& tok,
                 int64_t max_len, int64_t max_train, int64_t max_eval, bool root)
      : task_(task), tok_(tok), max_len_(max_len) {
    ENGINE_CHECK(!task.test_only, "[finetune_app] ", task.name, " has no training data: ",
                 "its predictions come from an MNLI model (glue/MNLI writes AX.tsv)");
    // DIR is the GLUE download or the task's own folder.
    fs::path dir(dir_arg);
    if (!dir.has_filename()) dir = dir.parent_path();  // "glue/RTE/"
    if (fs::exists(dir / "train.tsv") && !fs::exists(data::glue_split_path(task, dir.string(), "train"))) {
      task_dir_ = dir.string();
      glue_dir_ = fs::absolute(dir).parent_path().string();
    } else {
      glue_dir_ = dir.string();
      task_dir_ = (dir / task.dir).string();
    }
    const std::string train_path = path("train");
    ENGINE_CHECK(fs::exists(train_path), "[finetune_app] ", train_path, ": no such file (--data-dir ", dir_arg,
                 " should be the GLUE folder holding ", task.dir, "/train.tsv, or that task folder)");
    data::GlueReadStats stats;
    std::vector<data::GlueExample> train = data::read_glue(task, train_path, false, &stats);
    if (root && stats.skipped_rows > 0)
      std::printf("%s: skipped %lld malformed rows (first at line %d), as HF's processor does\n", train_path.c_str(),
                  (long long)stats.skipped_rows, stats.first_skipped_line);
    if (max_train > 0 && int64_t(train.size()) > max_train) train.resize(size_t(max_train));
    int64_t truncated = 0;
    train_ = encode(train, &truncated);
    for (const std::string& split : task.dev_splits) {
      std::vector<data::GlueExample> dev = data::read_glue(task, path(split), false);
      if (max_eval > 0 && int64_t(dev.size()) > max_eval) dev.resize(size_t(max_eval));
      dev_.push_back({split, dev, encode(dev, &truncated)});
    }
    if (root)
      std::printf("%s: %zu train examples, dev %s; %lld inputs truncated to %lld tokens\n", task.name.c_str(),
                  train_.size(), dev_summary().c_str(), (long long)truncated, (long long)max_len);
  }

  models::HeadKind head() const override {
    return task_.regression ? models::HeadKind::regression : models::HeadKind::classification;
  }
  int64_t num_labels() const override { return task_.regression ? 1 : task_.num_labels; }
  const std::vector<models::EncodedExample>& train() const override { return train_; }
  std::string describe() const override { return "glue/" + task_.name; }

  models::EvalResult evaluate(models::BertForFinetuning& model, int64_t batch_size) override {
    models::EvalResult r;
    for (size_t s = 0; s < dev_.size(); ++s) {
      auto logits = models::predict(model, dev_[s].encoded, batch_size);
      std::vector<int64_t> labels;
      std::vector<double> scores;
      decode(logits, &labels, &scores);
      auto m = data::glue_metrics(task_, dev_[s].examples, labels, scores);
      // MNLI: the matched split ranks runs; the mismatched one is reported as *_mm.
      for (auto& [name, v] : m) r.metrics.emplace_back(s == 0 ? name : name + "_mm", v);
      if (s == 0) {
        double sum = 0;
        for (auto& [name, v] : m) sum += v;
        r.score = sum / double(m.size());  // GLUE's convention: the mean of the task's metrics
      }
    }
    return r;
  }

  void write_predictions(models::BertForFinetuning& model, int64_t batch_size, const fs::path& dir, bool test,
                         bool root) override {
    for (auto& d : dev_) {
      auto logits = models::predict(model, d.encoded, batch_size);
      if (!root) continue;
      std::vector<int64_t> labels;
      std::vector<double> scores;
      decode(logits, &labels, &scores);
      std::ostringstream f;
      f << "line\tprediction\tgold\n";
      for (size_t i = 0; i < d.examples.size(); ++i) {
        const auto& e = d.examples[i];
        if (task_.regression) f << e.line << "\t" << scores[i] << "\t" << e.score << "\n";
        else f << e.line << "\t" << task_.label_names[size_t(labels[i])] << "\t" << task_.label_names[size_t(e.label)] << "\n";
      }
      engine::write_file_atomic((dir / (d.split + "_predictions.tsv")).string(), f.str(), "finetune_app");
    }
    if (!test) return;
    std::vector<std::pair<const data::GlueTask*, std::string>> tests;
    for (const std::string& split : task_.test_splits) tests.emplace_back(&task_, split);
    if (task_.name == "MNLI") tests.emplace_back(&data::glue_task("AX"), "diagnostic");
    for (auto& [t, split] : tests) {
      const std::string file = data::glue_split_path(*t, glue_dir_, split);
      const std::string p = t == &task_ ? path(split) : file;
      if (!fs::exists(p)) {
        if (root) std::printf("  (no %s: its predictions are not written)\n", p.c_str());
        continue;
      }
      std::vector<data::GlueExample> ex = data::read_glue(*t, p, true);
      int64_t truncated = 0;
      auto logits = models::predict(model, encode(ex, &truncated), batch_size);
      std::vector<int64_t> labels;
      std::vector<double> scores;
      decode(logits, &labels, &scores);
      if (root) data::write_glue_predictions(*t, ex, labels, scores, (dir / data::glue_submission_name(*t, split)).string());
    }
  }

 private:
  struct Dev {
    std::string split;
    std::vector<data::GlueExample> examples;
    std::vector<models::EncodedExample> encoded;
  };
  std::string path(const std::string& split) const { return (fs::path(task_dir_) / (split + ".tsv")).string(); }
  std::string dev_summary() const {
    std::string s;
    for (auto& d : dev_) s += (s.empty() ? "" : ", ") + d.split + " " + std::to_string(d.examples.size());
    return s;
  }
  std::vector<models::EncodedExample> encode(const std::vector<data::GlueExample>& ex, int64_t* truncated) const {
    std::vector<models::EncodedExample> out;
    out.reserve(ex.size());
    for (const auto& e : ex) {
      data::EncodedPair p = data::encode_pair(tok_, e.text_a, e.text_b, max_len_);
      *truncated += p.truncated;
      models::EncodedExample m;
      m.ids = std::move(p.ids);
      m.types = std::move(p.types);
      m.label = e.label;
      m.score = e.score;
      out.push_back(std::move(m));
    }
    return out;
  }
  void decode(const std::vector<std::vector<float>>& logits, std::vector<int64_t>* labels,
              std::vector<double>* scores) const {
    if (task_.regression)
      for (auto& row : logits) scores->push_back(row.at(0));
    else
      *labels = argmax_rows(logits);
  }

  const data::GlueTask& task_;
  const data::Tokenizer& tok_;
  int64_t max_len_;
  std::string glue_dir_, task_dir_;
  std::vector<models::EncodedExample> train_;
  std::vector<Dev> dev_;
};

class SquadTaskRunner : public Task {
 public:
  SquadTaskRunner(bool v2, const std::string& dir, const data::Tokenizer& tok, const data::SquadFeatureOptions& fo,
                  const data::SquadPredictOptions& po, int64_t max_train, int64_t max_eval, bool root)
      : v2_(v2), predict_options_(po) {
    const std::string version = v2 ? "v2.0" : "v1.1";
    const std::string train_path = (fs::path(dir) / ("train-" + version + ".json")).string();
    const std::string dev_path = (fs::path(dir) / ("dev-" + version + ".json")).string();
    for (const auto& p : {train_path, dev_path})
      ENGINE_CHECK(fs::exists(p), "[finetune_app] ", p, ": no such file (--data-dir should hold the official train-",
                   version, ".json and dev-", version, ".json)");
    std::vector<data::SquadExample> train = data::read_squad(train_path);
    if (max_train > 0 && int64_t(train.size()) > max_train) train.resize(size_t(max_train));
    dev_ = data::read_squad(dev_path);
    if (max_eval > 0 && int64_t(dev_.size()) > max_eval) dev_.resize(size_t(max_eval));
    if (!v2)
      for (const auto* set : {&train, &dev_})
        for (const auto& e : *set)
          ENGINE_CHECK(!e.is_impossible, "[finetune_app] question ", e.id,
                       " is marked impossible: that is SQuAD v2.0 data, run squad/v2.0");
    for (const auto& f : data::make_squad_features(train, tok, fo, true)) train_.push_back(to_encoded(f));
    dev_features_ = data::make_squad_features(dev_, tok, fo, false);
    for (const auto& f : dev_features_) dev_encoded_.push_back(to_encoded(f));
    if (root)
      std::printf("squad/%s: %zu train questions -> %zu windows, %zu dev questions -> %zu windows\n", version.c_str(),
                  train.size(), train_.size(), dev_.size(), dev_features_.size());
  }
  models::HeadKind head() const override { return models::HeadKind::span; }
  int64_t num_labels() const override { return 2; }
  const std::vector<models::EncodedExample>& train() const override { return train_; }
  std::string describe() const override { return v2_ ? "squad/v2.0" : "squad/v1.1"; }

  models::EvalResult evaluate(models::BertForFinetuning& model, int64_t batch_size) override {
    const std::vector<data::SquadAnswer> answers = answer(model, batch_size);
    std::map<std::string, std::string> preds;
    std::map<std::string, double> na;
    for (const auto& a : answers) {
      preds[a.id] = a.text;
      na[a.id] = a.null_score_diff;
    }
    const data::SquadScores s =
        data::evaluate_squad(dev_, preds, v2_ ? &na : nullptr, predict_options_.null_threshold);
    models::EvalResult r;
    r.metrics = {{"exact", s.exact}, {"f1", s.f1}};
    if (v2_) {
      r.metrics.emplace_back("has_ans_f1", s.has_ans_f1);
      r.metrics.emplace_back("no_ans_exact", s.no_ans_exact);
      r.metrics.emplace_back("best_f1", s.best_f1);
      r.metrics.emplace_back("best_f1_thresh", s.best_f1_thresh);
    }
    r.score = s.f1;
    return r;
  }

  void write_predictions(models::BertForFinetuning& model, int64_t batch_size, const fs::path& dir, bool /*test*/,
                         bool root) override {
    const std::vector<data::SquadAnswer> answers = answer(model, batch_size);
    if (!root) return;
    json preds = json::object(), na = json::object(), nbest = json::object();
    for (const auto& a : answers) {
      preds[a.id] = a.text;
      na[a.id] = a.null_score_diff;
      json list = json::array();
      for (const auto& c : a.n_best)
        list.push_back({{"text", c.text}, {"probability", c.probability}, {"start_logit", c.start_logit},
                        {"end_logit", c.end_logit}});
      nbest[a.id] = list;
    }
    auto write = [&](const char* name, const json& j) {
      engine::write_file_atomic((dir / name).string(), j.dump(1) + "\n", "finetune_app");
    };
    write("predictions.json", preds);
    write("nbest_predictions.json", nbest);
    if (v2_) write("null_odds.json", na);
  }

 private:
  static models::EncodedExample to_encoded(const data::SquadFeature& f) {
    models::EncodedExample e;
    e.ids = f.input_ids;
    e.types = f.token_types;
    e.label = f.start_position;
    e.end = f.end_position;
    return e;
  }
  std::vector<data::SquadAnswer> answer(models::BertForFinetuning& model, int64_t batch_size) {
    const auto logits = models::predict(model, dev_encoded_, batch_size);
    std::vector<std::vector<float>> start, end;
    for (size_t i = 0; i < logits.size(); ++i) {
      const size_t len = dev_encoded_[i].ids.size();
      start.emplace_back(logits[i].begin(), logits[i].begin() + int64_t(len));
      end.emplace_back(logits[i].begin() + int64_t(len), logits[i].end());
    }
    return data::squad_predictions(dev_, dev_features_, start, end, predict_options_);
  }

  bool v2_;
  data::SquadPredictOptions predict_options_;
  std::vector<data::SquadExample> dev_;
  std::vector<data::SquadFeature> dev_features_;
  std::vector<models::EncodedExample> train_, dev_encoded_;
};

// ---- reporting -----------------------------------------------------------------------------

std::string lr_str(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", lr);
  return buf;
}

json eval_json(const models::EvalResult& r) {
  json m = json::object();
  for (auto& [name, v] : r.metrics) m[name] = v;
  m["score"] = r.score;
  return m;
}

// The sweep table: one row per learning rate, each metric's median over seeds (percent), the
// score of every seed, the best learning rate marked.
std::string sweep_markdown(const std::string& task, const std::vector<models::SweepRun>& runs,
                           const models::SweepSummary& s) {
  std::ostringstream md;
  const bool squad = task.rfind("squad", 0) == 0;
  const size_t seeds = s.rows.front().scores.size();
  md << "| lr |";
  for (auto& [name, v] : s.rows.front().median_metrics) md << " " << name << " (median) |";
  md << " score per seed |\n|---:|";
  for (size_t i = 0; i < s.rows.front().median_metrics.size(); ++i) md << "---:|";
  md << "---|\n";
  char buf[64];
  for (size_t r = 0; r < s.rows.size(); ++r) {
    const auto& row = s.rows[r];
    md << "| " << lr_str(row.lr) << (r == s.best_row ? " **(best)**" : "") << " |";
    for (auto& [name, v] : row.median_metrics) {
      // GLUE metrics are fractions, shown as percentages; SQuAD's are percentages already.
      std::snprintf(buf, sizeof buf, " %.2f |", squad ? v : 100.0 * v);
      md << buf;
    }
    md << " ";
    for (size_t i = 0; i < row.scores.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s%.2f", i ? ", " : "", squad ? row.scores[i] : 100.0 * row.scores[i]);
      md << buf;
    }
    md << " |\n";
  }
  const auto& best = runs[s.best_run];
  md << "\n" << task << ": best learning rate " << lr_str(s.rows[s.best_row].lr) << " (median over " << seeds
     << " seed" << (seeds == 1 ? "" : "s") << "); submission from its best run, seed " << best.seed << " (step "
     << best.result.best_step << ", epoch " << best.result.best_epoch << ").\n";
  return md.str();
}

// ---- the dump mode (the PyTorch reference check) --------------------------------------------

int dump_batch(const Args& args, Task& task, models::BertForFinetuning& model) {
  model.train(false);
  const auto& train = task.train();
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < std::min<int64_t>(args.batch_size, int64_t(train.size())); ++i) rows.push_back(i);
  const data::TaskBatch batch = data::make_task_batch(train, rows, model.kind(), model.config().type_vocab_size > 0);
  engine::Generator gen(0);
  models::FinetuneOutput out = model.forward(batch.inputs, batch.labels, gen);
  out.loss.backward();
  engine::NamedTensors dump = {{"input_ids", batch.inputs.input_ids},
                               {"attention_mask", batch.inputs.attention_mask},
                               {"labels", batch.labels},
                               {"logits", out.logits.detach()},
                               {"loss", out.loss.detach()}};
  if (batch.inputs.token_type_ids.defined()) dump.emplace_back("token_type_ids", batch.inputs.token_type_ids);
  for (auto& [name, t] : model.named_parameters()) {
    dump.emplace_back("param." + name, t.detach());
    dump.emplace_back("grad." + name, t.grad());
  }
  engine::save_safetensors(args.dump, dump, {{"engine.model_config", model.config().to_json()},
                                             {"engine.head", models::head_kind_name(model.kind())}});
  std::printf("dump: %s head, batch %lld x %lld, loss %.9g, written to %s\n", models::head_kind_name(model.kind()),
              (long long)batch.inputs.input_ids.size(0), (long long)batch.inputs.input_ids.size(1), out.loss.item(),
              args.dump.c_str());
  return 0;
}

// ---- main ----------------------------------------------------------------------------------

int run(Args args) {
  engine::Communicator& comm = engine::world();
  const bool root = comm.is_root();
  std::string task_name = args.task;
  std::transform(task_name.begin(), task_name.end(), task_name.begin(), ::tolower);
  const bool squad = task_name.rfind("squad/", 0) == 0;
  if (!squad && task_name.rfind("glue/", 0) != 0)
    usage_error("TASK must be glue/<name> or squad/v1.1 or squad/v2.0, got '" + args.task + "'");
  if (squad && task_name != "squad/v1.1" && task_name != "squad/v2.0")
    usage_error("SQuAD versions are squad/v1.1 and squad/v2.0, got '" + args.task + "'");
  const data::GlueTask* glue = squad ? nullptr : &data::glue_task(args.task.substr(5));
  const std::string label = squad ? task_name : "glue/" + glue->name;

  // The papers' defaults per task.
  if (args.epochs < 0)
    args.epochs = squad ? 2 : (glue->name == "MNLI" || glue->name == "QNLI" || glue->name == "QQP") ? 5 : 10;
  if (args.max_len < 0) args.max_len = squad ? 384 : 128;
  if (args.out.empty()) args.out = "runs/finetune/" + (squad ? task_name.substr(6) : glue->name);

  // The model, from the checkpoint's config.
  models::BertConfig config = models::read_checkpoint_config(args.checkpoint);
  if (args.dropout >= 0) config.hidden_dropout = config.attention_dropout = args.dropout;
  if (config.position.has_position_table() && args.max_len > config.max_positions)
    ENGINE_FAIL("[finetune_app] --max-len ", args.max_len, " exceeds the checkpoint's max_positions ",
                config.max_positions, " (its learned position table)");

  // The tokenizer: given, or the one the checkpoint records.
  std::string tok_path = args.tokenizer;
  bool lower_case = !args.cased;
  if (tok_path.empty()) {
    const auto meta = engine::read_safetensors_metadata(args.checkpoint);
    auto it = meta.find("engine.tokenizer");
    ENGINE_CHECK(it != meta.end(), "[finetune_app] ", args.checkpoint,
                 ": records no tokenizer (engine.tokenizer); pass the pretraining vocabulary with --tokenizer");
    tok_path = it->second;
    auto lc = meta.find("engine.tokenizer_lower_case");
    if (lc != meta.end() && !args.cased) lower_case = lc->second != "false";
  }
  std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(tok_path, lower_case);
  ENGINE_CHECK(tok->vocab_size() == config.vocab_size, "[finetune_app] the tokenizer ", tok_path, " has ",
               tok->vocab_size(), " tokens but the checkpoint ", args.checkpoint, " has vocab_size ",
               config.vocab_size, ": pass the vocabulary it was pretrained with (--tokenizer)");

  std::unique_ptr<Task> task;
  if (squad) {
    data::SquadFeatureOptions fo;
    fo.max_len = args.max_len;
    fo.doc_stride = args.doc_stride;
    fo.max_query_len = args.max_query_len;
    data::SquadPredictOptions po;
    po.n_best = args.n_best;
    po.max_answer_len = args.max_answer_len;
    po.version_2 = task_name == "squad/v2.0";
    po.null_threshold = args.null_threshold;
    task = std::make_unique<SquadTaskRunner>(po.version_2, args.data_dir, *tok, fo, po, args.max_train, args.max_eval, root);
  } else {
    task = std::make_unique<GlueTaskRunner>(*glue, args.data_dir, *tok, args.max_len, args.max_train, args.max_eval, root);
  }

  if (!args.dump.empty()) {
    models::BertForFinetuning model(config, task->head(), task->num_labels(), args.seeds.front());
    models::load_encoder(args.checkpoint, model);
    return dump_batch(args, *task, model);
  }

  const fs::path out(args.out);
  if (root) fs::create_directories(out / "runs");
  if (root)
    std::printf("%s: %zu learning rate%s x %zu seed%s, %lld epochs, batch %lld (%d rank%s), max_len %lld, "
                "warmup %.0f%%, preset %s\n",
                label.c_str(), args.lrs.size(), args.lrs.size() == 1 ? "" : "s", args.seeds.size(),
                args.seeds.size() == 1 ? "" : "s", (long long)args.epochs, (long long)args.batch_size, comm.size(),
                comm.size() == 1 ? "" : "s", (long long)args.max_len, 100 * args.warmup_ratio,
                config.position.preset.c_str());

  std::vector<models::SweepRun> runs;
  json runs_json = json::array();
  for (double lr : args.lrs) {
    for (uint64_t seed : args.seeds) {
      const std::string name = "lr" + lr_str(lr) + "_seed" + std::to_string(seed);
      const fs::path dir = out / "runs" / name;
      if (root) {
        fs::create_directories(dir);
        std::printf("run %s\n", name.c_str());
        std::fflush(stdout);
      }
      models::BertForFinetuning model(config, task->head(), task->num_labels(), seed);
      models::load_encoder(args.checkpoint, model);
      models::FinetuneOptions fo;
      fo.lr = lr;
      fo.epochs = args.epochs;
      fo.batch_size = args.batch_size;
      fo.warmup_ratio = args.warmup_ratio;
      fo.weight_decay = args.weight_decay;
      fo.clip_norm = args.clip_norm;
      fo.evals_per_epoch = args.evals_per_epoch;
      fo.log_every = args.log_every;
      fo.max_steps = args.max_steps;
      fo.seed = seed;
      fo.metrics_path = (dir / "metrics.jsonl").string();
      const int64_t eval_batch = std::max<int64_t>(args.batch_size, 64);
      models::FinetuneResult r = models::finetune(model, task->train(), fo, [&](models::BertForFinetuning& m) {
        return task->evaluate(m, eval_batch);
      });
      // The model now holds the run's best weights.
      task->write_predictions(model, eval_batch, dir, !args.no_test, root);
      if (root && args.save_model) {
        engine::NamedTensors weights;
        for (auto& [n, t] : model.named_parameters()) weights.emplace_back(n, t.detach());
        engine::save_safetensors((dir / "model.safetensors").string(), weights,
                                 {{models::kConfigKey, model.config().to_json()},
                                  {models::kKindKey, std::string("bert_") + models::head_kind_name(model.kind())},
                                  {"engine.task", label}, {"format", "pt"}});
      }
      runs.push_back({lr, seed, r});
      json hist = json::array();
      for (auto& [step, e] : r.history) hist.push_back({{"step", step}, {"metrics", eval_json(e)}});
      runs_json.push_back({{"lr", lr}, {"seed", seed}, {"dir", dir.string()}, {"best", eval_json(r.best)},
                           {"best_step", r.best_step}, {"best_epoch", r.best_epoch}, {"steps", r.steps},
                           {"history", hist}});
    }
  }

  const models::SweepSummary summary = models::summarize_sweep(runs);
  if (!root) return 0;
  const std::string table = sweep_markdown(label, runs, summary);
  json rows = json::array();
  for (size_t i = 0; i < summary.rows.size(); ++i) {
    const auto& row = summary.rows[i];
    json med = json::object();
    for (auto& [n, v] : row.median_metrics) med[n] = v;
    rows.push_back({{"lr", row.lr}, {"median", med}, {"median_score", row.median_score}, {"scores", row.scores}});
  }
  const auto& best = runs[summary.best_run];
  json results = {
      {"task", label},
      {"checkpoint", args.checkpoint},
      {"model", {{"preset", config.position.preset}, {"layers", config.num_layers}, {"hidden_size", config.hidden_size}}},
      {"protocol",
       {{"epochs", args.epochs}, {"batch_size", args.batch_size}, {"max_len", args.max_len},
        {"warmup_ratio", args.warmup_ratio}, {"weight_decay", args.weight_decay}, {"clip_norm", args.clip_norm},
        {"evals_per_epoch", args.evals_per_epoch}, {"ranks", comm.size()}, {"max_train", args.max_train},
        {"max_eval", args.max_eval}, {"max_steps", args.max_steps}}},
      {"runs", runs_json},
      {"by_lr", rows},
      {"best_lr", summary.rows[summary.best_row].lr},
      {"best_run", {{"lr", best.lr}, {"seed", best.seed}, {"metrics", eval_json(best.result.best)}}}};
  if (squad) results["protocol"]["doc_stride"] = args.doc_stride;
  engine::write_file_atomic((out / "results.json").string(), results.dump(2) + "\n", "finetune_app");
  engine::write_file_atomic((out / "results.md").string(), "# " + label + "\n\n" + table, "finetune_app");
  // The submission: the best run of the best learning rate.
  if (!squad && !args.no_test) {
    const fs::path sub = out / "submission";
    fs::create_directories(sub);
    const fs::path from = out / "runs" / ("lr" + lr_str(best.lr) + "_seed" + std::to_string(best.seed));
    for (auto& e : fs::directory_iterator(from)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 4 && n.substr(n.size() - 4) == ".tsv" && n.find("_predictions") == std::string::npos)
        fs::copy_file(e.path(), sub / n, fs::copy_options::overwrite_existing);
    }
  }
  std::printf("\n%s\nresults: %s/results.md, %s/results.json\n", table.c_str(), args.out.c_str(), args.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return engine::run_job("finetune_app", [&] { return run(parse_args(argc, argv)); });
}
