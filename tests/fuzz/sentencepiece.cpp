// Fuzz target: the SentencePiece model reader (data/sentencepiece.cpp: libsentencepiece's Load,
// the special pieces the engine requires, and the engine's own reading of the serialized
// ModelProto's piece types) and encoding with the model it read. Every id must be in the
// vocabulary.
#include <cstdint>

#include "data/tokenizer.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_path("tokenizer.model");
  fuzz::write_bytes(path, fuzz::as_view(data, size));
  try {
    const std::unique_ptr<data::Tokenizer> tok = data::load_sentencepiece(path);
    for (std::string_view text : {"Hello, world! naïve café 東京 <mask>", "\xff\xfe bad \xc3"}) {
      for (int32_t id : tok->encode(text)) {
        if (id < 0 || id >= tok->vocab_size()) std::abort();
        (void)tok->id_to_piece(id);
        (void)tok->is_special(id);
      }
    }
  } catch (const engine::Error&) {
  }
  return 0;
}
