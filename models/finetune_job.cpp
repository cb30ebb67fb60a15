// finetune_app's job (see finetune_job.h).
#include "models/finetune_job.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/glue.h"
#include "data/squad_features.h"
#include "data/tokenizer.h"
#include "engine/comm.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "models/finetune_tasks.h"

namespace models {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

// An --out holding an earlier run's results is refused; --overwrite removes them (and only them:
// results.json, results.md, runs/, submission/, *_predictions.tsv) first.
void refuse_earlier_results(const std::string& out, bool overwrite, bool root) {
  namespace fs = std::filesystem;
  const std::vector<std::string> ours = {"results.json", "results.md", "runs", "submission"};
  std::vector<fs::path> found;
  if (fs::is_directory(out))
    for (auto& e : fs::directory_iterator(out)) {
      const std::string n = e.path().filename().string();
      if (std::find(ours.begin(), ours.end(), n) != ours.end() ||
          (n.size() > 16 && n.substr(n.size() - 16) == "_predictions.tsv") ||
          n == "predictions.json" || n == "nbest_predictions.json" || n == "null_odds.json")
        found.push_back(e.path());
    }
  // Every rank has looked before any rank writes into --out: without this, rank 0 could create
  // runs/ of this run before a slower rank looked, which then refused it as an earlier run's
  // (dist_finetune failed so once on the 2-core VM). All ranks see the same files, so all pass
  // or all refuse.
  engine::world().barrier();
  if (found.empty()) return;
  ENGINE_CHECK(overwrite, "[finetune_app] --out ", out, " holds an earlier run's results (",
               found.front().filename().string(),
               "); pass --overwrite to replace them or choose another --out");
  if (root)
    for (const auto& p : found) fs::remove_all(p);
  engine::world().barrier();
}

}  // namespace

std::string check_task_name(const std::string& task) {
  const std::string t = lower(task);
  const bool squad = t.rfind("squad/", 0) == 0;
  if (!squad && t.rfind("glue/", 0) != 0)
    return "TASK must be glue/<name> or squad/v1.1 or squad/v2.0, got '" + task + "'";
  if (squad && t != "squad/v1.1" && t != "squad/v2.0")
    return "SQuAD versions are squad/v1.1 and squad/v2.0, got '" + task + "'";
  return "";
}

void run_finetune_job(FinetuneJob args) {
  engine::Communicator& comm = engine::world();
  const bool root = comm.is_root();
  const std::string bad_task = check_task_name(args.task);
  ENGINE_CHECK(bad_task.empty(), "[finetune_app] ", bad_task);
  const std::string task_name = lower(args.task);
  const bool squad = task_name.rfind("squad/", 0) == 0;
  const data::GlueTask* glue = squad ? nullptr : &data::glue_task(args.task.substr(5));
  const std::string label = squad ? task_name : "glue/" + glue->name;

  // The papers' defaults per task.
  if (args.epochs < 0)
    args.epochs = squad                                                                   ? 2
                  : (glue->name == "MNLI" || glue->name == "QNLI" || glue->name == "QQP") ? 5
                                                                                          : 10;
  if (args.predict_only) {
    // The finetuned model first: what it is, and the max_len it was trained with.
    const HeadKind head = squad              ? HeadKind::span
                          : glue->regression ? HeadKind::regression
                                             : HeadKind::classification;
    const auto meta = check_finetuned(args.checkpoint, label, head);
    auto ml = meta.find(kMaxLenKey);
    if (args.max_len < 0 && ml != meta.end()) args.max_len = std::stoll(ml->second);
  }
  if (args.max_len < 0) args.max_len = squad ? 384 : 128;
  if (args.out.empty()) args.out = "runs/finetune/" + (squad ? task_name.substr(6) : glue->name);
  refuse_earlier_results(args.out, args.overwrite, root);

  // The model, from the checkpoint's config.
  BertConfig config = read_checkpoint_config(args.checkpoint);
  if (args.dropout >= 0) config.hidden_dropout = config.attention_dropout = args.dropout;
  if (config.position.has_position_table() && args.max_len > config.max_positions)
    ENGINE_FAIL("[finetune_app] --max-len ", args.max_len,
                " exceeds the checkpoint's max_positions ", config.max_positions,
                " (its learned position table)");

  // The tokenizer: given, or the one the checkpoint records.
  std::string tok_path = args.tokenizer;
  bool lower_case = !args.cased;
  if (tok_path.empty()) {
    const auto meta = engine::read_safetensors_metadata(args.checkpoint);
    tok_path = checkpoint_tokenizer(args.checkpoint, meta);
    ENGINE_CHECK(!tok_path.empty(), "[finetune_app] ", args.checkpoint, ": records no tokenizer (",
                 kTokenizerKey, "); pass the pretraining vocabulary with --tokenizer");
    auto lc = meta.find(kLowerCaseKey);
    if (lc != meta.end() && !args.cased) lower_case = lc->second != "false";
  }
  std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(tok_path, lower_case);
  ENGINE_CHECK(tok->vocab_size() == config.vocab_size, "[finetune_app] the tokenizer ", tok_path,
               " has ", tok->vocab_size(), " tokens but the checkpoint ", args.checkpoint,
               " has vocab_size ", config.vocab_size,
               ": pass the vocabulary it was pretrained with (--tokenizer)");

  TaskDataOptions data_options;
  data_options.read_train = !args.predict_only;
  data_options.max_len = args.max_len;
  data_options.max_train = args.max_train;
  data_options.max_eval = args.max_eval;
  std::unique_ptr<FinetuneTask> task;
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
    task = make_squad_task(po.version_2, args.data_dir, *tok, fo, po, data_options);
  } else {
    task = make_glue_task(*glue, args.data_dir, *tok, data_options);
  }

  if (args.predict_only) {
    PredictOptions po;
    po.out_dir = args.out;
    po.batch_size = std::max<int64_t>(args.batch_size, 64);
    po.test_predictions = !args.no_test;
    po.device = args.device;
    const PredictReport r = predict_only(*task, args.checkpoint, po);
    if (root)
      std::printf("\n%s\nresults: %s/results.md, %s/results.json\n", r.table.c_str(),
                  args.out.c_str(), args.out.c_str());
    return;
  }

  if (!args.dump.empty()) {
    BertForFinetuning model(config, task->head(), task->num_labels(), args.seeds.front());
    load_encoder(args.checkpoint, model);
    dump_first_batch(*task, model, args.batch_size, args.dump, args.device);
    return;
  }

  if (root)
    std::printf(
        "%s: %zu learning rate%s x %zu seed%s, %lld epochs, batch %lld (%d rank%s), max_len %lld, "
        "warmup %.0f%%, preset %s\n",
        label.c_str(), args.lrs.size(), args.lrs.size() == 1 ? "" : "s", args.seeds.size(),
        args.seeds.size() == 1 ? "" : "s", (long long)args.epochs, (long long)args.batch_size,
        comm.size(), comm.size() == 1 ? "" : "s", (long long)args.max_len, 100 * args.warmup_ratio,
        config.position.preset.c_str());
  if (root) std::printf("%s\n", engine::describe_cpu_compute().c_str());
  SweepOptions s;
  s.lrs = args.lrs;
  s.seeds = args.seeds;
  s.loop.epochs = args.epochs;
  s.loop.batch_size = args.batch_size;
  s.loop.warmup_ratio = args.warmup_ratio;
  s.loop.weight_decay = args.weight_decay;
  s.loop.optimizer = args.optimizer;
  s.loop.clip_norm = args.clip_norm;
  s.loop.evals_per_epoch = args.evals_per_epoch;
  s.loop.log_every = args.log_every;
  s.loop.max_steps = args.max_steps;
  s.loop.device = args.device;
  s.loop.precision = args.precision;
  s.eval_batch_size = std::max<int64_t>(args.batch_size, 64);
  s.out_dir = args.out;
  s.test_predictions = !args.no_test;
  s.save_models = args.save_model;
  // Saved models find their vocabulary in --out, so the output directory moves whole.
  if (args.save_model)
    s.model_metadata[kTokenizerKey] =
        root ? keep_tokenizer(tok_path, args.out) : kept_tokenizer_path(tok_path, args.out);
  s.model_metadata[kLowerCaseKey] = lower_case ? "true" : "false";
  s.max_len = args.max_len;
  s.doc_stride = squad ? args.doc_stride : 0;
  s.max_train = args.max_train;
  s.max_eval = args.max_eval;
  const SweepReport report = run_sweep(*task, config, args.checkpoint, s);
  if (root)
    std::printf("\n%s\nresults: %s/results.md, %s/results.json\n", report.table.c_str(),
                args.out.c_str(), args.out.c_str());
}

}  // namespace models
