// SentencePiece tokenizers through libsentencepiece (Debian's 0.1.97): loading a .model and
// training a BPE model whose special pieces are <pad>=0, <unk>=1, <s>=2 ([CLS]), </s>=3 ([SEP])
// and the user symbol <mask>. Every sentencepiece::util::Status that is not OK becomes an
// engine::Error naming the file.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "data/text_input.h"
#include "data/tokenizer.h"
#include "engine/error.h"

namespace data {
namespace {

constexpr const char* kMaskPiece = "<mask>";

// The piece types of a serialized ModelProto (sentencepiece_model.proto: ModelProto.pieces = 1,
// SentencePiece.type = 3, USER_DEFINED = 4). libsentencepiece 0.1.97 has IsControl, IsUnknown
// and IsUnused but no IsUserDefined, and Debian ships no protobuf headers for the model, so
// the few wire-format fields needed are read here. Returns nullopt if the bytes do not parse
// (they always should: the processor has just parsed them).
std::optional<std::vector<int>> piece_types(std::string_view proto) {
  struct Reader {
    std::string_view s;
    size_t pos = 0;
    bool varint(uint64_t& v) {
      v = 0;
      for (int shift = 0; shift < 64; shift += 7) {
        if (pos >= s.size()) return false;
        const auto b = uint8_t(s[pos++]);
        v |= uint64_t(b & 0x7F) << shift;
        if (!(b & 0x80)) return true;
      }
      return false;
    }
    // Reads one field's key; for a length-delimited field `payload` is its bytes, otherwise
    // `value` holds a varint (fixed-width values are skipped).
    bool field(uint32_t& number, int& wire, uint64_t& value, std::string_view& payload) {
      uint64_t key;
      if (!varint(key)) return false;
      number = uint32_t(key >> 3);
      wire = int(key & 7);
      switch (wire) {
        case 0:
          return varint(value);
        case 1:
          if (s.size() - pos < 8) return false;
          pos += 8;
          return true;
        case 5:
          if (s.size() - pos < 4) return false;
          pos += 4;
          return true;
        case 2: {
          uint64_t len;
          if (!varint(len) || len > s.size() - pos) return false;
          payload = s.substr(pos, size_t(len));
          pos += size_t(len);
          return true;
        }
        default:
          return false;  // groups are not used by the model proto
      }
    }
  };
  std::vector<int> types;
  Reader model{proto};
  while (model.pos < proto.size()) {
    uint32_t number;
    int wire;
    uint64_t value;
    std::string_view payload;
    if (!model.field(number, wire, value, payload)) return std::nullopt;
    if (number != 1 || wire != 2) continue;
    int type = 1;  // NORMAL, the proto default
    Reader piece{payload};
    while (piece.pos < payload.size()) {
      uint32_t n;
      int w;
      uint64_t v;
      std::string_view p;
      if (!piece.field(n, w, v, p)) return std::nullopt;
      if (n == 3 && w == 0) type = int(v);
    }
    types.push_back(type);
  }
  return types;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_file) : path_(model_file) {
    ENGINE_CHECK(std::filesystem::is_regular_file(model_file), "[tokenizer] ", model_file,
                 ": no such file (expected a SentencePiece .model)");
    // libsentencepiece reports most problems as a status, but some by throwing (its trie builder
    // throws Darts::Details::Exception on an empty piece): both are "not a SentencePiece model".
    sentencepiece::util::Status status;
    try {
      status = sp_.Load(model_file);
    } catch (const std::exception& e) {
      ENGINE_FAIL("[tokenizer] ", model_file, ": not a SentencePiece model (", e.what(), ")");
    }
    ENGINE_CHECK(status.ok(), "[tokenizer] ", model_file, ": not a SentencePiece model (",
                 status.ToString(), ")");
    const int n = sp_.GetPieceSize();
    ENGINE_CHECK(n > 0, "[tokenizer] ", model_file, ": the SentencePiece model has no pieces");

    auto require = [&](int id, const char* what) {
      ENGINE_CHECK(id >= 0 && id < n, "[tokenizer] ", model_file, ": the model has no ", what,
                   " piece (expected <pad>, <unk>, <s>, </s> and <mask>, as train_sentencepiece"
                   " makes them: pad_id=0 unk_id=1 bos_id=2 eos_id=3 user_defined_symbols=<mask>)");
      return int32_t(id);
    };
    special_.pad = require(sp_.pad_id(), "<pad>");
    special_.unk = require(sp_.unk_id(), "<unk>");
    special_.cls = require(sp_.bos_id(), "<s> (bos)");
    special_.sep = require(sp_.eos_id(), "</s> (eos)");
    special_.mask = require(piece_to_id(kMaskPiece), kMaskPiece);

    const auto types = piece_types(sp_.serialized_model_proto());
    ENGINE_CHECK(types && int(types->size()) == n, "[tokenizer] ", model_file,
                 ": could not read the piece types of the model (", types ? types->size() : 0,
                 " types for ", n, " pieces)");
    special_flag_.resize(size_t(n));
    for (int id = 0; id < n; ++id) {
      constexpr int kUserDefined = 4;
      special_flag_[size_t(id)] = sp_.IsControl(id) || sp_.IsUnknown(id) || sp_.IsUnused(id) ||
                                  (*types)[size_t(id)] == kUserDefined;
    }
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    ENGINE_CHECK(status.ok(), "[tokenizer] ", path_, ": encoding failed (", status.ToString(), ")");
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  std::vector<std::string> pieces(std::string_view text) const override {
    std::vector<std::string> out;
    const auto status = sp_.Encode(text, &out);
    ENGINE_CHECK(status.ok(), "[tokenizer] ", path_, ": encoding failed (", status.ToString(), ")");
    return out;
  }

  std::string id_to_piece(int32_t id) const override {
    check_id(id);
    return sp_.IdToPiece(id);
  }

  // SentencePiece maps an unknown piece to unk_id; the interface wants -1.
  int32_t piece_to_id(const std::string& piece) const override {
    const int id = sp_.PieceToId(piece);
    if (id < 0 || (id == sp_.unk_id() && piece != sp_.IdToPiece(id))) return -1;
    return id;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  const SpecialIds& special() const override { return special_; }
  bool is_special(int32_t id) const override {
    check_id(id);
    return special_flag_[size_t(id)] != 0;
  }
  std::string kind() const override { return "sentencepiece"; }
  std::string path() const override { return path_; }

 private:
  void check_id(int32_t id) const {
    ENGINE_CHECK(id >= 0 && int64_t(id) < vocab_size(), "[tokenizer] id ", id, " is outside ",
                 path_, "'s vocabulary [0, ", vocab_size(), ")");
  }

  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  SpecialIds special_;
  std::vector<uint8_t> special_flag_;
};

// The training lines of several files, one after the other. Reading the files here (rather
// than passing --input, a comma-separated list) keeps paths with commas or spaces working and
// lets a read error name its file.
class FileLines final : public sentencepiece::SentenceIterator {
 public:
  explicit FileLines(const std::vector<std::string>& files) : files_(files) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }

 private:
  void advance() {
    try {
      while (!done_) {
        if (lines_ && lines_->next(line_)) return;
        lines_.reset();
        file_.reset();
        if (next_ == files_.size()) {
          done_ = true;
          return;
        }
        file_ = std::make_unique<TextFile>(files_[next_++], "[tokenizer]");
        lines_ = std::make_unique<TextLines>(*file_);
      }
    } catch (const engine::Error& e) {  // the trainer takes errors as a status
      status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal, e.what());
      done_ = true;
    }
  }

  const std::vector<std::string>& files_;
  size_t next_ = 0;
  std::unique_ptr<TextFile> file_;
  std::unique_ptr<TextLines> lines_;
  std::string line_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

// Lines already in memory (the sample), each released once the trainer has copied it.
class SampledLines final : public sentencepiece::SentenceIterator {
 public:
  explicit SampledLines(std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { std::string().swap(lines_[i_++]); }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string>& lines_;
  size_t i_ = 0;
};

// A uniform sample of `k` non-empty lines of the files (reservoir sampling), in random order.
// SentencePiece 0.1.97 samples with a fixed seed of its own (SetRandomGeneratorSeed, which its
// spm_train --random_seed calls, does not change which lines it keeps), so the sampling and
// shuffling are done here, where SentencePieceTrainOptions::seed decides them.
std::vector<std::string> sample_lines(const std::vector<std::string>& files, size_t k,
                                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> sample;
  sample.reserve(std::min<size_t>(k, size_t(1) << 20));
  uint64_t seen = 0;
  std::string line;
  for (const auto& f : files) {
    TextFile file(f, "[tokenizer]");
    TextLines in(file);
    while (in.next(line)) {
      if (line.empty()) continue;
      ++seen;
      if (sample.size() < k) {
        sample.push_back(line);
      } else {
        const uint64_t j = std::uniform_int_distribution<uint64_t>(0, seen - 1)(rng);
        if (j < k) sample[size_t(j)] = line;
      }
    }
  }
  std::shuffle(sample.begin(), sample.end(), rng);
  return sample;
}

std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_file) {
  return std::make_unique<SentencePieceTokenizer>(model_file);
}

void train_sentencepiece(const std::vector<std::string>& inputs, const std::string& model_prefix,
                         const SentencePieceTrainOptions& options) {
  const std::string what = "[tokenizer] training SentencePiece model " + model_prefix + ".model: ";
  ENGINE_CHECK(!inputs.empty(), what, "no input files");
  for (const auto& f : inputs)
    ENGINE_CHECK(std::filesystem::is_regular_file(f), "[tokenizer] ", f,
                 ": no such file (expected a text file, one sentence or paragraph per line)");
  ENGINE_CHECK(!model_prefix.empty(), "[tokenizer] train_sentencepiece: empty model prefix");
  const auto dir = std::filesystem::path(model_prefix).parent_path();
  ENGINE_CHECK(dir.empty() || std::filesystem::is_directory(dir), what, "no directory ",
               dir.string());
  ENGINE_CHECK(options.vocab_size > 5, what, "vocab_size must exceed the 5 special pieces, got ",
               options.vocab_size);
  ENGINE_CHECK(options.character_coverage > 0 && options.character_coverage <= 1, what,
               "character_coverage must be in (0, 1], got ", options.character_coverage);
  // SentencePiece's own rule: sampling fewer than 101 sentences is refused.
  ENGINE_CHECK(options.input_sentence_size == 0 || options.input_sentence_size > 100, what,
               "input_sentence_size must be 0 (all lines) or more than 100, got ",
               options.input_sentence_size);
  ENGINE_CHECK(options.num_threads >= 0, what, "num_threads must be >= 0, got ",
               options.num_threads);
  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : int(std::max(1u, std::thread::hardware_concurrency()));

  const std::unordered_map<std::string, std::string> args = {
      {"model_prefix", model_prefix},
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", number(options.character_coverage)},
      {"input_sentence_size", std::to_string(options.input_sentence_size)},
      {"shuffle_input_sentence", "false"},  // the sample comes shuffled (sample_lines)
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"user_defined_symbols", kMaskPiece},
      {"num_threads", std::to_string(threads)},
      // Process-wide in SentencePiece: 0 logs INFO, 1 warnings and errors only.
      {"minloglevel", options.verbose ? "0" : "1"},
  };

  // Training runs on a fresh thread: SentencePiece draws any randomness of its own from a
  // thread_local generator seeded on a thread's first use, so the seed set here takes effect
  // even if the calling thread has trained before.
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(options.seed));
  sentencepiece::util::Status status;
  if (options.input_sentence_size > 0) {
    std::vector<std::string> sample =
        sample_lines(inputs, size_t(options.input_sentence_size), options.seed);
    ENGINE_CHECK(!sample.empty(), what, "the input files have no non-empty lines");
    SampledLines lines(sample);  // no more lines than input_sentence_size: the trainer keeps all
    std::thread worker([&] { status = sentencepiece::SentencePieceTrainer::Train(args, &lines); });
    worker.join();
  } else {
    FileLines lines(inputs);
    std::thread worker([&] { status = sentencepiece::SentencePieceTrainer::Train(args, &lines); });
    worker.join();
  }
  if (!status.ok()) {
    // SentencePiece suggests its spm_train flags; name the options of this function instead.
    std::string msg = status.ToString();
    const std::pair<const char*, const char*> hints[] = {
        {" with --character_coverage option", ""},
        {"Vocabulary size too high", "vocab_size too high"},
        {"Vocabulary size is smaller than required_chars",
         "vocab_size is smaller than the "
         "number of required characters"},
        {"Consider using --input_sentence_size=<size> and --shuffle_input_sentence=true.",
         "Consider a smaller input_sentence_size."},
        {"The maximum length can be changed with --max_sentence_length=<size> flag.",
         "(lines longer than 4192 bytes are skipped)"},
    };
    // "Internal: ./src/trainer_interface.cc(580) [condition] message": keep the message.
    const size_t src = msg.find("./src/"), close = msg.find("] ");
    if (src != std::string::npos && close != std::string::npos && close > src)
      msg.erase(src, close + 2 - src);
    for (auto& [from, to] : hints)
      for (size_t at; (at = msg.find(from)) != std::string::npos;)
        msg.replace(at, std::strlen(from), to);
    ENGINE_FAIL(what, msg, " (inputs: ", inputs.front(), inputs.size() > 1 ? " and others" : "",
                ")");
  }
}

}  // namespace data
