// GLUE and SQuAD task runners and the learning-rate x seed sweep (see finetune_tasks.h).
#include "models/finetune_tasks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/metrics.h"
#include "data/squad.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/safetensors.h"
#include "models/checkpoint.h"

namespace models {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::vector<int64_t> argmax_rows(const std::vector<std::vector<float>>& logits) {
  std::vector<int64_t> out;
  for (const auto& row : logits)
    out.push_back(std::max_element(row.begin(), row.end()) - row.begin());
  return out;
}

class GlueTaskRunner : public FinetuneTask {
 public:
  GlueTaskRunner(const data::GlueTask& task, const std::string& dir_arg, const data::Tokenizer& tok,
                 const TaskDataOptions& o)
      : task_(task), tok_(tok), max_len_(o.max_len) {
    const bool root = o.verbose && engine::world().is_root();
    const int64_t max_train = o.max_train, max_eval = o.max_eval, max_len = o.max_len;
    ENGINE_CHECK(!task.test_only, "[finetune] ", task.name, " has no training data: ",
                 "its predictions come from an MNLI model (glue/MNLI writes AX.tsv)");
    // DIR is the GLUE download or the task's own folder.
    fs::path dir(dir_arg);
    if (!dir.has_filename()) dir = dir.parent_path();  // "glue/RTE/"
    if (fs::exists(dir / "train.tsv") &&
        !fs::exists(data::glue_split_path(task, dir.string(), "train"))) {
      task_dir_ = dir.string();
      glue_dir_ = fs::absolute(dir).parent_path().string();
    } else {
      glue_dir_ = dir.string();
      task_dir_ = (dir / task.dir).string();
    }
    const std::string first = path(o.read_train ? "train" : task.dev_splits.front());
    ENGINE_CHECK(fs::exists(first), "[finetune] ", first, ": no such file (--data-dir ", dir_arg,
                 " should be the GLUE folder holding ", task.dir, "/",
                 fs::path(first).filename().string(), ", or that task folder)");
    int64_t truncated = 0;
    if (o.read_train) {
      data::GlueReadStats stats;
      std::vector<data::GlueExample> train = data::read_glue(task, first, false, &stats);
      if (root && stats.skipped_rows > 0)
        std::printf("%s: skipped %lld malformed rows (first at line %d), as HF's processor does\n",
                    first.c_str(), (long long)stats.skipped_rows, stats.first_skipped_line);
      if (max_train > 0 && int64_t(train.size()) > max_train) train.resize(size_t(max_train));
      train_ = encode(train, &truncated);
    }
    for (const std::string& split : task.dev_splits) {
      std::vector<data::GlueExample> dev = data::read_glue(task, path(split), false);
      if (max_eval > 0 && int64_t(dev.size()) > max_eval) dev.resize(size_t(max_eval));
      dev_.push_back({split, dev, encode(dev, &truncated)});
    }
    if (root)
      std::printf("%s: %zu train examples, dev %s; %lld inputs truncated to %lld tokens\n",
                  task.name.c_str(), train_.size(), dev_summary().c_str(), (long long)truncated,
                  (long long)max_len);
  }

  std::string name() const override { return "glue/" + task_.name; }
  HeadKind head() const override {
    return task_.regression ? HeadKind::regression : HeadKind::classification;
  }
  int64_t num_labels() const override { return task_.regression ? 1 : task_.num_labels; }
  bool is_squad() const override { return false; }
  const std::vector<EncodedExample>& train() const override { return train_; }

  EvalResult evaluate(BertForFinetuning& model, int64_t batch_size) override {
    EvalResult r;
    for (size_t s = 0; s < dev_.size(); ++s) {
      auto logits = predict(model, dev_[s].encoded, batch_size);
      std::vector<int64_t> labels;
      std::vector<double> scores;
      decode(logits, &labels, &scores);
      auto m = data::glue_metrics(task_, dev_[s].examples, labels, scores);
      // MNLI: the matched split ranks runs; the mismatched one is reported as *_mm.
      for (auto& [name, v] : m) r.metrics.emplace_back(s == 0 ? name : name + "_mm", v);
      if (s == 0 && !labels.empty() &&
          std::all_of(labels.begin(), labels.end(), [&](int64_t l) { return l == labels[0]; }))
        r.one_class = task_.label_names[size_t(labels[0])];
      if (s == 0) {
        double sum = 0;
        for (auto& [name, v] : m) sum += v;
        r.score = sum / double(m.size());  // GLUE's convention: the mean of the task's metrics
      }
    }
    return r;
  }

  EvalResult baseline() const override {
    EvalResult r;
    if (task_.regression || dev_.empty() || dev_[0].examples.empty()) return r;
    const auto& ex = dev_[0].examples;
    std::vector<int64_t> count(size_t(task_.num_labels), 0);
    for (const auto& e : ex) ++count[size_t(e.label)];
    const int64_t majority = std::max_element(count.begin(), count.end()) - count.begin();
    const std::vector<int64_t> labels(ex.size(), majority);
    double sum = 0;
    for (auto& [name, v] : data::glue_metrics(task_, ex, labels, {})) {
      r.metrics.emplace_back(name, v);
      sum += v;
    }
    r.score = sum / double(r.metrics.size());
    r.one_class = task_.label_names[size_t(majority)];
    return r;
  }

  void write_predictions(BertForFinetuning& model, int64_t batch_size, const fs::path& dir,
                         bool test) override {
    const bool root = engine::world().is_root();
    for (auto& d : dev_) {
      auto logits = predict(model, d.encoded, batch_size);
      if (!root) continue;
      std::vector<int64_t> labels;
      std::vector<double> scores;
      decode(logits, &labels, &scores);
      std::ostringstream f;
      f << "line\tprediction\tgold\n";
      for (size_t i = 0; i < d.examples.size(); ++i) {
        const auto& e = d.examples[i];
        if (task_.regression)
          f << e.line << "\t" << scores[i] << "\t" << e.score << "\n";
        else
          f << e.line << "\t" << task_.label_names[size_t(labels[i])] << "\t"
            << task_.label_names[size_t(e.label)] << "\n";
      }
      engine::write_file_atomic((dir / (d.split + "_predictions.tsv")).string(), f.str(),
                                "finetune");
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
      auto logits = predict(model, encode(ex, &truncated), batch_size);
      std::vector<int64_t> labels;
      std::vector<double> scores;
      decode(logits, &labels, &scores);
      if (root)
        data::write_glue_predictions(*t, ex, labels, scores,
                                     (dir / data::glue_submission_name(*t, split)).string());
    }
  }

 private:
  struct Dev {
    std::string split;
    std::vector<data::GlueExample> examples;
    std::vector<EncodedExample> encoded;
  };
  std::string path(const std::string& split) const {
    return (fs::path(task_dir_) / (split + ".tsv")).string();
  }
  std::string dev_summary() const {
    std::string s;
    for (auto& d : dev_)
      s += (s.empty() ? "" : ", ") + d.split + " " + std::to_string(d.examples.size());
    return s;
  }
  std::vector<EncodedExample> encode(const std::vector<data::GlueExample>& ex,
                                     int64_t* truncated) const {
    std::vector<EncodedExample> out;
    out.reserve(ex.size());
    for (const auto& e : ex) {
      data::EncodedPair p = data::encode_pair(tok_, e.text_a, e.text_b, max_len_);
      *truncated += p.truncated;
      EncodedExample m;
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
  std::vector<EncodedExample> train_;
  std::vector<Dev> dev_;
};

class SquadTaskRunner : public FinetuneTask {
 public:
  SquadTaskRunner(bool v2, const std::string& dir, const data::Tokenizer& tok,
                  const data::SquadFeatureOptions& fo, const data::SquadPredictOptions& po,
                  const TaskDataOptions& o)
      : v2_(v2), predict_options_(po) {
    const bool root = o.verbose && engine::world().is_root();
    const int64_t max_train = o.max_train, max_eval = o.max_eval;
    const std::string version = v2 ? "v2.0" : "v1.1";
    const std::string train_path = (fs::path(dir) / ("train-" + version + ".json")).string();
    const std::string dev_path = (fs::path(dir) / ("dev-" + version + ".json")).string();
    for (const auto& p : {train_path, dev_path})
      ENGINE_CHECK(fs::exists(p) || (p == train_path && !o.read_train), "[finetune] ", p,
                   ": no such file (--data-dir should hold the official train-", version,
                   ".json and dev-", version, ".json)");
    std::vector<data::SquadExample> train;
    if (o.read_train) train = data::read_squad(train_path);
    if (max_train > 0 && int64_t(train.size()) > max_train) train.resize(size_t(max_train));
    dev_ = data::read_squad(dev_path);
    if (max_eval > 0 && int64_t(dev_.size()) > max_eval) dev_.resize(size_t(max_eval));
    if (!v2)
      for (const auto* set : {&train, &dev_})
        for (const auto& e : *set)
          ENGINE_CHECK(!e.is_impossible, "[finetune] question ", e.id,
                       " is marked impossible: that is SQuAD v2.0 data, run squad/v2.0");
    for (const auto& f : data::make_squad_features(train, tok, fo, true))
      train_.push_back(to_encoded(f));
    dev_features_ = data::make_squad_features(dev_, tok, fo, false);
    for (const auto& f : dev_features_) dev_encoded_.push_back(to_encoded(f));
    if (root)
      std::printf(
          "squad/%s: %zu train questions -> %zu windows, %zu dev questions -> %zu windows\n",
          version.c_str(), train.size(), train_.size(), dev_.size(), dev_features_.size());
  }
  std::string name() const override { return v2_ ? "squad/v2.0" : "squad/v1.1"; }
  HeadKind head() const override { return HeadKind::span; }
  int64_t num_labels() const override { return 2; }
  bool is_squad() const override { return true; }
  const std::vector<EncodedExample>& train() const override { return train_; }

  EvalResult evaluate(BertForFinetuning& model, int64_t batch_size) override {
    const std::vector<data::SquadAnswer> answers = answer(model, batch_size);
    std::map<std::string, std::string> preds;
    std::map<std::string, double> na;
    for (const auto& a : answers) {
      preds[a.id] = a.text;
      na[a.id] = a.null_score_diff;
    }
    const data::SquadScores s =
        data::evaluate_squad(dev_, preds, v2_ ? &na : nullptr, predict_options_.null_threshold);
    EvalResult r;
    r.metrics = {{"exact", s.exact}, {"f1", s.f1}};
    if (v2_) {
      r.metrics.emplace_back("has_ans_f1", s.has_ans_f1);
      r.metrics.emplace_back("no_ans_exact", s.no_ans_exact);
      r.metrics.emplace_back("best_f1", s.best_f1);
      r.metrics.emplace_back("best_f1_thresh", s.best_f1_thresh);
    }
    r.score = s.f1;
    if (v2_ && !answers.empty() &&
        std::all_of(answers.begin(), answers.end(),
                    [](const data::SquadAnswer& a) { return a.text.empty(); }))
      r.one_class = "\"\" (no answer)";
    return r;
  }

  EvalResult baseline() const override {
    EvalResult r;
    if (!v2_ || dev_.empty()) return r;
    std::map<std::string, std::string> empty;
    for (const auto& e : dev_) empty[e.id] = "";
    const data::SquadScores s = data::evaluate_squad(dev_, empty, nullptr, 0);
    r.metrics = {{"exact", s.exact}, {"f1", s.f1}};
    r.score = s.f1;
    r.one_class = "\"\" (no answer)";
    return r;
  }

  void write_predictions(BertForFinetuning& model, int64_t batch_size, const fs::path& dir,
                         bool /*test*/) override {
    const std::vector<data::SquadAnswer> answers = answer(model, batch_size);
    if (!engine::world().is_root()) return;
    json preds = json::object(), na = json::object(), nbest = json::object();
    for (const auto& a : answers) {
      preds[a.id] = a.text;
      na[a.id] = a.null_score_diff;
      json list = json::array();
      for (const auto& c : a.n_best)
        list.push_back({{"text", c.text},
                        {"probability", c.probability},
                        {"start_logit", c.start_logit},
                        {"end_logit", c.end_logit}});
      nbest[a.id] = list;
    }
    auto write = [&](const char* name, const json& j) {
      engine::write_file_atomic((dir / name).string(), j.dump(1) + "\n", "finetune");
    };
    write("predictions.json", preds);
    write("nbest_predictions.json", nbest);
    if (v2_) write("null_odds.json", na);
  }

 private:
  static EncodedExample to_encoded(const data::SquadFeature& f) {
    EncodedExample e;
    e.ids = f.input_ids;
    e.types = f.token_types;
    e.label = f.start_position;
    e.end = f.end_position;
    return e;
  }
  std::vector<data::SquadAnswer> answer(BertForFinetuning& model, int64_t batch_size) {
    const auto logits = predict(model, dev_encoded_, batch_size);
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
  std::vector<EncodedExample> train_, dev_encoded_;
};

std::string lr_str(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", lr);
  return buf;
}

json eval_json(const EvalResult& r) {
  json m = json::object();
  for (auto& [name, v] : r.metrics) m[name] = v;
  m["score"] = r.score;
  if (!r.one_class.empty()) m["one_class"] = r.one_class;
  return m;
}

json baseline_json(const EvalResult& b, bool squad) {
  if (b.metrics.empty()) return nullptr;
  json m = json::object();
  for (auto& [name, v] : b.metrics) m[name] = v;
  return {{"predictor", squad ? "every question answered with \"\"" : "majority class"},
          {"prediction", b.one_class},
          {"metrics", m}};
}

// The sweep table: one row per learning rate, each metric's median over seeds (percent), the
// score of every seed, the best learning rate marked.
}  // namespace

std::string baseline_lines(const EvalResult& baseline, bool squad, const std::string& who,
                           const EvalResult* r) {
  std::ostringstream md;
  char buf[64];
  if (!baseline.metrics.empty()) {
    md << (squad ? "Baseline (every question answered with \"\")"
                 : "Baseline (majority class '" + baseline.one_class + "')")
       << " on dev:";
    for (auto& [name, v] : baseline.metrics) {
      std::snprintf(buf, sizeof buf, " %s %.2f", name.c_str(), squad ? v : 100.0 * v);
      md << buf;
    }
    md << ".\n";
  }
  if (r && !r->one_class.empty())
    md << "**Warning**: " << who << " predicts " << r->one_class
       << " for every dev example: it has learned nothing beyond a constant"
       << (baseline.metrics.empty() ? "" : " (the baseline above)") << ".\n";
  return md.str();
}

std::string sweep_markdown(const std::string& task, bool squad, const std::vector<SweepRun>& runs,
                           const SweepSummary& s, const EvalResult& baseline) {
  std::ostringstream md;
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
      std::snprintf(buf, sizeof buf, "%s%.2f", i ? ", " : "",
                    squad ? row.scores[i] : 100.0 * row.scores[i]);
      md << buf;
    }
    md << " |\n";
  }
  const auto& best = runs[s.best_run];
  md << "\n"
     << task << ": best learning rate " << lr_str(s.rows[s.best_row].lr) << " (median over "
     << seeds << " seed" << (seeds == 1 ? "" : "s") << "); submission from its best run, seed "
     << best.seed << " (step " << best.result.best_step << ", epoch " << best.result.best_epoch
     << ").\n";
  md << baseline_lines(baseline, squad, "", nullptr);
  for (const auto& run : runs)
    md << baseline_lines({}, squad,
                         "run lr " + lr_str(run.lr) + " seed " + std::to_string(run.seed) +
                             " (at its best evaluation)",
                         &run.result.best);
  return md.str();
}

std::unique_ptr<FinetuneTask> make_glue_task(const data::GlueTask& task, const std::string& dir,
                                             const data::Tokenizer& tok,
                                             const TaskDataOptions& options) {
  return std::make_unique<GlueTaskRunner>(task, dir, tok, options);
}

std::unique_ptr<FinetuneTask> make_squad_task(bool version_2, const std::string& dir,
                                              const data::Tokenizer& tok,
                                              const data::SquadFeatureOptions& features,
                                              const data::SquadPredictOptions& predict,
                                              const TaskDataOptions& options) {
  return std::make_unique<SquadTaskRunner>(version_2, dir, tok, features, predict, options);
}

SweepReport run_sweep(FinetuneTask& task, const BertConfig& config, const std::string& checkpoint,
                      const SweepOptions& o) {
  engine::Communicator& comm = engine::world();
  const bool root = comm.is_root();
  const std::string label = task.name();
  const bool squad = task.is_squad();
  ENGINE_CHECK(!o.lrs.empty() && !o.seeds.empty(),
               "[finetune] a sweep needs at least one learning rate and one seed");
  ENGINE_CHECK(!o.out_dir.empty(), "[finetune] the sweep has no output directory");
  const fs::path out(o.out_dir);
  if (root) fs::create_directories(out / "runs");
  std::vector<models::SweepRun> runs;
  json runs_json = json::array();
  for (double lr : o.lrs) {
    for (uint64_t seed : o.seeds) {
      const std::string name = "lr" + lr_str(lr) + "_seed" + std::to_string(seed);
      const fs::path dir = out / "runs" / name;
      if (root) {
        fs::create_directories(dir);
        std::printf("run %s\n", name.c_str());
        std::fflush(stdout);
      }
      BertForFinetuning model(config, task.head(), task.num_labels(), seed);
      load_encoder(checkpoint, model);
      FinetuneOptions fo = o.loop;
      fo.lr = lr;
      fo.seed = seed;
      fo.metrics_path = (dir / "metrics.jsonl").string();
      const int64_t eval_batch = o.eval_batch_size;
      FinetuneResult r = finetune(model, task.train(), fo, [&](BertForFinetuning& m) {
        return task.evaluate(m, eval_batch);
      });
      // The model now holds the run's best weights.
      task.write_predictions(model, eval_batch, dir, o.test_predictions);
      if (root && o.save_models) {
        save_finetuned((dir / "model.safetensors").string(), model, label, o.max_len,
                       o.model_metadata);
      }
      runs.push_back({lr, seed, r});
      json hist = json::array();
      for (auto& [step, e] : r.history) hist.push_back({{"step", step}, {"metrics", eval_json(e)}});
      runs_json.push_back({{"lr", lr},
                           {"seed", seed},
                           {"dir", dir.string()},
                           {"best", eval_json(r.best)},
                           {"best_step", r.best_step},
                           {"best_epoch", r.best_epoch},
                           {"steps", r.steps},
                           {"history", hist}});
    }
  }

  SweepReport report;
  report.summary = summarize_sweep(runs);
  const SweepSummary& summary = report.summary;
  const EvalResult baseline = task.baseline();
  report.table = sweep_markdown(label, squad, runs, summary, baseline);
  report.runs = runs;
  if (!root) return report;
  const std::string& table = report.table;
  json rows = json::array();
  for (size_t i = 0; i < summary.rows.size(); ++i) {
    const auto& row = summary.rows[i];
    json med = json::object();
    for (auto& [n, v] : row.median_metrics) med[n] = v;
    rows.push_back({{"lr", row.lr},
                    {"median", med},
                    {"median_score", row.median_score},
                    {"scores", row.scores}});
  }
  const auto& best = runs[summary.best_run];
  json results = {
      {"task", label},
      {"checkpoint", checkpoint},
      {"model",
       {{"preset", config.position.preset},
        {"layers", config.num_layers},
        {"hidden_size", config.hidden_size}}},
      {"protocol",
       {{"epochs", o.loop.epochs},
        {"batch_size", o.loop.batch_size},
        {"max_len", o.max_len},
        {"warmup_ratio", o.loop.warmup_ratio},
        {"weight_decay", o.loop.weight_decay},
        {"clip_norm", o.loop.clip_norm},
        {"evals_per_epoch", o.loop.evals_per_epoch},
        {"ranks", comm.size()},
        {"max_train", o.max_train},
        {"max_eval", o.max_eval},
        {"max_steps", o.loop.max_steps}}},
      {"runs", runs_json},
      {"by_lr", rows},
      {"best_lr", summary.rows[summary.best_row].lr},
      {"baseline", baseline_json(baseline, squad)},
      {"best_run",
       {{"lr", best.lr}, {"seed", best.seed}, {"metrics", eval_json(best.result.best)}}}};
  if (squad) results["protocol"]["doc_stride"] = o.doc_stride;
  engine::write_file_atomic((out / "results.json").string(), results.dump(2) + "\n", "finetune");
  engine::write_file_atomic((out / "results.md").string(), "# " + label + "\n\n" + table,
                            "finetune");
  // The submission: the best run of the best learning rate.
  if (!squad && o.test_predictions) {
    const fs::path sub = out / "submission";
    fs::create_directories(sub);
    const fs::path from =
        out / "runs" / ("lr" + lr_str(best.lr) + "_seed" + std::to_string(best.seed));
    for (auto& e : fs::directory_iterator(from)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 4 && n.substr(n.size() - 4) == ".tsv" &&
          n.find("_predictions") == std::string::npos)
        fs::copy_file(e.path(), sub / n, fs::copy_options::overwrite_existing);
    }
  }
  return report;
}

void save_finetuned(const std::string& path, const BertForFinetuning& model,
                    const std::string& task, int64_t max_len, engine::SafetensorsMetadata extra) {
  engine::NamedTensors weights;
  for (auto& [n, t] : model.named_parameters()) weights.emplace_back(n, t.detach());
  extra[kConfigKey] = model.config().to_json();
  extra[kKindKey] = std::string("bert_") + head_kind_name(model.kind());
  extra[kTaskKey] = task;
  extra[kMaxLenKey] = std::to_string(max_len);
  extra["format"] = "pt";
  make_tokenizer_relative(extra, path);
  engine::save_safetensors(path, weights, extra);
}

engine::SafetensorsMetadata check_finetuned(const std::string& checkpoint, const std::string& task,
                                            HeadKind head) {
  const engine::SafetensorsMetadata meta = engine::read_safetensors_metadata(checkpoint);
  auto get = [&](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  const std::string kind = get(kKindKey), want = std::string("bert_") + head_kind_name(head);
  ENGINE_CHECK(!is_pretraining_kind(kind), "[finetune] ", checkpoint,
               " is a pretraining checkpoint (", kKindKey, " ", kind,
               ") with no finetuned head; prediction needs a model finetuned on ", task,
               " (finetune_app --save-model writes runs/<run>/model.safetensors)");
  ENGINE_CHECK(kind == want, "[finetune] ", checkpoint, ": ", kKindKey, " is '", kind,
               "', expected '", want, "' (a model finetuned on ", task, ")");
  const std::string trained_on = get(kTaskKey);
  ENGINE_CHECK(trained_on == task, "[finetune] ", checkpoint, " was finetuned on '", trained_on,
               "', not ", task, " (", kTaskKey, ")");
  return meta;
}

PredictReport predict_only(FinetuneTask& task, const std::string& checkpoint,
                           const PredictOptions& o) {
  const bool root = engine::world().is_root();
  const bool squad = task.is_squad();
  check_finetuned(checkpoint, task.name(), task.head());
  const BertConfig config = read_checkpoint_config(checkpoint);
  BertForFinetuning model(config, task.head(), task.num_labels(), 0);
  engine::load_safetensors_into(checkpoint, model.named_parameters());
  engine::check_device(o.device);
  engine::FlatParameters flat(model.named_parameters(), o.device);
  model.train(false);

  PredictReport report;
  report.dev = task.evaluate(model, o.batch_size);
  report.baseline = task.baseline();
  const fs::path out(o.out_dir);
  if (root) fs::create_directories(out);
  task.write_predictions(model, o.batch_size, out, o.test_predictions);
  std::ostringstream md;
  char buf[64];
  md << "| metric | dev | baseline |\n|---|---:|---:|\n";
  for (auto& [name, v] : report.dev.metrics) {
    std::snprintf(buf, sizeof buf, "%.2f", squad ? v : 100.0 * v);
    md << "| " << name << " | " << buf << " | ";
    for (auto& [bn, bv] : report.baseline.metrics)
      if (bn == name) {
        std::snprintf(buf, sizeof buf, "%.2f", squad ? bv : 100.0 * bv);
        md << buf;
      }
    md << " |\n";
  }
  md << "\n"
     << task.name() << ": dev of " << checkpoint << " (prediction only, no training).\n"
     << baseline_lines(report.baseline, squad, "the model", &report.dev);
  report.table = md.str();
  if (!root) return report;
  if (!squad && o.test_predictions) {
    // GLUE's submission folder: the test predictions under GLUE's file names.
    const fs::path sub = out / "submission";
    fs::create_directories(sub);
    for (auto& e : fs::directory_iterator(out)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 4 && n.substr(n.size() - 4) == ".tsv" &&
          n.find("_predictions") == std::string::npos)
        fs::rename(e.path(), sub / n);
    }
  }
  const json results = {{"task", task.name()},
                        {"checkpoint", checkpoint},
                        {"mode", "predict-only"},
                        {"model",
                         {{"preset", config.position.preset},
                          {"layers", config.num_layers},
                          {"hidden_size", config.hidden_size}}},
                        {"dev", eval_json(report.dev)},
                        {"baseline", baseline_json(report.baseline, squad)}};
  engine::write_file_atomic((out / "results.json").string(), results.dump(2) + "\n", "finetune");
  engine::write_file_atomic((out / "results.md").string(),
                            "# " + task.name() + "\n\n" + report.table, "finetune");
  return report;
}

void dump_first_batch(FinetuneTask& task, BertForFinetuning& model, int64_t batch_size,
                      const std::string& path, engine::Device device) {
  engine::check_device(device);
  engine::FlatParameters flat(model.named_parameters(), device);
  model.train(false);
  const auto& train = task.train();
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < std::min<int64_t>(batch_size, int64_t(train.size())); ++i)
    rows.push_back(i);
  const data::TaskBatch batch =
      data::make_task_batch(train, rows, model.kind(), model.config().type_vocab_size > 0)
          .to(device);
  engine::Generator gen(0);
  FinetuneOutput out = model.forward(batch.inputs, batch.labels, gen);
  out.loss.backward();
  engine::NamedTensors dump = {{"input_ids", batch.inputs.input_ids},
                               {"attention_mask", batch.inputs.attention_mask},
                               {"labels", batch.labels},
                               {"logits", out.logits.detach()},
                               {"loss", out.loss.detach()}};
  if (batch.inputs.token_type_ids.defined())
    dump.emplace_back("token_type_ids", batch.inputs.token_type_ids);
  for (auto& [name, t] : model.named_parameters()) {
    dump.emplace_back("param." + name, t.detach());
    dump.emplace_back("grad." + name, t.grad());
  }
  engine::save_safetensors(path, dump,
                           {{"engine.model_config", model.config().to_json()},
                            {"engine.head", head_kind_name(model.kind())}});
  std::printf("dump: %s head, batch %lld x %lld, loss %.9g, written to %s\n",
              head_kind_name(model.kind()), (long long)batch.inputs.input_ids.size(0),
              (long long)batch.inputs.input_ids.size(1), out.loss.item(), path.c_str());
}

}  // namespace models
