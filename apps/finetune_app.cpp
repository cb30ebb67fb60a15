// finetune_app: finetunes a pretrained encoder on a GLUE task or SQuAD with the papers' protocol
// and reports the official metrics; a learning-rate x seed sweep gives, per learning rate, the
// median over seeds, as a markdown table and results.json. This file parses the command line into
// a models::FinetuneJob (models/finetune_job.h), which runs the job: the task runners and the
// sweep are models/finetune_tasks.h, the loop models/finetune.h.

#include <cstdint>
#include <sstream>
#include <string>

#include "apps/cli.h"
#include "engine/comm.h"
#include "models/finetune_job.h"

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
  --optim NAME         adamw (default) or lamb (apex FusedLAMB's rule: engine/optim.h)
  --weight-decay W     betas 0.9, 0.98, eps 1e-6, decay not on biases and LayerNorms (0.01)
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

models::FinetuneJob parse_args(int argc, char** argv) {
  models::FinetuneJob a;
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
    else if (arg == "--optim") {
      a.optimizer = p.value();
      if (a.optimizer != "adamw" && a.optimizer != "lamb")
        usage_error("--optim expects adamw or lamb, got '" + a.optimizer + "'");
    } else if (arg == "--clip-norm")
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
  if (const std::string bad = models::check_task_name(a.task); !bad.empty()) usage_error(bad);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  return engine::run_job("finetune_app", [&] {
    models::run_finetune_job(parse_args(argc, argv));
    return 0;
  });
}
