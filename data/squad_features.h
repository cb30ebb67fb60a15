// SQuAD for a BERT-style span model, as google-research/bert's run_squad.py does it: the model
// inputs of each question (doc-stride windows over the tokenized context, with training targets
// and the "max context" marks), and the way back from start/end logits to answer texts
// (write_predictions: n-best spans, the v2.0 null answer and its threshold). docs/finetune.md
// ("SQuAD features and predictions") describes both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/squad.h"
#include "data/tokenizer.h"

namespace data {

struct SquadFeatureOptions {
  int64_t max_len = 384;       // whole input: [CLS] question [SEP] window [SEP]
  int64_t doc_stride = 128;    // the window advances by this many context tokens
  int64_t max_query_len = 64;  // question tokens beyond this are cut
};

// One window of one question. The context is split as run_squad.py does: whitespace-separated
// words (Python's c.isspace() for " \t\r\n" and U+202F only), each with its UTF-8 byte range in
// the context; each word is tokenized alone (tok.encode(word)) and its sub-tokens point back to it.
struct SquadFeature {
  int64_t example = 0;              // index into the examples vector
  int64_t window = 0;               // 0, 1, ... within the example
  std::vector<int32_t> input_ids;   // [CLS] q [SEP] window tokens [SEP]  (no padding)
  std::vector<int8_t> token_types;  // 0 for [CLS] q [SEP], 1 for the window and its [SEP]
  int64_t context_start = 0;        // position in input_ids of the window's first token
  // Per window token (size = the number of window tokens): its word index.
  std::vector<int64_t> token_word;
  // Per window token: 1 when this window gives it the most context (BERT's _check_is_max_context:
  // min(left, right) + 0.01 * length, ties to the earlier window: exactly one window per token).
  std::vector<uint8_t> max_context;
  // Training targets, positions in input_ids: the answer's first and last sub-token when the whole
  // answer lies in this window; 0 and 0 ([CLS]) when it does not or the question is impossible
  // (and always 0 and 0 when not training).
  int64_t start_position = 0, end_position = 0;
};

// Windows for every example, in order (features of one example are consecutive).
//
// Question: tok.encode(question), cut to max_query_len tokens (q of them). Windows: length
// max_len - q - 3 context tokens; the first starts at context token 0, each next one
// min(length, doc_stride) later (BERT's loop: no token is skipped when doc_stride exceeds the
// length), until a window reaches the last context token. An example whose context has no tokens
// still gives one window with no context tokens (BERT gives none).
//
// `training`: targets from the FIRST gold answer (answer_byte_starts[0], answer_texts[0]). Its
// words are those overlapping its byte range [start, start + size); the sub-token range of those
// words is then tightened as BERT's _improve_answer_span does: the first (leftmost) sub-span whose
// ids equal tok.encode(answer_text), else the whole words' range. An answer that overlaps no word
// or whose words have no sub-tokens gets 0/0 everywhere.
//
// Errors (engine::Error "[squad] ..."): max_len leaving no room for one context token after a full
// question (max_len < max_query_len + 4: "max_len N is too short for max_query_len M");
// doc_stride < 1; max_query_len < 0; when training, an answerable example without a gold answer
// or whose first answer lies outside its context.
std::vector<SquadFeature> make_squad_features(const std::vector<SquadExample>& examples,
                                              const Tokenizer& tok,
                                              const SquadFeatureOptions& options, bool training);

struct SquadPredictOptions {
  int64_t n_best = 20;          // candidates kept per question
  int64_t max_answer_len = 30;  // in sub-tokens
  bool version_2 = false;       // consider the null answer ([CLS], position 0)
  double null_threshold = 0.0;  // v2: predict "" when null_score - best_span_score > threshold
};

struct SquadCandidate {
  std::string text;  // "" for the null answer
  double start_logit = 0, end_logit = 0;
  double probability = 0;  // softmax over the n-best list's scores (start + end)
};

struct SquadAnswer {
  std::string id;
  std::string text;            // the prediction after the threshold ("" = no answer)
  double null_score_diff = 0;  // v2: min null score over windows - best span score (for
                               // evaluate_squad's na_probs with threshold null_threshold);
                               // 0 for v1; the largest finite double when no span is valid
  // Best first; at most n_best entries, plus the null entry for v2.
  std::vector<SquadCandidate> n_best;
};

// BERT's write_predictions. For each example, over its features (in order): the top n_best start
// and end positions of each feature by logit (over its input_ids; ties to the lower position),
// paired when start <= end, both among the window's context tokens, max_context[start] set and
// end - start + 1 <= max_answer_len; score = start_logit + end_logit. Candidates are sorted by
// score (stable), deduplicated by text, and n_best kept; probabilities are their softmax.
//
// A span's text is the ORIGINAL context from the first byte of its first word to the last byte of
// its last word, i.e. whole words with their original spacing. This simplifies BERT's
// get_final_text, which trims the words to the sub-token span (so a span covering only "1895" of
// the word "(1895)" answers "(1895)" here, "1895" in BERT); the official normalisation drops the
// punctuation that this mostly adds, but a span ending inside a word that is not split off by
// punctuation ("hugging" of "huggingface") gives the whole word.
//
// v2: a feature's null score is start_logits[0] + end_logits[0]; the null candidate ("") takes the
// feature with the smallest one and joins the candidates (appended after the n_best if it did not
// make them); text = "" when null_score - best_non_null_score > null_threshold, else the best
// non-null text. When no span is valid the answer is "" (v1 too; v1's n_best is then empty).
//
// `start_logits[f]` / `end_logits[f]` are feature f's logits over its input_ids (at least
// input_ids.size() values; extra trailing values, e.g. padding, are ignored). Fails on a size
// mismatch, a feature naming an example out of range or inconsistent with it, an example without
// features, n_best < 1 or max_answer_len < 1.
std::vector<SquadAnswer> squad_predictions(const std::vector<SquadExample>& examples,
                                           const std::vector<SquadFeature>& features,
                                           const std::vector<std::vector<float>>& start_logits,
                                           const std::vector<std::vector<float>>& end_logits,
                                           const SquadPredictOptions& options);

}  // namespace data
