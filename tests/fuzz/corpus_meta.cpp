// Fuzz target: a prepared corpus directory as data::Corpus opens it (data/shards.cpp): meta.json
// (format, version, key types and ranges) and the memory-mapped shards (.bin token ids, .idx
// document offsets: sizes against meta.json, offsets from 0 strictly increasing to the token
// count, ids below the vocabulary size). Input: meta.json, then train.bin, train.idx, valid.bin
// and valid.idx, each after a separator line (tests/fuzz/fuzz_util.h); a missing part is a
// missing file.
#include <cstdint>
#include <filesystem>

#include "data/corpus.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = fuzz::scratch_path("corpus");
  static const char* const names[] = {"meta.json", "train.bin", "train.idx", "valid.bin",
                                      "valid.idx"};
  std::filesystem::create_directories(dir);
  const std::vector<std::string_view> parts = fuzz::split_parts(fuzz::as_view(data, size));
  for (size_t i = 0; i < 5; ++i) {
    const std::string path = dir + "/" + names[i];
    if (i < parts.size())
      fuzz::write_bytes(path, parts[i]);
    else
      std::filesystem::remove(path);
  }
  try {
    const data::Corpus corpus(dir);
    for (data::Split s : {data::Split::train, data::Split::valid}) {
      const data::ShardReader& r = corpus.split(s);
      int64_t tokens = 0;
      for (int64_t d = 0; d < r.num_documents(); ++d) {
        const std::span<const uint32_t> doc = r.document(d);
        if (doc.empty()) std::abort();  // documents are never empty
        for (uint32_t id : doc)
          if (int64_t(id) >= r.vocab_size()) std::abort();
        tokens += int64_t(doc.size());
      }
      if (tokens != r.num_tokens()) std::abort();
    }
  } catch (const engine::Error&) {
  }
  return 0;
}
