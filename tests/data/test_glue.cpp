// GLUE (data/glue.h): every task's files in the official layouts, written here as small files and
// read back field by field; malformed rows failing with file:line; metrics per task; submission
// files.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/glue.h"
#include "engine/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
using data::glue_task;
using data::GlueExample;
using data::read_glue;

using engine::testing::error_of;
using engine::testing::TempDir;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void check_example(const GlueExample& e, const std::string& guid, const std::string& a,
                   const std::string& b, int64_t label, int64_t index, int line) {
  CHECK(e.guid == guid);
  CHECK(e.text_a == a);
  CHECK(e.text_b == b);
  CHECK(e.label == label);
  CHECK(e.index == index);
  CHECK(e.line == line);
}

const std::string kMnliHeadTrain =
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n";
const std::string kMnliHeadDev =
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\t"
    "label5\tgold_label\n";
const std::string kMnliHeadTest =
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\n";
const std::string kStsbHead =
    "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2";

}  // namespace

TEST_CASE("glue: the task table", "[glue]") {
  CHECK(glue_task("CoLA").name == "CoLA");
  CHECK(glue_task("sst2").name == "SST-2");
  CHECK(glue_task("sts_b").name == "STS-B");
  CHECK(glue_task("mnli").name == "MNLI");
  CHECK(glue_task("ax").dir == "diagnostic");
  CHECK(data::glue_tasks().size() == 10);
  CHECK_THAT(error_of([] { glue_task("SNLI"); }),
             Catch::Contains("[glue] unknown task 'SNLI'; known tasks: CoLA, SST-2, MRPC, STS-B, "
                             "QQP, MNLI, QNLI, RTE, WNLI, AX"));

  // Label orders as HF transformers' glue processors (get_labels()).
  using V = std::vector<std::string>;
  CHECK(glue_task("MNLI").label_names == V{"contradiction", "entailment", "neutral"});
  CHECK(glue_task("AX").label_names == V{"contradiction", "entailment", "neutral"});
  CHECK(glue_task("QNLI").label_names == V{"entailment", "not_entailment"});
  CHECK(glue_task("RTE").label_names == V{"entailment", "not_entailment"});
  for (const char* t : {"CoLA", "SST-2", "MRPC", "QQP", "WNLI"})
    CHECK(glue_task(t).label_names == V{"0", "1"});
  CHECK(glue_task("STS-B").regression);
  CHECK(glue_task("STS-B").num_labels == 1);
  CHECK(glue_task("MNLI").num_labels == 3);
  CHECK(glue_task("CoLA").metric == "mcc");
  CHECK(glue_task("MRPC").metric == "acc_f1");
  CHECK(glue_task("QQP").metric == "acc_f1");
  CHECK(glue_task("STS-B").metric == "pearson_spearman");
  CHECK(glue_task("RTE").metric == "acc");
  CHECK(glue_task("MNLI").dev_splits == V{"dev_matched", "dev_mismatched"});
  CHECK(glue_task("MNLI").test_splits == V{"test_matched", "test_mismatched"});
  CHECK(glue_task("AX").test_only);

  CHECK(data::glue_split_path(glue_task("MNLI"), "/g", "dev_mismatched") ==
        "/g/MNLI/dev_mismatched.tsv");
  CHECK(data::glue_split_path(glue_task("AX"), "/g/", "diagnostic") ==
        "/g/diagnostic/diagnostic.tsv");
  CHECK(data::glue_split_path(glue_task("SST-2"), "g", "train") == "g/SST-2/train.tsv");
  CHECK_THAT(error_of([] { data::glue_split_path(glue_task("MNLI"), "/g", "dev"); }),
             Catch::Contains("MNLI has no split 'dev'; its splits: train, dev_matched, "
                             "dev_mismatched, test_matched, test_mismatched"));
  CHECK(data::glue_is_test_split(glue_task("MNLI"), "test_mismatched"));
  CHECK_FALSE(data::glue_is_test_split(glue_task("MNLI"), "dev_matched"));

  CHECK(data::glue_submission_name(glue_task("CoLA"), "test") == "CoLA.tsv");
  CHECK(data::glue_submission_name(glue_task("SST-2"), "test") == "SST-2.tsv");
  CHECK(data::glue_submission_name(glue_task("STS-B"), "test") == "STS-B.tsv");
  CHECK(data::glue_submission_name(glue_task("MNLI"), "test_matched") == "MNLI-m.tsv");
  CHECK(data::glue_submission_name(glue_task("MNLI"), "test_mismatched") == "MNLI-mm.tsv");
  CHECK(data::glue_submission_name(glue_task("AX"), "diagnostic") == "AX.tsv");
  for (const char* t : {"MRPC", "QQP", "QNLI", "RTE", "WNLI"})
    CHECK(data::glue_submission_name(glue_task(t), "test") == std::string(t) + ".tsv");
  CHECK_THAT(error_of([] { data::glue_submission_name(glue_task("RTE"), "dev"); }),
             Catch::Contains("no submission file for RTE split 'dev'"));
}

TEST_CASE("glue: CoLA dev without a header, test with one", "[glue]") {
  TempDir d;
  // No quoting: the '"' are ordinary characters, and a field may start with one.
  const std::string dev = d.write("CoLA/dev.tsv",
                                  "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\n"
                                  "gj04\t0\t*\tThe more books I ask to whom he will give.\n"
                                  "\n"
                                  "cj99\t1\t\t\"Hello,\" she said \"twice.\n");
  const auto ex = read_glue(glue_task("CoLA"), dev, false);
  REQUIRE(ex.size() == 3);
  check_example(ex[0], "0", "The sailors rode the breeze clear of the rocks.", "", 1, -1, 1);
  check_example(ex[1], "1", "The more books I ask to whom he will give.", "", 0, -1, 2);
  check_example(ex[2], "2", "\"Hello,\" she said \"twice.", "", 1, -1, 4);  // line 3 empty

  const std::string test = d.write("CoLA/test.tsv",
                                   "index\tsentence\n"
                                   "0\tBill whistled past the house.\n"
                                   "1\tThe car honked its way down the road.");  // no final \n
  const auto t = read_glue(glue_task("CoLA"), test, true);
  REQUIRE(t.size() == 2);
  check_example(t[0], "0", "Bill whistled past the house.", "", -1, 0, 2);
  check_example(t[1], "1", "The car honked its way down the road.", "", -1, 1, 3);

  // The test file read as labeled: 2 columns, CoLA train/dev rows have 4.
  CHECK_THAT(error_of([&] { read_glue(glue_task("CoLA"), test, false); }),
             Catch::Contains(test + ":1: expected 4 tab-separated columns, got 2"));
}

TEST_CASE("glue: SST-2, MRPC with a byte-order mark and CRLF, QNLI, RTE, WNLI, AX", "[glue]") {
  TempDir d;
  const auto sst = read_glue(glue_task("SST-2"),
                             d.write("SST-2/dev.tsv",
                                     "sentence\tlabel\n"
                                     "it 's a charming and often affecting journey . \t1\n"
                                     "unflinchingly bleak and desperate \t0\n"),
                             false);
  REQUIRE(sst.size() == 2);
  check_example(sst[0], "0", "it 's a charming and often affecting journey . ", "", 1, -1, 2);
  check_example(sst[1], "1", "unflinchingly bleak and desperate ", "", 0, -1, 3);
  const auto sst_test =
      read_glue(glue_task("SST-2"),
                d.write("SST-2/test.tsv", "index\tsentence\n7\tuneasy mishmash .\n"), true);
  REQUIRE(sst_test.size() == 1);
  check_example(sst_test[0], "7", "uneasy mishmash .", "", -1, 7, 2);

  const auto mrpc = read_glue(
      glue_task("MRPC"),
      d.write("MRPC/dev.tsv",
              "\xEF\xBB\xBFQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n"
              "1\t1355540\t1355592\tHe said the pie business doesn 't fit .\t\" The pie business "
              "does not fit our strategy .\r\n"
              "0\t2029631\t2029565\tMagnarelli said Racicot hated the Iraqi regime .\tHis wife "
              "said he was \" 100 percent behind George Bush \" .\r\n"),
      false);
  REQUIRE(mrpc.size() == 2);
  check_example(mrpc[0], "0", "He said the pie business doesn 't fit .",
                "\" The pie business does not fit our strategy .", 1, -1, 2);
  check_example(mrpc[1], "1", "Magnarelli said Racicot hated the Iraqi regime .",
                "His wife said he was \" 100 percent behind George Bush \" .", 0, -1, 3);
  const auto mrpc_test =
      read_glue(glue_task("MRPC"),
                d.write("MRPC/test.tsv",
                        "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                        "0\t1089874\t1089925\tPCCW 's chief will report .\tCurrent chief .\n"),
                true);
  REQUIRE(mrpc_test.size() == 1);
  check_example(mrpc_test[0], "0", "PCCW 's chief will report .", "Current chief .", -1, 0, 2);

  const auto qnli = read_glue(glue_task("QNLI"),
                              d.write("QNLI/dev.tsv",
                                      "index\tquestion\tsentence\tlabel\n"
                                      "0\tWhat came into force?\tThe constitution.\tentailment\n"
                                      "1\tWhy?\tBecause.\tnot_entailment\n"),
                              false);
  REQUIRE(qnli.size() == 2);
  check_example(qnli[0], "0", "What came into force?", "The constitution.", 0, -1, 2);
  check_example(qnli[1], "1", "Why?", "Because.", 1, -1, 3);

  const auto rte = read_glue(glue_task("RTE"),
                             d.write("RTE/dev.tsv",
                                     "index\tsentence1\tsentence2\tlabel\n"
                                     "0\tDana Reeve has died.\tReeve had an accident.\t"
                                     "not_entailment\n"
                                     "1\tYet.\tFound.\tentailment\n"),
                             false);
  REQUIRE(rte.size() == 2);
  check_example(rte[0], "0", "Dana Reeve has died.", "Reeve had an accident.", 1, -1, 2);
  check_example(rte[1], "1", "Yet.", "Found.", 0, -1, 3);
  const auto rte_test =
      read_glue(glue_task("RTE"),
                d.write("RTE/test.tsv",
                        "index\tsentence1\tsentence2\n"
                        "0\tMangla was summoned.\tShukla is related to Mangla.\n"),
                true);
  REQUIRE(rte_test.size() == 1);
  check_example(rte_test[0], "0", "Mangla was summoned.", "Shukla is related to Mangla.", -1, 0, 2);

  const auto wnli =
      read_glue(glue_task("WNLI"),
                d.write("WNLI/train.tsv",
                        "index\tsentence1\tsentence2\tlabel\n"
                        "0\tI stuck a pin through a carrot.\tThe carrot had a hole.\t1\n"
                        "1\tThe drain is clogged.\tThe hair is clogged.\t0\n"),
                false);
  REQUIRE(wnli.size() == 2);
  check_example(wnli[0], "0", "I stuck a pin through a carrot.", "The carrot had a hole.", 1, -1,
                2);
  check_example(wnli[1], "1", "The drain is clogged.", "The hair is clogged.", 0, -1, 3);

  const std::string ax_path =
      d.write("diagnostic/diagnostic.tsv",
              "index\tsentence1\tsentence2\n"
              "0\tThe cat sat on the mat.\tThe cat did not sit on the mat.\n"
              "1\tA.\tB.\n");
  const auto ax = read_glue(glue_task("AX"), ax_path, true);
  REQUIRE(ax.size() == 2);
  check_example(ax[0], "0", "The cat sat on the mat.", "The cat did not sit on the mat.", -1, 0, 2);
  check_example(ax[1], "1", "A.", "B.", -1, 1, 3);
  CHECK_THAT(error_of([&] { read_glue(glue_task("AX"), ax_path, false); }),
             Catch::Contains("AX has test files only"));
}

TEST_CASE("glue: STS-B scores", "[glue]") {
  TempDir d;
  const auto dev = read_glue(
      glue_task("STS-B"),
      d.write("STS-B/dev.tsv", kStsbHead + "\tscore\n" +
                                   "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man "
                                   "with a hard hat is dancing.\tA man wearing a hard hat is "
                                   "dancing.\t5.000\n"
                                   "1\tmain-news\theadlines\t2015\t0001\tnone\tnone\tA\tB\t0.5\n"
                                   "2\tmain-news\theadlines\t2015\t0002\tnone\tnone\tC\tD\t0\n"),
      false);
  REQUIRE(dev.size() == 3);
  check_example(dev[0], "0", "A man with a hard hat is dancing.",
                "A man wearing a hard hat is dancing.", -1, -1, 2);
  CHECK(dev[0].score == 5.0);
  CHECK(dev[1].score == 0.5);
  CHECK(dev[2].score == 0.0);
  const auto test = read_glue(
      glue_task("STS-B"),
      d.write("STS-B/test.tsv", kStsbHead + "\n" +
                                    "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl "
                                    "is styling her hair.\tA girl is brushing her hair.\n"),
      true);
  REQUIRE(test.size() == 1);
  check_example(test[0], "0", "A girl is styling her hair.", "A girl is brushing her hair.", -1, 0,
                2);

  for (const char* bad : {"abc", "5.5", "-0.1", "nan", "", "3.0x"}) {
    const std::string p = d.write("STS-B/bad.tsv", kStsbHead + "\tscore\n" +
                                                       "0\tg\tf\ty\to\ts\ts\tA\tB\t1.0\n"
                                                       "1\tg\tf\ty\to\ts\ts\tA\tB\t" +
                                                       bad + "\n");
    CHECK_THAT(error_of([&] { read_glue(glue_task("STS-B"), p, false); }),
               Catch::Contains(p + ":3: score") && Catch::Contains("[0, 5]"));
  }
  // The test file read as labeled: its header has no score column.
  CHECK_THAT(error_of([&] {
               read_glue(glue_task("STS-B"),
                         d.write("t.tsv", kStsbHead + "\n0\t\t\t\t\t\t\tA\tB\n"), false);
             }),
             Catch::Contains("t.tsv:1: the header has 9 columns, expected at least 10"));
}

TEST_CASE("glue: MNLI train, both dev files and a test file", "[glue]") {
  TempDir d;
  const std::string parse = "\t(a)\t(b)\t(ROOT a)\t(ROOT b)\t";
  const auto train =
      read_glue(glue_task("MNLI"),
                d.write("MNLI/train.tsv", kMnliHeadTrain + "0\t31193\t31193n\tgovernment" + parse +
                                              "Conceptually cream skimming.\tProduct and geography."
                                              "\tneutral\tneutral\n"),
                false);
  REQUIRE(train.size() == 1);
  check_example(train[0], "0", "Conceptually cream skimming.", "Product and geography.", 2, -1, 2);

  const auto matched = read_glue(
      glue_task("MNLI"),
      d.write("MNLI/dev_matched.tsv",
              kMnliHeadDev + "0\t63735\t63735n\tslate" + parse +
                  "The new rights are nice enough\tEveryone really likes the newest benefits"
                  "\tneutral\tentailment\tneutral\tneutral\tneutral\tneutral\n" +
                  "1\t91383\t91383c\tgovernment" + parse +
                  "This site includes a list.\tThe Government Executive articles.\tcontradiction"
                  "\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\n"),
      false);
  REQUIRE(matched.size() == 2);
  check_example(matched[0], "0", "The new rights are nice enough",
                "Everyone really likes the newest benefits", 2, -1, 2);
  check_example(matched[1], "1", "This site includes a list.", "The Government Executive articles.",
                0, -1, 3);
  const auto mismatched =
      read_glue(glue_task("MNLI"),
                d.write("MNLI/dev_mismatched.tsv",
                        kMnliHeadDev + "0\t75290\t75290c\tletters" + parse +
                            "Your contribution helped.\tYour contribution did nothing.\t"
                            "contradiction\tcontradiction\tcontradiction\tcontradiction\t"
                            "contradiction\tentailment\n"),
                false);
  REQUIRE(mismatched.size() == 1);
  // The gold label is the last column, not label1.
  check_example(mismatched[0], "0", "Your contribution helped.", "Your contribution did nothing.",
                1, -1, 2);

  const auto test =
      read_glue(glue_task("MNLI"),
                d.write("MNLI/test_matched.tsv", kMnliHeadTest + "0\t31493\t31493\ttravel" + parse +
                                                     "Hierbas, ans seco.\tThis is a list.\n"),
                true);
  REQUIRE(test.size() == 1);
  check_example(test[0], "0", "Hierbas, ans seco.", "This is a list.", -1, 0, 2);

  // A dev file read as a test file: the test layout has no label column.
  CHECK_THAT(error_of([&] {
               read_glue(glue_task("MNLI"), d.path.string() + "/MNLI/dev_matched.tsv", true);
             }),
             Catch::Contains("dev_matched.tsv:1: the header has 16 columns, expected 10"));
  // SNLI/MNLI's "-" (no gold label) is not a label.
  const std::string dash =
      d.write("MNLI/dash.tsv", kMnliHeadTrain + "0\t1\t1n\tg" + parse + "A\tB\tneutral\t-\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("MNLI"), dash, false); }),
             Catch::Contains(dash + ":2: unknown label '-' for MNLI, expected one of: "
                                    "contradiction, entailment, neutral"));
}

TEST_CASE("glue: QQP skips train/dev rows with missing columns, counted", "[glue]") {
  TempDir d;
  const std::string head = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n";
  // Row 3 is a question broken across two lines: 5 columns, then 2.
  const std::string p =
      d.write("QQP/train.tsv", head +
                                   "133273\t213221\t213222\tHow is it?\tWhat is "
                                   "it?\t0\n"
                                   "402555\t536040\t536041\tHow do I\tHow can "
                                   "I\n"
                                   "continue?\t1\n"
                                   "360472\t364011\t490273\tWhy \"so\"?\tWhy?\t1\n");
  data::GlueReadStats stats;
  const auto ex = read_glue(glue_task("QQP"), p, false, &stats);
  REQUIRE(ex.size() == 2);
  check_example(ex[0], "133273", "How is it?", "What is it?", 0, -1, 2);
  check_example(ex[1], "360472", "Why \"so\"?", "Why?", 1, -1, 5);
  CHECK(stats.skipped_rows == 2);
  CHECK(stats.first_skipped_line == 3);

  // A row with too many columns still fails, as does an unknown label.
  const std::string wide = d.write("QQP/wide.tsv", head + "1\t2\t3\ta\tb\t0\textra\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("QQP"), wide, false); }),
             Catch::Contains(wide + ":2: expected 6 tab-separated columns (as the header), got 7"));
  const std::string label = d.write("QQP/label.tsv", head + "1\t2\t3\ta\tb\tyes\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("QQP"), label, false); }),
             Catch::Contains(label + ":2: unknown label 'yes' for QQP, expected one of: 0, 1"));

  // Test files: no skipping (the row would be missing from the submission).
  const std::string test = d.write("QQP/test.tsv", "id\tquestion1\tquestion2\n0\tA?\tB?\n1\tC?\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("QQP"), test, true); }),
             Catch::Contains(test + ":3: expected 3 tab-separated columns (as the header), got 2"));
  const auto t = read_glue(glue_task("QQP"),
                           d.write("QQP/test2.tsv", "id\tquestion1\tquestion2\n0\tA?\tB?\n"), true);
  REQUIRE(t.size() == 1);
  check_example(t[0], "0", "A?", "B?", -1, 0, 2);
}

TEST_CASE("glue: malformed files fail with file:line and what was expected", "[glue]") {
  TempDir d;
  const std::string head = "index\tsentence1\tsentence2\tlabel\n";
  const std::string short_row =
      d.write("RTE/dev.tsv", head + "0\tA.\tB.\tentailment\n1\tA.\tentailment\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("RTE"), short_row, false); }),
             Catch::Contains("[glue] " + short_row +
                             ":3: expected 4 tab-separated columns (as the header), got 3 "
                             "(reading a RTE train/dev file)"));
  const std::string bad_label = d.write("RTE/label.tsv", head + "0\tA.\tB.\tcontradiction\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("RTE"), bad_label, false); }),
             Catch::Contains(bad_label + ":2: unknown label 'contradiction' for RTE, expected one "
                                         "of: entailment, not_entailment"));
  const std::string cola = d.write("CoLA/bad.tsv", "gj04\t1\t\tFine.\ngj04\t2\t\tNot fine.\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("CoLA"), cola, false); }),
             Catch::Contains(cola + ":2: unknown label '2' for CoLA, expected one of: 0, 1"));
  // A header that does not name the expected columns (an RTE file read as QNLI).
  const std::string rte = d.write("RTE/ok.tsv", head + "0\tA.\tB.\tentailment\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("QNLI"), rte, false); }),
             Catch::Contains(rte + ":1: header column 2 is 'sentence1', expected 'question'"));
  // A labeled file read as a test file.
  CHECK_THAT(error_of([&] { read_glue(glue_task("RTE"), rte, true); }),
             Catch::Contains(rte + ":1: the header has 4 columns, expected 3"));
  const std::string bad_id = d.write("RTE/id.tsv", "index\tsentence1\tsentence2\nx1\tA.\tB.\n");
  CHECK_THAT(error_of([&] { read_glue(glue_task("RTE"), bad_id, true); }),
             Catch::Contains(bad_id + ":2: test id 'x1' is not a non-negative integer"));
  const std::string missing = (d.path / "nope.tsv").string();
  CHECK_THAT(error_of([&] { read_glue(glue_task("RTE"), missing, false); }),
             Catch::Contains(missing + ": cannot open (No such file or directory)"));
  const std::string empty = d.write("RTE/empty.tsv", "");
  CHECK_THAT(error_of([&] { read_glue(glue_task("RTE"), empty, false); }),
             Catch::Contains(empty + ": empty file"));
  const std::string header_only = d.write("RTE/header.tsv", head);
  CHECK_THAT(error_of([&] { read_glue(glue_task("RTE"), header_only, false); }),
             Catch::Contains(header_only + ": no examples"));
}

TEST_CASE("glue: metrics per task", "[glue]") {
  std::vector<GlueExample> ex(4);
  const int64_t gold[] = {1, 0, 1, 1};
  for (size_t i = 0; i < ex.size(); ++i) ex[i].label = gold[i];
  // pred 1 1 0 1: acc 2/4; TP 2, FP 1, FN 1 → F1 = 4 / 6.
  const auto mrpc = data::glue_metrics(glue_task("MRPC"), ex, {1, 1, 0, 1}, {});
  REQUIRE(mrpc.size() == 2);
  CHECK(mrpc[0].first == "acc");
  CHECK(mrpc[0].second == Approx(0.5));
  CHECK(mrpc[1].first == "f1");
  CHECK(mrpc[1].second == Approx(2.0 / 3.0));
  const auto cola = data::glue_metrics(glue_task("CoLA"), ex, {1, 0, 1, 1}, {});
  REQUIRE(cola.size() == 1);
  CHECK(cola[0].first == "mcc");
  CHECK(cola[0].second == Approx(1.0));
  const auto rte = data::glue_metrics(glue_task("RTE"), ex, {0, 0, 0, 0}, {});
  REQUIRE(rte.size() == 1);
  CHECK(rte[0].first == "acc");
  CHECK(rte[0].second == Approx(0.25));

  std::vector<GlueExample> sts(3);
  sts[0].score = 1, sts[1].score = 2, sts[2].score = 3;
  const auto r = data::glue_metrics(glue_task("STS-B"), sts, {}, {1, 3, 2});
  REQUIRE(r.size() == 2);
  CHECK(r[0].first == "pearson");
  CHECK(r[0].second == Approx(0.5));
  CHECK(r[1].first == "spearman");
  CHECK(r[1].second == Approx(0.5));

  CHECK_THAT(error_of([&] {
               data::glue_metrics(glue_task("STS-B"), sts, {1, 2, 3}, {});
             }),
             Catch::Contains("expected 3 scores and no labels, got 0 scores and 3 labels"));
  std::vector<GlueExample> unlabeled(2);
  CHECK_THAT(error_of([&] {
               data::glue_metrics(glue_task("RTE"), unlabeled, {0, 1}, {});
             }),
             Catch::Contains("has no gold label"));
}

TEST_CASE("glue: submission files", "[glue]") {
  TempDir d;
  const auto rte = read_glue(glue_task("RTE"),
                             d.write("RTE/test.tsv",
                                     "index\tsentence1\tsentence2\n"
                                     "0\tA.\tB.\n1\tC.\tD.\n2\tE.\tF.\n"),
                             true);
  const std::string out = (d.path / data::glue_submission_name(glue_task("RTE"), "test")).string();
  data::write_glue_predictions(glue_task("RTE"), rte, {1, 0, 0}, {}, out);
  CHECK(slurp(out) == "index\tprediction\n0\tnot_entailment\n1\tentailment\n2\tentailment\n");
  CHECK(engine::testing::names_starting_with(d.path, "RTE.tsv.tmp").empty());
  // The submission reads back as the predictions: each row's label name is the predicted class.
  {
    std::ifstream f(out);
    std::string line;
    std::getline(f, line);
    CHECK(line == "index\tprediction");
    const int64_t want[] = {1, 0, 0};
    for (size_t i = 0; i < rte.size(); ++i) {
      REQUIRE(std::getline(f, line));
      const size_t tab = line.find('\t');
      CHECK(std::stoll(line.substr(0, tab)) == rte[i].index);
      const auto& names = glue_task("RTE").label_names;
      CHECK(std::find(names.begin(), names.end(), line.substr(tab + 1)) - names.begin() == want[i]);
    }
    CHECK_FALSE(std::getline(f, line));
  }

  // Numeric labels for the 0/1 tasks; test ids as the file has them (here not 0-based).
  const auto sst = read_glue(glue_task("SST-2"),
                             d.write("SST-2/test.tsv", "index\tsentence\n10\ta\n11\tb\n"), true);
  data::write_glue_predictions(glue_task("SST-2"), sst, {0, 1}, {}, d.path / "SST-2.tsv");
  CHECK(slurp((d.path / "SST-2.tsv").string()) == "index\tprediction\n10\t0\n11\t1\n");

  // STS-B: scores as the shortest decimal that reads back exactly.
  const std::string h = kStsbHead + "\n";
  const auto sts = read_glue(
      glue_task("STS-B"),
      d.write("STS-B/test.tsv", h + "0\tg\tf\ty\to\ts\ts\tA\tB\n1\tg\tf\ty\to\ts\ts\tC\tD\n"
                                    "2\tg\tf\ty\to\ts\ts\tE\tF\n"),
      true);
  const std::string sts_out = (d.path / "STS-B.tsv").string();
  data::write_glue_predictions(glue_task("STS-B"), sts, {}, {3.25, 0.1, 5.0}, sts_out);
  CHECK(slurp(sts_out) == "index\tprediction\n0\t3.25\n1\t0.1\n2\t5\n");

  // MNLI labels, overwriting an existing file.
  std::vector<GlueExample> mnli(3);
  for (int i = 0; i < 3; ++i) mnli[i].index = i;
  data::write_glue_predictions(glue_task("MNLI"), mnli, {0, 1, 2}, {}, out);
  CHECK(slurp(out) == "index\tprediction\n0\tcontradiction\n1\tentailment\n2\tneutral\n");

  // Errors: dev examples (no test index), a label out of range, sizes, duplicate ids.
  std::vector<GlueExample> dev(1);
  CHECK_THAT(error_of([&] { data::write_glue_predictions(glue_task("RTE"), dev, {0}, {}, out); }),
             Catch::Contains("has no test index"));
  CHECK_THAT(error_of([&] {
               data::write_glue_predictions(glue_task("RTE"), rte, {0, 2, 1}, {}, out);
             }),
             Catch::Contains("label 2 of example 1 is outside [0, 2) for RTE"));
  CHECK_THAT(error_of([&] { data::write_glue_predictions(glue_task("RTE"), rte, {0}, {}, out); }),
             Catch::Contains("expected 3 labels and no scores, got 1 labels"));
  CHECK_THAT(error_of([&] {
               data::write_glue_predictions(glue_task("STS-B"), sts, {0, 1, 2}, {}, out);
             }),
             Catch::Contains("expected 3 scores and no labels"));
  std::vector<GlueExample> dup(2);
  dup[0].index = dup[1].index = 4;
  CHECK_THAT(error_of([&] {
               data::write_glue_predictions(glue_task("RTE"), dup, {0, 0}, {}, out);
             }),
             Catch::Contains("test index 4 appears twice"));
  // A failed write leaves the previous file as it was.
  CHECK(slurp(out) == "index\tprediction\n0\tcontradiction\n1\tentailment\n2\tneutral\n");
  const std::string no_dir = (d.path / "missing" / "RTE.tsv").string();
  CHECK_THAT(error_of([&] {
               data::write_glue_predictions(glue_task("RTE"), rte, {0, 0, 0}, {}, no_dir);
             }),
             Catch::Contains("[glue] " + no_dir + ": cannot create the temporary file '" + no_dir +
                             ".tmp.") &&
                 Catch::Contains("(No such file or directory)"));
}

TEST_CASE("encode_pair: BERT's layout, segment ids and longest-first truncation",
          "[glue][encode]") {
  engine::testing::TempDir dir;
  // ids: [PAD]0 [UNK]1 [CLS]2 [SEP]3 [MASK]4 a5 b6 c7 d8 e9
  auto tok = data::load_wordpiece(
      dir.write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\nc\nd\ne\n"), true);
  data::EncodedPair one = data::encode_pair(*tok, "a B c", "", 16);
  CHECK(one.ids == std::vector<int32_t>{2, 5, 6, 7, 3});
  CHECK(one.types == std::vector<int8_t>{0, 0, 0, 0, 0});
  CHECK_FALSE(one.truncated);
  data::EncodedPair two = data::encode_pair(*tok, "a b", "c d e", 16);
  CHECK(two.ids == std::vector<int32_t>{2, 5, 6, 3, 7, 8, 9, 3});
  CHECK(two.types == std::vector<int8_t>{0, 0, 0, 0, 1, 1, 1, 1});
  // 4 + 2 tokens in 7 positions: 3 specials leave 4, taken from the longer side first (a on ties).
  data::EncodedPair cut = data::encode_pair(*tok, "a b c d", "e a", 7);
  CHECK(cut.ids == std::vector<int32_t>{2, 5, 6, 3, 9, 5, 3});
  CHECK(cut.truncated);
  cut = data::encode_pair(*tok, "a b c", "d e a", 7);  // tie: a loses first, then b, ...
  CHECK(cut.ids == std::vector<int32_t>{2, 5, 6, 3, 8, 9, 3});
  CHECK(data::encode_pair(*tok, "a b c d e", "", 4).ids == std::vector<int32_t>{2, 5, 6, 3});
  CHECK_THAT(engine::testing::error_of([&] { data::encode_pair(*tok, "a", "b", 4); }),
             Catch::Contains("max_len 4 cannot hold"));
}
