// The pieces of file_io.h: buffered POSIX writes, fsync, rename over, directory fsync.
#include "engine/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "engine/error.h"

namespace engine {
namespace {

std::string os_error(int err) { return std::strerror(err); }

// 0666 before the umask, as fopen and Python create files.
int create_file(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
}

std::string directory_of(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return dir.empty() ? std::string(".") : dir.string();
}

void rename_over(const std::string& from, const std::string& to, const std::string& tag) {
  ENGINE_CHECK(::rename(from.c_str(), to.c_str()) == 0, "[", tag, "] ", to, ": cannot rename '",
               from, "' over it (", os_error(errno), ")");
}

}  // namespace

// ---- FileWriter ------------------------------------------------------------------------------

FileWriter::FileWriter(std::string path, std::string tag)
    : path_(std::move(path)), tag_(std::move(tag)) {
  fd_ = create_file(path_);
  ENGINE_CHECK(fd_ >= 0, "[", tag_, "] ", path_, ": cannot create (", os_error(errno), ")");
}

FileWriter::FileWriter(int fd, std::string path, std::string tag)
    : path_(std::move(path)), tag_(std::move(tag)), fd_(fd) {}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  ENGINE_ASSERT(fd_ >= 0);  // written after close()
  const char* p = static_cast<const char*>(data);
  if (buf_.size() + n > kBufferBytes) flush();
  if (n >= kBufferBytes) {
    write_all(p, n);  // a large block would only be copied through the buffer
    return;
  }
  buf_.insert(buf_.end(), p, p + n);
}

void FileWriter::write_at(uint64_t offset, const void* data, size_t n) {
  ENGINE_ASSERT(fd_ >= 0);  // written after close()
  flush();
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    ENGINE_CHECK(w > 0, "[", tag_, "] ", path_, ": write failed (",
                 w < 0 ? os_error(errno) : std::string("no bytes written"), ")");
    p += w;
    offset += uint64_t(w);
    n -= static_cast<size_t>(w);
  }
}

void FileWriter::flush() {
  write_all(buf_.data(), buf_.size());
  buf_.clear();
}

void FileWriter::close() {
  ENGINE_ASSERT(fd_ >= 0);  // closed twice
  flush();
  ENGINE_CHECK(::fsync(fd_) == 0, "[", tag_, "] ", path_, ": fsync failed (", os_error(errno), ")");
  const int fd = fd_;
  fd_ = -1;
  // close can report a write error that fsync did not (NFS): the file is not known to be whole.
  ENGINE_CHECK(::close(fd) == 0, "[", tag_, "] ", path_, ": close failed (", os_error(errno), ")");
}

void FileWriter::write_all(const char* p, size_t n) {
  while (n > 0) {
    // Linux writes at most ~2 GB per call; 1 GB pieces keep every call within that.
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    ENGINE_CHECK(w > 0, "[", tag_, "] ", path_, ": write failed (",
                 w < 0 ? os_error(errno) : std::string("no bytes written"), ")");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// ---- AtomicFile ------------------------------------------------------------------------------

std::string temporary_path(const std::string& path) {
  // The pid keeps two processes writing the same file from sharing a temporary, and marks the
  // leftovers of a killed one.
  return path + ".tmp." + std::to_string(::getpid());
}

AtomicFile::AtomicFile(std::string path, std::string tag)
    : path_(std::move(path)), tmp_(temporary_path(path_)), tag_(std::move(tag)) {
  const int fd = create_file(tmp_);
  ENGINE_CHECK(fd >= 0, "[", tag_, "] ", path_, ": cannot create the temporary file '", tmp_, "' (",
               os_error(errno), ")");
  try {
    file_.reset(new FileWriter(fd, tmp_, tag_));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp_.c_str());
    throw;
  }
}

AtomicFile::~AtomicFile() {
  if (!pending_) return;
  file_.reset();  // closes the descriptor if commit() did not get that far
  ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  ENGINE_ASSERT(file_ != nullptr);  // written after commit()
  file_->write(data, n);
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t n) {
  ENGINE_ASSERT(file_ != nullptr);  // written after commit()
  file_->write_at(offset, data, n);
}

void AtomicFile::commit() {
  ENGINE_ASSERT(file_ != nullptr);  // committed twice
  file_->close();                   // the bytes are on disk before the name points at them
  file_.reset();
  rename_over(tmp_, path_, tag_);
  pending_ = false;
  fsync_directory(directory_of(path_), tag_);
}

std::string read_file(const std::string& path, const std::string& tag) {
  std::ifstream f(path, std::ios::binary);
  ENGINE_CHECK(f, "[", tag, "] cannot read ", path, ": ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  ENGINE_CHECK(!f.bad(), "[", tag, "] error reading ", path, ": ", std::strerror(errno));
  return ss.str();
}

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& tag) {
  AtomicFile f(path, tag);
  f.write(bytes);
  f.commit();
}

// ---- renames and directories -----------------------------------------------------------------

void rename_durably(const std::string& from, const std::string& to, const std::string& tag) {
  rename_over(from, to, tag);
  fsync_directory(directory_of(to), tag);
}

void fsync_directory(const std::string& dir, const std::string& tag) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ENGINE_CHECK(fd >= 0, "[", tag, "] ", dir, ": cannot open the directory to fsync it (",
               os_error(errno), ")");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems (some network and FUSE ones) cannot sync a directory and say so with
  // EINVAL; the rename is then as durable as they make it, and failing would only lose the file.
  ENGINE_CHECK(rc == 0 || err == EINVAL || err == ENOTSUP, "[", tag, "] ", dir,
               ": fsync of the directory failed (", os_error(err), ")");
}

}  // namespace engine
