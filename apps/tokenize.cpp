// tokenize: runs a tokenizer over stdin, one output line per input line, so that tokenization
// can be inspected by hand and compared with reference implementations from a script
// (tests/data/check_wordpiece.py). Lines end at '\n' only; other bytes, invalid UTF-8 included,
// are the tokenizer's to handle.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "apps/cli.h"
#include "data/tokenizer.h"
#include "engine/error.h"

namespace {

const char* kUsage =
    R"(usage: tokenize (--vocab VOCAB.txt [--cased] [--max-word-chars N] | --model M.model) [--ids]

Reads lines from stdin and prints each line's tokens, separated by single spaces.
  --vocab FILE          WordPiece vocab (BERT vocab.txt); lower-cases and strips accents
  --cased               WordPiece without lower-casing and accent stripping
  --max-word-chars N    longer words become [UNK] (default 100)
  --model FILE          SentencePiece model
  --ids                 print token ids instead of pieces
  --version             the version and git commit
  -h, --help            this text
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "tokenize: " << msg << "\n\n" << kUsage;
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string vocab, model;
  bool cased = false, ids = false;
  int max_word_chars = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--vocab")
      vocab = value();
    else if (a == "--model")
      model = value();
    else if (a == "--cased")
      cased = true;
    else if (a == "--ids")
      ids = true;
    else if (a == "--max-word-chars") {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n <= 0 || n > 1000000)
        usage_error("--max-word-chars expects a positive integer, got '" + v + "'");
      max_word_chars = int(n);
    } else if (a == "--version") {
      std::cout << "tokenize " << cli::version() << "\n";
      return 0;
    } else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (vocab.empty() == model.empty()) usage_error("give exactly one of --vocab and --model");
  if (!model.empty() && cased) usage_error("--cased applies to --vocab (WordPiece) only");

  try {
    std::unique_ptr<data::Tokenizer> tok =
        vocab.empty() ? data::load_sentencepiece(model)
                      : data::load_wordpiece(vocab, !cased, max_word_chars);
    std::ios::sync_with_stdio(false);
    std::string line, out;
    while (std::getline(std::cin, line)) {
      out.clear();
      if (ids) {
        for (int32_t id : tok->encode(line)) {
          if (!out.empty()) out += ' ';
          out += std::to_string(id);
        }
      } else {
        for (const std::string& p : tok->pieces(line)) {
          if (!out.empty()) out += ' ';
          out += p;
        }
      }
      out += '\n';
      std::cout << out;
    }
    std::cout.flush();
    return std::cout.good() ? 0 : 1;
  } catch (const engine::Error& e) {
    std::cerr << "tokenize: " << e.what() << "\n";
    return 1;
  }
}
