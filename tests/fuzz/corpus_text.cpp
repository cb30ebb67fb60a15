// Fuzz target: raw text input for corpus preparation (data/text_input.cpp: plain, xz or gzip by
// magic bytes, chunked reads cut into lines, '\r\n', the BOM) and the UTF-8 repair
// (data::sanitize_utf8: U+FFFD per maximal ill-formed subpart). Checks that repaired text is
// well-formed: repairing it again changes nothing.
#include <cstdint>

#include "data/corpus.h"
#include "data/text_input.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void check_sanitize(std::string_view in) {
  std::string out, again;
  const int64_t replaced = data::sanitize_utf8(in, out);
  if (replaced < 0 || (replaced == 0 && out != in)) std::abort();
  if (data::sanitize_utf8(out, again) != 0 || again != out) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_path("corpus.txt");
  check_sanitize(fuzz::as_view(data, size));
  fuzz::write_bytes(path, fuzz::as_view(data, size));
  try {
    data::TextFile file(path);
    data::TextLines lines(file);
    std::string line;
    size_t total = 0;
    while (lines.next(line)) {
      if (line.find('\n') != std::string::npos) std::abort();
      check_sanitize(line);
      total += line.size();
      if (total > (size_t(64) << 20)) break;  // a decompression bomb: enough has been read
    }
  } catch (const engine::Error&) {
  }
  return 0;
}
