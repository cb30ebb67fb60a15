// Text input for corpus preparation and tokenizer training: plain, xz- or gzip-compressed files
// (the magic bytes decide, not the name), read in chunks and cut into lines, so memory does not
// grow with the file. One reader for every place that reads raw text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace data {

class TextFile {
 public:
  // `tag` prefixes errors ("[corpus]", "[tokenizer]"); every error names the path.
  explicit TextFile(const std::string& path, std::string tag = "[corpus]");
  ~TextFile();
  TextFile(const TextFile&) = delete;
  TextFile& operator=(const TextFile&) = delete;

  const std::string& path() const;
  bool compressed() const;    // xz or gzip
  uint64_t consumed() const;  // bytes of the file read so far (compressed bytes when compressed)
  // Up to `cap` bytes of text; 0 at the end. A corrupt or truncated stream is an error.
  size_t read(char* dst, size_t cap);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The lines of a TextFile: "\n" or "\r\n" ends a line, a last line without one counts, a UTF-8
// byte-order mark at the start is dropped. Holds one line and one read buffer.
class TextLines {
 public:
  explicit TextLines(TextFile& in);
  bool next(std::string& line);  // false at the end

 private:
  TextFile& in_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false, first_ = true;
};

}  // namespace data
