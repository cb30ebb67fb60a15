// Corpus preparation and memory-mapped shards. prepare_corpus streams text files (one sentence or
// paragraph per line, blank lines between documents, plain or .xz) through a Tokenizer into a
// directory of flat little-endian token files, split by document into train and valid:
//
//   train.bin, valid.bin   token ids, u32 little-endian, the split's documents concatenated
//   train.idx, valid.idx   u64 little-endian document offsets into the .bin (documents + 1 entries,
//                          0 first, the token count last)
//   meta.json              tokenizer, dtypes, counts, sources and the split rule (written last)
//
// ShardReader maps one split read-only (POSIX mmap), so opening a corpus costs constant memory
// whatever its size; Corpus opens meta.json and both splits. The format is documented in
// docs/data.md ("Corpus and batches").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace data {

enum class Split { train, valid };
const char* split_name(Split s);  // "train" / "valid"

struct PrepareOptions {
  // One document in (valid_ratio + 1) goes to valid (199 → 199:1); 0 = no valid split.
  int64_t valid_ratio = 199;
  uint64_t seed = 1;       // keys the split hash
  bool overwrite = false;  // replace an existing, non-empty corpus directory
  bool quiet = false;      // no progress output
};

struct SplitCounts {
  int64_t documents = 0;  // non-empty documents written
  int64_t lines = 0;      // non-blank lines of those documents
  int64_t tokens = 0;
};

struct CorpusStats {
  SplitCounts train, valid;
  int64_t lines = 0;            // non-blank lines read, all documents
  int64_t invalid_utf8 = 0;     // ill-formed UTF-8 sequences replaced by U+FFFD
  int64_t empty_documents = 0;  // documents whose lines gave no tokens (skipped)
  int64_t bytes_read = 0;       // input bytes as stored (compressed for .xz)
  const SplitCounts& split(Split s) const { return s == Split::train ? train : valid; }
};

// Tokenizes `inputs` into `out_dir` (see the file comment). Documents are separated by blank
// lines (only ASCII whitespace) and by the end of each file; a UTF-8 byte-order mark at the start
// of a file is dropped, and "\r\n" line ends are accepted. Input is read line by line and output
// written through buffers, so memory does not grow with the corpus. Files that start with the xz
// magic bytes are decompressed on the fly.
//
// Atomic: everything is written into "<out_dir>.tmp.<pid>" (those of killed runs, and a
// "<out_dir>.tmp" of older builds, are removed first), meta.json last, files and directory
// fsynced, then the directory is renamed to out_dir and its parent fsynced; a failure removes the
// temporary directory. Errors (engine::Error, "[corpus] ..."): a missing input, no tokens in the
// whole input, out_dir existing and non-empty without `overwrite` (with `overwrite`, out_dir must
// itself be a prepared corpus: a directory holding meta.json).
CorpusStats prepare_corpus(const std::vector<std::string>& inputs, const Tokenizer& tok,
                           const std::string& out_dir, const PrepareOptions& options = {});

// The split rule: document `index` (0-based over all documents of all inputs in order, empty ones
// included) goes to valid iff word 0 of Philox4x32-10 at counter (index_lo, index_hi, "SPLT", 0)
// under key `seed` is 0 modulo (valid_ratio + 1). valid_ratio == 0: never.
bool is_valid_document(uint64_t index, uint64_t seed, int64_t valid_ratio);

// Replaces each ill-formed UTF-8 sequence of `in` by U+FFFD (one per maximal ill-formed subpart,
// the Unicode/WHATWG practice: overlongs, surrogates and code points above U+10FFFF are
// ill-formed) and writes the result to `out`; returns the number of replacements.
int64_t sanitize_utf8(std::string_view in, std::string& out);

// meta.json as read back.
struct CorpusMeta {
  std::string dir;
  std::string tokenizer_kind, tokenizer_path;
  int64_t vocab_size = 0;
  SpecialIds special;
  std::string token_dtype;  // "uint32"
  CorpusStats stats;
  std::vector<std::string> sources;
  int64_t valid_ratio = 0;
  uint64_t seed = 0;
};
// Reads and checks `<dir>/meta.json`; errors name the file and the missing or bad key.
CorpusMeta read_corpus_meta(const std::string& dir);

struct OpenOptions {
  // Scan every token id against the vocabulary size on open (one sequential pass over the
  // mapping). Off: only sizes and offsets are checked; the batch builder still checks each id it
  // reads.
  bool check_tokens = true;
};

// One split of a prepared corpus, memory-mapped read-only. Move-only; the mapping lives as long as
// the reader. Open checks that the file sizes match meta.json, the offsets start at 0, increase
// strictly and end at the token count, and (by default) that every id is below the vocabulary
// size; errors name the file.
//
// Read faults: a mapped file that is deleted or renamed stays readable (the mapping holds it),
// but one truncated or unreadable (an I/O error) while mapped makes the next read of a lost page
// raise SIGBUS, where no exception can be thrown. The readers register their mappings with a
// SIGBUS handler (installed with the first) that writes "[corpus] <file>: reading the
// memory-mapped shard failed at byte <n> of <size> (SIGBUS: ...); the run stops here. <hint>" to
// stderr and ends the process with exit code 1; a SIGBUS elsewhere goes to the handler before it
// (or the default action). docs/data.md, "Storage faults".
class ShardReader {
 public:
  ShardReader(const CorpusMeta& meta, Split split, const OpenOptions& options = {});
  // Reads `<dir>/meta.json` first.
  ShardReader(const std::string& dir, Split split, const OpenOptions& options = {});
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  Split split() const { return split_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t vocab_size() const { return vocab_size_; }
  uint32_t token(int64_t i) const { return tokens_[i]; }
  std::span<const uint32_t> tokens() const { return {tokens_, static_cast<size_t>(num_tokens_)}; }
  // offsets()[d] .. offsets()[d + 1] are document d's tokens; num_documents() + 1 entries.
  std::span<const uint64_t> offsets() const {
    return {offsets_, static_cast<size_t>(num_documents_ + 1)};
  }
  std::span<const uint32_t> document(int64_t d) const;  // checked index
  const std::string& bin_path() const { return bin_path_; }
  const std::string& idx_path() const { return idx_path_; }

 private:
  struct Mapping {
    void* addr = nullptr;
    size_t bytes = 0;
  };
  static Mapping map_file(const std::string& path, size_t expected_bytes, const char* what);
  void release();

  Split split_ = Split::train;
  std::string bin_path_, idx_path_;
  Mapping bin_, idx_;
  const uint32_t* tokens_ = nullptr;
  const uint64_t* offsets_ = nullptr;
  int64_t num_tokens_ = 0, num_documents_ = 0, vocab_size_ = 0;
};

// Text appended to the read-fault message (see ShardReader): pretraining names the last
// checkpoint to continue from with --resume once the file is restored. "" clears it; at most
// ~2 KB are kept.
void set_read_fault_hint(const std::string& hint);

// A prepared corpus directory: meta.json and both splits. Neither copied nor moved: packers and
// batch streams keep references to its readers.
class Corpus {
 public:
  explicit Corpus(const std::string& dir, const OpenOptions& options = {});
  Corpus(const Corpus&) = delete;
  Corpus& operator=(const Corpus&) = delete;
  const CorpusMeta& meta() const { return meta_; }
  const ShardReader& train() const { return train_; }
  const ShardReader& valid() const { return valid_; }
  const ShardReader& split(Split s) const { return s == Split::train ? train_ : valid_; }

 private:
  CorpusMeta meta_;
  ShardReader train_, valid_;
};

}  // namespace data
