// GLUE (data/glue.h): the task table, the .tsv reader, per-task metrics and submission files.
// Columns and label orders follow HuggingFace transformers' glue processors
// (transformers/data/processors/glue.py), which read the files of the GLUE download script.
#include "data/glue.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <string_view>

#include "data/metrics.h"
#include "engine/error.h"
#include "engine/file_io.h"

namespace data {
namespace {

constexpr int kNone = GlueLayout::kNone;
constexpr int kLast = GlueLayout::kLast;

GlueLayout layout(bool header, int columns, int id, std::string id_name, int text_a,
                  std::string text_a_name, int text_b, std::string text_b_name, int label,
                  std::string label_name) {
  GlueLayout l;
  l.header = header;
  l.columns = columns;
  l.id = id, l.id_name = std::move(id_name);
  l.text_a = text_a, l.text_a_name = std::move(text_a_name);
  l.text_b = text_b, l.text_b_name = std::move(text_b_name);
  l.label = label, l.label_name = std::move(label_name);
  return l;
}

GlueTask task(std::string name, std::string dir, std::vector<std::string> labels,
              std::string metric, GlueLayout labeled, GlueLayout test) {
  GlueTask t;
  t.name = std::move(name);
  t.dir = std::move(dir);
  t.label_names = std::move(labels);
  t.num_labels = static_cast<int>(t.label_names.size());
  t.metric = std::move(metric);
  t.labeled = std::move(labeled);
  t.test = std::move(test);
  t.dev_splits = {"dev"};
  t.test_splits = {"test"};
  return t;
}

std::vector<GlueTask> make_tasks() {
  const std::vector<std::string> binary = {"0", "1"};
  const std::vector<std::string> nli3 = {"contradiction", "entailment", "neutral"};
  const std::vector<std::string> nli2 = {"entailment", "not_entailment"};
  // A pair task whose files are "index, sentence1, sentence2[, label]" (RTE, WNLI; QNLI with its
  // own names): the label is the last column.
  auto pair_labeled = [](std::string a, std::string b) {
    return layout(true, 0, 0, "index", 1, std::move(a), 2, std::move(b), kLast, "label");
  };
  auto pair_test = [](std::string a, std::string b) {
    return layout(true, 0, 0, "index", 1, std::move(a), 2, std::move(b), kNone, "");
  };
  std::vector<GlueTask> t;
  // CoLA train/dev: source, label, original annotation, sentence; no header. Test: index, sentence.
  t.push_back(task("CoLA", "CoLA", binary, "mcc",
                   layout(false, 4, kNone, "", 3, "", kNone, "", 1, ""),
                   layout(true, 0, 0, "index", 1, "sentence", kNone, "", kNone, "")));
  t.push_back(task("SST-2", "SST-2", binary, "acc",
                   layout(true, 0, kNone, "", 0, "sentence", kNone, "", 1, "label"),
                   layout(true, 0, 0, "index", 1, "sentence", kNone, "", kNone, "")));
  // MRPC: "Quality  #1 ID  #2 ID  #1 String  #2 String"; test: "index  #1 ID  #2 ID  ...".
  t.push_back(task("MRPC", "MRPC", binary, "acc_f1",
                   layout(true, 0, kNone, "", 3, "#1 String", 4, "#2 String", 0, "Quality"),
                   layout(true, 0, 0, "index", 3, "#1 String", 4, "#2 String", kNone, "")));
  // STS-B: index genre filename year old_index source1 source2 sentence1 sentence2 [score].
  GlueTask stsb = task("STS-B", "STS-B", {}, "pearson_spearman",
                       layout(true, 0, 0, "index", 7, "sentence1", 8, "sentence2", kLast, "score"),
                       layout(true, 0, 0, "index", 7, "sentence1", 8, "sentence2", kNone, ""));
  stsb.num_labels = 1;
  stsb.regression = true;
  t.push_back(std::move(stsb));
  // QQP: id qid1 qid2 question1 question2 is_duplicate; test: id question1 question2.
  t.push_back(task("QQP", "QQP", binary, "acc_f1",
                   layout(true, 0, 0, "id", 3, "question1", 4, "question2", 5, "is_duplicate"),
                   layout(true, 0, 0, "id", 1, "question1", 2, "question2", kNone, "")));
  // MNLI: index promptID pairID genre 4 parse columns sentence1 sentence2 [label1 (.. label5)
  // gold_label]: 12 columns in train, 16 in dev, 10 in test.
  GlueTask mnli =
      task("MNLI", "MNLI", nli3, "acc",
           layout(true, 0, 0, "index", 8, "sentence1", 9, "sentence2", kLast, "gold_label"),
           layout(true, 0, 0, "index", 8, "sentence1", 9, "sentence2", kNone, ""));
  mnli.dev_splits = {"dev_matched", "dev_mismatched"};
  mnli.test_splits = {"test_matched", "test_mismatched"};
  t.push_back(std::move(mnli));
  t.push_back(task("QNLI", "QNLI", nli2, "acc", pair_labeled("question", "sentence"),
                   pair_test("question", "sentence")));
  t.push_back(task("RTE", "RTE", nli2, "acc", pair_labeled("sentence1", "sentence2"),
                   pair_test("sentence1", "sentence2")));
  t.push_back(task("WNLI", "WNLI", binary, "acc", pair_labeled("sentence1", "sentence2"),
                   pair_test("sentence1", "sentence2")));
  // AX (the diagnostic set): diagnostic/diagnostic.tsv, index sentence1 sentence2, predicted with
  // an MNLI model (MNLI's labels); GLUE scores it by Matthews correlation.
  GlueTask ax =
      task("AX", "diagnostic", nli3, "mcc", GlueLayout{}, pair_test("sentence1", "sentence2"));
  ax.test_only = true;
  ax.dev_splits = {};
  ax.test_splits = {"diagnostic"};
  t.push_back(std::move(ax));
  return t;
}

std::string task_key(const std::string& name) {
  std::string k;
  for (char c : name)
    if (c != '-' && c != '_') k += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return k;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::vector<std::string_view> split_tabs(std::string_view line) {
  std::vector<std::string_view> cols;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    if (tab == std::string_view::npos) {
      cols.push_back(line.substr(start));
      return cols;
    }
    cols.push_back(line.substr(start, tab - start));
    start = tab + 1;
  }
}

// The column a layout field names in a row of `n` columns (kLast → n − 1).
int column_of(int field, size_t n) { return field == kLast ? static_cast<int>(n) - 1 : field; }

// Fewest columns a row of this layout can have: every used column, and with the label in the
// last column, one more than the other used columns.
size_t min_columns(const GlueLayout& l) {
  int highest = -1;
  for (int c : {l.id, l.text_a, l.text_b, l.label}) highest = std::max(highest, c);
  return static_cast<size_t>(highest + 1 + (l.label == kLast ? 1 : 0));
}

std::string shorten(std::string_view s, size_t max = 60) {
  return s.size() <= max ? std::string(s) : std::string(s.substr(0, max)) + "...";
}

// Checks the header's name at one used column.
void check_header_name(const std::vector<std::string_view>& header, int field,
                       const std::string& name, const std::string& where, const std::string& what) {
  if (field == kNone || name.empty()) return;
  const int c = column_of(field, header.size());
  ENGINE_CHECK(header[c] == name, "[glue] ", where, ": header column ", c + 1, " is '",
               shorten(header[c]), "', expected '", name, "' (reading ", what, ")");
}

}  // namespace

const std::vector<GlueTask>& glue_tasks() {
  static const std::vector<GlueTask> tasks = make_tasks();
  return tasks;
}

const GlueTask& glue_task(const std::string& name) {
  const std::string key = task_key(name);
  std::vector<std::string> names;
  for (const GlueTask& t : glue_tasks()) {
    if (task_key(t.name) == key) return t;
    names.push_back(t.name);
  }
  ENGINE_FAIL("[glue] unknown task '", name, "'; known tasks: ", join(names));
}

bool glue_is_test_split(const GlueTask& task, const std::string& split) {
  for (const std::string& s : task.test_splits)
    if (s == split) return true;
  return false;
}

std::string glue_split_path(const GlueTask& task, const std::string& glue_dir,
                            const std::string& split) {
  std::vector<std::string> splits;
  if (!task.test_only) splits.push_back("train");
  splits.insert(splits.end(), task.dev_splits.begin(), task.dev_splits.end());
  splits.insert(splits.end(), task.test_splits.begin(), task.test_splits.end());
  bool known = false;
  for (const std::string& s : splits) known = known || s == split;
  ENGINE_CHECK(known, "[glue] ", task.name, " has no split '", split,
               "'; its splits: ", join(splits));
  std::string dir = glue_dir;
  if (!dir.empty() && dir.back() != '/') dir += '/';
  return dir + task.dir + "/" + split + ".tsv";
}

std::vector<GlueExample> read_glue(const GlueTask& task, const std::string& path, bool test_split,
                                   GlueReadStats* stats) {
  ENGINE_CHECK(test_split || !task.test_only, "[glue] ", path, ": ", task.name,
               " has test files only (unlabeled); read it with test_split = true");
  const GlueLayout& lay = test_split ? task.test : task.labeled;
  const std::string what = "a " + task.name + (test_split ? " test file" : " train/dev file");
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in, "[glue] ", path, ": cannot open (", std::strerror(errno), ") while reading ",
               what);

  GlueReadStats local;
  GlueReadStats& st = stats ? *stats : local;
  st = GlueReadStats{};
  // QQP only, train/dev only: rows with missing columns are skipped (see glue.h).
  const bool skip_short_rows = task.name == "QQP" && !test_split;

  std::vector<GlueExample> out;
  size_t columns = lay.header ? 0 : static_cast<size_t>(lay.columns);
  bool header_pending = lay.header;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // BOM (MRPC)
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const std::vector<std::string_view> cols = split_tabs(line);

    if (header_pending) {
      header_pending = false;
      // Train/dev files have at least the used columns (MNLI: 12 in train, 16 in dev); test
      // files have exactly those, so a labeled file passed as a test file fails here.
      const size_t need = min_columns(lay);
      if (test_split)
        ENGINE_CHECK(cols.size() == need, "[glue] ", where, ": the header has ", cols.size(),
                     " columns, expected ", need, " (reading ", what,
                     "; a train/dev file has a label column)");
      else
        ENGINE_CHECK(cols.size() >= need, "[glue] ", where, ": the header has ", cols.size(),
                     " columns, expected at least ", need, " (reading ", what, ")");
      check_header_name(cols, lay.id, lay.id_name, where, what);
      check_header_name(cols, lay.text_a, lay.text_a_name, where, what);
      check_header_name(cols, lay.text_b, lay.text_b_name, where, what);
      check_header_name(cols, lay.label, lay.label_name, where, what);
      columns = cols.size();
      continue;
    }

    if (cols.size() != columns) {
      if (skip_short_rows && cols.size() < columns) {
        if (st.skipped_rows++ == 0) st.first_skipped_line = line_no;
        continue;
      }
      ENGINE_FAIL("[glue] ", where, ": expected ", columns, " tab-separated columns",
                  lay.header ? " (as the header)" : "", ", got ", cols.size(), " (reading ", what,
                  ")");
    }

    GlueExample ex;
    ex.line = line_no;
    ex.text_a = std::string(cols[lay.text_a]);
    if (lay.text_b != kNone) ex.text_b = std::string(cols[lay.text_b]);
    ex.guid = lay.id != kNone ? std::string(cols[lay.id]) : std::to_string(out.size());
    if (test_split) {
      const std::string_view id = cols[lay.id];
      int64_t index = -1;
      const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), index);
      ENGINE_CHECK(ec == std::errc() && end == id.data() + id.size() && index >= 0 && !id.empty(),
                   "[glue] ", where, ": test id '", shorten(id),
                   "' is not a non-negative integer (column ", lay.id + 1, ", reading ", what, ")");
      ex.index = index;
    } else {
      const std::string_view label = cols[column_of(lay.label, cols.size())];
      if (task.regression) {
        double score = 0;
        const auto [end, ec] = std::from_chars(label.data(), label.data() + label.size(), score);
        ENGINE_CHECK(ec == std::errc() && end == label.data() + label.size() && !label.empty() &&
                         std::isfinite(score),
                     "[glue] ", where, ": score '", shorten(label), "' is not a number (",
                     task.name, " expects a similarity score in [0, 5] in the last column)");
        ENGINE_CHECK(score >= 0 && score <= 5, "[glue] ", where, ": score ", label,
                     " is outside [0, 5] (", task.name, " similarity scores)");
        ex.score = score;
      } else {
        for (size_t k = 0; k < task.label_names.size(); ++k)
          if (label == task.label_names[k]) ex.label = static_cast<int64_t>(k);
        ENGINE_CHECK(ex.label >= 0, "[glue] ", where, ": unknown label '", shorten(label), "' for ",
                     task.name, ", expected one of: ", join(task.label_names));
      }
    }
    out.push_back(std::move(ex));
  }
  ENGINE_CHECK(!in.bad(), "[glue] ", path, ": read error after line ", line_no);
  ENGINE_CHECK(!header_pending, "[glue] ", path, ": empty file (expected ", what, ")");
  ENGINE_CHECK(!out.empty(), "[glue] ", path, ": no examples (expected ", what, ")");
  if (!stats && st.skipped_rows > 0)
    std::cerr << "[glue] warning: " << path << ": skipped " << st.skipped_rows << " " << task.name
              << " row(s) with missing columns (first at line " << st.first_skipped_line << ")\n";
  return out;
}

std::vector<std::pair<std::string, double>> glue_metrics(const GlueTask& task,
                                                         const std::vector<GlueExample>& examples,
                                                         const std::vector<int64_t>& labels,
                                                         const std::vector<double>& scores) {
  ENGINE_CHECK(!task.test_only, "[glue] ", task.name,
               " has no gold labels here (test only): it is scored by gluebenchmark.com");
  const size_t n = examples.size();
  if (task.regression) {
    ENGINE_CHECK(scores.size() == n && labels.empty(), "[glue] ", task.name, " metrics: expected ",
                 n, " scores and no labels, got ", scores.size(), " scores and ", labels.size(),
                 " labels");
    std::vector<double> gold(n);
    for (size_t i = 0; i < n; ++i) gold[i] = examples[i].score;
    return {{"pearson", metrics::pearson(scores, gold)},
            {"spearman", metrics::spearman(scores, gold)}};
  }
  ENGINE_CHECK(labels.size() == n && scores.empty(), "[glue] ", task.name, " metrics: expected ", n,
               " labels and no scores, got ", labels.size(), " labels and ", scores.size(),
               " scores");
  std::vector<int64_t> gold(n);
  for (size_t i = 0; i < n; ++i) {
    gold[i] = examples[i].label;
    ENGINE_CHECK(gold[i] >= 0, "[glue] ", task.name, " metrics: example ", i, " (line ",
                 examples[i].line, ") has no gold label (a test file?)");
  }
  if (task.metric == "mcc") return {{"mcc", metrics::matthews_corrcoef(labels, gold)}};
  if (task.metric == "acc_f1")
    return {{"acc", metrics::accuracy(labels, gold)}, {"f1", metrics::f1_binary(labels, gold, 1)}};
  ENGINE_ASSERT(task.metric == "acc");
  return {{"acc", metrics::accuracy(labels, gold)}};
}

std::string glue_submission_name(const GlueTask& task, const std::string& split) {
  ENGINE_CHECK(glue_is_test_split(task, split), "[glue] no submission file for ", task.name,
               " split '", split, "': predictions are submitted for ", join(task.test_splits));
  if (task.name == "MNLI") return split == "test_matched" ? "MNLI-m.tsv" : "MNLI-mm.tsv";
  return task.name + ".tsv";
}

void write_glue_predictions(const GlueTask& task, const std::vector<GlueExample>& examples,
                            const std::vector<int64_t>& labels, const std::vector<double>& scores,
                            const std::string& path) {
  const size_t n = examples.size();
  ENGINE_CHECK(n > 0, "[glue] ", path, ": no examples to write predictions for");
  if (task.regression)
    ENGINE_CHECK(scores.size() == n && labels.empty(), "[glue] ", path, ": ", task.name,
                 " predictions are scores: expected ", n, " scores and no labels, got ",
                 scores.size(), " scores and ", labels.size(), " labels");
  else
    ENGINE_CHECK(labels.size() == n && scores.empty(), "[glue] ", path, ": ", task.name,
                 " predictions are labels: expected ", n, " labels and no scores, got ",
                 labels.size(), " labels and ", scores.size(), " scores");

  std::string text = "index\tprediction\n";
  std::set<int64_t> seen;
  for (size_t i = 0; i < n; ++i) {
    const GlueExample& ex = examples[i];
    ENGINE_CHECK(ex.index >= 0, "[glue] ", path, ": example ", i, " (line ", ex.line,
                 ") has no test index; submission files are written for test files only");
    ENGINE_CHECK(seen.insert(ex.index).second, "[glue] ", path, ": test index ", ex.index,
                 " appears twice (example ", i, ", line ", ex.line, ")");
    text += std::to_string(ex.index);
    text += '\t';
    if (task.regression) {
      ENGINE_CHECK(std::isfinite(scores[i]), "[glue] ", path, ": score ", i, " is ", scores[i],
                   ", expected a finite value");
      char buf[64];
      const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, scores[i]);
      ENGINE_ASSERT(ec == std::errc());
      text.append(buf, end);
    } else {
      ENGINE_CHECK(labels[i] >= 0 && labels[i] < task.num_labels, "[glue] ", path, ": label ",
                   labels[i], " of example ", i, " is outside [0, ", task.num_labels, ") for ",
                   task.name);
      text += task.label_names[labels[i]];
    }
    text += '\n';
  }

  engine::write_file_atomic(path, text, "glue");
}

EncodedPair encode_pair(const Tokenizer& tok, const std::string& text_a, const std::string& text_b,
                        int64_t max_len) {
  std::vector<int32_t> a = tok.encode(text_a), b = tok.encode(text_b);
  const bool pair = !text_b.empty();
  const int64_t specials = pair ? 3 : 2;
  const int64_t needed = specials + (a.empty() ? 0 : 1) + (pair && !b.empty() ? 1 : 0);
  ENGINE_CHECK(max_len >= needed, "[glue] max_len ", max_len,
               " cannot hold [CLS], [SEP] and one token of each segment (", needed, " positions)");
  EncodedPair out;
  while (int64_t(a.size() + b.size()) + specials > max_len) {
    (a.size() >= b.size() ? a : b).pop_back();
    out.truncated = true;
  }
  const SpecialIds& sp = tok.special();
  out.ids.push_back(sp.cls);
  out.ids.insert(out.ids.end(), a.begin(), a.end());
  out.ids.push_back(sp.sep);
  out.types.assign(out.ids.size(), 0);
  if (pair) {
    out.ids.insert(out.ids.end(), b.begin(), b.end());
    out.ids.push_back(sp.sep);
    out.types.resize(out.ids.size(), 1);
  }
  return out;
}

}  // namespace data
