// Corpus preparation, memory-mapped shards, FULL-SENTENCES packing, dynamic masking and the batch
// streams (data/corpus.h, data/batches.h), against a tiny whitespace tokenizer defined here so the
// tests do not depend on a WordPiece or SentencePiece vocabulary.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "data/batches.h"
#include "data/corpus.h"
#include "engine/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
using data::Split;

using engine::testing::error_of;
using engine::testing::error_with_file_size_limit;
using engine::testing::names_starting_with;
using engine::testing::TempDir;

namespace {

// Ids: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then "w0" .. "w<words-1>" = 5 ... Words split on
// ASCII spaces and tabs; unknown words are [UNK]; a word made only of U+FFFD is dropped (as BERT's
// text cleaning drops U+FFFD), so a line of invalid bytes gives no tokens.
class TestTokenizer : public data::Tokenizer {
 public:
  explicit TestTokenizer(int64_t words = 995, std::string path = "test-vocab")
      : words_(words), path_(std::move(path)) {
    special_.pad = 0, special_.unk = 1, special_.cls = 2, special_.sep = 3, special_.mask = 4;
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (const std::string& w : pieces(text)) {
      bool replacement_only = true;
      for (size_t i = 0; i < w.size(); i += 3)
        replacement_only = replacement_only && w.compare(i, 3, "\xEF\xBF\xBD") == 0;
      if (replacement_only && w.size() % 3 == 0) continue;
      ids.push_back(piece_to_id(w));
      if (ids.back() < 0) ids.back() = special_.unk;
    }
    return ids;
  }
  std::vector<std::string> pieces(std::string_view text) const override {
    std::vector<std::string> out;
    std::string cur;
    for (char c : text) {
      if (c == ' ' || c == '\t') {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
  }
  std::string id_to_piece(int32_t id) const override {
    static const char* names[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    return id < 5 ? names[id] : "w" + std::to_string(id - 5);
  }
  int32_t piece_to_id(const std::string& piece) const override {
    for (int32_t i = 0; i < 5; ++i)
      if (piece == id_to_piece(i)) return i;
    if (piece.size() < 2 || piece[0] != 'w' || piece.size() > 8) return -1;
    int64_t n = 0;
    for (size_t i = 1; i < piece.size(); ++i) {
      if (piece[i] < '0' || piece[i] > '9') return -1;
      n = n * 10 + (piece[i] - '0');
    }
    return n < words_ ? static_cast<int32_t>(5 + n) : -1;
  }
  int64_t vocab_size() const override { return 5 + words_; }
  const data::SpecialIds& special() const override { return special_; }
  bool is_special(int32_t id) const override { return id >= 0 && id < 5; }
  std::string kind() const override { return "test"; }
  std::string path() const override { return path_; }

 private:
  int64_t words_;
  std::string path_;
  data::SpecialIds special_;
};

using Doc = std::vector<std::string>;  // lines

std::string random_line(std::mt19937& rng, int words, int vocab_words = 995) {
  std::string line;
  for (int i = 0; i < words; ++i) {
    if (i) line += ' ';
    line += "w" + std::to_string(rng() % vocab_words);
  }
  return line;
}

// A few hundred documents: ordinary ones, some with invalid UTF-8 inside words, some empty (a line
// of invalid bytes only: no tokens), one longer than any max_len used here.
std::vector<Doc> make_docs(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Doc> docs;
  for (int d = 0; d < n; ++d) {
    Doc doc;
    if (d % 50 == 7) {
      doc.push_back("\xff\xfe");
    } else if (d == 5) {
      for (int l = 0; l < 40; ++l) doc.push_back(random_line(rng, 30));  // 1200 tokens
    } else {
      const int lines = 1 + rng() % 4;
      for (int l = 0; l < lines; ++l) doc.push_back(random_line(rng, 1 + rng() % 25));
      if (d % 17 == 3) doc.back() += " w12\xc3 \xe2\x82 w99";  // two invalid sequences
      if (d % 23 == 4) doc.back() += " zzz";                   // an unknown word: [UNK]
    }
    docs.push_back(doc);
  }
  return docs;
}

// Blank lines between documents, in several spellings (empty, spaces, repeated, CRLF).
void write_docs(const std::string& path, const std::vector<Doc>& docs) {
  std::ofstream f(path, std::ios::binary);
  for (size_t d = 0; d < docs.size(); ++d) {
    const char* eol = d % 11 == 2 ? "\r\n" : "\n";
    for (const std::string& line : docs[d]) f << line << eol;
    f << (d % 3 == 0 ? "\n" : d % 3 == 1 ? "  \t\n" : "\n\n");
  }
}

struct Expected {
  std::vector<uint32_t> tokens[2];
  std::vector<uint64_t> offsets[2] = {{0}, {0}};
  int64_t lines[2] = {0, 0}, empty = 0, invalid = 0;
};

// What prepare_corpus should write, computed independently from the documents (document index
// counts every document, empty ones included, over all files in order).
Expected expected_of(const std::vector<std::vector<Doc>>& files, const data::Tokenizer& tok,
                     uint64_t seed, int64_t ratio) {
  Expected e;
  uint64_t index = 0;
  std::string clean;
  for (const auto& docs : files) {
    for (const Doc& doc : docs) {
      const int s = data::is_valid_document(index++, seed, ratio) ? 1 : 0;
      std::vector<uint32_t> toks;
      for (const std::string& line : doc) {
        e.invalid += data::sanitize_utf8(line, clean);
        for (int32_t id : tok.encode(clean)) toks.push_back(static_cast<uint32_t>(id));
      }
      if (toks.empty()) {
        ++e.empty;
        continue;
      }
      e.lines[s] += static_cast<int64_t>(doc.size());
      e.tokens[s].insert(e.tokens[s].end(), toks.begin(), toks.end());
      e.offsets[s].push_back(e.tokens[s].size());
    }
  }
  return e;
}

data::PrepareOptions quiet_options(int64_t ratio = 199, uint64_t seed = 1) {
  data::PrepareOptions o;
  o.valid_ratio = ratio;
  o.seed = seed;
  o.quiet = true;
  return o;
}

std::vector<int64_t> row(const engine::Tensor& t, int64_t r) {
  const std::vector<int64_t> all = t.to_vector<int64_t>();
  const int64_t T = t.size(1);
  return std::vector<int64_t>(all.begin() + r * T, all.begin() + (r + 1) * T);
}

// A corpus of `n` random documents (lengths 1 .. max_doc words, one per line) in `dir`/corpus.
std::string random_corpus(const TempDir& dir, int n, int max_doc, uint32_t seed,
                          int64_t ratio = 199) {
  std::mt19937 rng(seed);
  std::vector<Doc> docs;
  for (int d = 0; d < n; ++d) docs.push_back({random_line(rng, 1 + rng() % max_doc)});
  write_docs(dir / "in.txt", docs);
  TestTokenizer tok;
  data::prepare_corpus({dir / "in.txt"}, tok, dir / "corpus", quiet_options(ratio));
  return dir / "corpus";
}

int64_t read_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}

}  // namespace

// ---- UTF-8 -------------------------------------------------------------------------------------

TEST_CASE("sanitize_utf8 replaces each maximal ill-formed subpart by one U+FFFD", "[corpus]") {
  std::string out;
  const std::string r = "\xEF\xBF\xBD";
  CHECK(data::sanitize_utf8("plain ascii", out) == 0);
  CHECK(out == "plain ascii");
  CHECK(data::sanitize_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", out) == 0);  // é € 😀
  CHECK(out == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(data::sanitize_utf8("a\xff"
                            "b",
                            out) == 1);
  CHECK(out == "a" + r + "b");
  CHECK(data::sanitize_utf8("\xe2\x82x", out) == 1);  // truncated 3-byte sequence: one
  CHECK(out == r + "x");
  CHECK(data::sanitize_utf8("\xc0\xaf", out) == 2);          // overlong '/': two
  CHECK(data::sanitize_utf8("\xed\xa0\x80", out) == 3);      // a surrogate: three
  CHECK(data::sanitize_utf8("\xf4\x90\x80\x80", out) == 4);  // above U+10FFFF
  CHECK(data::sanitize_utf8("\xf0\x9f\x98", out) == 1);      // truncated at the end
  CHECK(out == r);
}

// ---- preparation -------------------------------------------------------------------------------

TEST_CASE("prepare_corpus writes shards that read back as the input's tokens", "[corpus]") {
  TempDir dir;
  TestTokenizer tok;
  const std::vector<Doc> docs_a = make_docs(400, 11), docs_b = make_docs(150, 12);
  write_docs(dir / "a.txt", docs_a);
  write_docs(dir / "b.txt", docs_b);
  const int64_t ratio = GENERATE(int64_t{199}, int64_t{4});
  const std::string out = dir / "corpus";
  const data::CorpusStats stats =
      data::prepare_corpus({dir / "a.txt", dir / "b.txt"}, tok, out, quiet_options(ratio, 7));
  const Expected e = expected_of({docs_a, docs_b}, tok, 7, ratio);

  CHECK(names_starting_with(dir.path, "corpus.tmp").empty());
  for (const char* f : {"train.bin", "train.idx", "valid.bin", "valid.idx", "meta.json"})
    CHECK(fs::exists(fs::path(out) / f));

  CHECK(stats.empty_documents == e.empty);
  CHECK(stats.empty_documents == 11);  // documents 7, 57, ..., 357 of a.txt; 7, 57, 107 of b.txt
  CHECK(stats.invalid_utf8 == e.invalid);
  CHECK(stats.invalid_utf8 > 0);
  CHECK(stats.lines == e.lines[0] + e.lines[1] + e.empty);
  CHECK(stats.train.tokens == static_cast<int64_t>(e.tokens[0].size()));
  CHECK(stats.valid.tokens == static_cast<int64_t>(e.tokens[1].size()));
  CHECK(stats.train.documents + stats.valid.documents + stats.empty_documents == 550);
  CHECK(stats.train.lines == e.lines[0]);
  CHECK(stats.valid.lines == e.lines[1]);
  // The split: about 1 document in ratio + 1 goes to valid.
  const double valid_share =
      static_cast<double>(stats.valid.documents) / (stats.train.documents + stats.valid.documents);
  if (ratio == 4) CHECK(std::abs(valid_share - 0.2) < 0.05);
  if (ratio == 199) CHECK(valid_share < 0.02);

  // meta.json holds the counts.
  const data::CorpusMeta meta = data::read_corpus_meta(out);
  CHECK(meta.tokenizer_kind == "test");
  CHECK(meta.tokenizer_path == std::filesystem::absolute("test-vocab")
                                   .lexically_normal()
                                   .string());  // absolute: usable from any directory
  CHECK(meta.vocab_size == 1000);
  CHECK(meta.token_dtype == "uint32");
  CHECK(meta.stats.train.tokens == stats.train.tokens);
  CHECK(meta.stats.valid.documents == stats.valid.documents);
  CHECK(meta.stats.invalid_utf8 == stats.invalid_utf8);
  CHECK(meta.stats.empty_documents == stats.empty_documents);
  CHECK(meta.stats.lines == stats.lines);
  CHECK(meta.sources.size() == 2);
  CHECK(meta.valid_ratio == ratio);
  CHECK(meta.seed == 7);
  {
    std::ifstream f(fs::path(out) / "meta.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    CHECK(j["split_rule"]["rule"].get<std::string>().find("Philox") != std::string::npos);
    CHECK(j["tokenizer"]["special"]["cls"] == 2);
  }

  // Reading back: the tokens and document boundaries of each split, in input order.
  const data::Corpus corpus(out);
  for (int s = 0; s < 2; ++s) {
    const data::ShardReader& shard = corpus.split(s ? Split::valid : Split::train);
    REQUIRE(shard.num_tokens() == static_cast<int64_t>(e.tokens[s].size()));
    CHECK(std::equal(shard.tokens().begin(), shard.tokens().end(), e.tokens[s].begin()));
    CHECK(std::vector<uint64_t>(shard.offsets().begin(), shard.offsets().end()) == e.offsets[s]);
    for (int64_t d = 0; d < shard.num_documents(); ++d)
      CHECK(shard.document(d).size() == e.offsets[s][d + 1] - e.offsets[s][d]);
  }
  // A split opened on its own, and moved: the mapping goes with the reader.
  data::ShardReader solo(out, Split::train);
  const data::ShardReader moved(std::move(solo));
  CHECK(moved.num_tokens() == static_cast<int64_t>(e.tokens[0].size()));
  CHECK(std::equal(moved.tokens().begin(), moved.tokens().end(), e.tokens[0].begin()));
  CHECK(solo.num_tokens() == 0);
  CHECK_THAT(error_of([&] { moved.document(moved.num_documents()); }),
             Catch::Contains("out of range"));

  // The long document survives whole (1200 tokens in one document).
  bool found_long = false;
  for (Split s : {Split::train, Split::valid})
    for (int64_t d = 0; d < corpus.split(s).num_documents(); ++d)
      found_long = found_long || corpus.split(s).document(d).size() == 1200;
  CHECK(found_long);
}

TEST_CASE("a large valid share and a 4000-document corpus split about 1 in 200", "[corpus]") {
  TempDir dir;
  TestTokenizer tok;
  std::vector<Doc> docs;
  for (int d = 0; d < 4000; ++d) docs.push_back({"w" + std::to_string(d % 900)});
  write_docs(dir / "in.txt", docs);
  const data::CorpusStats s =
      data::prepare_corpus({dir / "in.txt"}, tok, dir / "c", quiet_options(199, 3));
  CHECK(s.train.documents + s.valid.documents == 4000);
  CHECK(s.valid.documents >= 6);  // 20 expected; binomial sd 4.5
  CHECK(s.valid.documents <= 40);
  // valid_ratio 0: no valid split (and an empty valid split opens fine).
  const data::CorpusStats none =
      data::prepare_corpus({dir / "in.txt"}, tok, dir / "d", quiet_options(0));
  CHECK(none.valid.documents == 0);
  const data::Corpus c(dir / "d");
  CHECK(c.valid().num_tokens() == 0);
  CHECK(c.valid().num_documents() == 0);
  CHECK(c.train().num_documents() == 4000);
}

TEST_CASE("prepare_corpus reads .xz and .gz input like plain text", "[corpus]") {
  const std::string tool = GENERATE(std::string("xz"), std::string("gzip"));
  if (std::system(("command -v " + tool + " >/dev/null 2>&1").c_str()) != 0) {
    WARN(tool << " not installed: not tested");
    return;
  }
  const std::string ext = tool == "xz" ? ".xz" : ".gz";
  TempDir dir;
  TestTokenizer tok;
  write_docs(dir / "in.txt", make_docs(300, 5));
  if (tool == "xz") {
    REQUIRE(std::system(("xz -k -c " + (dir / "in.txt") + " > " + (dir / "in.txt.xz")).c_str()) ==
            0);
  } else {
    // Two gzip members back to back (cat a.gz b.gz) read as one text.
    const std::string half = "head -c 40000 " + (dir / "in.txt");
    const std::string rest = "tail -c +40001 " + (dir / "in.txt");
    REQUIRE(
        std::system(("(" + half + " | gzip -c; " + rest + " | gzip -c) > " + (dir / "in.txt.gz"))
                        .c_str()) == 0);
  }
  const std::string packed = dir / ("in.txt" + ext);
  const data::CorpusStats plain =
      data::prepare_corpus({dir / "in.txt"}, tok, dir / "p", quiet_options());
  const data::CorpusStats xz = data::prepare_corpus({packed}, tok, dir / "x", quiet_options());
  CHECK(xz.train.tokens == plain.train.tokens);
  CHECK(xz.valid.tokens == plain.valid.tokens);
  CHECK(xz.invalid_utf8 == plain.invalid_utf8);
  const data::Corpus p(dir / "p"), x(dir / "x");
  CHECK(std::equal(p.train().tokens().begin(), p.train().tokens().end(), x.train().tokens().begin(),
                   x.train().tokens().end()));

  // A truncated archive is an error naming the file, and leaves nothing behind.
  const auto size = fs::file_size(packed);
  fs::resize_file(packed, size / 2);
  const std::string err =
      error_of([&] { data::prepare_corpus({packed}, tok, dir / "y", quiet_options()); });
  CHECK_THAT(err, Catch::Contains("[corpus]") && Catch::Contains("in.txt" + ext));
  CHECK_FALSE(fs::exists(dir / "y"));
  CHECK(names_starting_with(dir.path, "y.tmp").empty());
}

TEST_CASE("prepare_corpus errors: missing input, no tokens, non-empty output", "[corpus]") {
  TempDir dir;
  TestTokenizer tok;
  write_docs(dir / "in.txt", make_docs(30, 1));

  CHECK_THAT(error_of([&] {
               data::prepare_corpus({dir / "in.txt", dir / "missing.txt"}, tok, dir / "c",
                                    quiet_options());
             }),
             Catch::Contains("[corpus] input file") && Catch::Contains("missing.txt") &&
                 Catch::Contains("does not exist"));
  CHECK_FALSE(fs::exists(dir / "c"));

  // Only blank lines and lines that tokenize to nothing.
  {
    std::ofstream f(dir / "empty.txt", std::ios::binary);
    f << "\n\n   \n\xff\xfe\n\n\xc3\n";
  }
  CHECK_THAT(
      error_of([&] { data::prepare_corpus({dir / "empty.txt"}, tok, dir / "c", quiet_options()); }),
      Catch::Contains("[corpus] no tokens") && Catch::Contains("empty.txt"));
  CHECK_FALSE(fs::exists(dir / "c"));
  CHECK(names_starting_with(dir.path, "c.tmp").empty());

  // An existing, non-empty output directory.
  fs::create_directories(dir / "busy");
  std::ofstream(dir / "busy/notes.txt") << "mine";
  CHECK_THAT(
      error_of([&] { data::prepare_corpus({dir / "in.txt"}, tok, dir / "busy", quiet_options()); }),
      Catch::Contains("exists and is not empty") && Catch::Contains("overwrite"));
  data::PrepareOptions over = quiet_options();
  over.overwrite = true;
  CHECK_THAT(error_of([&] { data::prepare_corpus({dir / "in.txt"}, tok, dir / "busy", over); }),
             Catch::Contains("not a prepared corpus"));
  CHECK(fs::exists(dir / "busy/notes.txt"));

  // An empty directory is fine; a prepared corpus is replaced with overwrite only.
  fs::create_directories(dir / "fresh");
  data::prepare_corpus({dir / "in.txt"}, tok, dir / "fresh/", quiet_options());
  CHECK(fs::exists(dir / "fresh/meta.json"));
  CHECK_THAT(error_of([&] {
               data::prepare_corpus({dir / "in.txt"}, tok, dir / "fresh", quiet_options());
             }),
             Catch::Contains("exists and is not empty"));
  // Stale temporaries are cleared: a killed run's (its pid is no process: above any pid_max) and
  // an older build's "<dir>.tmp"; a running process's (pid 1 always runs) is left alone.
  for (const char* stale : {"fresh.tmp.99999999", "fresh.tmp", "fresh.tmp.1"}) {
    fs::create_directories(dir.path / stale);
    std::ofstream(dir.path / stale / "train.bin") << "junk";
  }
  const data::CorpusStats s = data::prepare_corpus({dir / "in.txt"}, tok, dir / "fresh", over);
  CHECK(s.train.tokens > 0);
  CHECK(names_starting_with(dir.path, "fresh.tmp") == std::vector<std::string>{"fresh.tmp.1"});
  CHECK(data::Corpus(dir / "fresh").train().num_tokens() == s.train.tokens);
}

TEST_CASE("prepare_corpus on a full disk keeps the old corpus and leaves no temporary",
          "[corpus]") {
  TempDir dir;
  TestTokenizer tok;
  write_docs(dir / "small.txt", make_docs(30, 1));
  write_docs(dir / "large.txt", make_docs(2000, 2));
  const std::string out = dir / "corpus";
  const data::CorpusStats old =
      data::prepare_corpus({dir / "small.txt"}, tok, out, quiet_options());
  data::PrepareOptions over = quiet_options();
  over.overwrite = true;
  // A file size limit in a forked child stands in for the full disk (see test_support.h).
  const std::string err = error_with_file_size_limit(
      4096, [&] { data::prepare_corpus({dir / "large.txt"}, tok, out, over); });
  CHECK_THAT(err, Catch::Contains("[corpus] " + out + ".tmp.") &&
                      Catch::Contains(": write failed (File too large)"));
  CHECK(names_starting_with(dir.path, "corpus.tmp").empty());
  const data::Corpus c(out);
  CHECK(c.train().num_tokens() == old.train.tokens);
}

TEST_CASE("the shard reader names the file on truncation and bad ids", "[corpus]") {
  TempDir dir;
  TestTokenizer tok;
  write_docs(dir / "in.txt", make_docs(100, 3));
  const std::string out = dir / "c";
  data::prepare_corpus({dir / "in.txt"}, tok, out, quiet_options(4));

  SECTION("no meta.json") {
    CHECK_THAT(error_of([&] { data::Corpus c(dir / "nothing"); }),
               Catch::Contains("meta.json not found"));
  }
  SECTION("truncated train.bin") {
    fs::resize_file(fs::path(out) / "train.bin", fs::file_size(fs::path(out) / "train.bin") - 6);
    CHECK_THAT(error_of([&] { data::Corpus c(out); }), Catch::Contains("[corpus]") &&
                                                           Catch::Contains("train.bin") &&
                                                           Catch::Contains("truncated"));
  }
  SECTION("truncated valid.idx") {
    fs::resize_file(fs::path(out) / "valid.idx", 8);
    CHECK_THAT(error_of([&] { data::Corpus c(out); }), Catch::Contains("valid.idx"));
  }
  SECTION("a token id >= the vocabulary size") {
    {
      std::fstream f(fs::path(out) / "train.bin", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(4 * 10);
      const uint32_t bad = 1000;
      f.write(reinterpret_cast<const char*>(&bad), 4);
    }
    CHECK_THAT(error_of([&] { data::Corpus c(out); }), Catch::Contains("train.bin") &&
                                                           Catch::Contains("token 10 is 1000") &&
                                                           Catch::Contains("vocabulary size 1000"));
    // Without the scan, the batch builder catches it when it reads the token.
    data::OpenOptions lazy;
    lazy.check_tokens = false;
    const data::Corpus c(out, lazy);
    data::BatchOptions bo;
    bo.batch_size = 4;
    bo.max_len = 32;
    bo.shuffle = false;
    data::BatchStream stream(c, Split::train, tok, bo);
    CHECK_THAT(error_of([&] { stream.next_batch(); }),
               Catch::Contains("[batch]") && Catch::Contains("train.bin"));
  }
  SECTION("offsets out of order") {
    {
      std::fstream f(fs::path(out) / "train.idx", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(8 * 2);
      const uint64_t bad = 0;
      f.write(reinterpret_cast<const char*>(&bad), 8);
    }
    CHECK_THAT(error_of([&] { data::Corpus c(out); }),
               Catch::Contains("train.idx") && Catch::Contains("strictly increasing"));
  }
  SECTION("meta.json with a missing key") {
    std::ifstream in(fs::path(out) / "meta.json");
    nlohmann::json j = nlohmann::json::parse(in);
    in.close();
    j["splits"]["train"].erase("tokens");
    std::ofstream(fs::path(out) / "meta.json") << j.dump();
    CHECK_THAT(error_of([&] { data::Corpus c(out); }),
               Catch::Contains("meta.json") && Catch::Contains("splits.train.tokens"));
  }
}

TEST_CASE("prepare_corpus failing at meta.json keeps the old corpus and removes the temporary",
          "[corpus]") {
  TempDir dir;
  TestTokenizer tok;
  write_docs(dir / "tiny.txt", make_docs(2, 4));  // shards of a few dozen bytes
  const std::string out = dir / "corpus";
  const data::CorpusStats old = data::prepare_corpus({dir / "tiny.txt"}, tok, out, quiet_options());
  const uintmax_t meta = fs::file_size(fs::path(out) / "meta.json");
  REQUIRE(fs::file_size(fs::path(out) / "train.bin") < meta / 2);
  data::PrepareOptions over = quiet_options();
  over.overwrite = true;
  const std::string err = error_with_file_size_limit(
      meta / 2, [&] { data::prepare_corpus({dir / "tiny.txt"}, tok, out, over); });
  CHECK_THAT(err, Catch::Contains("[corpus] " + out + ".tmp.") &&
                      Catch::Contains("/meta.json: write failed (File too large)"));
  CHECK(names_starting_with(dir.path, "corpus.tmp").empty());
  CHECK(fs::file_size(fs::path(out) / "meta.json") == meta);
  CHECK(data::Corpus(out).train().num_tokens() == old.train.tokens);
}

namespace {

// How a forked child running `f` ended (waitpid status) and what it wrote to stderr. The child
// starts with the default SIGBUS action (not the test framework's handler) and ends with
// _exit(0) if `f` returns.
template <class F>
std::pair<int, std::string> run_in_child(F&& f) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], STDERR_FILENO);
    ::signal(SIGBUS, SIG_DFL);
    f();
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t r; (r = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    err.append(buf, static_cast<size_t>(r));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {status, err};
}

}  // namespace

TEST_CASE("a shard truncated while mapped stops the process naming it, a deleted one still reads",
          "[corpus]") {
  TempDir dir;
  TestTokenizer tok;
  write_docs(dir / "in.txt", make_docs(100, 3));
  const std::string out = dir / "c";
  data::prepare_corpus({dir / "in.txt"}, tok, out, quiet_options(4));
  const std::string bin = (fs::path(out) / "train.bin").string();

  SECTION("truncated: exit 1 with the file, the byte and the hint") {
    const auto [status, err] = run_in_child([&] {
      const data::Corpus c(out);
      data::set_read_fault_hint("The last checkpoint is ckpt/step_00000004.safetensors.");
      ::truncate(bin.c_str(), 0);
      uint32_t sum = 0;
      for (uint32_t t : c.train().tokens()) sum += t;
      std::fprintf(stderr, "read %u without a fault\n", sum);
    });
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 1);
    CHECK_THAT(err, Catch::StartsWith("[corpus] " + bin +
                                      ": reading the memory-mapped shard failed at byte 0 of ") &&
                        Catch::Contains("(SIGBUS: the file was truncated or became unreadable "
                                        "while it was in use); the run stops here. The last "
                                        "checkpoint is ckpt/step_00000004.safetensors.\n"));
  }
  SECTION("a SIGBUS outside the shards keeps its default action") {
    const auto [status, err] = run_in_child([&] {
      const data::Corpus c(out);  // the handler is installed
      const std::string other = dir / "other.bin";
      std::ofstream(other) << std::string(8192, 'x');
      const int fd = ::open(other.c_str(), O_RDONLY);
      auto* p =
          static_cast<const volatile char*>(::mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0));
      ::truncate(other.c_str(), 0);
      std::fprintf(stderr, "read %d without a fault\n", int(p[100]));
    });
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGBUS);
    CHECK(err.empty());
  }
  SECTION("deleted while mapped: the mapping holds the file; opening again names it") {
    const data::Corpus c(out);
    const std::vector<uint32_t> before(c.train().tokens().begin(), c.train().tokens().end());
    fs::remove(bin);
    CHECK(std::vector<uint32_t>(c.train().tokens().begin(), c.train().tokens().end()) == before);
    CHECK_THAT(error_of([&] { data::Corpus again(out); }),
               Catch::Contains("[corpus] cannot open " + bin + ": No such file or directory"));
  }
}

TEST_CASE("a 50 MB input prepares in bounded memory", "[corpus]") {
  TempDir dir;
  TestTokenizer tok;
  {
    std::ofstream f(dir / "big.txt", std::ios::binary);
    std::mt19937 rng(9);
    std::string line;
    int64_t written = 0;
    int n = 0;
    while (written < 50'000'000) {
      line = random_line(rng, 5 + rng() % 60);
      line += (++n % 8 == 0) ? "\n\n" : "\n";
      f << line;
      written += static_cast<int64_t>(line.size());
    }
  }
  const int64_t rss_before = read_status_kb("VmRSS:");
  const int64_t hwm_before = read_status_kb("VmHWM:");
  const auto t0 = std::chrono::steady_clock::now();
  const data::CorpusStats s =
      data::prepare_corpus({dir / "big.txt"}, tok, dir / "c", quiet_options());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t hwm_after = read_status_kb("VmHWM:");
  INFO("prepared " << s.train.tokens + s.valid.tokens << " tokens in " << secs << " s");
  CHECK(s.train.tokens + s.valid.tokens > 8'000'000);
  // The peak resident size grew by far less than the 50 MB input (or the 35 MB of tokens).
  if (rss_before > 0 && hwm_after > 0)
    CHECK(hwm_after <= std::max(hwm_before, rss_before + 24 * 1024));
  const data::Corpus c(dir / "c");
  CHECK(c.train().num_tokens() == s.train.tokens);
}

// ---- packing -----------------------------------------------------------------------------------

TEST_CASE("FULL-SENTENCES packing: max_len, [CLS] ... [SEP], document order, separators",
          "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const std::string path = random_corpus(dir, 300, 400, 21);  // many documents longer than max_len
  const data::Corpus corpus(path);
  const data::ShardReader& shard = corpus.train();
  const int64_t T = GENERATE(int64_t{3}, int64_t{64}, int64_t{129});
  const data::SequencePacker packer(shard, T, tok.special());

  // The expected content stream: documents joined by [SEP].
  std::vector<int64_t> stream;
  for (int64_t d = 0; d < shard.num_documents(); ++d) {
    if (d) stream.push_back(3);
    for (uint32_t t : shard.document(d)) stream.push_back(t);
  }
  CHECK(packer.stream_length() == static_cast<int64_t>(stream.size()));
  CHECK(packer.num_sequences() == (packer.stream_length() + T - 3) / (T - 2));

  std::vector<int64_t> content, ids(static_cast<size_t>(T));
  for (int64_t i = 0; i < packer.num_sequences(); ++i) {
    const int64_t len = packer.fill(i, ids.data());
    REQUIRE(len <= T);
    REQUIRE(len >= 3);
    CHECK(ids[0] == 2);
    CHECK(ids[len - 1] == 3);
    if (i + 1 < packer.num_sequences()) CHECK(len == T);
    for (int64_t p = len; p < T; ++p) CHECK(ids[p] == 0);
    content.insert(content.end(), ids.begin() + 1, ids.begin() + len - 1);
  }
  CHECK(content == stream);
  CHECK_THAT(error_of([&] { packer.fill(packer.num_sequences(), ids.data()); }),
             Catch::Contains("out of range"));
}

TEST_CASE("the unshuffled, unmasked stream yields the packed sequences in order", "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 50, 100, 4));
  data::BatchOptions o;
  o.batch_size = 3;
  o.max_len = 40;
  o.shuffle = false;
  o.masking.mask_prob = 0;
  data::BatchStream stream(corpus, Split::train, tok, o);
  const data::SequencePacker packer(corpus.train(), 40, tok.special());
  std::vector<int64_t> ids(40);
  int64_t seq = 0;
  for (int step = 0; step < 2 * stream.num_sequences() / 3 + 2; ++step) {
    const data::MlmBatch b = stream.next_batch();
    REQUIRE(b.inputs.input_ids.shape() == engine::Shape{3, 40});
    CHECK(b.inputs.input_ids.dtype() == engine::DType::i64);
    CHECK(b.inputs.attention_mask.dtype() == engine::DType::i64);
    CHECK(b.labels.dtype() == engine::DType::i64);
    for (int64_t r = 0; r < 3; ++r, seq = (seq + 1) % stream.num_sequences()) {
      const int64_t len = packer.fill(seq, ids.data());
      CHECK(row(b.inputs.input_ids, r) == ids);
      const std::vector<int64_t> mask = row(b.inputs.attention_mask, r);
      for (int64_t p = 0; p < 40; ++p) CHECK(mask[p] == (p < len ? 1 : 0));
      for (int64_t l : row(b.labels, r)) CHECK(l == -100);
    }
  }
}

TEST_CASE("cut_segment_pair: [CLS] A [SEP] B [SEP], types 0 then 1, a new cut each epoch",
          "[batches]") {
  const int64_t T = 16, sep = 3;
  std::set<int64_t> cuts;
  for (uint64_t epoch = 0; epoch < 60; ++epoch) {
    std::vector<int64_t> ids(T, 0), types(T, 7);
    ids[0] = 2;
    for (int64_t p = 1; p <= 10; ++p) ids[p] = 100 + p;  // 10 content tokens
    ids[11] = sep;
    const int64_t len = data::cut_segment_pair(ids.data(), types.data(), 12, T, sep, 5, epoch, 9);
    REQUIRE(len == 13);
    // Exactly one [SEP] inserted inside the content, A and B non-empty.
    std::vector<int64_t> seps;
    for (int64_t p = 0; p < len; ++p)
      if (ids[p] == sep) seps.push_back(p);
    REQUIRE(seps.size() == 2);
    const int64_t mid = seps[0];
    CHECK(mid >= 2);
    CHECK(mid <= 10);
    CHECK(seps[1] == len - 1);
    cuts.insert(mid);
    // The content in order, without the inserted [SEP].
    std::vector<int64_t> content;
    for (int64_t p = 1; p < len - 1; ++p)
      if (p != mid) content.push_back(ids[p]);
    std::vector<int64_t> want(10);
    std::iota(want.begin(), want.end(), 101);
    CHECK(content == want);
    for (int64_t p = 0; p < T; ++p) CHECK(types[p] == (p > mid && p < len ? 1 : 0));
    for (int64_t p = len; p < T; ++p) CHECK(ids[p] == 0);
    // The same (seed, epoch, sequence): the same cut.
    std::vector<int64_t> again(T, 0), again_types(T);
    again[0] = 2;
    for (int64_t p = 1; p <= 10; ++p) again[p] = 100 + p;
    again[11] = sep;
    data::cut_segment_pair(again.data(), again_types.data(), 12, T, sep, 5, epoch, 9);
    CHECK(again == ids);
  }
  CHECK(cuts.size() >= 5);  // 9 possible cuts, 60 epochs
  // One content token: nothing to cut.
  std::vector<int64_t> one{2, 50, sep, 0, 0, 0}, types(6, 9);
  CHECK(data::cut_segment_pair(one.data(), types.data(), 3, 6, sep, 1, 0, 0) == 3);
  CHECK(one == std::vector<int64_t>{2, 50, sep, 0, 0, 0});
  CHECK(types == std::vector<int64_t>(6, 0));
}

TEST_CASE("segment-pair batches: the packed stream with a [SEP] and types, never masked there",
          "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 50, 100, 4));
  data::BatchOptions o;
  o.batch_size = 4;
  o.max_len = 24;
  o.shuffle = false;
  o.segment_pairs = true;
  data::BatchStream stream(corpus, Split::train, tok, o);
  const data::SequencePacker packer(corpus.train(), 24, tok.special(), true);
  CHECK(stream.num_sequences() == packer.num_sequences());
  std::vector<int64_t> ids(24);
  int64_t seq = 0;
  for (int step = 0; step < 5; ++step) {
    const data::MlmBatch b = stream.next_batch();
    REQUIRE(b.inputs.token_type_ids.defined());
    REQUIRE(b.inputs.token_type_ids.shape() == engine::Shape{4, 24});
    for (int64_t r = 0; r < 4; ++r, ++seq) {
      const int64_t len = packer.fill(seq, ids.data());
      REQUIRE(len <= 23);  // room for the [SEP] between the segments
      const std::vector<int64_t> got = row(b.inputs.input_ids, r),
                                 types = row(b.inputs.token_type_ids, r);
      const std::vector<int64_t> labels = row(b.labels, r), mask = row(b.inputs.attention_mask, r);
      // Undo the masking, then drop the first [SEP] after B starts' predecessor: the packed row.
      std::vector<int64_t> orig = got;
      for (int64_t p = 0; p < 24; ++p)
        if (labels[p] != -100) orig[p] = labels[p];
      int64_t mid = -1;
      for (int64_t p = 1; p < 24; ++p)
        if (types[p] == 1) {
          mid = p - 1;
          break;
        }
      REQUIRE(mid > 1);
      CHECK(orig[mid] == 3);
      CHECK(labels[mid] == -100);  // the inserted [SEP] is never a prediction target
      orig.erase(orig.begin() + mid);
      orig.push_back(0);
      CHECK(orig == ids);
      for (int64_t p = 0; p < 24; ++p) CHECK(mask[p] == (p < len + 1 ? 1 : 0));
      for (int64_t p = mid + 1; p < len + 1; ++p) CHECK(types[p] == 1);
    }
  }
  // Same seed, same batches (types included).
  data::BatchStream a(corpus, Split::train, tok, o), c(corpus, Split::train, tok, o);
  const data::MlmBatch ba = a.next_batch(), bc = c.next_batch();
  CHECK(ba.inputs.token_type_ids.to_vector<int64_t>() ==
        bc.inputs.token_type_ids.to_vector<int64_t>());
  CHECK(ba.inputs.input_ids.to_vector<int64_t>() == bc.inputs.input_ids.to_vector<int64_t>());
  // Evaluation batches cut the same way every pass.
  data::EvalBatches e(corpus, Split::train, tok, 4, 24, data::EvalBatches::kDefaultSeed, {}, true);
  const std::optional<data::MlmBatch> e1 = e.next();
  e.rewind();
  const std::optional<data::MlmBatch> e2 = e.next();
  REQUIRE(e1);
  REQUIRE(e1->inputs.token_type_ids.defined());
  CHECK(e1->inputs.token_type_ids.to_vector<int64_t>() ==
        e2->inputs.token_type_ids.to_vector<int64_t>());
  // Too short for a pair.
  CHECK_THAT(error_of([&] { data::SequencePacker(corpus.train(), 4, tok.special(), true); }),
             Catch::Contains("expected >= 5 for segment pairs"));
}

TEST_CASE("sentence order: the same cut, half the pairs swapped and labelled", "[batches]") {
  const int32_t sep = 3;
  const int64_t T = 16;
  int swapped = 0, in_order = 0;
  for (uint64_t seq = 0; seq < 400; ++seq) {
    // [CLS] 10 11 .. 20 [SEP]: 11 content tokens.
    std::vector<int64_t> plain(T, 0), types_plain(T, 7);
    plain[0] = 2;
    for (int64_t k = 0; k < 11; ++k) plain[1 + k] = 10 + k;
    plain[12] = sep;
    std::vector<int64_t> ordered = plain, types(T, 7);
    const int64_t n =
        data::cut_segment_pair(plain.data(), types_plain.data(), 13, T, sep, 5, 1, seq);
    int64_t label = 42;
    CHECK(data::cut_segment_pair(ordered.data(), types.data(), 13, T, sep, 5, 1, seq, &label) == n);
    REQUIRE(n == 14);
    int64_t a = 0;  // A's length in the plain cut
    while (plain[1 + a] != sep) ++a;
    REQUIRE((label == 0 || label == 1));
    if (label == 0) {
      ++in_order;
      CHECK(ordered == plain);  // the cut without sentence order
      CHECK(types == types_plain);
      continue;
    }
    ++swapped;
    // [CLS] B [SEP] A [SEP], types 0 through B's [SEP], 1 after.
    const int64_t b = 11 - a;
    std::vector<int64_t> want{2};
    for (int64_t k = 0; k < b; ++k) want.push_back(10 + a + k);
    want.push_back(sep);
    for (int64_t k = 0; k < a; ++k) want.push_back(10 + k);
    want.push_back(sep);
    want.resize(T, 0);
    CHECK(ordered == want);
    for (int64_t p = 0; p < T; ++p) CHECK(types[p] == (p >= b + 2 && p < n ? 1 : 0));
  }
  CHECK(swapped > 160);
  CHECK(in_order > 160);
  // One content token: no pair, label -100.
  std::vector<int64_t> one{2, 50, sep, 0, 0, 0}, types(6, 9);
  int64_t label = 0;
  CHECK(data::cut_segment_pair(one.data(), types.data(), 3, 6, sep, 1, 0, 0, &label) == 3);
  CHECK(label == -100);
}

TEST_CASE("sentence-order batches: labels per row, reproducible, the same tokens as pairs",
          "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 50, 100, 4));
  data::BatchOptions o;
  o.batch_size = 8;
  o.max_len = 24;
  o.segment_pairs = true;
  data::BatchOptions so = o;
  so.sentence_order = true;
  data::BatchStream pairs(corpus, Split::train, tok, o), order(corpus, Split::train, tok, so),
      again(corpus, Split::train, tok, so);
  int64_t ones = 0, zeros = 0;
  for (int step = 0; step < 6; ++step) {
    const data::MlmBatch p = pairs.next_batch(), b = order.next_batch(), c = again.next_batch();
    CHECK_FALSE(p.sentence_labels.defined());
    REQUIRE(b.sentence_labels.defined());
    REQUIRE(b.sentence_labels.shape() == engine::Shape{8});
    CHECK(b.sentence_labels.to_vector<int64_t>() == c.sentence_labels.to_vector<int64_t>());
    CHECK(b.inputs.input_ids.to_vector<int64_t>() == c.inputs.input_ids.to_vector<int64_t>());
    const std::vector<int64_t> labels = b.sentence_labels.to_vector<int64_t>();
    for (int64_t r = 0; r < 8; ++r) {
      const int64_t l = labels[size_t(r)];
      REQUIRE((l == 0 || l == 1));
      (l ? ones : zeros) += 1;
      // Rows in order are the segment-pair rows, masks included; swapped rows hold the same
      // multiset of tokens.
      std::vector<int64_t> x = row(b.inputs.input_ids, r), y = row(p.inputs.input_ids, r);
      if (l == 0) {
        CHECK(x == y);
        CHECK(row(b.inputs.token_type_ids, r) == row(p.inputs.token_type_ids, r));
      } else {
        std::vector<int64_t> xl = row(b.labels, r), yl = row(p.labels, r);
        for (size_t k = 0; k < x.size(); ++k) {
          if (xl[k] != -100) x[k] = xl[k];
          if (yl[k] != -100) y[k] = yl[k];
        }
        CHECK(x != y);
        std::sort(x.begin(), x.end());
        std::sort(y.begin(), y.end());
        CHECK(x == y);
      }
    }
  }
  CHECK(ones > 8);
  CHECK(zeros > 8);
  // Host batches move their labels with them.
  const data::MlmBatch moved = order.next_batch().to(engine::Device::cpu());
  CHECK(moved.sentence_labels.defined());
  // Evaluation batches: the same labels every pass.
  data::EvalBatches e(corpus, Split::train, tok, 8, 24, data::EvalBatches::kDefaultSeed, {}, true,
                      true);
  const std::optional<data::MlmBatch> e1 = e.next();
  e.rewind();
  const std::optional<data::MlmBatch> e2 = e.next();
  REQUIRE(e1);
  REQUIRE(e1->sentence_labels.defined());
  CHECK(e1->sentence_labels.to_vector<int64_t>() == e2->sentence_labels.to_vector<int64_t>());
  CHECK_THAT(
      error_of([&] { data::SequencePacker(corpus.train(), 24, tok.special(), false, true); }),
      Catch::Contains("sentence order needs segment pairs"));
}

TEST_CASE("shuffled_index is a permutation per epoch", "[batches]") {
  for (uint64_t n : {1, 2, 3, 7, 100, 1000, 4097}) {
    std::set<uint64_t> seen;
    std::vector<uint64_t> order;
    for (uint64_t i = 0; i < n; ++i) {
      order.push_back(data::shuffled_index(i, n, 5, 0));
      seen.insert(order.back());
    }
    CHECK(seen.size() == n);
    CHECK(*seen.rbegin() == n - 1);
    if (n >= 100) {
      std::vector<uint64_t> next, other_seed;
      for (uint64_t i = 0; i < n; ++i) {
        next.push_back(data::shuffled_index(i, n, 5, 1));
        other_seed.push_back(data::shuffled_index(i, n, 6, 0));
      }
      CHECK(next != order);
      CHECK(other_seed != order);
      int fixed = 0;
      for (uint64_t i = 0; i < n; ++i) fixed += order[i] == i;
      CHECK(fixed < static_cast<int>(n / 10));
    }
  }
}

// ---- masking -----------------------------------------------------------------------------------

// A batch's predicted positions (flat b * T + t, ascending) and targets are its labels that are
// not -100, and its token count is the attention mask's sum: what the training step reads.
void check_predicted(const data::MlmBatch& b) {
  const std::vector<int64_t> labels = b.labels.to_vector<int64_t>(),
                             att = b.inputs.attention_mask.to_vector<int64_t>();
  std::vector<int64_t> positions, targets;
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] != -100) positions.push_back(int64_t(i)), targets.push_back(labels[i]);
  REQUIRE(b.positions.dtype() == engine::DType::i64);
  REQUIRE(b.positions.to_vector<int64_t>() == positions);
  REQUIRE(b.targets.to_vector<int64_t>() == targets);
  REQUIRE(b.num_predicted() == int64_t(positions.size()));
  REQUIRE(b.num_tokens == std::accumulate(att.begin(), att.end(), int64_t(0)));
}

TEST_CASE("masking rates are 15% / 80% / 10% / 10% and labels mark the chosen", "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 2000, 300, 8));
  data::BatchOptions o;
  o.batch_size = 16;
  o.max_len = 128;
  o.seed = 77;
  data::BatchStream stream(corpus, Split::train, tok, o);
  data::BatchOptions plain = o;
  plain.masking.mask_prob = 0;
  data::BatchStream original(corpus, Split::train, tok, plain);  // same order, no masking

  int64_t eligible = 0, chosen = 0, masked = 0, random = 0, kept = 0;
  while (eligible < 300'000) {
    const data::MlmBatch b = stream.next_batch(), u = original.next_batch();
    const std::vector<int64_t> ids = b.inputs.input_ids.to_vector<int64_t>(),
                               orig = u.inputs.input_ids.to_vector<int64_t>(),
                               labels = b.labels.to_vector<int64_t>(),
                               att = b.inputs.attention_mask.to_vector<int64_t>();
    REQUIRE(att == u.inputs.attention_mask.to_vector<int64_t>());
    check_predicted(b);
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool special = tok.is_special(static_cast<int32_t>(orig[i]));
      eligible += !special;
      if (labels[i] == -100) {
        REQUIRE(ids[i] == orig[i]);  // unchosen positions are untouched
        continue;
      }
      REQUIRE_FALSE(special);  // [CLS], [SEP], [PAD], [UNK] are never chosen
      REQUIRE(att[i] == 1);
      REQUIRE(labels[i] == orig[i]);
      ++chosen;
      if (ids[i] == 4) {
        ++masked;
      } else if (ids[i] != orig[i]) {
        ++random;
        REQUIRE_FALSE(tok.is_special(static_cast<int32_t>(ids[i])));
      } else {
        ++kept;
      }
    }
  }
  const double rate = static_cast<double>(chosen) / eligible;
  INFO("eligible " << eligible << " chosen " << chosen << " masked " << masked << " random "
                   << random << " kept " << kept);
  CHECK(std::abs(rate - 0.15) < 0.01);
  CHECK(std::abs(static_cast<double>(masked) / chosen - 0.8) < 0.01);
  CHECK(std::abs(static_cast<double>(random) / chosen - 0.1) < 0.01);
  CHECK(std::abs(static_cast<double>(kept) / chosen - 0.1) < 0.01);
}

TEST_CASE("the masker chooses round-about 15% per sequence and never special ids", "[batches]") {
  TestTokenizer tok;
  const data::Masker masker(tok);
  CHECK(masker.random_candidates().size() == 995);
  for (int32_t id : masker.random_candidates()) CHECK_FALSE(tok.is_special(id));
  // A sequence of 100 eligible tokens gets exactly 15 chosen; 10 eligible get 1 or 2.
  std::vector<int64_t> ids(102), labels(102);
  std::map<int64_t, int> counts;
  for (uint64_t s = 0; s < 200; ++s) {
    ids[0] = 2;
    for (int p = 1; p <= 100; ++p) ids[p] = 5 + (p * 7) % 995;
    ids[101] = 3;
    CHECK(masker.apply(ids.data(), labels.data(), 102, 1, 0, s) == 15);
    ids.assign(12, 5);
    ids[0] = 2;
    ids[11] = 3;
    ids.resize(102);
    ++counts[masker.apply(ids.data(), labels.data(), 12, 1, 0, s)];
  }
  CHECK(counts.size() == 2);
  CHECK(counts[1] + counts[2] == 200);
  CHECK(counts[2] > 60);  // P(2) = 0.5
  CHECK(counts[2] < 140);
}

// ---- determinism and resumption ----------------------------------------------------------------

TEST_CASE("same seed, same batches, seek resumes exactly, another seed differs", "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 60, 200, 13));
  data::BatchOptions o;
  o.batch_size = 5;
  o.max_len = 48;
  o.seed = 42;
  data::BatchStream a(corpus, Split::train, tok, o), b(corpus, Split::train, tok, o);
  const int64_t n = a.num_sequences();
  REQUIRE(n > 10);
  // Enough steps to cross two epoch boundaries.
  const int steps = static_cast<int>(3 * n / 5 + 3);
  std::vector<data::MlmBatch> run;
  std::vector<data::DataPosition> before;
  for (int k = 0; k < steps; ++k) {
    before.push_back(a.position());
    run.push_back(a.next_batch());
    const data::MlmBatch other = b.next_batch();
    CHECK(run.back().inputs.input_ids.to_vector<int64_t>() ==
          other.inputs.input_ids.to_vector<int64_t>());
    CHECK(run.back().labels.to_vector<int64_t>() == other.labels.to_vector<int64_t>());
  }
  CHECK(a.position().epoch >= 2);

  // Resume from a saved position (through its JSON form) at several steps.
  for (int k : {0, 1, 7, steps / 2, steps - 2}) {
    const std::string saved = before[k].to_json();
    data::BatchStream resumed(corpus, Split::train, tok, o);
    resumed.seek(data::DataPosition::from_json(saved));
    // The position is a pure function of the step: k batches of B sequences.
    CHECK(before[k].epoch == k * o.batch_size / n);
    CHECK(before[k].next_sequence == k * o.batch_size % n);
    for (int j = k; j < std::min(steps, k + 3); ++j) {
      const data::MlmBatch r = resumed.next_batch();
      CHECK(r.inputs.input_ids.to_vector<int64_t>() ==
            run[j].inputs.input_ids.to_vector<int64_t>());
      CHECK(r.inputs.attention_mask.to_vector<int64_t>() ==
            run[j].inputs.attention_mask.to_vector<int64_t>());
      CHECK(r.labels.to_vector<int64_t>() == run[j].labels.to_vector<int64_t>());
    }
  }

  // Dynamic masking: the same sequence is masked differently in another epoch.
  data::BatchOptions no_shuffle = o;
  no_shuffle.shuffle = false;
  data::BatchStream e0(corpus, Split::train, tok, no_shuffle),
      e1(corpus, Split::train, tok, no_shuffle);
  e1.seek({1, 0});
  const data::MlmBatch x0 = e0.next_batch(), x1 = e1.next_batch();
  CHECK(x0.inputs.attention_mask.to_vector<int64_t>() ==
        x1.inputs.attention_mask.to_vector<int64_t>());
  CHECK(x0.labels.to_vector<int64_t>() != x1.labels.to_vector<int64_t>());

  // Another seed: other order and other masks.
  data::BatchOptions other = o;
  other.seed = 43;
  data::BatchStream c(corpus, Split::train, tok, other);
  const data::MlmBatch first = c.next_batch();
  CHECK(first.labels.to_vector<int64_t>() != run[0].labels.to_vector<int64_t>());
  CHECK(first.inputs.input_ids.to_vector<int64_t>() !=
        run[0].inputs.input_ids.to_vector<int64_t>());
  data::BatchOptions other_unshuffled = no_shuffle;
  other_unshuffled.seed = 43;
  data::BatchStream c2(corpus, Split::train, tok, other_unshuffled),
      c1(corpus, Split::train, tok, no_shuffle);
  CHECK(c2.next_batch().labels.to_vector<int64_t>() != c1.next_batch().labels.to_vector<int64_t>());
}

TEST_CASE("shards of a global batch concatenate to the unsharded batch", "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 40, 200, 17));
  data::BatchOptions whole;
  whole.batch_size = 6;
  whole.max_len = 32;
  whole.seed = 7;
  data::BatchStream full(corpus, Split::train, tok, whole);
  const int64_t n = full.num_sequences();
  std::vector<data::BatchStream> shards;
  for (int64_t r = 0; r < 3; ++r) {
    data::BatchOptions o = whole;
    o.batch_size = 2;
    o.shard = r;
    o.num_shards = 3;
    shards.emplace_back(corpus, Split::train, tok, o);
  }
  // Across an epoch boundary; every shard stream keeps the global position.
  for (int64_t step = 0; step < n / 6 + 3; ++step) {
    const data::MlmBatch b = full.next_batch();
    std::vector<int64_t> ids, labels;
    for (auto& s : shards) {
      const data::MlmBatch part = s.next_batch();
      CHECK(part.inputs.input_ids.size(0) == 2);
      for (int64_t v : part.inputs.input_ids.to_vector<int64_t>()) ids.push_back(v);
      for (int64_t v : part.labels.to_vector<int64_t>()) labels.push_back(v);
      CHECK(s.position() == full.position());
    }
    CHECK(ids == b.inputs.input_ids.to_vector<int64_t>());
    CHECK(labels == b.labels.to_vector<int64_t>());
  }
  data::BatchOptions bad = whole;
  bad.shard = 3;
  bad.num_shards = 3;
  CHECK_THROWS_WITH(data::BatchStream(corpus, Split::train, tok, bad),
                    Catch::Contains("shard 3 of 3: expected 0 <= shard < num_shards"));
}

TEST_CASE("data positions: JSON round trip and bad input", "[batches]") {
  const data::DataPosition p{3, 17};
  CHECK(p.to_json() == R"({"epoch":3,"next_sequence":17})");
  CHECK(data::DataPosition::from_json(p.to_json()) == p);
  CHECK_THAT(error_of([] { data::DataPosition::from_json("{oops"); }),
             Catch::Contains("[batch]") && Catch::Contains("not JSON"));
  CHECK_THAT(error_of([] { data::DataPosition::from_json(R"({"epoch":-1,"next_sequence":0})"); }),
             Catch::Contains("'epoch'"));
  CHECK_THAT(error_of([] { data::DataPosition::from_json(R"({"epoch":1})"); }),
             Catch::Contains("'next_sequence'"));

  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 20, 50, 2));
  data::BatchStream s(corpus, Split::train, tok, {});
  CHECK_THAT(error_of([&] {
               s.seek({0, s.num_sequences()});
             }),
             Catch::Contains("cannot seek") && Catch::Contains("sequences per epoch"));
}

TEST_CASE("evaluation batches cover the valid split once, identically each time", "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 400, 200, 31, 4));
  REQUIRE(corpus.valid().num_tokens() > 0);
  data::EvalBatches eval(corpus, Split::valid, tok, 7, 64), again(corpus, Split::valid, tok, 7, 64);
  const data::SequencePacker packer(corpus.valid(), 64, tok.special());
  std::vector<std::vector<int64_t>> first_pass;
  int64_t rows = 0, batches = 0;
  while (auto b = eval.next()) {
    ++batches;
    const auto other = again.next();
    REQUIRE(other.has_value());
    CHECK(b->inputs.input_ids.to_vector<int64_t>() == other->inputs.input_ids.to_vector<int64_t>());
    CHECK(b->labels.to_vector<int64_t>() == other->labels.to_vector<int64_t>());
    check_predicted(*b);
    first_pass.push_back(b->labels.to_vector<int64_t>());
    // Every row is its packed sequence with the labelled positions restored.
    std::vector<int64_t> ids(64);
    for (int64_t r = 0; r < b->inputs.input_ids.size(0); ++r, ++rows) {
      packer.fill(rows, ids.data());
      std::vector<int64_t> restored = row(b->inputs.input_ids, r);
      const std::vector<int64_t> labels = row(b->labels, r);
      for (int p = 0; p < 64; ++p)
        if (labels[p] != -100) restored[p] = labels[p];
      CHECK(restored == ids);
    }
  }
  CHECK_FALSE(again.next().has_value());
  CHECK(rows == eval.num_sequences());
  CHECK(batches == eval.num_batches());
  eval.rewind();
  for (const auto& labels : first_pass) CHECK(eval.next()->labels.to_vector<int64_t>() == labels);
}

TEST_CASE("batching refuses a tokenizer that is not the corpus's", "[batches]") {
  TempDir dir;
  TestTokenizer tok;
  const data::Corpus corpus(random_corpus(dir, 20, 50, 2));
  TestTokenizer bigger(2000, "other-vocab");
  CHECK_THAT(
      error_of([&] { data::BatchStream s(corpus, Split::train, bigger, {}); }),
      Catch::Contains("[batch] tokenizer other-vocab") && Catch::Contains("not the one corpus"));
  data::BatchOptions bad;
  bad.max_len = 2;
  CHECK_THAT(error_of([&] { data::BatchStream s(corpus, Split::train, tok, bad); }),
             Catch::Contains("max_len is 2"));
  data::prepare_corpus({dir / "in.txt"}, tok, dir / "nv", quiet_options(0));
  const data::Corpus no_valid(dir / "nv");
  CHECK_THAT(error_of([&] { data::BatchStream s(no_valid, Split::valid, tok, {}); }),
             Catch::Contains("has no tokens"));
}
