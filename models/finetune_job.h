// finetune_app's whole job as one library call: a pretraining checkpoint, its tokenizer and a
// GLUE or SQuAD task in, a learning-rate x seed sweep (or predictions from a finetuned model, or
// the single-batch dump) out, with the papers' defaults per task. finetune_app parses its command
// line into a FinetuneJob and calls run_finetune_job; the pieces it is made of are
// models/finetune_tasks.h (tasks, the sweep) and models/finetune.h (the loop).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/device.h"

namespace models {

struct FinetuneJob {
  // glue/<name> (any case; the name as data::glue_task takes it) or squad/v1.1, squad/v2.0.
  std::string task;
  std::string checkpoint;  // a pretraining checkpoint, or with predict_only a finetuned model
  std::string data_dir;
  std::string tokenizer;  // "": the one the checkpoint records
  std::string out;        // "": runs/finetune/<task>
  std::string dump;       // the single-batch dump file (dropout off, then stop); "": none
  engine::Device device = engine::Device::cpu();
  std::string precision = "f32";
  std::string optimizer = "adamw";  // adamw | lamb
  std::vector<double> lrs = {2e-5, 3e-5, 4e-5, 5e-5};
  std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  // -1: the task's default (epochs: 2 SQuAD, 5 MNLI / QNLI / QQP, 10 others; max_len: the
  // finetuned model's with predict_only, else 384 SQuAD, 128 GLUE; dropout: the checkpoint's).
  int64_t epochs = -1, batch_size = 32, max_len = -1, doc_stride = 128, max_query_len = 64;
  double warmup_ratio = 0.06, weight_decay = 0.01, clip_norm = 1.0, dropout = -1,
         null_threshold = 0;
  int64_t evals_per_epoch = 1, log_every = 50, n_best = 20, max_answer_len = 30;
  int64_t max_train = 0, max_eval = 0, max_steps = 0;  // 0: all
  bool cased = false, no_test = false, save_model = false, predict_only = false, overwrite = false;
};

// "" when `task` names a task as FinetuneJob::task says, else what is wrong with it.
std::string check_task_name(const std::string& task);

// Runs the job (every rank of a data-parallel job calls it; rank 0 prints and writes): refuses an
// --out holding an earlier run's results unless overwrite, reads the task with the checkpoint's
// tokenizer, then predicts (predict_only), dumps one batch (dump) or runs the sweep and prints its
// table. Errors are engine::Error naming the file or option.
void run_finetune_job(FinetuneJob job);

}  // namespace models
