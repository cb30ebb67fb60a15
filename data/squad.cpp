// SQuAD (data/squad.h): the JSON reader with path-naming errors, and the official evaluation
// (evaluate-v1.1.py / evaluate-v2.0.py) reimplemented: normalisation, EM, F1, the no-answer
// threshold and the best-threshold search.
#include "data/squad.h"

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "data/corpus.h"  // sanitize_utf8
#include "engine/error.h"

namespace data {
namespace {

using json = nlohmann::json;

// ---- reading -----------------------------------------------------------------------------------

std::string preview(const json& j) {
  std::string s = j.dump();
  return s.size() <= 60 ? s : s.substr(0, 60) + "...";
}

std::string preview(const std::string& s, size_t max = 60) {
  return s.size() <= max ? s : s.substr(0, max) + "...";
}

struct Reader {
  const std::string& path;

  [[noreturn]] void fail_type(const json& j, const std::string& where, const char* expected) const {
    ENGINE_FAIL("[squad] ", path, ": ", where, ": expected ", expected, ", got ", j.type_name(),
                " ", preview(j));
  }
  const json& member(const json& obj, const std::string& where, const char* key,
                     const char* expected) const {
    const auto it = obj.find(key);
    ENGINE_CHECK(it != obj.end(), "[squad] ", path, ": ", where, ": missing key '", key,
                 "' (expected ", expected, ")");
    return *it;
  }
  const json& array(const json& obj, const std::string& where, const char* key) const {
    const json& j = member(obj, where, key, "an array");
    if (!j.is_array()) fail_type(j, where + "." + key, "an array");
    return j;
  }
  std::string string(const json& obj, const std::string& where, const char* key) const {
    const json& j = member(obj, where, key, "a string");
    if (!j.is_string()) fail_type(j, where + "." + key, "a string");
    return j.get<std::string>();
  }
  void object(const json& j, const std::string& where) const {
    if (!j.is_object()) fail_type(j, where, "an object");
  }
};

// UTF-8 byte offset of code point `cp` in valid UTF-8 `s` (s.size() for cp = its length); -1 past
// the end.
int64_t byte_offset_of(const std::string& s, int64_t cp) {
  int64_t seen = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // continuation byte
    if (seen++ == cp) return static_cast<int64_t>(i);
  }
  return seen == cp ? static_cast<int64_t>(s.size()) : -1;
}

int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// The bytes of `n` code points of `s` from byte `start`.
std::string take_code_points(const std::string& s, size_t start, int64_t n) {
  size_t end = start;
  for (int64_t k = 0; end < s.size();) {
    if ((static_cast<unsigned char>(s[end]) & 0xC0) != 0x80 && k++ == n) break;
    ++end;
  }
  return s.substr(start, end - start);
}

// ---- normalisation -----------------------------------------------------------------------------

// Python's str.isspace(), which str.split() splits on.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python's re \w for str patterns: str.isalnum() (letters Lu/Ll/Lt/Lm/Lo, or any character with
// a numeric type) or '_'.
bool is_python_word(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) || c == '_';
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return true;
    default:
      return u_getIntPropertyValue(static_cast<UChar32>(c), UCHAR_NUMERIC_TYPE) != U_NT_NONE;
  }
}

// Python's string.punctuation: the 32 ASCII punctuation characters.
bool is_ascii_punct(char32_t c) { return c < 0x80 && std::ispunct(static_cast<int>(c)); }

std::u32string lower_code_points(const std::string& utf8) {
  std::string clean;
  sanitize_utf8(utf8, clean);
  std::u32string out;
  if (std::all_of(clean.begin(), clean.end(), [](char c) { return (c & 0x80) == 0; })) {
    for (char c : clean) out.push_back(static_cast<char32_t>(std::tolower(c)));
    return out;
  }
  // Full Unicode lower-casing in the root locale, as Python's str.lower() (U+0130 → "i̇",
  // final capital sigma → ς).
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(clean);
  u.toLower(icu::Locale::getRoot());
  for (int32_t i = 0; i < u.length();) {
    const UChar32 c = u.char32At(i);
    i += U16_LENGTH(c);
    out.push_back(static_cast<char32_t>(c));
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::vector<std::string> tokens_of(const std::string& normalized) {
  std::vector<std::string> toks;
  size_t start = 0;
  while (start < normalized.size()) {
    size_t sp = normalized.find(' ', start);
    if (sp == std::string::npos) sp = normalized.size();
    toks.push_back(normalized.substr(start, sp - start));
    start = sp + 1;
  }
  return toks;
}

// F1 of two normalised strings (the v2.0 compute_f1).
double f1_normalized(const std::string& pred, const std::string& gold) {
  const std::vector<std::string> p = tokens_of(pred), g = tokens_of(gold);
  if (p.empty() || g.empty()) return p.empty() && g.empty() ? 1.0 : 0.0;
  std::map<std::string, int64_t> count;
  for (const std::string& t : g) ++count[t];
  int64_t common = 0;
  for (const std::string& t : p) {
    auto it = count.find(t);
    if (it != count.end() && it->second > 0) --it->second, ++common;
  }
  if (common == 0) return 0;
  const double precision = static_cast<double>(common) / static_cast<double>(p.size());
  const double recall = static_cast<double>(common) / static_cast<double>(g.size());
  return 2 * precision * recall / (precision + recall);
}

}  // namespace

std::vector<SquadExample> read_squad(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in, "[squad] ", path, ": cannot open (", std::strerror(errno), ")");
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400
    ENGINE_FAIL("[squad] ", path, ": invalid JSON: ", e.what());
  }
  const Reader r{path};
  r.object(root, "(top level)");
  const json& articles = r.array(root, "(top level)", "data");

  std::vector<SquadExample> out;
  std::map<std::string, std::string> where_of_id;
  for (size_t a = 0; a < articles.size(); ++a) {
    const std::string wa = "data[" + std::to_string(a) + "]";
    r.object(articles[a], wa);
    const json& paragraphs = r.array(articles[a], wa, "paragraphs");
    for (size_t p = 0; p < paragraphs.size(); ++p) {
      const std::string wp = wa + ".paragraphs[" + std::to_string(p) + "]";
      r.object(paragraphs[p], wp);
      const std::string context = r.string(paragraphs[p], wp, "context");
      const int64_t context_len = code_points(context);
      const json& qas = r.array(paragraphs[p], wp, "qas");
      for (size_t q = 0; q < qas.size(); ++q) {
        const std::string wq = wp + ".qas[" + std::to_string(q) + "]";
        const json& qa = qas[q];
        r.object(qa, wq);
        SquadExample ex;
        ex.id = r.string(qa, wq, "id");
        ex.question = r.string(qa, wq, "question");
        ex.context = context;
        if (const auto it = qa.find("is_impossible"); it != qa.end()) {
          if (!it->is_boolean()) r.fail_type(*it, wq + ".is_impossible", "true or false");
          ex.is_impossible = it->get<bool>();
        }
        const auto [seen, inserted] = where_of_id.emplace(ex.id, wq);
        ENGINE_CHECK(inserted, "[squad] ", path, ": ", wq, ": question id '", ex.id,
                     "' appears twice (also at ", seen->second, ")");
        const json& answers = r.array(qa, wq, "answers");
        ENGINE_CHECK(!(ex.is_impossible && !answers.empty()), "[squad] ", path, ": ", wq,
                     ": question '", ex.id, "' is_impossible but has ", answers.size(),
                     " answers (expected none)");
        ENGINE_CHECK(ex.is_impossible || !answers.empty(), "[squad] ", path, ": ", wq,
                     ": question '", ex.id,
                     "' has no answers and is not marked is_impossible (expected at least one)");
        for (size_t k = 0; k < answers.size(); ++k) {
          const std::string wk = wq + ".answers[" + std::to_string(k) + "]";
          r.object(answers[k], wk);
          const std::string text = r.string(answers[k], wk, "text");
          const json& start_j = r.member(answers[k], wk, "answer_start", "a non-negative integer");
          if (!start_j.is_number_integer() || start_j.get<int64_t>() < 0)
            r.fail_type(start_j, wk + ".answer_start", "a non-negative integer");
          const int64_t start = start_j.get<int64_t>();
          const int64_t len = code_points(text);
          ENGINE_CHECK(start + len <= context_len, "[squad] ", path, ": question '", ex.id, "' (",
                       wk, "): answer_start ", start, " + ", len,
                       " characters of answer text runs past the end of the context (", context_len,
                       " characters)");
          const int64_t byte = byte_offset_of(context, start);
          const bool match = context.compare(static_cast<size_t>(byte), text.size(), text) == 0;
          ENGINE_CHECK(match, "[squad] ", path, ": question '", ex.id, "' (", wk,
                       "): the context at answer_start ", start, " reads '",
                       preview(take_code_points(context, static_cast<size_t>(byte), len)),
                       "', not the answer text '", preview(text),
                       "' (offsets count Unicode code points)");
          ex.answer_texts.push_back(text);
          ex.answer_starts.push_back(start);
          ex.answer_byte_starts.push_back(byte);
        }
        out.push_back(std::move(ex));
      }
    }
  }
  ENGINE_CHECK(!out.empty(), "[squad] ", path, ": no questions");
  return out;
}

std::string squad_normalize(const std::string& text) {
  const std::u32string lower = lower_code_points(text);
  std::u32string s;
  for (char32_t c : lower)
    if (!is_ascii_punct(c)) s.push_back(c);
  // Articles: a maximal run of word characters spelling a, an or the (what \b(a|an|the)\b
  // matches) becomes a space.
  std::u32string t;
  for (size_t i = 0; i < s.size();) {
    if (!is_python_word(s[i])) {
      t.push_back(s[i++]);
      continue;
    }
    size_t j = i;
    while (j < s.size() && is_python_word(s[j])) ++j;
    const std::u32string_view w(s.data() + i, j - i);
    if (w == U"a" || w == U"an" || w == U"the")
      t.push_back(U' ');
    else
      t.append(w);
    i = j;
  }
  std::string out;
  bool pending_space = false;
  for (char32_t c : t) {
    if (is_python_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    append_utf8(out, c);
  }
  return out;
}

double squad_exact(const std::string& prediction, const std::string& gold) {
  return squad_normalize(prediction) == squad_normalize(gold) ? 1.0 : 0.0;
}

double squad_f1(const std::string& prediction, const std::string& gold) {
  return f1_normalized(squad_normalize(prediction), squad_normalize(gold));
}

SquadScores evaluate_squad(const std::vector<SquadExample>& examples,
                           const std::map<std::string, std::string>& predictions,
                           const std::map<std::string, double>* na_probs, double na_threshold) {
  const size_t n = examples.size();
  ENGINE_CHECK(n > 0, "[squad] evaluate_squad: no examples");
  std::vector<double> raw_exact(n), raw_f1(n), na(n, 0.0);
  std::vector<bool> has_ans(n), predicted_something(n);
  for (size_t i = 0; i < n; ++i) {
    const SquadExample& ex = examples[i];
    has_ans[i] = !ex.answer_texts.empty();
    const auto it = predictions.find(ex.id);
    const std::string pred = it == predictions.end() ? std::string() : it->second;
    predicted_something[i] = !pred.empty();
    const std::string p = squad_normalize(pred);
    // Gold answers that normalise to nothing are dropped; none left: "" (unanswerable).
    std::vector<std::string> golds;
    for (const std::string& g : ex.answer_texts) {
      std::string ng = squad_normalize(g);
      if (!ng.empty()) golds.push_back(std::move(ng));
    }
    if (golds.empty()) golds.push_back("");
    for (const std::string& g : golds) {
      raw_exact[i] = std::max(raw_exact[i], p == g ? 1.0 : 0.0);
      raw_f1[i] = std::max(raw_f1[i], f1_normalized(p, g));
    }
    if (na_probs) {
      const auto pit = na_probs->find(ex.id);
      ENGINE_CHECK(pit != na_probs->end(),
                   "[squad] evaluate_squad: no no-answer probability for question '", ex.id, "'");
      ENGINE_CHECK(std::isfinite(pit->second), "[squad] evaluate_squad: no-answer probability of '",
                   ex.id, "' is ", pit->second);
      na[i] = pit->second;
    }
  }

  SquadScores s;
  s.total = static_cast<int64_t>(n);
  double exact = 0, f1 = 0, ha_exact = 0, ha_f1 = 0, na_exact = 0;
  for (size_t i = 0; i < n; ++i) {
    // apply_no_ans_threshold: above the threshold the question is answered "".
    double e = raw_exact[i], f = raw_f1[i];
    if (na[i] > na_threshold) e = f = has_ans[i] ? 0.0 : 1.0;
    exact += e, f1 += f;
    if (has_ans[i]) {
      ++s.has_ans, ha_exact += e, ha_f1 += f;
    } else {
      ++s.no_ans, na_exact += e;
    }
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  s.exact = 100.0 * exact / static_cast<double>(n);
  s.f1 = 100.0 * f1 / static_cast<double>(n);
  s.has_ans_exact = s.has_ans ? 100.0 * ha_exact / static_cast<double>(s.has_ans) : nan;
  s.has_ans_f1 = s.has_ans ? 100.0 * ha_f1 / static_cast<double>(s.has_ans) : nan;
  s.no_ans_exact = s.no_ans ? 100.0 * na_exact / static_cast<double>(s.no_ans) : nan;

  s.best_exact = s.best_exact_thresh = s.best_f1 = s.best_f1_thresh = nan;
  if (na_probs) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return na[a] < na[b]; });
    // find_best_thresh: start from "answer nothing" (every unanswerable question right), then
    // let the questions answer in order of rising no-answer probability.
    auto best = [&](const std::vector<double>& raw, double& score, double& thresh) {
      double cur = static_cast<double>(s.no_ans), top = cur;
      thresh = 0.0;
      for (size_t i : order) {
        cur += has_ans[i] ? raw[i] : (predicted_something[i] ? -1.0 : 0.0);
        if (cur > top) top = cur, thresh = na[i];
      }
      score = 100.0 * top / static_cast<double>(n);
    };
    best(raw_exact, s.best_exact, s.best_exact_thresh);
    best(raw_f1, s.best_f1, s.best_f1_thresh);
  }
  return s;
}

}  // namespace data
