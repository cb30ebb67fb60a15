// WordPiece: the original BERT tokenizer (google-research/bert tokenization.py, FullTokenizer =
// BasicTokenizer + WordpieceTokenizer) over a BERT vocab.txt, reproducing its output piece for
// piece. tools/reference/wordpiece_reference.py is a Python port of the reference and
// tests/data/check_wordpiece.py compares the two on generated text.
//
// Unicode properties come from ICU (general categories, bidi classes, full lower-casing, NFD)
// so that no table is written by hand here; the reference uses Python's unicodedata and str
// methods. The two agree wherever their Unicode versions agree on a character (see docs/data.md).
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <unordered_map>

#include "data/tokenizer.h"
#include "engine/error.h"

namespace data {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

// Strict UTF-8 decoding with the rules of Python's decoder (no overlongs, no surrogates,
// nothing above U+10FFFF). An invalid byte becomes one U+FFFD and decoding resumes at the next
// byte: a byte that cannot start a sequence is never part of a valid character, so this drops
// exactly what the reference's decode("utf-8", "ignore") drops (BERT's _clean_text removes
// U+FFFD anyway, so the number of replacements does not matter). Returns false when some byte
// was invalid.
bool decode_utf8(std::string_view s, std::u32string& out) {
  out.clear();
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  bool valid = true;
  auto cont = [&](size_t k) { return k < n && (p[k] & 0xC0) == 0x80; };
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    char32_t c = kReplacement;
    size_t len = 1;
    if (b >= 0xC2 && b <= 0xDF) {
      if (cont(i + 1)) c = (char32_t(b & 0x1F) << 6) | (p[i + 1] & 0x3F), len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      // E0 needs A0..BF next (no overlongs), ED needs 80..9F (no surrogates).
      const unsigned char lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
      if (i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi && cont(i + 2))
        c = (char32_t(b & 0x0F) << 12) | (char32_t(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F),
        len = 3;
    } else if (b >= 0xF0 && b <= 0xF4) {
      // F0 needs 90..BF next (no overlongs), F4 needs 80..8F (nothing above U+10FFFF).
      const unsigned char lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
      if (i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi && cont(i + 2) && cont(i + 3))
        c = (char32_t(b & 0x07) << 18) | (char32_t(p[i + 1] & 0x3F) << 12) |
            (char32_t(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F),
        len = 4;
    }
    valid = valid && len > 1;
    out.push_back(c);
    i += len;
  }
  return valid;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

int8_t category(char32_t c) { return u_charType(UChar32(c)); }

// BERT's _is_whitespace: space, \t, \n, \r, or general category Zs.
bool is_bert_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || category(c) == U_SPACE_SEPARATOR;
}

// BERT's _is_control: categories Cc and Cf, except \t \n \r (whitespace). Unassigned (Cn),
// private-use (Co) and surrogate (Cs) code points are not controls in the reference.
bool is_bert_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const int8_t cat = category(c);
  return cat == U_CONTROL_CHAR || cat == U_FORMAT_CHAR;
}

// BERT's _is_punctuation: every non-alphanumeric printable ASCII character ("$", "^", "`" are
// symbols in Unicode, punctuation here) and every character of a P* category.
bool is_bert_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  return (U_GET_GC_MASK(UChar32(c)) & U_GC_P_MASK) != 0;
}

// BERT's _is_chinese_char: the CJK Unified Ideographs blocks (not Hangul, kana, ...).
bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Python's str.isspace(), which str.split() and str.strip() use (the reference's
// whitespace_tokenize and load_vocab): category Zs or bidi class WS, B or S. After _clean_text
// this still matters: U+2028 and U+2029 are neither controls nor Zs, yet split words.
bool is_python_space(char32_t c) {
  if (c == ' ' || (c >= '\t' && c <= '\r')) return true;
  if (c < 0x80) return c >= 0x1C && c <= 0x1F;
  if (category(c) == U_SPACE_SEPARATOR) return true;
  const UCharDirection d = u_charDirection(UChar32(c));
  return d == U_WHITE_SPACE_NEUTRAL || d == U_BLOCK_SEPARATOR || d == U_SEGMENT_SEPARATOR;
}

// Heterogeneous lookup: the greedy match probes string_views into one buffer.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class WordPieceTokenizer final : public Tokenizer {
 public:
  WordPieceTokenizer(const std::string& vocab_txt, bool lower_case, int max_input_chars_per_word)
      : path_(vocab_txt), lower_case_(lower_case), max_word_chars_(max_input_chars_per_word) {
    ENGINE_CHECK(max_input_chars_per_word > 0,
                 "[tokenizer] max_input_chars_per_word must be "
                 "positive, got ",
                 max_input_chars_per_word);
    UErrorCode err = U_ZERO_ERROR;
    nfd_ = icu::Normalizer2::getNFDInstance(err);
    ENGINE_CHECK(U_SUCCESS(err) && nfd_, "[tokenizer] ICU has no NFD normalizer (",
                 u_errorName(err), "); is the ICU data library installed?");
    load_vocab();
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    tokenize(text, [&](std::string_view, int32_t id) { ids.push_back(id); });
    return ids;
  }

  std::vector<std::string> pieces(std::string_view text) const override {
    std::vector<std::string> out;
    tokenize(text, [&](std::string_view piece, int32_t) { out.emplace_back(piece); });
    return out;
  }

  std::string id_to_piece(int32_t id) const override {
    check_id(id);
    return id_to_token_[size_t(id)];
  }

  int32_t piece_to_id(const std::string& piece) const override {
    auto it = token_to_id_.find(piece);
    return it == token_to_id_.end() ? -1 : it->second;
  }

  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  const SpecialIds& special() const override { return special_; }
  bool is_special(int32_t id) const override {
    check_id(id);
    return special_flag_[size_t(id)] != 0;
  }
  std::string kind() const override { return "wordpiece"; }
  std::string path() const override { return path_; }

 private:
  void check_id(int32_t id) const {
    ENGINE_CHECK(id >= 0 && int64_t(id) < vocab_size(), "[tokenizer] id ", id, " is outside ",
                 path_, "'s vocabulary [0, ", vocab_size(), ")");
  }

  // The reference's load_vocab: one token per line (lines end at '\n' only, as GFile.readline
  // splits), stripped of leading/trailing whitespace (Python's str.strip()); the id is the line
  // number. A token that appears on several lines maps to its last line (the dict assignment
  // overwrites); id_to_piece still gives each line's token.
  void load_vocab() {
    ENGINE_CHECK(std::filesystem::is_regular_file(path_), "[tokenizer] ", path_,
                 ": no such file (expected a WordPiece vocab.txt, one token per line)");
    std::ifstream in(path_, std::ios::binary);
    ENGINE_CHECK(in.good(), "[tokenizer] ", path_, ": cannot open the vocab file");
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ENGINE_CHECK(!in.bad(), "[tokenizer] ", path_, ": read error");
    ENGINE_CHECK(!bytes.empty(), "[tokenizer] ", path_,
                 ": empty vocab (expected one WordPiece token per line, e.g. BERT's vocab.txt)");

    std::u32string cps;
    size_t begin = 0;
    int64_t line_no = 0;
    while (begin < bytes.size()) {
      size_t end = bytes.find('\n', begin);
      if (end == std::string::npos) end = bytes.size();
      const std::string_view line(bytes.data() + begin, end - begin);
      ++line_no;
      ENGINE_CHECK(line_no < std::numeric_limits<int32_t>::max(), "[tokenizer] ", path_,
                   ": more lines than int32 token ids can number");
      // The reference decodes the file strictly and would fail on invalid bytes; so do we,
      // rather than keep a token that no text could ever match.
      ENGINE_CHECK(decode_utf8(line, cps), "[tokenizer] ", path_, ":", line_no,
                   ": not valid UTF-8");
      size_t a = 0, b = cps.size();
      while (a < b && is_python_space(cps[a])) ++a;
      while (b > a && is_python_space(cps[b - 1])) --b;
      std::string token;
      for (size_t k = a; k < b; ++k) append_utf8(cps[k], token);
      max_token_chars_ = std::max(max_token_chars_, b - a);
      token_to_id_[token] = int32_t(id_to_token_.size());
      // "[...]" tokens ([CLS], [unused12], ...) can never come out of tokenization ('[' is
      // punctuation and is split off), so they are all reserved.
      special_flag_.push_back(token.size() >= 2 && token.front() == '[' && token.back() == ']');
      id_to_token_.push_back(std::move(token));
      begin = end + 1;
    }

    auto require = [&](const char* token) {
      const int32_t id = piece_to_id(token);
      ENGINE_CHECK(id >= 0, "[tokenizer] ", path_, ": the vocab has no ", token,
                   " token (a BERT vocab.txt needs [PAD], [UNK], [CLS], [SEP] and [MASK])");
      return id;
    };
    special_.pad = require("[PAD]");
    special_.unk = require("[UNK]");
    special_.cls = require("[CLS]");
    special_.sep = require("[SEP]");
    special_.mask = require("[MASK]");
    unk_piece_ = "[UNK]";
  }

  // The reference's lower() + _run_strip_accents for one whitespace-separated word: full
  // lower-casing in the root locale (what Python's str.lower() does: U+0130 becomes "i̇", a
  // final capital sigma becomes ς), then NFD, then every Mn character dropped.
  void lower_and_strip_accents(std::u32string& word) const {
    if (std::all_of(word.begin(), word.end(), [](char32_t c) { return c < 0x80; })) {
      for (char32_t& c : word)
        if (c >= 'A' && c <= 'Z') c += 'a' - 'A';
      return;  // ASCII: nothing to decompose, no marks
    }
    icu::UnicodeString u = icu::UnicodeString::fromUTF32(
        reinterpret_cast<const UChar32*>(word.data()), int32_t(word.size()));
    u.toLower(icu::Locale::getRoot());
    UErrorCode err = U_ZERO_ERROR;
    const icu::UnicodeString d = nfd_->normalize(u, err);
    ENGINE_CHECK(U_SUCCESS(err), "[tokenizer] ICU NFD normalization failed: ", u_errorName(err));
    word.clear();
    for (int32_t i = 0; i < d.length();) {
      const UChar32 c = d.char32At(i);
      i += U16_LENGTH(c);
      if (u_charType(c) != U_NON_SPACING_MARK) word.push_back(char32_t(c));
    }
  }

  // BasicTokenizer.tokenize, then WordpieceTokenizer.tokenize on each of its tokens; `emit`
  // receives each piece and its id.
  template <class Emit>
  void tokenize(std::string_view text, Emit&& emit) const {
    std::u32string cps;
    decode_utf8(text, cps);

    // _clean_text and _tokenize_chinese_chars in one pass.
    std::u32string clean;
    clean.reserve(cps.size() + 16);
    for (char32_t c : cps) {
      if (c == 0 || c == kReplacement || is_bert_control(c)) continue;
      if (is_bert_whitespace(c)) {
        clean.push_back(' ');
      } else if (is_cjk(c)) {
        clean.push_back(' ');
        clean.push_back(c);
        clean.push_back(' ');
      } else {
        clean.push_back(c);
      }
    }

    // whitespace_tokenize, then per word: lower-case and strip accents, _run_split_on_punc, and
    // the final whitespace_tokenize (which only drops empty words: a word is empty when it was
    // made of marks alone).
    std::u32string word, piece;
    Matcher m;
    size_t i = 0;
    while (i < clean.size()) {
      while (i < clean.size() && is_python_space(clean[i])) ++i;
      if (i == clean.size()) break;
      size_t j = i;
      while (j < clean.size() && !is_python_space(clean[j])) ++j;
      word.assign(clean, i, j - i);
      i = j;
      if (lower_case_) lower_and_strip_accents(word);
      piece.clear();
      for (char32_t c : word) {
        if (is_bert_punctuation(c)) {
          if (!piece.empty()) wordpiece(piece, m, emit);
          piece.assign(1, c);
          wordpiece(piece, m, emit);
          piece.clear();
        } else if (is_python_space(c)) {  // never produced by lower()/NFD; kept for fidelity
          if (!piece.empty()) wordpiece(piece, m, emit);
          piece.clear();
        } else {
          piece.push_back(c);
        }
      }
      if (!piece.empty()) wordpiece(piece, m, emit);
    }
  }

  struct Matcher {  // scratch buffers for wordpiece(), reused across words
    std::string utf8, key;
    std::vector<size_t> offsets;
    std::vector<std::pair<size_t, int32_t>> found;  // (key start in `keys`, id)
    std::string keys;
  };

  // WordpieceTokenizer.tokenize on one word: [UNK] if it is longer than max_input_chars_per_word
  // characters; otherwise greedy longest-match-first from the left, pieces after the first
  // prefixed "##"; [UNK] for the whole word if some position matches nothing.
  template <class Emit>
  void wordpiece(const std::u32string& word, Matcher& m, Emit& emit) const {
    const size_t n = word.size();
    if (n > size_t(max_word_chars_)) {
      emit(unk_piece_, special_.unk);
      return;
    }
    m.utf8.clear();
    m.offsets.clear();
    for (char32_t c : word) {
      m.offsets.push_back(m.utf8.size());
      append_utf8(c, m.utf8);
    }
    m.offsets.push_back(m.utf8.size());
    m.found.clear();
    m.keys.clear();
    size_t start = 0;
    while (start < n) {
      // No vocab token is longer than max_token_chars_ characters, so longer candidates are
      // skipped without a lookup; the first match found is the same as the reference's.
      size_t end = std::min(n, start + max_token_chars_);
      int32_t id = -1;
      for (; end > start; --end) {
        m.key.assign(start > 0 ? "##" : "");
        m.key.append(m.utf8, m.offsets[start], m.offsets[end] - m.offsets[start]);
        auto it = token_to_id_.find(std::string_view(m.key));
        if (it != token_to_id_.end()) {
          id = it->second;
          break;
        }
      }
      if (id < 0) {
        emit(unk_piece_, special_.unk);
        return;
      }
      m.found.emplace_back(m.keys.size(), id);
      m.keys.append(m.key);
      start = end;
    }
    for (size_t k = 0; k < m.found.size(); ++k) {
      const size_t b = m.found[k].first,
                   e = k + 1 < m.found.size() ? m.found[k + 1].first : m.keys.size();
      emit(std::string_view(m.keys).substr(b, e - b), m.found[k].second);
    }
  }

  std::string path_;
  bool lower_case_;
  int max_word_chars_;
  const icu::Normalizer2* nfd_ = nullptr;  // owned by ICU, thread-safe
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<uint8_t> special_flag_;
  size_t max_token_chars_ = 0;
  SpecialIds special_;
  std::string unk_piece_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_wordpiece(const std::string& vocab_txt, bool lower_case,
                                          int max_input_chars_per_word) {
  return std::make_unique<WordPieceTokenizer>(vocab_txt, lower_case, max_input_chars_per_word);
}

}  // namespace data
