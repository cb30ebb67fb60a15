// SQuAD features and predictions (data/squad_features.h): run_squad.py's
// convert_examples_to_features (whitespace words, per-word sub-tokens, doc-stride windows,
// _improve_answer_span, _check_is_max_context) and write_predictions (n-best spans, null answer).
#include "data/squad_features.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string_view>
#include <tuple>
#include <utility>

#include "engine/error.h"

namespace data {
namespace {

// A whitespace-separated word of the context: its UTF-8 bytes [begin, end).
struct Word {
  int64_t begin = 0, end = 0;
};

// run_squad.py's is_whitespace: " ", "\t", "\r", "\n" and U+202F (E2 80 AF). Returns the
// whitespace's byte length at `i`, 0 if it is not whitespace.
size_t whitespace_at(const std::string& s, size_t i) {
  const char c = s[i];
  if (c == ' ' || c == '\t' || c == '\r' || c == '\n') return 1;
  if (static_cast<unsigned char>(c) == 0xE2 && i + 2 < s.size() &&
      static_cast<unsigned char>(s[i + 1]) == 0x80 && static_cast<unsigned char>(s[i + 2]) == 0xAF)
    return 3;
  return 0;
}

std::vector<Word> split_words(const std::string& context) {
  std::vector<Word> words;
  bool in_word = false;
  for (size_t i = 0; i < context.size();) {
    if (const size_t ws = whitespace_at(context, i)) {
      in_word = false;
      i += ws;
      continue;
    }
    if (!in_word) words.push_back({static_cast<int64_t>(i), 0});
    in_word = true;
    words.back().end = static_cast<int64_t>(++i);
  }
  return words;
}

// The context's sub-tokens: ids, the word of each, and each word's first sub-token
// (word_first[n_words] = the number of sub-tokens).
struct ContextTokens {
  std::vector<Word> words;
  std::vector<int32_t> ids;
  std::vector<int64_t> word_of;
  std::vector<int64_t> word_first;
};

ContextTokens tokenize_context(const std::string& context, const Tokenizer& tok) {
  ContextTokens c;
  c.words = split_words(context);
  for (size_t w = 0; w < c.words.size(); ++w) {
    c.word_first.push_back(static_cast<int64_t>(c.ids.size()));
    const Word& word = c.words[w];
    for (int32_t id : tok.encode(std::string_view(context).substr(
             static_cast<size_t>(word.begin), static_cast<size_t>(word.end - word.begin)))) {
      c.ids.push_back(id);
      c.word_of.push_back(static_cast<int64_t>(w));
    }
  }
  c.word_first.push_back(static_cast<int64_t>(c.ids.size()));
  return c;
}

// The answer's sub-token range [first, last] (first > last: none), as run_squad.py computes it
// from the words, then _improve_answer_span.
std::pair<int64_t, int64_t> answer_tokens(const ContextTokens& c, const SquadExample& ex,
                                          const Tokenizer& tok) {
  ENGINE_CHECK(!ex.answer_texts.empty() && ex.answer_byte_starts.size() == ex.answer_texts.size(),
               "[squad] question '", ex.id, "': ", ex.answer_texts.size(), " answer texts and ",
               ex.answer_byte_starts.size(),
               " byte offsets (training needs a first gold answer on a question that is not "
               "is_impossible)");
  const int64_t start = ex.answer_byte_starts[0];
  const int64_t end = start + static_cast<int64_t>(ex.answer_texts[0].size());
  ENGINE_CHECK(start >= 0 && end <= static_cast<int64_t>(ex.context.size()), "[squad] question '",
               ex.id, "': answer bytes [", start, ", ", end, ") outside the context (",
               ex.context.size(), " bytes)");
  // Words overlapping [start, end).
  int64_t first_word = -1, last_word = -1;
  for (size_t w = 0; w < c.words.size(); ++w) {
    if (c.words[w].begin < end && c.words[w].end > start) {
      if (first_word < 0) first_word = static_cast<int64_t>(w);
      last_word = static_cast<int64_t>(w);
    }
  }
  if (first_word < 0) return {0, -1};
  const int64_t lo = c.word_first[static_cast<size_t>(first_word)];
  const int64_t hi = c.word_first[static_cast<size_t>(last_word) + 1] - 1;
  // _improve_answer_span: the leftmost sub-span equal to the answer's own tokens (only spans of
  // that length can be equal, so the reference's longest-first inner loop finds the same one).
  const std::vector<int32_t> want = tok.encode(ex.answer_texts[0]);
  const int64_t m = static_cast<int64_t>(want.size());
  if (m > 0) {
    for (int64_t s = lo; s + m - 1 <= hi; ++s) {
      if (std::equal(want.begin(), want.end(), c.ids.begin() + s)) return {s, s + m - 1};
    }
  }
  return {lo, hi};
}

}  // namespace

std::vector<SquadFeature> make_squad_features(const std::vector<SquadExample>& examples,
                                              const Tokenizer& tok,
                                              const SquadFeatureOptions& options, bool training) {
  ENGINE_CHECK(options.max_query_len >= 0, "[squad] max_query_len must be >= 0, got ",
               options.max_query_len);
  ENGINE_CHECK(options.max_len >= options.max_query_len + 4, "[squad] max_len ", options.max_len,
               " is too short for max_query_len ", options.max_query_len,
               " (needs at least max_query_len + 4: [CLS], [SEP], [SEP] and one context token)");
  ENGINE_CHECK(options.doc_stride >= 1, "[squad] doc_stride must be >= 1, got ",
               options.doc_stride);
  const SpecialIds& special = tok.special();

  std::vector<SquadFeature> out;
  for (size_t e = 0; e < examples.size(); ++e) {
    const SquadExample& ex = examples[e];
    std::vector<int32_t> query = tok.encode(ex.question);
    if (static_cast<int64_t>(query.size()) > options.max_query_len)
      query.resize(static_cast<size_t>(options.max_query_len));
    const ContextTokens c = tokenize_context(ex.context, tok);
    const int64_t n = static_cast<int64_t>(c.ids.size());

    int64_t answer_first = 0, answer_last = -1;  // none
    if (training && !ex.is_impossible) {
      std::tie(answer_first, answer_last) = answer_tokens(c, ex, tok);
    }

    // BERT's doc spans.
    const int64_t max_window = options.max_len - static_cast<int64_t>(query.size()) - 3;
    std::vector<std::pair<int64_t, int64_t>> spans;  // (start, length)
    for (int64_t start = 0;;) {
      const int64_t length = std::min(n - start, max_window);
      spans.emplace_back(start, length);
      if (start + length >= n) break;
      start += std::min(length, options.doc_stride);
    }

    const int64_t context_start = static_cast<int64_t>(query.size()) + 2;
    for (size_t s = 0; s < spans.size(); ++s) {
      const auto [start, length] = spans[s];
      SquadFeature f;
      f.example = static_cast<int64_t>(e);
      f.window = static_cast<int64_t>(s);
      f.input_ids.reserve(static_cast<size_t>(context_start + length + 1));
      f.input_ids.push_back(special.cls);
      f.input_ids.insert(f.input_ids.end(), query.begin(), query.end());
      f.input_ids.push_back(special.sep);
      f.input_ids.insert(f.input_ids.end(), c.ids.begin() + start, c.ids.begin() + start + length);
      f.input_ids.push_back(special.sep);
      f.token_types.assign(f.input_ids.size(), 1);
      std::fill(f.token_types.begin(), f.token_types.begin() + context_start, int8_t{0});
      f.context_start = context_start;
      f.token_word.assign(c.word_of.begin() + start, c.word_of.begin() + start + length);
      // _check_is_max_context: the window where min(left, right) + 0.01 * length is largest (the
      // first one on ties).
      f.max_context.resize(static_cast<size_t>(length));
      for (int64_t p = start; p < start + length; ++p) {
        double best_score = 0;
        size_t best = spans.size();
        for (size_t o = 0; o < spans.size(); ++o) {
          const int64_t o_start = spans[o].first, o_end = spans[o].first + spans[o].second - 1;
          if (p < o_start || p > o_end) continue;
          const double score = static_cast<double>(std::min(p - o_start, o_end - p)) +
                               0.01 * static_cast<double>(spans[o].second);
          if (best == spans.size() || score > best_score) best_score = score, best = o;
        }
        f.max_context[static_cast<size_t>(p - start)] = best == s ? 1 : 0;
      }
      if (answer_first <= answer_last && answer_first >= start &&
          answer_last <= start + length - 1) {
        f.start_position = answer_first - start + context_start;
        f.end_position = answer_last - start + context_start;
      }
      out.push_back(std::move(f));
    }
  }
  return out;
}

namespace {

struct Prelim {
  size_t feature = 0;          // index into the example's features
  int64_t start = 0, end = 0;  // positions in input_ids (0, 0: the null answer)
  double start_logit = 0, end_logit = 0;
};

// _get_best_indexes: the n positions with the largest values, largest first, ties to the lower
// position (Python's stable sort).
std::vector<int64_t> best_indexes(const std::vector<float>& logits, size_t size, int64_t n) {
  std::vector<int64_t> idx(size);
  std::iota(idx.begin(), idx.end(), int64_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  if (static_cast<int64_t>(idx.size()) > n) idx.resize(static_cast<size_t>(n));
  return idx;
}

}  // namespace

std::vector<SquadAnswer> squad_predictions(const std::vector<SquadExample>& examples,
                                           const std::vector<SquadFeature>& features,
                                           const std::vector<std::vector<float>>& start_logits,
                                           const std::vector<std::vector<float>>& end_logits,
                                           const SquadPredictOptions& options) {
  ENGINE_CHECK(options.n_best >= 1, "[squad] n_best must be >= 1, got ", options.n_best);
  ENGINE_CHECK(options.max_answer_len >= 1, "[squad] max_answer_len must be >= 1, got ",
               options.max_answer_len);
  ENGINE_CHECK(start_logits.size() == features.size() && end_logits.size() == features.size(),
               "[squad] squad_predictions: ", features.size(), " features but ",
               start_logits.size(), " start and ", end_logits.size(), " end logit rows");

  std::vector<std::vector<size_t>> of_example(examples.size());
  for (size_t f = 0; f < features.size(); ++f) {
    const SquadFeature& ft = features[f];
    ENGINE_CHECK(ft.example >= 0 && ft.example < static_cast<int64_t>(examples.size()),
                 "[squad] squad_predictions: feature ", f, " names example ", ft.example, " of ",
                 examples.size());
    const size_t n_ids = ft.input_ids.size();
    ENGINE_CHECK(start_logits[f].size() >= n_ids && end_logits[f].size() >= n_ids,
                 "[squad] squad_predictions: feature ", f, " has ", n_ids, " input ids but ",
                 start_logits[f].size(), " start and ", end_logits[f].size(), " end logits");
    const size_t window = ft.token_word.size();
    ENGINE_CHECK(ft.context_start >= 1 && ft.max_context.size() == window &&
                     static_cast<size_t>(ft.context_start) + window + 1 == n_ids,
                 "[squad] squad_predictions: feature ", f, " is inconsistent (", n_ids,
                 " input ids, context_start ", ft.context_start, ", ", window, " token_word and ",
                 ft.max_context.size(), " max_context entries)");
    of_example[static_cast<size_t>(ft.example)].push_back(f);
  }

  std::vector<SquadAnswer> answers;
  answers.reserve(examples.size());
  for (size_t e = 0; e < examples.size(); ++e) {
    const SquadExample& ex = examples[e];
    const std::vector<size_t>& feats = of_example[e];
    ENGINE_CHECK(!feats.empty(), "[squad] squad_predictions: question '", ex.id, "' (example ", e,
                 ") has no features");
    const std::vector<Word> words = split_words(ex.context);

    std::vector<Prelim> prelim;
    double null_score = std::numeric_limits<double>::infinity();
    Prelim null;
    for (size_t k = 0; k < feats.size(); ++k) {
      const SquadFeature& ft = features[feats[k]];
      const std::vector<float>& sl = start_logits[feats[k]];
      const std::vector<float>& el = end_logits[feats[k]];
      const size_t n_ids = ft.input_ids.size();
      for (int64_t w : ft.token_word) {
        ENGINE_CHECK(w >= 0 && w < static_cast<int64_t>(words.size()),
                     "[squad] squad_predictions: feature ", feats[k], " names word ", w, " but '",
                     ex.id, "' has ", words.size(), " context words");
      }
      if (options.version_2) {
        const double score = static_cast<double>(sl[0]) + static_cast<double>(el[0]);
        if (score < null_score) {
          null_score = score;
          null = {k, 0, 0, sl[0], el[0]};
        }
      }
      const int64_t ctx_first = ft.context_start;
      const int64_t ctx_last = ft.context_start + static_cast<int64_t>(ft.token_word.size()) - 1;
      const std::vector<int64_t> starts = best_indexes(sl, n_ids, options.n_best);
      const std::vector<int64_t> ends = best_indexes(el, n_ids, options.n_best);
      for (int64_t s : starts) {
        for (int64_t t : ends) {
          if (s < ctx_first || s > ctx_last || t < ctx_first || t > ctx_last) continue;
          if (!ft.max_context[static_cast<size_t>(s - ctx_first)]) continue;
          if (t < s || t - s + 1 > options.max_answer_len) continue;
          prelim.push_back({k, s, t, sl[static_cast<size_t>(s)], el[static_cast<size_t>(t)]});
        }
      }
    }
    if (options.version_2) prelim.push_back(null);
    std::stable_sort(prelim.begin(), prelim.end(), [](const Prelim& a, const Prelim& b) {
      return a.start_logit + a.end_logit > b.start_logit + b.end_logit;
    });

    SquadAnswer ans;
    ans.id = ex.id;
    bool have_null = false;
    for (const Prelim& p : prelim) {
      if (static_cast<int64_t>(ans.n_best.size()) >= options.n_best) break;
      std::string text;
      if (p.start > 0) {
        const SquadFeature& ft = features[feats[p.feature]];
        const Word& first = words[static_cast<size_t>(
            ft.token_word[static_cast<size_t>(p.start - ft.context_start)])];
        const Word& last = words[static_cast<size_t>(
            ft.token_word[static_cast<size_t>(p.end - ft.context_start)])];
        text = ex.context.substr(static_cast<size_t>(first.begin),
                                 static_cast<size_t>(last.end - first.begin));
        const bool seen = std::any_of(ans.n_best.begin(), ans.n_best.end(),
                                      [&](const SquadCandidate& c) { return c.text == text; });
        if (seen) continue;
      } else {
        have_null = true;
      }
      ans.n_best.push_back({std::move(text), p.start_logit, p.end_logit, 0.0});
    }
    if (options.version_2 && !have_null)
      ans.n_best.push_back({"", null.start_logit, null.end_logit, 0.0});

    // _compute_softmax over the scores.
    double max_score = -std::numeric_limits<double>::infinity();
    for (const SquadCandidate& c : ans.n_best)
      max_score = std::max(max_score, c.start_logit + c.end_logit);
    double total = 0;
    for (SquadCandidate& c : ans.n_best)
      total += c.probability = std::exp(c.start_logit + c.end_logit - max_score);
    for (SquadCandidate& c : ans.n_best) c.probability /= total;

    const auto best = std::find_if(ans.n_best.begin(), ans.n_best.end(),
                                   [](const SquadCandidate& c) { return !c.text.empty(); });
    if (best == ans.n_best.end()) {
      ans.text = "";
      ans.null_score_diff = options.version_2 ? std::numeric_limits<double>::max() : 0.0;
    } else if (options.version_2) {
      ans.null_score_diff = null_score - best->start_logit - best->end_logit;  // as BERT
      ans.text = ans.null_score_diff > options.null_threshold ? "" : best->text;
    } else {
      ans.text = best->text;
    }
    answers.push_back(std::move(ans));
  }
  return answers;
}

}  // namespace data
