// SQuAD v1.1 / v2.0: a reader for the official JSON files and the official evaluation
// (evaluate-v1.1.py / evaluate-v2.0.py: answer normalisation, exact match, token F1, the
// no-answer threshold and its best-threshold search). docs/finetune.md ("Data formats and
// metrics") describes both.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace data {

struct SquadExample {
  std::string id, question, context;
  // Gold answers in file order (several in dev files, one in train files; none when impossible).
  std::vector<std::string> answer_texts;
  // Where each answer starts in `context`: in Unicode code points, as the file gives it (Python
  // string indices), and as a UTF-8 byte offset into `context` (for slicing the std::string).
  std::vector<int64_t> answer_starts;
  std::vector<int64_t> answer_byte_starts;
  bool is_impossible = false;  // v2.0 unanswerable question
};

// Reads a SQuAD v1.1 or v2.0 file: {"data": [{"paragraphs": [{"context", "qas": [{"id",
// "question", "answers": [{"text", "answer_start"}], "is_impossible" (v2.0, optional, default
// false)}]}]}]}. Other keys ("version", "title", "plausible_answers") are ignored. Checks: the
// structure and types, unique question ids, every answer's text found in the context at
// answer_start (code points), an impossible question having no answers and any other question at
// least one.
//
// Errors (engine::Error, "[squad] <path>: ..."): a missing file; invalid JSON (with nlohmann's
// position); a missing key or wrong type, naming its JSON path and what was expected
// (`data[3].paragraphs[0].qas[2].answers[0].answer_start: expected a non-negative integer, got
// "12"`); an answer not at its answer_start, naming the question id.
std::vector<SquadExample> read_squad(const std::string& path);

// The official normalize_answer: lower-case (Unicode, as Python's str.lower()), remove ASCII
// punctuation (Python's string.punctuation), remove the words "a", "an", "the" (whole words,
// Python's Unicode \b), collapse whitespace (Python's str.split()) into single spaces. Invalid
// UTF-8 bytes become U+FFFD.
std::string squad_normalize(const std::string& text);

// 1 if the normalised strings are equal, else 0.
double squad_exact(const std::string& prediction, const std::string& gold);
// Token F1 over the normalised whitespace tokens (a multiset intersection): 2·P·R / (P + R) with
// P = common / prediction tokens, R = common / gold tokens; 0 when nothing is common. v2.0 rule:
// when either side normalises to no tokens, F1 = 1 if both do, else 0 (v1.1 gave 0 for two
// empty answers; the cases differ only there).
double squad_f1(const std::string& prediction, const std::string& gold);

struct SquadScores {
  // Percentages (×100) over all questions, as the scripts print them, after the no-answer
  // threshold. NaN marks a value the v2.0 script leaves out: has_ans_* without answerable
  // questions, no_ans_exact without unanswerable ones, best_* without na_probs.
  double exact = 0, f1 = 0;
  int64_t total = 0, has_ans = 0, no_ans = 0;
  double has_ans_exact = 0, has_ans_f1 = 0;
  double no_ans_exact = 0;  // F1 on unanswerable questions equals their exact match
  double best_exact = 0, best_exact_thresh = 0, best_f1 = 0, best_f1_thresh = 0;
};

// evaluate-v2.0.py over `examples` (which also reproduces evaluate-v1.1.py on v1.1 data, where
// no normalised gold answer is empty): per question, the max of squad_exact / squad_f1 over its
// gold answers whose normalised text is non-empty (only "" when there are none: unanswerable).
// With `na_probs` (question id → probability of no answer, required for every question), a
// question whose probability exceeds `na_threshold` is scored as an empty prediction, and the
// best-threshold search (find_best_thresh) fills best_*: questions sorted by probability (stable,
// in `examples` order, as the script walks its na_prob file), the running score starting from
// "answer nothing" and each question switching to its prediction; the best score and the
// probability where it is reached.
//
// A question without a prediction counts as predicted "" (evaluate-v1.1.py scores it 0, which
// "" gives on an answerable question; evaluate-v2.0.py leaves it out of the totals). Predictions
// and probabilities for ids not in `examples` are ignored. Fails on no examples or a missing or
// non-finite probability.
SquadScores evaluate_squad(const std::vector<SquadExample>& examples,
                           const std::map<std::string, std::string>& predictions,
                           const std::map<std::string, double>* na_probs = nullptr,
                           double na_threshold = 1.0);

}  // namespace data
