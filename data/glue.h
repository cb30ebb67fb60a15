// GLUE tasks: the task table (labels, file layouts, metric), a reader for the official .tsv files
// as the GLUE download script lays them out (the columns and label orders of HuggingFace
// transformers' glue processors), the metrics of each task, and the submission files that
// gluebenchmark.com expects. docs/finetune.md ("Data formats and metrics") describes the formats.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace data {

// Where one kind of GLUE file (labeled train/dev, or unlabeled test) keeps its fields. Columns
// are 0-based; kNone = the file has no such field, kLast = the row's last column.
struct GlueLayout {
  static constexpr int kNone = -1;
  static constexpr int kLast = -2;
  bool header = true;  // the first line names the columns (CoLA train/dev have no header)
  int columns = 0;     // without a header: the columns of every row (with one: the header's count)
  int id = kNone;      // the row's id: GlueExample::guid, and in test files the submission index
  int text_a = kNone, text_b = kNone, label = kNone;
  // With a header: the names it must have at those columns (a wrong file fails at line 1).
  std::string id_name, text_a_name, text_b_name, label_name;
};

struct GlueTask {
  std::string name;  // "CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI", "AX"
  std::string dir;   // its folder in the GLUE download ("diagnostic" for AX)
  int num_labels = 2;       // 1 for STS-B
  bool regression = false;  // STS-B: a score in [0, 5] instead of a class
  // Class index → the label as the files spell it (HF's get_labels() order); empty for STS-B.
  std::vector<std::string> label_names;
  GlueLayout labeled;                    // train and dev files
  GlueLayout test;                       // test files
  bool test_only = false;                // AX: a test file only
  std::vector<std::string> dev_splits;   // {"dev"}; MNLI {"dev_matched", "dev_mismatched"}; AX {}
  std::vector<std::string> test_splits;  // {"test"}; MNLI {"test_matched", "test_mismatched"};
                                         // AX {"diagnostic"}
  std::string metric;  // "mcc" (CoLA, AX), "acc", "acc_f1" (MRPC, QQP), "pearson_spearman" (STS-B)
};

// The task by name, case-insensitive, '-' and '_' ignored ("sst2", "STS-B", "mnli" all work).
// Unknown names fail, listing the known ones.
const GlueTask& glue_task(const std::string& name);
// All ten, in the order of the GLUE paper (CoLA ... WNLI, then AX).
const std::vector<GlueTask>& glue_tasks();

// "<glue_dir>/<task.dir>/<split>.tsv" for "train", a dev split or a test split of the task;
// other splits fail, listing the task's.
std::string glue_split_path(const GlueTask& task, const std::string& glue_dir,
                            const std::string& split);
// True for the task's test splits (unlabeled files), false for train and dev splits.
bool glue_is_test_split(const GlueTask& task, const std::string& split);

struct GlueExample {
  std::string guid;  // the file's id column (index / id) when it has one, else the row number
  std::string text_a;
  std::string text_b;  // empty for single-sentence tasks (CoLA, SST-2)
  int64_t label = -1;  // class index into label_names; -1 unlabeled (test) and for STS-B
  double score = 0;    // STS-B: the similarity in [0, 5]
  int64_t index = -1;  // test files: the id to write in the submission file
  int line = 0;        // 1-based line in the file
};

struct GlueReadStats {
  int64_t skipped_rows = 0;    // QQP train/dev rows with missing columns, skipped
  int first_skipped_line = 0;  // 1-based; 0 when none
};

// Reads one GLUE .tsv: a train/dev file (test_split = false) or a test file (true). Fields are
// separated by tabs and never quoted (QUOTE_NONE: a '"' is an ordinary character); a UTF-8
// byte-order mark at the start (MRPC) and a '\r' before each '\n' are dropped, empty lines are
// skipped. Rows are checked against the task's layout: the header's names at the used columns,
// every row with exactly the header's column count (CoLA train/dev: 4 columns, no header), labels
// among label_names, STS-B scores numbers in [0, 5], test ids non-negative integers, at least one
// example.
//
// QQP: the real QQP train file has a few rows with missing columns (questions broken across
// lines). As HF's QqpProcessor does, rows of a QQP train/dev file with FEWER columns than the
// header are skipped and counted in `stats`; when `stats` is null, one warning line goes to stderr
// instead. Every other malformed row, in any task (QQP test files included: a skipped test row
// would be missing from the submission), fails.
//
// Errors (engine::Error, "[glue] <path>:<line>: ..."): a missing file, a header without the
// expected columns, a wrong column count (expected and found), an unknown label (the allowed
// ones listed), a bad STS-B score, a bad test id, an AX file read as labeled, an empty file.
std::vector<GlueExample> read_glue(const GlueTask& task, const std::string& path, bool test_split,
                                   GlueReadStats* stats = nullptr);

// The task's metrics of `labels` (classification) or `scores` (STS-B; pass the other empty)
// against the gold labels/scores of `examples`, as name/value pairs in [−1, 1] (not percent):
// "mcc" → {"mcc"}; "acc" → {"acc"}; "acc_f1" → {"acc", "f1"} (F1 of class 1); "pearson_spearman"
// → {"pearson", "spearman"}. Fails on unlabeled examples or a size mismatch.
std::vector<std::pair<std::string, double>> glue_metrics(const GlueTask& task,
                                                         const std::vector<GlueExample>& examples,
                                                         const std::vector<int64_t>& labels,
                                                         const std::vector<double>& scores);

// The file name gluebenchmark.com expects for a test split's predictions: CoLA.tsv, SST-2.tsv,
// MRPC.tsv, STS-B.tsv, QQP.tsv, MNLI-m.tsv (test_matched), MNLI-mm.tsv (test_mismatched),
// QNLI.tsv, RTE.tsv, WNLI.tsv, AX.tsv (split "diagnostic"). Other splits fail.
std::string glue_submission_name(const GlueTask& task, const std::string& split);

// Writes a submission file: a header "index\tprediction", then one row per example in order,
// "<example.index>\t<prediction>". Classification tasks take `labels` (class indices; `scores`
// empty) and write label_names[label] (so "entailment" for MNLI/QNLI/RTE/AX, "0"/"1" for CoLA,
// SST-2, MRPC, QQP, WNLI); STS-B takes `scores` (`labels` empty) and writes each as the shortest
// decimal that reads back to the same double (not clipped to [0, 5]). Examples must come from a
// test file (index ≥ 0, unique). Atomic (engine/file_io.h): written to "<path>.tmp.<pid>",
// fsynced, renamed over `path`.
void write_glue_predictions(const GlueTask& task, const std::vector<GlueExample>& examples,
                            const std::vector<int64_t>& labels, const std::vector<double>& scores,
                            const std::string& path);

// One example as the encoder's input, the way BERT pretraining lays out two segments:
// [CLS] a [SEP] for one sentence, [CLS] a [SEP] b [SEP] for a pair (the pretraining corpus
// separates documents with [SEP] too), token types 0 up to the first [SEP] and 1 after it.
// Longer than max_len: BERT's _truncate_seq_pair, one token at a time from the end of the longer
// segment (a on ties) until it fits.
struct EncodedPair {
  std::vector<int32_t> ids;
  std::vector<int8_t> types;
  bool truncated = false;
};
// Fails when max_len cannot hold the special tokens and one token of each non-empty segment.
EncodedPair encode_pair(const Tokenizer& tok, const std::string& text_a, const std::string& text_b,
                        int64_t max_len);

}  // namespace data
