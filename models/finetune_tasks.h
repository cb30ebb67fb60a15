// Finetuning tasks and sweeps, in the library so a program of your own runs them as finetune_app
// does (finetune_app's whole job, built from these, is run_finetune_job in models/finetune_job.h):
//
//   auto task = models::make_glue_task(data::glue_task("RTE"), "glue", *tokenizer, {});
//   models::SweepOptions s;            // learning rates x seeds, the loop's options, outputs
//   models::run_sweep(*task, config, checkpoint, s);   // results.md, results.json, submission/
//
// A task reads its files once (GLUE TSVs, SQuAD JSON), encodes the examples with the tokenizer
// ([CLS] a [SEP] (b [SEP]), SQuAD's doc-stride windows), and knows its head, how to score the
// dev split(s) with the official metrics and how to write prediction files. The readers, metrics
// and SQuAD features are data/glue.h, data/squad.h and data/squad_features.h; the loop is
// models/finetune.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/glue.h"
#include "data/squad_features.h"
#include "data/tokenizer.h"
#include "engine/safetensors.h"
#include "models/finetune.h"
#include "models/heads.h"

namespace models {

class FinetuneTask {
 public:
  virtual ~FinetuneTask() = default;
  virtual std::string name() const = 0;  // "glue/RTE", "squad/v2.0"
  virtual HeadKind head() const = 0;
  virtual int64_t num_labels() const = 0;
  virtual bool is_squad() const = 0;
  virtual const std::vector<EncodedExample>& train() const = 0;
  // The dev metrics (every rank calls it: prediction is data parallel); score ranks evaluations.
  virtual EvalResult evaluate(BertForFinetuning& model, int64_t batch_size) = 0;
  // The dev metrics of the trivial predictor — the majority class of the first dev split (GLUE
  // classification), every question unanswered (SQuAD v2.0) — with its description in
  // `one_class`; no metrics when there is none (regression, SQuAD v1.1).
  virtual EvalResult baseline() const = 0;
  // Dev predictions and, when `test`, test predictions (GLUE's file names) into `dir`; rank 0
  // writes, every rank predicts.
  virtual void write_predictions(BertForFinetuning& model, int64_t batch_size,
                                 const std::filesystem::path& dir, bool test) = 0;
};

// How much of a task's data to use.
struct TaskDataOptions {
  int64_t max_len = 128;   // tokens per input, [CLS] and [SEP] included (SQuAD: window length)
  int64_t max_train = 0;   // > 0: the first N training examples
  int64_t max_eval = 0;    // > 0: the first N examples of each dev split
  bool read_train = true;  // false: dev (and test) only, for prediction from a finetuned model
  bool verbose = true;     // rank 0 prints what was read
};

// `dir` is the GLUE folder (holding <task>/train.tsv, ...) or the task's own folder.
std::unique_ptr<FinetuneTask> make_glue_task(const data::GlueTask& task, const std::string& dir,
                                             const data::Tokenizer& tok,
                                             const TaskDataOptions& options);
// `dir` holds train-v1.1.json and dev-v1.1.json (v2.0 likewise); features.max_len is the window.
std::unique_ptr<FinetuneTask> make_squad_task(bool version_2, const std::string& dir,
                                              const data::Tokenizer& tok,
                                              const data::SquadFeatureOptions& features,
                                              const data::SquadPredictOptions& predict,
                                              const TaskDataOptions& options);

// ---- sweeps
// --------------------------------------------------------------------------------------

struct SweepOptions {
  std::vector<double> lrs = {2e-5, 3e-5, 4e-5, 5e-5};
  std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  FinetuneOptions loop;  // everything but lr, seed and metrics_path (set per run)
  int64_t eval_batch_size = 64;
  std::string out_dir;           // results.md, results.json, runs/lr<lr>_seed<s>/, submission/
  bool test_predictions = true;  // test predictions per run and GLUE's submission/ folder
  bool save_models = false;      // runs/.../model.safetensors: each run's best weights
  engine::SafetensorsMetadata model_metadata;  // added to saved models (e.g. the tokenizer)
  int64_t max_len = 128;                       // recorded in results.json
  int64_t doc_stride = 0;                      // SQuAD: recorded in results.json
  int64_t max_train = 0, max_eval = 0;         // recorded in results.json
};

// One run per (learning rate, seed), each from the checkpoint's encoder with a fresh head; writes
// every run's metrics.jsonl and predictions, then (rank 0) results.json, results.md and the GLUE
// submission of the best run of the best learning rate. Returns the runs and their summary.
struct SweepReport {
  std::vector<SweepRun> runs;
  SweepSummary summary;
  std::string table;  // results.md's table
};
SweepReport run_sweep(FinetuneTask& task, const BertConfig& config, const std::string& checkpoint,
                      const SweepOptions& options);

// The results.md table: per learning rate each metric's median over seeds (percent for GLUE),
// every seed's score, the best learning rate marked, and where the submission comes from.
// Below it: the trivial baseline's metrics (`baseline`, FinetuneTask::baseline()) and a warning
// for every run whose best evaluation predicted one class only.
std::string sweep_markdown(const std::string& task, bool squad, const std::vector<SweepRun>& runs,
                           const SweepSummary& summary, const EvalResult& baseline = {});

// The lines results.md and the console show under a result: the baseline beside the metrics,
// e.g. "baseline (majority class 'not_entailment'): acc 52.71", and, when `r` predicted one
// class, a warning saying so. `percent`: GLUE's fractions are shown as percentages.
std::string baseline_lines(const EvalResult& baseline, bool squad, const std::string& who,
                           const EvalResult* r);

// Evaluation and prediction without training: a model finetuned on this task (finetune_app
// --save-model: engine.model bert_<head>, engine.task) is scored on dev, with the baseline and
// the one-class check; dev predictions, test predictions and (GLUE) submission/ go to out_dir,
// with results.json and results.md. Errors name what the checkpoint is when it is not such a
// model (a pretraining checkpoint, another task, another head).
// Checks that `checkpoint` is a model finetuned on `task` with a `head` head (one clear error
// naming what it is otherwise) and returns its metadata (kMaxLenKey: the run's max_len).
inline constexpr const char* kMaxLenKey = "engine.max_len";
engine::SafetensorsMetadata check_finetuned(const std::string& checkpoint, const std::string& task,
                                            HeadKind head);
// Writes `model`, finetuned on `task` with sequences of `max_len`, as check_finetuned reads it:
// the parameters, with the config, the kind (bert_<head>), the task and max_len in the metadata
// beside `extra` (an absolute tokenizer path there is stored relative to `path`'s directory).
void save_finetuned(const std::string& path, const BertForFinetuning& model,
                    const std::string& task, int64_t max_len,
                    engine::SafetensorsMetadata extra = {});
struct PredictOptions {
  std::string out_dir;
  int64_t batch_size = 64;
  bool test_predictions = true;
  engine::Device device = engine::Device::cpu();
};
struct PredictReport {
  EvalResult dev, baseline;
  std::string table;  // results.md's body
};
PredictReport predict_only(FinetuneTask& task, const std::string& checkpoint,
                           const PredictOptions& options);

// The reference check's dump: with dropout off, the first `batch_size` training examples in file
// order; inputs, labels, logits, loss, every parameter and its gradient, to `path` (safetensors).
// The model moves to `device` first (its parameters into one slab there).
void dump_first_batch(FinetuneTask& task, BertForFinetuning& model, int64_t batch_size,
                      const std::string& path, engine::Device device = engine::Device::cpu());

}  // namespace models
