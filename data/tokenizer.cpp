// Tokenizer selection by file (see tokenizer.h); the implementations live in wordpiece.cpp and
// sentencepiece.cpp.
#include "data/tokenizer.h"

#include <filesystem>

#include "engine/error.h"

namespace data {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, bool lower_case) {
  ENGINE_CHECK(std::filesystem::is_regular_file(path), "[tokenizer] ", path,
               ": no such file (expected a SentencePiece .model or a WordPiece vocab.txt)");
  if (std::filesystem::path(path).extension() == ".model") return load_sentencepiece(path);
  return load_wordpiece(path, lower_case);
}

}  // namespace data
