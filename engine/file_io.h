// Small files written whole and atomically (result tables, prediction files, rewritten logs): a
// reader, or a run killed mid-write, sees the old file or the new one, never half of one.
// (Checkpoints have their own streaming writer in safetensors.cpp.)
#pragma once

#include <string>
#include <string_view>

namespace engine {

// Writes `bytes` to "<path>.tmp", fsyncs it and renames it over `path`. Errors are engine::Error
// "[<tag>] <file>: cannot create / write failed / fsync failed / cannot rename ... (<errno text>)";
// the temporary file is removed on failure.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& tag);

}  // namespace engine
