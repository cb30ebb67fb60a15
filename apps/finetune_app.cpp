// finetune_app: finetunes a pretrained encoder on a GLUE task or SQuAD with the papers' protocol
// and reports the official metrics; a learning-rate x seed sweep gives, per learning rate, the
// median over seeds, as a markdown table and results.json. This file parses the command line;
// the task runners and the sweep are models/finetune_tasks.h, the loop models/finetune.h.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "data/glue.h"
#include "data/squad_features.h"
#include "data/tokenizer.h"
#include "engine/comm.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "models/finetune_tasks.h"

namespace {

const char* kUsage = R"(usage: finetune_app TASK --checkpoint CKPT --data-dir DIR [options]
       finetune_app TASK --init FINETUNED --data-dir DIR --predict-only [--out DIR]

Finetunes the encoder of a pretraining checkpoint on one task and reports the official dev
metrics beside the majority-class baseline (SQuAD v2.0: the empty-answer baseline), flagging a
model whose dev predictions are all one class. TASK is glue/<name> (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI) or squad/v1.1,
squad/v2.0.

Data:
  --checkpoint CKPT    a checkpoint of pretrain_app (model.safetensors or a training checkpoint;
                       the MLM head and optimizer state are ignored), or one converted from
                       Hugging Face (pretrain_app convert --from-hf); --init is the same flag
  --predict-only       no training: CKPT is a model finetuned on TASK (--save-model's
                       runs/<run>/model.safetensors); scores dev, writes dev and test predictions
                       and GLUE's submission/ files, results.json and results.md to --out
  --data-dir DIR       GLUE: the GLUE download (DIR/<task>/train.tsv, ...) or the task's folder;
                       SQuAD: the folder of train-v1.1.json and dev-v1.1.json (v2.0 likewise)
  --tokenizer TOK      the pretraining vocabulary (.model or vocab.txt); default: the one the
                       checkpoint records (pretrain_app writes it into its checkpoints)
  --cased              WordPiece: keep case (default: lower-case, BERT-uncased)
  --out DIR            where results, logs and predictions go (default runs/finetune/<task>);
                       one holding an earlier run's results is refused unless --overwrite
  --overwrite          replace the earlier results in --out
  --device DEV         cpu (default), cuda or cuda:N: where the model trains and evaluates (in
                       the emulation build build-emu/, the emulated GPU)
  --precision P        f32 (default), bf16 or fp16 (CUDA only): the forward's compute dtype, with
                       f32 master weights (fp16 with dynamic loss scaling)

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

Other: --version prints the version and git commit; -h, --help this text.

Exit status: 0 on success, 1 on an error (one message naming the file, line or key), 2 on a bad
command line.
)";

[[noreturn]] void usage_error(const std::string& msg) { cli::usage_error("finetune_app", msg); }

struct Args {
  std::string task, checkpoint, data_dir, tokenizer, out, dump;
  engine::Device device = engine::Device::cpu();
  std::string precision = "f32";
  std::vector<double> lrs = {2e-5, 3e-5, 4e-5, 5e-5};
  std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  int64_t epochs = -1, batch_size = 32, max_len = -1, doc_stride = 128, max_query_len = 64;
  double warmup_ratio = 0.06, weight_decay = 0.01, clip_norm = 1.0, dropout = -1,
         null_threshold = 0;
  int64_t evals_per_epoch = 1, log_every = 50, n_best = 20, max_answer_len = 30;
  int64_t max_train = 0, max_eval = 0, max_steps = 0;
  bool cased = false, no_test = false, save_model = false, predict_only = false, overwrite = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  cli::ArgParser p("finetune_app", kUsage, argc, argv);
  while (p.next()) {
    const std::string& arg = p.arg();
    if (!p.is_flag()) {
      if (!a.task.empty()) usage_error("one TASK only (got '" + a.task + "' and '" + arg + "')");
      a.task = arg;
    } else if (arg == "--checkpoint" || arg == "--init")
      a.checkpoint = p.value();
    else if (arg == "--predict-only")
      a.predict_only = true;
    else if (arg == "--overwrite")
      a.overwrite = true;
    else if (arg == "--data-dir")
      a.data_dir = p.value();
    else if (arg == "--tokenizer")
      a.tokenizer = p.value();
    else if (arg == "--out")
      a.out = p.value();
    else if (arg == "--dump")
      a.dump = p.value();
    else if (arg == "--precision")
      a.precision = p.precision_value();
    else if (arg == "--device")
      a.device = p.device_value();
    else if (arg == "--cased")
      a.cased = true;
    else if (arg == "--no-test")
      a.no_test = true;
    else if (arg == "--save-model")
      a.save_model = true;
    else if (arg == "--lr") {
      const std::string v = p.value();
      a.lrs.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) a.lrs.push_back(p.to_double("--lr", item, 1e-12, 1.0));
      if (a.lrs.empty())
        usage_error("--lr expects a comma-separated list of learning rates, got '" + v + "'");
    } else if (arg == "--seeds") {
      const int64_t n = p.int_value(1);
      a.seeds.clear();
      for (int64_t s = 1; s <= n; ++s) a.seeds.push_back(uint64_t(s));
    } else if (arg == "--seed") {
      a.seeds = {uint64_t(p.int_value(0))};
    } else if (arg == "--epochs")
      a.epochs = p.int_value(1);
    else if (arg == "--batch-size")
      a.batch_size = p.int_value(1);
    else if (arg == "--max-len")
      a.max_len = p.int_value(3);
    else if (arg == "--doc-stride")
      a.doc_stride = p.int_value(1);
    else if (arg == "--max-query-len")
      a.max_query_len = p.int_value(1);
    else if (arg == "--warmup-ratio")
      a.warmup_ratio = p.double_value(0, 1);
    else if (arg == "--weight-decay")
      a.weight_decay = p.double_value(0, 1);
    else if (arg == "--clip-norm")
      a.clip_norm = p.double_value(0, 1e9);
    else if (arg == "--dropout")
      a.dropout = p.double_value(0, 0.99);
    else if (arg == "--null-threshold")
      a.null_threshold = p.double_value(-1e9, 1e9);
    else if (arg == "--evals-per-epoch")
      a.evals_per_epoch = p.int_value(1);
    else if (arg == "--log-every")
      a.log_every = p.int_value(1);
    else if (arg == "--n-best")
      a.n_best = p.int_value(1);
    else if (arg == "--max-answer-len")
      a.max_answer_len = p.int_value(1);
    else if (arg == "--max-train")
      a.max_train = p.int_value(1);
    else if (arg == "--max-eval")
      a.max_eval = p.int_value(1);
    else if (arg == "--max-steps")
      a.max_steps = p.int_value(1);
    else
      usage_error("unknown argument '" + arg + "'");
  }
  if (a.task.empty()) usage_error("TASK is required (glue/RTE, glue/MNLI, squad/v1.1, ...)");
  if (a.checkpoint.empty()) usage_error("--checkpoint (or --init) is required");
  if (a.predict_only && (!a.dump.empty() || a.save_model))
    usage_error("--predict-only trains nothing: --dump and --save-model do not apply");
  if (a.data_dir.empty()) usage_error("--data-dir is required");
  return a;
}

// ---- main ----------------------------------------------------------------------------------

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
  if (found.empty()) return;
  ENGINE_CHECK(overwrite, "[finetune_app] --out ", out, " holds an earlier run's results (",
               found.front().filename().string(),
               "); pass --overwrite to replace them or choose another --out");
  engine::world().barrier();  // every rank has looked before rank 0 removes anything
  if (root)
    for (const auto& p : found) fs::remove_all(p);
  engine::world().barrier();
}

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
    args.epochs = squad                                                                   ? 2
                  : (glue->name == "MNLI" || glue->name == "QNLI" || glue->name == "QQP") ? 5
                                                                                          : 10;
  if (args.predict_only) {
    // The finetuned model first: what it is, and the max_len it was trained with.
    const models::HeadKind head = squad              ? models::HeadKind::span
                                  : glue->regression ? models::HeadKind::regression
                                                     : models::HeadKind::classification;
    const auto meta = models::check_finetuned(args.checkpoint, label, head);
    auto ml = meta.find(models::kMaxLenKey);
    if (args.max_len < 0 && ml != meta.end()) args.max_len = std::stoll(ml->second);
  }
  if (args.max_len < 0) args.max_len = squad ? 384 : 128;
  if (args.out.empty()) args.out = "runs/finetune/" + (squad ? task_name.substr(6) : glue->name);
  refuse_earlier_results(args.out, args.overwrite, root);

  // The model, from the checkpoint's config.
  models::BertConfig config = models::read_checkpoint_config(args.checkpoint);
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
    tok_path = models::checkpoint_tokenizer(args.checkpoint, meta);
    ENGINE_CHECK(!tok_path.empty(), "[finetune_app] ", args.checkpoint, ": records no tokenizer (",
                 models::kTokenizerKey, "); pass the pretraining vocabulary with --tokenizer");
    auto lc = meta.find(models::kLowerCaseKey);
    if (lc != meta.end() && !args.cased) lower_case = lc->second != "false";
  }
  std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(tok_path, lower_case);
  ENGINE_CHECK(tok->vocab_size() == config.vocab_size, "[finetune_app] the tokenizer ", tok_path,
               " has ", tok->vocab_size(), " tokens but the checkpoint ", args.checkpoint,
               " has vocab_size ", config.vocab_size,
               ": pass the vocabulary it was pretrained with (--tokenizer)");

  models::TaskDataOptions data_options;
  data_options.read_train = !args.predict_only;
  data_options.max_len = args.max_len;
  data_options.max_train = args.max_train;
  data_options.max_eval = args.max_eval;
  std::unique_ptr<models::FinetuneTask> task;
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
    task = models::make_squad_task(po.version_2, args.data_dir, *tok, fo, po, data_options);
  } else {
    task = models::make_glue_task(*glue, args.data_dir, *tok, data_options);
  }

  if (args.predict_only) {
    models::PredictOptions po;
    po.out_dir = args.out;
    po.batch_size = std::max<int64_t>(args.batch_size, 64);
    po.test_predictions = !args.no_test;
    po.device = args.device;
    const models::PredictReport r = models::predict_only(*task, args.checkpoint, po);
    if (root)
      std::printf("\n%s\nresults: %s/results.md, %s/results.json\n", r.table.c_str(),
                  args.out.c_str(), args.out.c_str());
    return 0;
  }

  if (!args.dump.empty()) {
    models::BertForFinetuning model(config, task->head(), task->num_labels(), args.seeds.front());
    models::load_encoder(args.checkpoint, model);
    models::dump_first_batch(*task, model, args.batch_size, args.dump, args.device);
    return 0;
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
  models::SweepOptions s;
  s.lrs = args.lrs;
  s.seeds = args.seeds;
  s.loop.epochs = args.epochs;
  s.loop.batch_size = args.batch_size;
  s.loop.warmup_ratio = args.warmup_ratio;
  s.loop.weight_decay = args.weight_decay;
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
    s.model_metadata[models::kTokenizerKey] = root
                                                  ? models::keep_tokenizer(tok_path, args.out)
                                                  : models::kept_tokenizer_path(tok_path, args.out);
  s.model_metadata[models::kLowerCaseKey] = lower_case ? "true" : "false";
  s.max_len = args.max_len;
  s.doc_stride = squad ? args.doc_stride : 0;
  s.max_train = args.max_train;
  s.max_eval = args.max_eval;
  const models::SweepReport report = models::run_sweep(*task, config, args.checkpoint, s);
  if (root)
    std::printf("\n%s\nresults: %s/results.md, %s/results.json\n", report.table.c_str(),
                args.out.c_str(), args.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return engine::run_job("finetune_app", [&] { return run(parse_args(argc, argv)); });
}
