// SQuAD features and predictions (data/squad_features.h) with a tiny WordPiece vocab written here:
// the input layout, word pointers and training targets (sub-word answers, _improve_answer_span
// tightening), doc-stride windows and max-context flags against hand-computed values, the option
// errors; n-best span extraction from hand-made logits (original spacing, length and order limits,
// max context, dedup, probabilities, the v2.0 null answer), and a features → logits → answers →
// evaluate_squad round trip.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "data/squad.h"
#include "data/squad_features.h"
#include "data/tokenizer.h"
#include "engine/error.h"
#include "test_support.h"

using Catch::Contains;
using engine::testing::error_of;
using engine::testing::TempDir;

namespace {

std::unique_ptr<data::Tokenizer> tiny_tokenizer(const TempDir& dir) {
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (const char* w : {"the", "cat", "sat", "on", "mat", "(", ")", "1895", "hug", "##ging",
                        "##face", ".", "?", "who", "what", "when", "was", "born", "is"})
    vocab += std::string(w) + "\n";
  for (int i = 0; i < 20; ++i) vocab += "t" + std::to_string(i) + "\n";
  return data::load_wordpiece(dir.write("vocab.txt", vocab), true);
}

// An example whose first answer is `answer` at its first occurrence in `context` (none:
// impossible).
data::SquadExample example(const std::string& id, const std::string& question,
                           const std::string& context, const std::string& answer = "") {
  data::SquadExample ex;
  ex.id = id;
  ex.question = question;
  ex.context = context;
  ex.is_impossible = answer.empty();
  if (!answer.empty()) {
    const size_t at = context.find(answer);
    REQUIRE(at != std::string::npos);
    ex.answer_texts = {answer};
    ex.answer_byte_starts = {static_cast<int64_t>(at)};
    ex.answer_starts = {static_cast<int64_t>(at)};  // ASCII contexts where it matters
  }
  return ex;
}

std::vector<int32_t> ids(const data::Tokenizer& tok, const std::vector<std::string>& pieces) {
  std::vector<int32_t> out;
  for (const std::string& p : pieces) {
    const int32_t id = tok.piece_to_id(p);
    REQUIRE(id >= 0);
    out.push_back(id);
  }
  return out;
}

// "t0 t1 ... t{n-1}": one token per word.
std::string t_words(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? " t" : "t") + std::to_string(i);
  return s;
}

// Rows of `fill` for each feature, `pad` values longer than its input_ids (ignored padding).
std::vector<std::vector<float>> rows(const std::vector<data::SquadFeature>& features, float fill,
                                     size_t pad = 0) {
  std::vector<std::vector<float>> out;
  for (const auto& f : features) out.emplace_back(f.input_ids.size() + pad, fill);
  return out;
}

// The context of the short cases: two spaces and a tab between words, a word split into
// "(" "1895" ")" and one into "hug" "##ging" "##face" ".".
const std::string kShort = "The  cat (1895) sat\ton huggingface.";

}  // namespace

TEST_CASE("squad features: one window's layout, word pointers and targets", "[squad_features]") {
  TempDir dir;
  const auto tok = tiny_tokenizer(dir);
  // Words: 0 "The", 1 "cat", 2 "(1895)", 3 "sat", 4 "on", 5 "huggingface.". Sub-tokens (context
  // index: piece/word): 0 the/0, 1 cat/1, 2 (/2, 3 1895/2, 4 )/2, 5 sat/3, 6 on/4, 7 hug/5,
  // 8 ##ging/5, 9 ##face/5, 10 ./5. The question has 6 tokens: the window starts at 8.
  const std::string q = "When was the cat born?";
  const std::vector<data::SquadExample> ex = {
      example("year", q, kShort, "1895"),         // tightened inside "(1895)": 3..3
      example("word", q, kShort, "huggingface"),  // sub-word split, "." dropped: 7..9
      example("two", q, kShort, "cat (1895)"),    // two words: 1..4
      example("inner", q, kShort, "ugging"),      // no sub-span matches: the word, 7..10
      example("none", q, kShort)};                // impossible
  const auto f = data::make_squad_features(ex, *tok, {}, true);
  REQUIRE(f.size() == 5);

  const std::vector<int32_t> expected_ids =
      ids(*tok, {"[CLS]", "when", "was", "the", "cat", "born", "?",      "[SEP]",  "the", "cat",
                 "(",     "1895", ")",   "sat", "on",  "hug",  "##ging", "##face", ".",   "[SEP]"});
  for (size_t i = 0; i < f.size(); ++i) {
    CHECK(f[i].example == int64_t(i));
    CHECK(f[i].window == 0);
    CHECK(f[i].input_ids == expected_ids);
    CHECK(f[i].context_start == 8);
    CHECK(f[i].token_types ==
          std::vector<int8_t>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
    CHECK(f[i].token_word == std::vector<int64_t>{0, 1, 2, 2, 2, 3, 4, 5, 5, 5, 5});
    CHECK(f[i].max_context == std::vector<uint8_t>(11, 1));
  }
  CHECK(f[0].start_position == 11);
  CHECK(f[0].end_position == 11);
  CHECK(f[1].start_position == 15);
  CHECK(f[1].end_position == 17);
  CHECK(f[2].start_position == 9);
  CHECK(f[2].end_position == 12);
  CHECK(f[3].start_position == 15);
  CHECK(f[3].end_position == 18);
  CHECK(f[4].start_position == 0);
  CHECK(f[4].end_position == 0);

  // Not training: no targets.
  for (const auto& g : data::make_squad_features(ex, *tok, {}, false)) {
    CHECK(g.start_position == 0);
    CHECK(g.end_position == 0);
  }
}

TEST_CASE("squad features: words split on run_squad.py's whitespace only", "[squad_features]") {
  TempDir dir;
  const auto tok = tiny_tokenizer(dir);
  // U+202F, "\r\n" split words; U+00A0 does not (the tokenizer still splits there: two
  // sub-tokens of one word).
  const std::string context = "cat\xE2\x80\xAFsat\xC2\xA0on\r\n mat";
  const auto f = data::make_squad_features({example("q", "who", context, "on")}, *tok, {}, true);
  REQUIRE(f.size() == 1);
  CHECK(f[0].input_ids == ids(*tok, {"[CLS]", "who", "[SEP]", "cat", "sat", "on", "mat", "[SEP]"}));
  CHECK(f[0].token_word == std::vector<int64_t>{0, 1, 1, 2});
  CHECK(f[0].context_start == 3);
  CHECK(f[0].start_position == 5);  // word 1 = "sat on", tightened to "on"
  CHECK(f[0].end_position == 5);

  // A context without tokens: one window with no context tokens.
  const auto e = data::make_squad_features({example("e", "who", " \t\n")}, *tok, {}, true);
  REQUIRE(e.size() == 1);
  CHECK(e[0].input_ids == ids(*tok, {"[CLS]", "who", "[SEP]", "[SEP]"}));
  CHECK(e[0].token_types == std::vector<int8_t>{0, 0, 0, 1});
  CHECK(e[0].context_start == 3);
  CHECK(e[0].token_word.empty());
  CHECK(e[0].max_context.empty());
  CHECK(e[0].start_position == 0);
}

TEST_CASE("squad features: doc-stride windows, max context and targets", "[squad_features]") {
  TempDir dir;
  const auto tok = tiny_tokenizer(dir);
  // 20 context tokens t0..t19, question "what is" (2 tokens): max_len 10 leaves windows of
  // 10 - 2 - 3 = 5 tokens, the window starts at input position 4. Stride 2: starts 0, 2, ..., 14
  // (length 5), then 16 with the last 4 tokens (16 + 4 = 20 ends the loop): 9 windows.
  const std::vector<data::SquadExample> ex = {example("long", "what is", t_words(20), "t9 t10")};
  data::SquadFeatureOptions opt;
  opt.max_len = 10;
  opt.max_query_len = 4;  // 10 >= 4 + 4 (the default 64 would be refused)
  opt.doc_stride = 2;
  const auto f = data::make_squad_features(ex, *tok, opt, true);
  REQUIRE(f.size() == 9);
  std::vector<int> windows_of_max(20, 0);
  for (size_t w = 0; w < f.size(); ++w) {
    INFO("window " << w);
    const int64_t start = 2 * int64_t(w);
    const int64_t length = w < 8 ? 5 : 4;
    CHECK(f[w].example == 0);
    CHECK(f[w].window == int64_t(w));
    CHECK(f[w].context_start == 4);
    REQUIRE(f[w].input_ids.size() == size_t(4 + length + 1));
    REQUIRE(f[w].token_word.size() == size_t(length));
    for (int64_t k = 0; k < length; ++k) {
      CHECK(f[w].token_word[size_t(k)] == start + k);
      CHECK(f[w].input_ids[size_t(4 + k)] == tok->piece_to_id("t" + std::to_string(start + k)));
    }
    CHECK(f[w].input_ids.back() == tok->special().sep);
    // Max context, min(left, right) + 0.01 * length: window 0 keeps t0..t3 (t3: 1.05 against
    // window 1's 1.05, the earlier wins), every later window the 3rd and 4th of its tokens
    // (window 8: t18 at 1.04 beats window 7's 0.05).
    const std::vector<uint8_t> expected_max =
        w == 0 ? std::vector<uint8_t>{1, 1, 1, 1, 0}
               : (w < 8 ? std::vector<uint8_t>{0, 0, 1, 1, 0} : std::vector<uint8_t>{0, 0, 1, 1});
    CHECK(f[w].max_context == expected_max);
    for (int64_t k = 0; k < length; ++k)
      windows_of_max[size_t(start + k)] += f[w].max_context[size_t(k)];
    // The answer t9..t10 lies wholly in windows 3 (t6..t10) and 4 (t8..t12) only.
    if (w == 3) {
      CHECK(f[w].start_position == 4 + 3);
      CHECK(f[w].end_position == 4 + 4);
    } else if (w == 4) {
      CHECK(f[w].start_position == 4 + 1);
      CHECK(f[w].end_position == 4 + 2);
    } else {
      CHECK(f[w].start_position == 0);
      CHECK(f[w].end_position == 0);
    }
  }
  CHECK(windows_of_max == std::vector<int>(20, 1));

  // A stride longer than the window advances by the window (BERT's min(length, doc_stride)).
  opt.doc_stride = 100;
  const auto g = data::make_squad_features(ex, *tok, opt, true);
  REQUIRE(g.size() == 4);
  for (size_t w = 0; w < 4; ++w) {
    CHECK(g[w].token_word.front() == int64_t(5 * w));
    CHECK(g[w].max_context == std::vector<uint8_t>(5, 1));
    // t9 is window 1's last token, t10 window 2's first: no window holds the whole answer.
    CHECK(g[w].start_position == 0);
    CHECK(g[w].end_position == 0);
  }
}

TEST_CASE("squad features: question truncation and option errors", "[squad_features]") {
  TempDir dir;
  const auto tok = tiny_tokenizer(dir);
  const std::vector<data::SquadExample> ex = {
      example("q", "t0 t1 t2 t3 t4 t5", "the cat sat on the mat", "mat")};
  data::SquadFeatureOptions opt;
  opt.max_query_len = 3;
  opt.max_len = 7;  // 3 + 4: one context token per window
  const auto f = data::make_squad_features(ex, *tok, opt, true);
  REQUIRE(f.size() == 6);
  CHECK(f[0].input_ids == ids(*tok, {"[CLS]", "t0", "t1", "t2", "[SEP]", "the", "[SEP]"}));
  CHECK(f[0].context_start == 5);
  CHECK(f[5].input_ids == ids(*tok, {"[CLS]", "t0", "t1", "t2", "[SEP]", "mat", "[SEP]"}));
  CHECK(f[5].start_position == 5);
  CHECK(f[5].end_position == 5);
  CHECK(f[4].start_position == 0);  // "the": not the answer

  opt.max_len = 6;
  CHECK(error_of([&] { data::make_squad_features(ex, *tok, opt, true); }) ==
        "[squad] max_len 6 is too short for max_query_len 3 (needs at least max_query_len + 4: "
        "[CLS], [SEP], [SEP] and one context token)");
  opt.max_len = 384;
  opt.doc_stride = 0;
  CHECK_THAT(error_of([&] { data::make_squad_features(ex, *tok, opt, true); }),
             Contains("[squad] doc_stride must be >= 1, got 0"));
  opt.doc_stride = 128;
  CHECK(data::make_squad_features(ex, *tok, opt, true).size() == 1);

  // Training needs the first answer of an answerable question.
  data::SquadExample bad = ex[0];
  bad.answer_texts.clear();
  bad.answer_byte_starts.clear();
  CHECK_THAT(error_of([&] { data::make_squad_features({bad}, *tok, opt, true); }),
             Contains("question 'q'"));
  CHECK(data::make_squad_features({bad}, *tok, opt, false).size() == 1);
  bad = ex[0];
  bad.answer_byte_starts = {20};
  CHECK_THAT(error_of([&] { data::make_squad_features({bad}, *tok, opt, true); }),
             Contains("outside the context"));
}

TEST_CASE("squad features: impossible questions have 0/0 targets in every window",
          "[squad_features]") {
  TempDir dir;
  const auto tok = tiny_tokenizer(dir);
  data::SquadFeatureOptions opt;
  opt.max_len = 10;
  opt.max_query_len = 4;
  opt.doc_stride = 3;
  const auto f = data::make_squad_features({example("x", "what is", t_words(12))}, *tok, opt, true);
  REQUIRE(f.size() == 4);  // starts 0, 3, 6 (length 5), 9 (the last 3 tokens)
  for (const auto& g : f) {
    CHECK(g.start_position == 0);
    CHECK(g.end_position == 0);
  }
}

TEST_CASE("squad predictions: the best span, its original text and the candidate rules",
          "[squad_features]") {
  TempDir dir;
  const auto tok = tiny_tokenizer(dir);
  // "who sat?" has 3 tokens: context index i is at input position 5 + i (kShort's list above):
  // 5 the, 6 cat, 7 (, 8 1895, 9 ), 10 sat, 11 on, 12 hug, 13 ##ging, 14 ##face, 15 ., 16 [SEP].
  const std::vector<data::SquadExample> ex = {example("s", "who sat?", kShort, "cat")};
  const auto f = data::make_squad_features(ex, *tok, {}, false);
  REQUIRE(f.size() == 1);
  REQUIRE(f[0].context_start == 5);
  REQUIRE(f[0].input_ids.size() == 17);
  auto start = rows(f, -10.0f, 3), end = rows(f, -10.0f, 3);  // 3 padding values, ignored
  data::SquadPredictOptions opt;

  SECTION("original spacing, the whole words") {
    start[0][6] = 5, end[0][11] = 5;  // cat .. on
    auto a = data::squad_predictions(ex, f, start, end, opt);
    REQUIRE(a.size() == 1);
    CHECK(a[0].id == "s");
    CHECK(a[0].text == "cat (1895) sat\ton");
    CHECK(a[0].null_score_diff == 0);
    REQUIRE(a[0].n_best.size() == 20);
    CHECK(a[0].n_best[0].text == "cat (1895) sat\ton");
    CHECK(a[0].n_best[0].start_logit == 5);
    CHECK(a[0].n_best[0].end_logit == 5);
    double sum = 0;
    for (const auto& c : a[0].n_best) sum += c.probability;
    CHECK(sum == Approx(1.0).epsilon(1e-12));
    // A sub-token span gives its whole word (the documented simplification).
    start[0][6] = -10, start[0][8] = 5, end[0][11] = -10, end[0][8] = 5;
    a = data::squad_predictions(ex, f, start, end, opt);
    CHECK(a[0].text == "(1895)");
    start[0][8] = -10, start[0][12] = 5, end[0][8] = -10, end[0][13] = 5;
    CHECK(data::squad_predictions(ex, f, start, end, opt)[0].text == "huggingface.");
  }

  SECTION("max_answer_len counts sub-tokens") {
    start[0][6] = 5, end[0][15] = 6, end[0][10] = 1;  // cat .. "." (10 tokens): 11; cat .. sat: 6
    CHECK(data::squad_predictions(ex, f, start, end, opt)[0].text ==
          "cat (1895) sat\ton huggingface.");
    opt.max_answer_len = 9;
    CHECK(data::squad_predictions(ex, f, start, end, opt)[0].text == "cat (1895) sat");
    opt.max_answer_len = 5;  // cat .. sat is 5 tokens
    CHECK(data::squad_predictions(ex, f, start, end, opt)[0].text == "cat (1895) sat");
    // 4: the best is now a -10 start before "." (hug .. ".": -4), then "cat" with a -10 end (-5).
    opt.max_answer_len = 4;
    const auto a = data::squad_predictions(ex, f, start, end, opt);
    CHECK(a[0].text == "huggingface.");
    CHECK(a[0].n_best[0].end_logit == 6);
    CHECK(a[0].n_best[1].text == "cat");
    CHECK(a[0].n_best[1].start_logit == 5);
  }

  SECTION("end before start, and question positions, are no spans") {
    start[0][12] = 5, end[0][6] = 5;  // hug .. cat: reversed (either with a -10 partner: -5)
    start[0][1] = 9, end[0][2] = 9;   // in the question
    start[0][8] = 1, end[0][10] = 1;  // 1895 .. sat: 2
    CHECK(data::squad_predictions(ex, f, start, end, opt)[0].text == "(1895) sat");
  }

  SECTION("dedup by text, n_best, probabilities") {
    // n_best 3: the top 3 starts are 8, 7, 10 and ends 8, 9, 11. Pairs: (8,8) 8, (8,9) 7,
    // (7,8) 7, (7,9) 6 read "(1895)"; (8,11) 6, (7,11) 5 "(1895) sat\ton"; (10,11) 4 "sat\ton".
    start[0][8] = 4, start[0][7] = 3, start[0][10] = 2;
    end[0][8] = 4, end[0][9] = 3, end[0][11] = 2;
    opt.n_best = 3;
    const auto a = data::squad_predictions(ex, f, start, end, opt);
    REQUIRE(a[0].n_best.size() == 3);
    CHECK(a[0].n_best[0].text == "(1895)");
    CHECK(a[0].n_best[1].text == "(1895) sat\ton");
    CHECK(a[0].n_best[2].text == "sat\ton");
    CHECK(a[0].n_best[0].start_logit + a[0].n_best[0].end_logit == 8);
    CHECK(a[0].n_best[1].start_logit + a[0].n_best[1].end_logit == 6);
    CHECK(a[0].n_best[2].start_logit + a[0].n_best[2].end_logit == 4);
    const double z = std::exp(8.0) + std::exp(6.0) + std::exp(4.0);
    CHECK(a[0].n_best[0].probability == Approx(std::exp(8.0) / z));
    CHECK(a[0].n_best[1].probability == Approx(std::exp(6.0) / z));
    CHECK(a[0].n_best[2].probability == Approx(std::exp(4.0) / z));
    // n_best 2: starts 8, 7 and ends 8, 9 all read "(1895)".
    opt.n_best = 2;
    const auto b = data::squad_predictions(ex, f, start, end, opt);
    REQUIRE(b[0].n_best.size() == 1);
    CHECK(b[0].n_best[0].probability == 1.0);
  }

  SECTION("v2: the null answer against the threshold") {
    opt.version_2 = true;
    start[0][6] = 2, end[0][6] = 2;  // "cat": 4
    start[0][0] = 3, end[0][0] = 3;  // null: 6
    auto a = data::squad_predictions(ex, f, start, end, opt);
    CHECK(a[0].null_score_diff == 2);
    CHECK(a[0].text == "");             // 2 > 0
    REQUIRE(a[0].n_best.size() == 20);  // the null entry is among the n_best
    CHECK(a[0].n_best[0].text == "");
    CHECK(a[0].n_best[0].start_logit == 3);
    CHECK(a[0].n_best[1].text == "cat");
    opt.null_threshold = 2;  // not above: the span
    CHECK(data::squad_predictions(ex, f, start, end, opt)[0].text == "cat");
    opt.null_threshold = 1.5;
    CHECK(data::squad_predictions(ex, f, start, end, opt)[0].text == "");
    // The null entry joins after the n_best when it did not make them (null -2 against 4).
    opt.n_best = 1;
    start[0][0] = -3, end[0][0] = 1;
    a = data::squad_predictions(ex, f, start, end, opt);
    CHECK(a[0].text == "cat");
    CHECK(a[0].null_score_diff == -6);
    REQUIRE(a[0].n_best.size() == 2);
    CHECK(a[0].n_best[1].text == "");
    CHECK(a[0].n_best[1].start_logit == -3);
    CHECK(a[0].n_best[0].probability + a[0].n_best[1].probability == Approx(1.0));
  }

  SECTION("no valid span: no answer") {
    start[0][1] = 5, end[0][1] = 5;  // the only top-1 indices are in the question
    opt.n_best = 1;
    auto a = data::squad_predictions(ex, f, start, end, opt);
    CHECK(a[0].text == "");
    CHECK(a[0].n_best.empty());
    opt.version_2 = true;
    a = data::squad_predictions(ex, f, start, end, opt);
    CHECK(a[0].text == "");
    CHECK(a[0].null_score_diff == std::numeric_limits<double>::max());
    REQUIRE(a[0].n_best.size() == 1);
    CHECK(a[0].n_best[0].text == "");
    CHECK(a[0].n_best[0].probability == 1.0);
  }

  SECTION("errors") {
    CHECK_THAT(error_of([&] { data::squad_predictions(ex, f, {}, end, opt); }),
               Contains("1 features but 0 start and 1 end logit rows"));
    start[0].resize(16);
    CHECK_THAT(error_of([&] { data::squad_predictions(ex, f, start, end, opt); }),
               Contains("feature 0 has 17 input ids but 16 start and 20 end logits"));
    CHECK_THAT(error_of([&] {
                 data::squad_predictions({ex[0], ex[0]}, f, end, end, opt);
               }),
               Contains("(example 1) has no features"));
    opt.n_best = 0;
    CHECK_THAT(error_of([&] { data::squad_predictions(ex, f, end, end, opt); }),
               Contains("n_best must be >= 1"));
  }
}

TEST_CASE("squad predictions: several windows", "[squad_features]") {
  TempDir dir;
  const auto tok = tiny_tokenizer(dir);
  // The windows of the doc-stride case: window w holds t(2w)..t(2w+4) at positions 4..8 and has
  // the max context of its 3rd and 4th tokens (positions 6, 7; window 0 also 4, 5).
  const std::vector<data::SquadExample> ex = {example("long", "what is", t_words(20))};
  data::SquadFeatureOptions fo;
  fo.max_len = 10;
  fo.max_query_len = 4;
  fo.doc_stride = 2;
  const auto f = data::make_squad_features(ex, *tok, fo, false);
  REQUIRE(f.size() == 9);
  auto start = rows(f, -10.0f), end = rows(f, -10.0f);
  data::SquadPredictOptions opt;

  SECTION("a start without max context is ignored") {
    start[0][8] = 10, end[0][8] = 10;  // t4 in window 0 (its 5th token): not max context
    start[1][6] = 3, end[1][6] = 3;    // t4 in window 1: max context
    const auto a = data::squad_predictions(ex, f, start, end, opt);
    CHECK(a[0].text == "t4");
    CHECK(a[0].n_best[0].start_logit == 3);
  }

  SECTION("the best span from the second window") {
    start[0][4] = 2, end[0][5] = 2;  // t0 t1 in window 0: 4
    start[5][6] = 4, end[5][7] = 4;  // t12 t13 in window 5: 8
    const auto a = data::squad_predictions(ex, f, start, end, opt);
    CHECK(a[0].text == "t12 t13");
    CHECK(a[0].n_best[1].text == "t0 t1");
    // v2: the null score is the smallest over the windows, with that window's logits.
    opt.version_2 = true;
    for (auto& r : start) r[0] = 3;
    for (auto& r : end) r[0] = 3;
    start[6][0] = 0.5, end[6][0] = 0.5;
    const auto b = data::squad_predictions(ex, f, start, end, opt);
    CHECK(b[0].text == "t12 t13");
    CHECK(b[0].null_score_diff == 1 - 8);
    const auto null = std::find_if(b[0].n_best.begin(), b[0].n_best.end(),
                                   [](const data::SquadCandidate& c) { return c.text.empty(); });
    REQUIRE(null != b[0].n_best.end());
    CHECK(null->start_logit == 0.5);
    CHECK(null->end_logit == 0.5);
  }
}

TEST_CASE("squad features → logits at the targets → answers: exact 100", "[squad_features]") {
  TempDir dir;
  const auto tok = tiny_tokenizer(dir);
  const std::string q = "When was the cat born?";
  // Answers whose normalised text equals that of their whole words ("(1895)" → "1895").
  const std::vector<data::SquadExample> ex = {example("year", q, kShort, "1895"),
                                              example("word", q, kShort, "huggingface"),
                                              example("two", q, kShort, "cat (1895)"),
                                              example("long", "what is", t_words(20), "t9 t10"),
                                              example("end", "what is", t_words(20), "t19"),
                                              example("start", "what is", t_words(20), "t0 t1 t2"),
                                              example("none", "what is", t_words(20))};
  data::SquadFeatureOptions fo;
  fo.max_len = 12;
  fo.max_query_len = 3;
  fo.doc_stride = 2;
  // Windows of 6 tokens over the short context (4 windows; "1895" in two, with the max context in
  // the first), of 7 over t0..t19 (8 windows; t9 t10 in three).
  const auto f = data::make_squad_features(ex, *tok, fo, true);
  REQUIRE(f.size() == 3 * 4 + 4 * 8);
  auto start = rows(f, -10.0f, 2), end = rows(f, -10.0f, 2);
  for (size_t i = 0; i < f.size(); ++i) {
    start[i][size_t(f[i].start_position)] = 10;
    end[i][size_t(f[i].end_position)] = 10;
  }
  // v1 over the answerable questions.
  const std::vector<data::SquadExample> answerable(ex.begin(), ex.end() - 1);
  std::vector<data::SquadFeature> fa;
  std::vector<std::vector<float>> sa, ea;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i].example == 6) continue;
    fa.push_back(f[i]), sa.push_back(start[i]), ea.push_back(end[i]);
  }
  std::map<std::string, std::string> pred;
  for (const auto& a : data::squad_predictions(answerable, fa, sa, ea, {})) pred[a.id] = a.text;
  CHECK(pred.at("long") == "t9 t10");
  CHECK(pred.at("year") == "(1895)");
  const auto s = data::evaluate_squad(answerable, pred);
  CHECK(s.exact == 100.0);
  CHECK(s.f1 == 100.0);

  // v2 with the impossible question, null_score_diff as na_probs.
  data::SquadPredictOptions po;
  po.version_2 = true;
  std::map<std::string, std::string> pred2;
  std::map<std::string, double> na;
  for (const auto& a : data::squad_predictions(ex, f, start, end, po)) {
    pred2[a.id] = a.text;
    na[a.id] = a.null_score_diff;
  }
  CHECK(pred2.at("none") == "");
  CHECK(na.at("none") == 40);   // null 20, best span -20
  CHECK(na.at("long") == -40);  // null -20 in the answer's window, span 20
  const auto s2 = data::evaluate_squad(ex, pred2, &na, po.null_threshold);
  CHECK(s2.exact == 100.0);
  CHECK(s2.f1 == 100.0);
  CHECK(s2.no_ans == 1);
}
