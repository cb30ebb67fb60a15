// Fuzz target: the WordPiece vocabulary reader (data/wordpiece.cpp: one token per line, strict
// UTF-8, Python's strip(), the five [..] special tokens) and tokenization with the vocabulary it
// read: a fixed mixed-script text and the vocabulary's own text, cased (odd-sized inputs) or
// uncased. Every id must be in the vocabulary.
#include <cstdint>

#include "data/tokenizer.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_path("vocab.txt");
  fuzz::write_bytes(path, fuzz::as_view(data, size));
  try {
    const std::unique_ptr<data::Tokenizer> tok =
        data::load_wordpiece(path, /*lower_case=*/size % 2 == 0, /*max_input_chars_per_word=*/40);
    const std::string_view own = fuzz::as_view(data, std::min<size_t>(size, 512));
    for (std::string_view text :
         {std::string_view("Hello, WORLD! naïve café 東京 [MASK] ##ing"), own}) {
      for (int32_t id : tok->encode(text)) {
        if (id < 0 || id >= tok->vocab_size()) std::abort();
        (void)tok->id_to_piece(id);
      }
      (void)tok->pieces(text);
    }
  } catch (const engine::Error&) {
  }
  return 0;
}
