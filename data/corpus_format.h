// Internal to libengine_data: what corpus preparation (corpus.cpp) writes and the shard reader
// (shards.cpp) checks, the meta.json format name and version.
#pragma once

#include <bit>
#include <cerrno>
#include <cstring>
#include <string>

namespace data {

// The shard files are raw little-endian arrays that are memory-mapped and used in place; a
// big-endian host would need a byte-swapping reader, which nothing here needs yet.
static_assert(std::endian::native == std::endian::little,
              "corpus shards are little-endian and mapped in place");

inline constexpr int kCorpusFormatVersion = 1;
inline constexpr const char* kCorpusFormatName = "engine-corpus";

inline std::string errno_text() { return std::strerror(errno); }

}  // namespace data
