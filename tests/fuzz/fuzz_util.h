// Helpers shared by the fuzz targets (tests/fuzz/*.cpp): most parsers read files by path, so an
// input is written to a scratch file under /dev/shm (memory, no disk I/O) and the public API is
// called on it; inputs made of several files are cut at a separator line.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace fuzz {

// Separates the files of a multi-file input ("meta.json\n@@@@\ntrain.bin\n@@@@\n...") and a YAML
// config from its --set assignments. In every dictionary that needs it.
inline constexpr std::string_view kSeparator = "\n@@@@\n";

// A directory of this process's own (/dev/shm/engine_fuzz.<pid>, else the system temp dir),
// removed when the process exits normally. A crash leaves it for inspection.
inline const std::string& scratch_dir() {
  struct Dir {
    std::string path;
    Dir() {
      std::error_code ec;
      std::filesystem::path base = "/dev/shm";
      if (!std::filesystem::is_directory(base, ec)) base = std::filesystem::temp_directory_path();
      path = (base / ("engine_fuzz." + std::to_string(::getpid()))).string();
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// "<scratch_dir>/<name>"
inline std::string scratch_path(const std::string& name) { return scratch_dir() + "/" + name; }

// Replaces `path` with `bytes` (plain stdio: the fuzz loop must be fast, durability is moot).
inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The pieces of `in` between separators; always at least one (the whole input).
inline std::vector<std::string_view> split_parts(std::string_view in) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t at = in.find(kSeparator, start);
    if (at == std::string_view::npos) break;
    parts.push_back(in.substr(start, at - start));
    start = at + kSeparator.size();
  }
  parts.push_back(in.substr(start));
  return parts;
}

}  // namespace fuzz
