// SQuAD (data/squad.h): normalisation, EM/F1 and the v2.0 evaluation (no-answer threshold, best
// threshold) against hand-computed values; the reader on small v1.1 / v2.0 files written here,
// including code-point offsets in a non-ASCII context, and its errors. The expected normalised
// strings were checked once against Python's str.lower / re \b / str.split, as the official
// scripts use them (the tests need no Python).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/squad.h"
#include "engine/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
using data::squad_normalize;
using json = nlohmann::json;

using engine::testing::error_of;
using engine::testing::TempDir;

namespace {

data::SquadExample question(const std::string& id, std::vector<std::string> answers) {
  data::SquadExample ex;
  ex.id = id;
  ex.answer_texts = std::move(answers);
  ex.is_impossible = ex.answer_texts.empty();
  return ex;
}

json squad_file(json paragraphs) {
  return {{"version", "1.1"}, {"data", {{{"title", "T"}, {"paragraphs", std::move(paragraphs)}}}}};
}

}  // namespace

TEST_CASE("squad: normalisation as the official scripts", "[squad]") {
  // lower → drop ASCII punctuation → articles to spaces → collapse whitespace.
  CHECK(squad_normalize("The  Cat!") == "cat");
  CHECK(squad_normalize("An apple, a day") == "apple day");
  CHECK(squad_normalize("theory") == "theory");   // articles only as whole words
  CHECK(squad_normalize("the_cat") == "thecat");  // '_' is punctuation, removed first
  CHECK(squad_normalize("A-team") == "ateam");
  CHECK(squad_normalize("a2 the3 the") == "a2 the3");  // digits are word characters
  CHECK(squad_normalize("  \t\n ") == "");
  CHECK(squad_normalize("the a an") == "");
  // Unicode: lower-casing, non-ASCII punctuation kept, Unicode whitespace splits (not U+200B).
  CHECK(squad_normalize("Théâtre, the ÉTÉ") == "théâtre été");
  CHECK(squad_normalize("\xC2\xAB"
                        "cat\xC2\xBB") ==
        "\xC2\xAB"
        "cat\xC2\xBB");  // «cat»
  CHECK(squad_normalize("a\xC2\xA0"
                        "cat\xE3\x80\x80"
                        "dog\xE2\x80\x8Bx") ==
        "cat dog\xE2\x80\x8Bx");  // NBSP and U+3000 split, U+200B does not
  CHECK(squad_normalize("\xC4\xB0stanbul") == "i\xCC\x87stanbul");  // İ → i + U+0307
  CHECK(squad_normalize("\xCE\xA3\xCE\x91\xCE\xA3") == "\xCF\x83\xCE\xB1\xCF\x82");  // ΣΑΣ → σας
  // A combining mark is not a word character: "the" + U+0301 loses its "the" (as in Python).
  CHECK(squad_normalize("the\xCC\x81 end") == "\xCC\x81 end");
  CHECK(squad_normalize("the\xE2\x82\xAC"
                        "cat") ==
        "\xE2\x82\xAC"
        "cat");  // the€cat → €cat
  // Invalid UTF-8 does not crash: U+FFFD.
  CHECK(squad_normalize("cat\xFF") == "cat\xEF\xBF\xBD");
}

TEST_CASE("squad: exact match and token F1", "[squad]") {
  CHECK(data::squad_exact("Cat", "the cat.") == 1.0);
  CHECK(data::squad_exact("the big cat", "a cat") == 0.0);
  // "big cat" vs "cat": common 1, precision 1/2, recall 1: F1 = 2·(1/2)·1 / (3/2) = 2/3.
  CHECK(data::squad_f1("the big cat", "a cat") == Approx(2.0 / 3.0).epsilon(1e-15));
  // Multiset overlap: "cat cat dog" vs "cat dog dog": common cat×1 + dog×1 = 2,
  // P = R = 2/3: F1 = 2/3.
  CHECK(data::squad_f1("cat cat dog", "cat dog dog") == Approx(2.0 / 3.0).epsilon(1e-15));
  CHECK(data::squad_f1("red", "blue") == 0.0);
  // No-answer (v2.0): either side empty after normalisation → 1 iff both are.
  CHECK(data::squad_f1("", "") == 1.0);
  CHECK(data::squad_exact("", "") == 1.0);
  CHECK(data::squad_f1("The.", "") == 1.0);  // normalises to nothing
  CHECK(data::squad_f1("cat", "") == 0.0);
  CHECK(data::squad_f1("", "cat") == 0.0);
  CHECK(data::squad_exact("cat", "") == 0.0);
}

TEST_CASE("squad: evaluation takes the max over gold answers", "[squad]") {
  const std::vector<data::SquadExample> ex = {
      question("q1", {"Denver Broncos", "the Denver Broncos", "Broncos"}),
      question("q2", {"Santa Clara, California", "Levi's Stadium"}), question("q3", {"2016"})};
  // q1: "broncos team" vs "denver broncos" F1 1/2, vs "broncos" P 1/2 R 1 → 2/3; EM 0.
  // q2: "levis stadium" matches the second gold exactly: EM 1, F1 1.
  // q3: no prediction → "" → EM 0, F1 0 (as evaluate-v1.1.py scores a missing answer).
  const auto s = data::evaluate_squad(ex, {{"q1", "Broncos team"}, {"q2", "Levi's Stadium."}});
  CHECK(s.total == 3);
  CHECK(s.has_ans == 3);
  CHECK(s.no_ans == 0);
  CHECK(s.exact == Approx(100.0 / 3.0));
  CHECK(s.f1 == Approx(100.0 * (2.0 / 3.0 + 1.0) / 3.0));
  CHECK(s.has_ans_exact == Approx(s.exact));
  CHECK(s.has_ans_f1 == Approx(s.f1));
  CHECK(std::isnan(s.no_ans_exact));  // no unanswerable question: the script prints no NoAns_*
  CHECK(std::isnan(s.best_exact));    // no na_probs: no best-threshold search
  CHECK_THAT(error_of([] { data::evaluate_squad({}, {}); }), Catch::Contains("no examples"));
}

TEST_CASE("squad: v2.0 no-answer threshold and best threshold", "[squad]") {
  // q1 answerable, predicted right (EM 1, F1 1), no-answer probability 0.2.
  // q3 answerable "big red dog", predicted "red dog" (EM 0; P 1, R 2/3: F1 0.8), probability 0.9.
  // q2 unanswerable, predicted "dog" (EM = F1 = 0), probability 0.95.
  const std::vector<data::SquadExample> ex = {question("q1", {"cat"}), question("q2", {}),
                                              question("q3", {"big red dog"})};
  const std::map<std::string, std::string> pred = {{"q1", "cat"}, {"q2", "dog"}, {"q3", "red dog"}};
  const std::map<std::string, double> na = {{"q1", 0.2}, {"q2", 0.95}, {"q3", 0.9}};

  // Threshold 1.0: nothing switched to "no answer".
  // exact = (1 + 0 + 0) / 3, f1 = (1 + 0 + 0.8) / 3; HasAns: (1 + 0) / 2, (1 + 0.8) / 2.
  const auto s = data::evaluate_squad(ex, pred, &na);
  CHECK(s.total == 3);
  CHECK(s.has_ans == 2);
  CHECK(s.no_ans == 1);
  CHECK(s.exact == Approx(100.0 / 3.0));
  CHECK(s.f1 == Approx(60.0));
  CHECK(s.has_ans_exact == Approx(50.0));
  CHECK(s.has_ans_f1 == Approx(90.0));
  CHECK(s.no_ans_exact == Approx(0.0));
  // find_best_thresh, questions by rising probability q1 (0.2), q3 (0.9), q2 (0.95), starting
  // from "answer nothing" = 1 (q2 right):
  //   EM: 1 → +1 (q1) = 2 [best, 0.2] → +0 (q3) = 2 → −1 (q2 answered "dog") = 1.
  //   F1: 1 → 2 [0.2] → +0.8 = 2.8 [best, 0.9] → −1 = 1.8.
  CHECK(s.best_exact == Approx(200.0 / 3.0));
  CHECK(s.best_exact_thresh == 0.2);
  CHECK(s.best_f1 == Approx(280.0 / 3.0));
  CHECK(s.best_f1_thresh == 0.9);

  // Threshold 0.9: q2 (0.95) becomes "no answer" → right; q3 (0.9, not above) keeps its answer:
  // exact = (1 + 1 + 0) / 3, f1 = (1 + 1 + 0.8) / 3 (the best F1 above).
  const auto t = data::evaluate_squad(ex, pred, &na, 0.9);
  CHECK(t.exact == Approx(200.0 / 3.0));
  CHECK(t.f1 == Approx(280.0 / 3.0));
  CHECK(t.no_ans_exact == Approx(100.0));
  CHECK(t.has_ans_f1 == Approx(90.0));
  // Threshold 0.5: q3 and q2 switched: exact = f1 = (1 + 1 + 0) / 3.
  const auto u = data::evaluate_squad(ex, pred, &na, 0.5);
  CHECK(u.exact == Approx(200.0 / 3.0));
  CHECK(u.f1 == Approx(200.0 / 3.0));
  CHECK(u.has_ans_f1 == Approx(50.0));

  // An empty prediction on an unanswerable question is right, and costs nothing in the search.
  const auto v = data::evaluate_squad(ex, {{"q1", "cat"}, {"q3", "red dog"}}, &na);
  CHECK(v.no_ans_exact == Approx(100.0));
  CHECK(v.exact == Approx(200.0 / 3.0));
  //   F1: 1 → 2 → 2.8 → +0 = 2.8 [best stays at 0.9].
  CHECK(v.best_f1 == Approx(280.0 / 3.0));

  const std::map<std::string, double> partial = {{"q1", 0.2}};
  CHECK_THAT(error_of([&] { data::evaluate_squad(ex, pred, &partial); }),
             Catch::Contains("no no-answer probability for question 'q2'"));
}

TEST_CASE("squad: reading v1.1 and v2.0 files", "[squad]") {
  TempDir d;
  const std::string context = "Super Bowl 50 was an American football game.";
  const json v11 = squad_file(
      json::array({{{"context", context},
                    {"qas",
                     {{{"id", "q1"},
                       {"question", "Which game?"},
                       {"answers",
                        {{{"text", "Super Bowl 50"}, {"answer_start", 0}},
                         {{"text", "American football"}, {"answer_start", 21}}}}},
                      {{"id", "q2"},
                       {"question", "What kind?"},
                       {"answers", {{{"text", "football"}, {"answer_start", 30}}}}}}}}}));
  const auto ex = data::read_squad(d.write("v11.json", v11.dump()));
  REQUIRE(ex.size() == 2);
  CHECK(ex[0].id == "q1");
  CHECK(ex[0].question == "Which game?");
  CHECK(ex[0].context == context);
  CHECK(ex[0].answer_texts == std::vector<std::string>{"Super Bowl 50", "American football"});
  CHECK(ex[0].answer_starts == std::vector<int64_t>{0, 21});
  CHECK(ex[0].answer_byte_starts == std::vector<int64_t>{0, 21});
  CHECK_FALSE(ex[0].is_impossible);
  CHECK(ex[1].answer_starts == std::vector<int64_t>{30});

  // v2.0 with a non-ASCII context: "😀 Le café à Zürich — 東京 tower." In code points (as Python
  // indexes it) 東京 starts at 21 and Zürich at 12; in UTF-8 bytes at 29 and 17 (😀 is 4 bytes,
  // é, à, ü 2 each, — 3).
  const std::string ctx =
      "\xF0\x9F\x98\x80 Le caf\xC3\xA9 \xC3\xA0 Z\xC3\xBCrich \xE2\x80\x94 "
      "\xE6\x9D\xB1\xE4\xBA\xAC tower.";
  const std::string tokyo = "\xE6\x9D\xB1\xE4\xBA\xAC", zurich = "Z\xC3\xBCrich";
  json v20 = {{"version", "v2.0"},
              {"data",
               {{{"title", "Cities"},
                 {"paragraphs",
                  {{{"context", ctx},
                    {"qas",
                     {{{"id", "a1"},
                       {"question", "Where?"},
                       {"answers",
                        {{{"text", tokyo}, {"answer_start", 21}},
                         {{"text", zurich}, {"answer_start", 12}}}},
                       {"is_impossible", false}},
                      {{"id", "a2"},
                       {"question", "Why?"},
                       {"answers", json::array()},
                       {"plausible_answers", {{{"text", "tower"}, {"answer_start", 24}}}},
                       {"is_impossible", true}}}}}}}}}}};
  const std::string v20_path = d.write("v20.json", v20.dump());
  const auto ex2 = data::read_squad(v20_path);
  REQUIRE(ex2.size() == 2);
  CHECK(ex2[0].answer_texts == std::vector<std::string>{tokyo, zurich});
  CHECK(ex2[0].answer_starts == std::vector<int64_t>{21, 12});
  CHECK(ex2[0].answer_byte_starts == std::vector<int64_t>{29, 17});
  CHECK(ctx.substr(29, tokyo.size()) == tokyo);
  CHECK_FALSE(ex2[0].is_impossible);
  CHECK(ex2[1].id == "a2");
  CHECK(ex2[1].is_impossible);
  CHECK(ex2[1].answer_texts.empty());
  CHECK(ex2[1].answer_starts.empty());

  // The byte offset (29) instead of the code-point offset (21) is caught, naming the question:
  // here it runs past the end of the 30-code-point context.
  json wrong = v20;
  wrong["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 29;
  const std::string wrong_path = d.write("wrong.json", wrong.dump());
  CHECK_THAT(error_of([&] { data::read_squad(wrong_path); }),
             Catch::Contains("[squad] " + wrong_path +
                             ": question 'a1' "
                             "(data[0].paragraphs[0].qas[0].answers[0]): answer_start 29 + 2 "
                             "characters of answer text runs past the end of the context (30 "
                             "characters)"));
  // Code points 27, 28 of the context are "er" (of "tower").
  wrong["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 27;
  d.write("wrong.json", wrong.dump());
  CHECK_THAT(error_of([&] { data::read_squad(wrong_path); }),
             Catch::Contains("[squad] " + wrong_path +
                             ": question 'a1' "
                             "(data[0].paragraphs[0].qas[0].answers[0]): the context at "
                             "answer_start 27 reads 'er', not the answer text '" +
                             tokyo + "'"));
}

TEST_CASE("squad: malformed files fail with the JSON path and what was expected", "[squad]") {
  TempDir d;
  const std::string bad_json = d.write("bad.json", "{\"data\": [");
  CHECK_THAT(error_of([&] { data::read_squad(bad_json); }),
             Catch::Contains("[squad] " + bad_json + ": invalid JSON: ") &&
                 Catch::Contains("parse error"));
  const std::string missing = (d.path / "none.json").string();
  CHECK_THAT(error_of([&] { data::read_squad(missing); }),
             Catch::Contains(missing + ": cannot open"));
  CHECK_THAT(error_of([&] { data::read_squad(d.write("nodata.json", "{\"version\": \"1.1\"}")); }),
             Catch::Contains("(top level): missing key 'data' (expected an array)"));

  // answer_start as a string, deep in the file: data[3].paragraphs[0].qas[2].answers[0].
  json articles = json::array();
  for (int a = 0; a < 4; ++a) {
    json qas = json::array();
    for (int q = 0; q < 3; ++q)
      qas.push_back({{"id", "id" + std::to_string(a) + std::to_string(q)},
                     {"question", "?"},
                     {"answers", {{{"text", "b"}, {"answer_start", 1}}}}});
    articles.push_back({{"title", "t"}, {"paragraphs", {{{"context", "abc"}, {"qas", qas}}}}});
  }
  json file = {{"data", articles}};
  file["data"][3]["paragraphs"][0]["qas"][2]["answers"][0]["answer_start"] = "1";
  const std::string p = d.write("types.json", file.dump());
  CHECK_THAT(error_of([&] { data::read_squad(p); }),
             Catch::Contains("[squad] " + p +
                             ": data[3].paragraphs[0].qas[2].answers[0].answer_start: expected a "
                             "non-negative integer, got string \"1\""));
  file["data"][3]["paragraphs"][0]["qas"][2]["answers"][0]["answer_start"] = -1;
  d.write("types.json", file.dump());
  CHECK_THAT(error_of([&] { data::read_squad(p); }),
             Catch::Contains("answers[0].answer_start: expected a non-negative integer, got "
                             "number -1"));
  file["data"][3]["paragraphs"][0]["qas"][2]["answers"][0]["answer_start"] = 1;
  file["data"][1]["paragraphs"][0].erase("context");
  d.write("types.json", file.dump());
  CHECK_THAT(error_of([&] { data::read_squad(p); }),
             Catch::Contains("data[1].paragraphs[0]: missing key 'context' (expected a string)"));
  file["data"][1]["paragraphs"][0]["context"] = 7;
  d.write("types.json", file.dump());
  CHECK_THAT(error_of([&] { data::read_squad(p); }),
             Catch::Contains("data[1].paragraphs[0].context: expected a string, got number 7"));
  file["data"][1]["paragraphs"][0]["context"] = "abc";
  file["data"][2]["paragraphs"][0]["qas"][1]["id"] = "id00";
  d.write("types.json", file.dump());
  CHECK_THAT(error_of([&] { data::read_squad(p); }),
             Catch::Contains("data[2].paragraphs[0].qas[1]: question id 'id00' appears twice "
                             "(also at data[0].paragraphs[0].qas[0])"));
  file["data"][2]["paragraphs"][0]["qas"][1]["id"] = "id21";
  file["data"][0]["paragraphs"][0]["qas"][0]["is_impossible"] = true;
  d.write("types.json", file.dump());
  CHECK_THAT(error_of([&] { data::read_squad(p); }),
             Catch::Contains("question 'id00' is_impossible but has 1 answers (expected none)"));
  file["data"][0]["paragraphs"][0]["qas"][0]["is_impossible"] = "yes";
  d.write("types.json", file.dump());
  CHECK_THAT(error_of([&] { data::read_squad(p); }),
             Catch::Contains("data[0].paragraphs[0].qas[0].is_impossible: expected true or "
                             "false, got string \"yes\""));
  file["data"][0]["paragraphs"][0]["qas"][0].erase("is_impossible");
  file["data"][0]["paragraphs"][0]["qas"][0]["answers"] = json::array();
  d.write("types.json", file.dump());
  CHECK_THAT(error_of([&] { data::read_squad(p); }),
             Catch::Contains("question 'id00' has no answers and is not marked is_impossible"));
  file["data"][0]["paragraphs"][0]["qas"][0]["answers"] = {{{"text", "b"}, {"answer_start", 1}}};
  CHECK(data::read_squad(d.write("types.json", file.dump())).size() == 12);
  CHECK_THAT(error_of([&] { data::read_squad(d.write("empty.json", "{\"data\": []}")); }),
             Catch::Contains("no questions"));
}
