// Text cleaning before tokenization: ill-formed UTF-8 replaced by U+FFFD (see corpus.h).
#include <string>
#include <string_view>

#include "data/corpus.h"

namespace data {

int64_t sanitize_utf8(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  int64_t replaced = 0;
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    // Copy ASCII runs in one go: most text is mostly ASCII.
    size_t j = i;
    while (j < n && static_cast<unsigned char>(in[j]) < 0x80) ++j;
    out.append(in.data() + i, j - i);
    i = j;
    if (i == n) break;
    const unsigned char c = static_cast<unsigned char>(in[i]);
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c == 0xE0) {
      need = 2, lo = 0xA0;  // no overlongs
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      need = 2;
    } else if (c == 0xED) {
      need = 2, hi = 0x9F;  // no surrogates
    } else if (c == 0xF0) {
      need = 3, lo = 0x90;  // no overlongs
    } else if (c >= 0xF1 && c <= 0xF3) {
      need = 3;
    } else if (c == 0xF4) {
      need = 3, hi = 0x8F;  // nothing above U+10FFFF
    }
    j = i + 1;
    int k = 0;
    while (k < need && j < n) {
      const unsigned char d = static_cast<unsigned char>(in[j]);
      if (k == 0 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) break;
      ++j;
      ++k;
    }
    if (need > 0 && k == need) {
      out.append(in.data() + i, j - i);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal ill-formed subpart in[i, j)
      ++replaced;
    }
    i = j;
  }
  return replaced;
}

}  // namespace data
