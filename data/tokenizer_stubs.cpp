// Placeholders for load_wordpiece and load_sentencepiece until wordpiece.cpp and sentencepiece.cpp
// land (they are written on the `tokenizer` branch): tokenizer.cpp calls them, and without a
// definition libengine_data.so cannot be linked into an executable. The definitions are weak, so
// the real ones replace them at link time once merged; delete this file then.
#include "data/tokenizer.h"
#include "engine/error.h"

namespace data {

[[gnu::weak]] std::unique_ptr<Tokenizer> load_wordpiece(const std::string& vocab_txt, bool) {
  ENGINE_FAIL("[tokenizer] cannot load ", vocab_txt,
              ": WordPiece is not built into this library (wordpiece.cpp is missing)");
}

[[gnu::weak]] std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_file) {
  ENGINE_FAIL("[tokenizer] cannot load ", model_file,
              ": SentencePiece is not built into this library (sentencepiece.cpp is missing)");
}

}  // namespace data
