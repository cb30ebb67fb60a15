// Writing files so that a reader, or a run killed mid-write, sees the old file or the new one,
// never half of one: one set of pieces for every writer (checkpoints, .npy dumps, result tables,
// predictions, rewritten logs, PNGs, corpus shards).
//
//   AtomicFile f(path, "safetensors");   // writes "<path>.tmp.<pid>" next to path
//   f.write(header.data(), header.size());
//   f.commit();                          // flush, fsync, close, rename over path, fsync the dir
//
// A temporary that a killed process left behind keeps the pid suffix, so a later run can tell it
// from its own and remove it (pretraining does so in its checkpoint directory). Every error is an
// engine::Error "[<tag>] <file>: <what failed> (<OS error text>)".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace engine {

// Buffered writes to a new file (created, or truncated when it exists), made durable by close():
// flush, fsync, close. Writes of the buffer's size or more go straight to the file. On its own
// it is for files inside a temporary directory that is renamed as a whole (corpus shards); it is
// also what AtomicFile writes through. Destroyed without close() (after an error) it closes the
// descriptor and leaves the file as far as it got.
// Errors: "[<tag>] <path>: cannot create / write failed / fsync failed / close failed (<errno>)".
class FileWriter {
 public:
  FileWriter(std::string path, std::string tag);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Overwrites bytes already written (a header patched once the data behind it is known), after
  // flushing the buffer; the next write() continues at the end.
  void write_at(uint64_t offset, const void* data, size_t n);
  void flush();  // hands the buffer to the OS (not yet durable)
  void close();  // flush, fsync, close: the bytes are on disk when it returns
  const std::string& path() const { return path_; }

  static constexpr size_t kBufferBytes = size_t(1) << 20;

 private:
  friend class AtomicFile;
  FileWriter(int fd, std::string path, std::string tag);  // adopts an open descriptor
  void write_all(const char* p, size_t n);

  std::string path_, tag_;
  int fd_ = -1;
  std::vector<char> buf_;
};

// A file that replaces `path` only when committed. It is written to temporary_path(path) in the
// same directory (a rename across file systems would not be atomic); commit() flushes, fsyncs and
// closes it, renames it over `path` and fsyncs the directory so the rename survives a power cut.
// Destroyed without commit() (an exception, an early return) it removes the temporary: `path` is
// left exactly as it was. Errors name the temporary for create / write / fsync / close and
// `path` for the rename:
// "[<tag>] <path>: cannot create the temporary file '<tmp>' (<errno>)",
// "[<tag>] <tmp>: write failed (...)", "[<tag>] <path>: cannot rename '<tmp>' over it (...)".
class AtomicFile {
 public:
  AtomicFile(std::string path, std::string tag);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  void write_at(uint64_t offset, const void* data, size_t n);  // FileWriter::write_at
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temporary() const { return tmp_; }

 private:
  std::string path_, tmp_, tag_;
  std::unique_ptr<FileWriter> file_;  // the open temporary; null once commit() closed it
  bool pending_ = true;               // the temporary exists under its own name
};

// "<path>.tmp.<pid>": where AtomicFile (and prepare_corpus, for its directory) writes before the
// rename.
std::string temporary_path(const std::string& path);

// The whole file as bytes. Error: "[<tag>] cannot read <path>: <errno>".
std::string read_file(const std::string& path, const std::string& tag);

// Writes `bytes` to `path` atomically: an AtomicFile written once and committed.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& tag);

// Renames `from` over `to` (a file, or a directory over an absent or empty one) and fsyncs the
// directory holding `to`, so the new name is on disk when it returns.
// Error: "[<tag>] <to>: cannot rename '<from>' over it (<errno>)", or fsync_directory's.
void rename_durably(const std::string& from, const std::string& to, const std::string& tag);

// fsyncs a directory, making the entries created, renamed or removed in it durable. A file
// system that cannot sync directories (EINVAL, ENOTSUP) is not an error: nothing more can be done
// there. Errors: "[<tag>] <dir>: cannot open the directory to fsync it / fsync of the directory
// failed (<errno>)".
void fsync_directory(const std::string& dir, const std::string& tag);

}  // namespace engine
