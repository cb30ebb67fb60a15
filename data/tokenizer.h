// Tokenizers: text -> token ids. Two implementations behind one interface:
//   - WordPiece, loading an original BERT vocab.txt (BERT's BasicTokenizer: cleaning, CJK
//     spacing, lower-casing, accent stripping, punctuation split; then greedy longest-match
//     "##" pieces), tokenizing like the reference implementation;
//   - SentencePiece BPE through libsentencepiece (a vocabulary trained from a corpus).
// Special tokens: every tokenizer has [CLS]/<s>, [SEP]/</s>, [MASK]/<mask>, [PAD]/<pad> and
// [UNK]/<unk> ids; special ids are never drawn as "random" replacement tokens by the masker.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace data {

struct SpecialIds {
  int32_t pad = -1, unk = -1, cls = -1, sep = -1, mask = -1;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of one line of text (no [CLS]/[SEP] added). Invalid UTF-8 must not crash: bytes
  // that are not UTF-8 are treated as U+FFFD.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::vector<std::string> pieces(std::string_view text) const = 0;  // for tests/debugging
  virtual std::string id_to_piece(int32_t id) const = 0;  // throws for ids outside the vocab
  virtual int32_t piece_to_id(const std::string& piece) const = 0;  // -1 if absent
  virtual int64_t vocab_size() const = 0;
  virtual const SpecialIds& special() const = 0;
  // True for [CLS], [SEP], [MASK], [PAD], [UNK] and any other control/reserved token ("[unused3]",
  // SentencePiece control symbols): the masker never draws these as random replacements.
  virtual bool is_special(int32_t id) const = 0;  // throws for ids outside the vocab
  virtual std::string kind() const = 0;           // "wordpiece" or "sentencepiece"
  virtual std::string path() const = 0;           // the file it was loaded from
};

// Loads by file: a SentencePiece model (*.model) or a WordPiece vocab (one token per line,
// e.g. BERT's vocab.txt). `lower_case` applies to WordPiece (BERT-uncased: true).
// Errors (missing file, empty vocab, missing special tokens) name the file and what is expected.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, bool lower_case = true);

// WordPiece as google-research/bert's FullTokenizer (see docs/data.md for the exact rules).
// `max_input_chars_per_word`: longer words become [UNK] whole. 100 is this project's default
// (HuggingFace's BertTokenizer has 100); google-research/bert's WordpieceTokenizer has had 200
// as its default, so it is an option: the two differ only on words of 101..200 characters.
std::unique_ptr<Tokenizer> load_wordpiece(const std::string& vocab_txt, bool lower_case = true,
                                          int max_input_chars_per_word = 100);
// A SentencePiece model; it must have <pad>, <unk>, <s>, </s> and <mask> pieces (as
// train_sentencepiece makes them).
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_file);

struct SentencePieceTrainOptions {
  int64_t vocab_size = 32768;  // the TUPE paper's
  std::string model_type = "bpe";
  double character_coverage = 0.9999;
  int64_t input_sentence_size = 2000000;  // sampled lines; 0 = all
  uint64_t seed = 1;     // sentence sampling/shuffling (SentencePiece keeps the low 32 bits)
  int num_threads = 0;   // 0 = hardware concurrency
  bool verbose = false;  // SentencePiece's INFO log on stderr (off: warnings and errors only)
};
// Trains a BPE model from text files (one sentence/paragraph per line; plain, .xz or .gz) and
// writes
// `<model_prefix>.model` and `<model_prefix>.vocab`. Pieces <pad>=0, <unk>=1, <s>=2 ([CLS]),
// </s>=3 ([SEP]) and the user symbol <mask>=4. SentencePiece's own errors come back with its
// command-line hints replaced by the names of the options above (vocab_size,
// character_coverage, input_sentence_size), which an app maps to its flags.
void train_sentencepiece(const std::vector<std::string>& inputs, const std::string& model_prefix,
                         const SentencePieceTrainOptions& options = {});

}  // namespace data
