// Tokenizers: WordPiece against expected pieces taken from the reference (a Python port of
// google-research/bert's tokenizer), SentencePiece training/loading/round trips, and the errors
// of both. Every file a test reads is written by the test into its own temporary directory.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "data/tokenizer.h"
#include "engine/error.h"

using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() / ("engine_tokenizer_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& contents) const {
    const std::string p = (path_ / name).string();
    std::ofstream(p, std::ios::binary) << contents;
    return p;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The small vocab of the WordPiece cases: specials, reserved "[...]" tokens, whole words, "##"
// continuations, accented/Greek/Cyrillic/CJK tokens; "the" twice (the later line wins), a blank
// line and a line with surrounding whitespace ("spaced" after stripping).
const std::vector<std::string> kVocab = {
    "[PAD]",  "[unused0]",  "[unused12]", "[UNK]",   "[CLS]",    "[SEP]",    "[MASK]", "the",
    "un",     "##aff",      "##able",     "hello",   "world",    "naive",    "cafe",   "café",
    "H",      "##é",        "##llo",      "W",       "##ö",      "##rld",    "中",     "文",
    "字",     "mixed",      "a",          "b",       "zero",     "##width",  "tab",    "new",
    "line",   "ret",        "no",         "##break", "break",    "wow",      "!",      ".",
    "'",      "-",          "dr",         "smith",   "s",        "state",    "of",     "art",
    "x",      "##x",        "##xx",       "##xxxx",  "οδυσσευς", "αθηνα",    "москва", "елка",
    "МОСКВА", "bad",        "##byte",     "byte",    "i",        "istanbul", "σας",    "the",
    "",       "  spaced \t"};

std::string vocab_text() {
  std::string s;
  for (const auto& t : kVocab) s += t + "\n";
  return s;
}

struct Case {
  std::string text;
  bool lower_case;
  std::vector<std::string> pieces;
};

std::vector<std::string> repeat_pieces(const std::string& first, const std::string& middle, int n,
                                       std::vector<std::string> tail) {
  std::vector<std::string> out{first};
  out.insert(out.end(), size_t(n), middle);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

}  // namespace

TEST_CASE("WordPiece reproduces the reference BERT tokenizer on tricky text", "[tokenizer]") {
  TempDir dir;
  const std::string vocab = dir.file("vocab.txt", vocab_text());
  const auto uncased = data::load_wordpiece(vocab, true);
  const auto cased = data::load_wordpiece(vocab, false);

  // Expected pieces: the output of tools/reference/wordpiece_reference.py (the Python port of
  // google-research/bert tokenization.py, FullTokenizer with max_input_chars_per_word=100) on
  // these strings and this vocab, run with /usr/bin/python3 (3.11, unicodedata 14.0.0).
  const std::vector<Case> cases = {
      {"Héllo Wörld", true, {"hello", "world"}},  // accents stripped after lower-casing
      {"naïve café", true, {"naive", "cafe"}},
      {"Héllo Wörld", false, {"H", "##é", "##llo", "W", "##ö", "##rld"}},  // cased keeps both
      {"naïve café", false, {"[UNK]", "café"}},
      {"中文字符 mixed", true, {"中", "文", "字", "[UNK]", "mixed"}},  // CJK: one token each
      {"\x01"
       "a\x7f"
       "b",
       true,
       {"[UNK]"}},                                           // controls removed: "ab" has no pieces
      {"zero\xe2\x80\x8bwidth", true, {"zero", "##width"}},  // U+200B is Cf: removed, no split
      {"tab\tnew\nline\rret", true, {"tab", "new", "line", "ret"}},
      {"no\xc2\xa0"
       "break",
       true,
       {"no", "break"}},  // U+00A0 (Zs) is a space
      {"nobreak", true, {"no", "##break"}},
      {"wow!!!...", true, {"wow", "!", "!", "!", ".", ".", "."}},
      {"Dr.Smith's", true, {"dr", ".", "smith", "'", "s"}},
      {"state-of-the-art", true, {"state", "-", "of", "-", "the", "-", "art"}},
      {"unknownword the", true, {"[UNK]", "the"}},
      {"unaffable", true, {"un", "##aff", "##able"}},
      {"UNAFFABLE", false, {"[UNK]"}},
      {"bad\xff"
       "byte\xe4\xb8",
       true,
       {"bad", "##byte"}},  // invalid bytes dropped, no split
      {"\xc0\xaf"
       "bad \xed\xa0\x80"
       "byte",
       true,
       {"bad", "byte"}},  // overlong, surrogate
      {"", true, {}},
      {" \t\n ", true, {}},
      {"ΟΔΥΣΣΕΥΣ Άθηνα", true, {"οδυσσευς", "αθηνα"}},  // final sigma ς, tonos stripped
      {"МОСКВА Ёлка", true, {"москва", "елка"}},
      {"МОСКВА Ёлка", false, {"МОСКВА", "[UNK]"}},
      {"İstanbul ΣΑΣ", true, {"istanbul", "σας"}},  // İ lower-cases to i + U+0307 (then stripped)
      {"\xe2\x80\xa8the\xe2\x80\xa9"
       "art",
       true,
       {"the", "art"}},  // U+2028/9 split words
      {"the\xef\xbb\xbf"
       "art\xc2\xadx",
       true,
       {"[UNK]"}},  // BOM, soft hyphen (Cf) removed
      {std::string(100, 'x'), true, repeat_pieces("x", "##xxxx", 24, {"##xx", "##x"})},
      {std::string(101, 'x'), true, {"[UNK]"}},  // longer than max_input_chars_per_word
      {"the [MASK] [unused0]", true, {"the", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[UNK]"}},
  };
  for (const auto& c : cases) {
    INFO("text: \"" << c.text << "\" lower_case=" << c.lower_case);
    const auto& tok = c.lower_case ? *uncased : *cased;
    CHECK(tok.pieces(c.text) == c.pieces);
    std::vector<int32_t> ids;
    for (const auto& p : c.pieces) ids.push_back(tok.piece_to_id(p));
    CHECK(tok.encode(c.text) == ids);
  }

  // The reference's ids (convert_tokens_to_ids): "the" is its last line, 63.
  CHECK(uncased->encode("unaffable the!") == std::vector<int32_t>{8, 9, 10, 63, 38});

  // max_input_chars_per_word is an option (google-research/bert's default is 200).
  const auto wide = data::load_wordpiece(vocab, true, 200);
  CHECK(uncased->pieces(std::string(150, 'x')) == std::vector<std::string>{"[UNK]"});
  CHECK(wide->pieces(std::string(150, 'x')) == repeat_pieces("x", "##xxxx", 37, {"##x"}));
}

TEST_CASE("WordPiece vocab: ids by line, special tokens, duplicates", "[tokenizer]") {
  TempDir dir;
  const std::string vocab = dir.file("vocab.txt", vocab_text());
  const auto tok = data::load_tokenizer(vocab);  // not .model: WordPiece
  REQUIRE(tok->kind() == "wordpiece");
  REQUIRE(tok->path() == vocab);
  REQUIRE(tok->vocab_size() == int64_t(kVocab.size()));  // one id per line, blank line included
  const auto& sp = tok->special();
  CHECK(sp.pad == 0);
  CHECK(sp.unk == 3);
  CHECK(sp.cls == 4);
  CHECK(sp.sep == 5);
  CHECK(sp.mask == 6);
  CHECK(tok->piece_to_id("the") == 63);     // the later duplicate wins, as in the reference
  CHECK(tok->id_to_piece(7) == "the");      // ... while its first line keeps its token
  CHECK(tok->piece_to_id("spaced") == 65);  // stripped
  CHECK(tok->id_to_piece(64).empty());
  CHECK(tok->piece_to_id("absent") == -1);
  CHECK(tok->id_to_piece(22) == "中");
  for (int32_t id : {0, 1, 2, 3, 4, 5, 6}) CHECK(tok->is_special(id));
  for (int32_t id : {7, 8, 9, 38, 64, 65}) CHECK_FALSE(tok->is_special(id));
  CHECK_THROWS_WITH(tok->id_to_piece(66), Contains("outside") && Contains("[0, 66)"));
  CHECK_THROWS_AS(tok->is_special(-1), engine::Error);

  // A vocab without a trailing newline has the same ids; CRLF lines are stripped of '\r'.
  std::string crlf;
  for (const auto& t : kVocab) crlf += t + "\r\n";
  const auto tok2 = data::load_wordpiece(dir.file("crlf.txt", crlf.substr(0, crlf.size() - 2)));
  CHECK(tok2->vocab_size() == int64_t(kVocab.size()));
  CHECK(tok2->pieces("Unaffable hello") ==
        std::vector<std::string>{"un", "##aff", "##able", "hello"});
}

TEST_CASE("WordPiece errors name the vocab file and what is missing", "[tokenizer][errors]") {
  TempDir dir;
  const std::string missing = dir.path("missing.txt");
  CHECK_THROWS_WITH(data::load_wordpiece(missing), Contains(missing) && Contains("no such file"));
  CHECK_THROWS_WITH(data::load_tokenizer(missing), Contains(missing) && Contains("no such file"));
  const std::string empty = dir.file("empty.txt", "");
  CHECK_THROWS_WITH(data::load_wordpiece(empty), Contains(empty) && Contains("empty vocab"));
  const std::string no_mask = dir.file("no_mask.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n");
  CHECK_THROWS_WITH(data::load_wordpiece(no_mask),
                    Contains(no_mask) && Contains("no [MASK] token") && Contains("[PAD], [UNK]"));
  const std::string no_pad = dir.file("no_pad.txt", "[UNK]\n[CLS]\n[SEP]\n[MASK]\n");
  CHECK_THROWS_WITH(data::load_wordpiece(no_pad), Contains("no [PAD] token"));
  const std::string bad = dir.file("bad.txt",
                                   "[PAD]\n[UNK]\nca\xff"
                                   "fe\n[CLS]\n[SEP]\n[MASK]\n");
  CHECK_THROWS_WITH(data::load_wordpiece(bad), Contains(bad + ":3: not valid UTF-8"));
  CHECK_THROWS_WITH(data::load_wordpiece(dir.path("")), Contains("no such file"));  // a directory
}

namespace {

std::string marker(int k) {  // U+0400 + k, k < 64: Cyrillic letters, two UTF-8 bytes
  const int c = 0x400 + k;
  return {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
}

int markers_in_vocab(const data::Tokenizer& t) {
  int n = 0;
  for (int k = 0; k < 64; ++k) n += t.piece_to_id(marker(k)) >= 0 ? 1 : 0;
  return n;
}

// A few hundred lines of English-like text from a fixed seed: words built from syllables,
// with a skewed word distribution so that BPE finds merges. Every 20th line ends with a marker
// character of its own (U+0400 + marker_base + k): with character_coverage 1 a marker is in the
// vocabulary exactly when its line was among the training sample.
std::string english_like_corpus(int lines, uint32_t seed, int marker_base = 0) {
  const std::vector<std::string> syllables = {
      "the", "an",   "ing", "er", "re", "con", "ver", "sa", "ti", "on", "al", "pro",
      "de",  "ment", "ly",  "in", "ex", "per", "ab",  "or", "us", "ta", "mo", "ble"};
  std::mt19937 rng(seed);
  std::vector<std::string> words;
  for (int i = 0; i < 400; ++i) {
    std::string w;
    const int n = 1 + int(rng() % 3);
    for (int k = 0; k < n; ++k) w += syllables[rng() % syllables.size()];
    words.push_back(w);
  }
  std::ostringstream os;
  for (int l = 0; l < lines; ++l) {
    const int n = 5 + int(rng() % 12);
    for (int k = 0; k < n; ++k) {
      const size_t idx = size_t(rng() % 20 == 0 ? rng() % words.size() : rng() % 40);
      std::string w = words[idx];
      if (k == 0) w[0] = char(w[0] - 'a' + 'A');
      os << (k ? " " : "") << w;
    }
    os << (l % 3 == 0 ? "." : l % 3 == 1 ? ", and more." : "?");
    if (l % 20 == 0) os << " " << marker(marker_base + l / 20);
    os << "\n";
  }
  return os.str();
}

}  // namespace

TEST_CASE("SentencePiece BPE: train, load, encode/decode, special ids", "[tokenizer]") {
  TempDir dir;
  const std::string a = dir.file("a.txt", english_like_corpus(250, 1, 0));   // 13 markers
  const std::string b = dir.file("b.txt", english_like_corpus(150, 2, 32));  // 8 markers
  data::SentencePieceTrainOptions opt;
  opt.vocab_size = 300;
  opt.character_coverage = 1.0;
  opt.input_sentence_size = 300;  // fewer than the 400 lines: sampled (and shuffled)
  opt.seed = 7;
  opt.num_threads = 2;
  const std::string prefix = dir.path("spm");
  data::train_sentencepiece({a, b}, prefix, opt);
  REQUIRE(fs::is_regular_file(prefix + ".model"));
  REQUIRE(fs::is_regular_file(prefix + ".vocab"));

  const auto tok = data::load_tokenizer(prefix + ".model");  // .model: SentencePiece
  REQUIRE(tok->kind() == "sentencepiece");
  REQUIRE(tok->path() == prefix + ".model");
  CHECK(tok->vocab_size() == 300);
  const auto& sp = tok->special();
  CHECK(sp.pad == 0);
  CHECK(sp.unk == 1);
  CHECK(sp.cls == 2);
  CHECK(sp.sep == 3);
  CHECK(sp.mask == 4);
  CHECK(tok->id_to_piece(2) == "<s>");
  CHECK(tok->id_to_piece(3) == "</s>");
  CHECK(tok->id_to_piece(4) == "<mask>");
  CHECK(tok->piece_to_id("<mask>") == 4);
  CHECK(tok->piece_to_id("<unk>") == 1);
  CHECK(tok->piece_to_id("no such piece") == -1);  // SentencePiece itself would say unk_id
  for (int32_t id : {0, 1, 2, 3, 4}) CHECK(tok->is_special(id));
  int normal = 0;
  for (int32_t id = 5; id < 300; ++id) normal += tok->is_special(id) ? 0 : 1;
  CHECK(normal == 295);
  CHECK_THROWS_AS(tok->id_to_piece(300), engine::Error);

  // Round trip: decoding gives back the normalised text (here the text itself).
  const std::string text = "The conver ingment exally proble, and more.";
  const auto ids = tok->encode(text);
  const auto pieces = tok->pieces(text);
  REQUIRE(ids.size() == pieces.size());
  REQUIRE(!ids.empty());
  CHECK(ids.size() < text.size());  // merges were learned
  for (size_t i = 0; i < ids.size(); ++i) CHECK(tok->id_to_piece(ids[i]) == pieces[i]);
  std::string decoded;
  for (const auto& p : pieces) decoded += p;
  // "▁" (U+2581) stands for a space; the dummy prefix adds one at the start.
  std::string spaced;
  for (size_t i = 0; i < decoded.size();) {
    if (decoded.compare(i, 3, "\xe2\x96\x81") == 0)
      spaced += ' ', i += 3;
    else
      spaced += decoded[i++];
  }
  CHECK(spaced == " " + text);
  // <mask> is a user-defined symbol: kept whole inside text.
  const auto masked = tok->pieces("the <mask> con");
  CHECK(std::find(masked.begin(), masked.end(), "<mask>") != masked.end());
  // Invalid UTF-8 does not crash (SentencePiece reads bad bytes as U+FFFD).
  CHECK_NOTHROW(tok->encode("bad\xff\xfe bytes \xe4\xb8"));
  CHECK(tok->encode("").empty());

  // The seed makes training reproducible, also on a thread that has trained before. (The
  // .model files differ: they record the model prefix.)
  auto all_pieces = [](const data::Tokenizer& t) {
    std::vector<std::string> out;
    for (int32_t id = 0; id < int32_t(t.vocab_size()); ++id) out.push_back(t.id_to_piece(id));
    return out;
  };
  data::train_sentencepiece({a, b}, dir.path("again"), opt);
  const auto again = data::load_sentencepiece(dir.path("again") + ".model");
  const bool same = all_pieces(*again) == all_pieces(*tok);
  CHECK(same);
  // The sample: 300 of the 400 lines, so some of the 21 marker lines are left out; another seed
  // leaves out others.
  const int kept = markers_in_vocab(*tok);
  CHECK(kept > 0);
  CHECK(kept < 21);
  opt.seed = 8;
  data::train_sentencepiece({a, b}, dir.path("other"), opt);
  const auto other = data::load_sentencepiece(dir.path("other") + ".model");
  bool same_markers = true;
  for (int k = 0; k < 64; ++k)
    same_markers =
        same_markers && (tok->piece_to_id(marker(k)) >= 0) == (other->piece_to_id(marker(k)) >= 0);
  CHECK_FALSE(same_markers);
  // Without sampling every line is used.
  opt.input_sentence_size = 0;
  data::train_sentencepiece({a, b}, dir.path("all"), opt);
  CHECK(markers_in_vocab(*data::load_sentencepiece(dir.path("all") + ".model")) == 21);
}

TEST_CASE("SentencePiece trains on .xz and .gz text as on the plain text", "[tokenizer]") {
  TempDir dir;
  const std::string a = dir.file("a.txt", english_like_corpus(250, 1, 0));
  data::SentencePieceTrainOptions opt;
  opt.vocab_size = 200;
  opt.character_coverage = 1.0;
  opt.input_sentence_size = 0;
  opt.num_threads = 1;
  data::train_sentencepiece({a}, dir.path("plain"), opt);
  const auto plain = data::load_sentencepiece(dir.path("plain") + ".model");
  for (const std::string tool : {"xz", "gzip"}) {
    if (std::system(("command -v " + tool + " >/dev/null 2>&1").c_str()) != 0) {
      WARN(tool << " not installed: not tested");
      continue;
    }
    // Named .txt on purpose: the magic bytes decide, not the name.
    const std::string packed = dir.path(tool + "_a.txt");
    REQUIRE(std::system((tool + " -c " + a + " > " + packed).c_str()) == 0);
    data::train_sentencepiece({packed}, dir.path(tool), opt);
    const auto t = data::load_sentencepiece(dir.path(tool) + ".model");
    bool same = t->vocab_size() == plain->vocab_size();
    for (int32_t id = 0; same && id < int32_t(t->vocab_size()); ++id)
      same = t->id_to_piece(id) == plain->id_to_piece(id);
    CHECK(same);
    // Sampling reads them too.
    opt.input_sentence_size = 150;
    data::train_sentencepiece({packed}, dir.path(tool + "_sampled"), opt);
    opt.input_sentence_size = 0;
    // A truncated archive is an error naming it.
    fs::resize_file(packed, fs::file_size(packed) / 2);
    CHECK_THROWS_WITH(data::train_sentencepiece({packed}, dir.path(tool + "_cut"), opt),
                      Contains(packed) && Contains("cannot decompress"));
  }
}

TEST_CASE("SentencePiece errors name the file", "[tokenizer][errors]") {
  TempDir dir;
  const std::string missing = dir.path("missing.model");
  CHECK_THROWS_WITH(data::load_sentencepiece(missing),
                    Contains(missing) && Contains("no such file"));
  CHECK_THROWS_WITH(data::load_tokenizer(missing), Contains(missing) && Contains("no such file"));

  std::mt19937 rng(3);
  std::string junk(4096, '\0');
  for (char& c : junk) c = char(rng() & 0xFF);
  const std::string corrupt = dir.file("corrupt.model", junk);
  CHECK_THROWS_WITH(data::load_sentencepiece(corrupt),
                    Contains(corrupt) && Contains("not a SentencePiece model"));
  const std::string empty = dir.file("empty.model", "");
  CHECK_THROWS_WITH(data::load_tokenizer(empty), Contains(empty));

  const std::string text = dir.file("corpus.txt", english_like_corpus(200, 5));
  data::SentencePieceTrainOptions opt;
  opt.vocab_size = 100;
  CHECK_THROWS_WITH(data::train_sentencepiece({text, dir.path("nope.txt")}, dir.path("m"), opt),
                    Contains(dir.path("nope.txt")) && Contains("no such file"));
  CHECK_THROWS_WITH(data::train_sentencepiece({}, dir.path("m"), opt), Contains("no input files"));
  CHECK_THROWS_WITH(data::train_sentencepiece({text}, dir.path("no_dir/m"), opt),
                    Contains("no directory"));
  opt.input_sentence_size = 50;
  CHECK_THROWS_WITH(data::train_sentencepiece({text}, dir.path("m"), opt),
                    Contains("more than 100"));
  opt.input_sentence_size = 0;
  opt.vocab_size = 100000;  // more pieces than the corpus can give: SentencePiece's own error
  CHECK_THROWS_WITH(data::train_sentencepiece({text}, dir.path("m"), opt),
                    Contains("training SentencePiece model " + dir.path("m") + ".model"));
  // Its hints name this function's options, not spm_train's flags.
  opt.vocab_size = 30;
  opt.character_coverage = 1.0;
  CHECK_THROWS_WITH(data::train_sentencepiece({text}, dir.path("m"), opt),
                    !Contains("--character_coverage") && !Contains("--input_sentence_size"));
}
