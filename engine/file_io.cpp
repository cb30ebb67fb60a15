// Atomic whole-file writes (see file_io.h).
#include "engine/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/error.h"

namespace engine {

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& tag) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ENGINE_CHECK(fd >= 0, "[", tag, "] ", tmp, ": cannot create (", std::strerror(errno), ")");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      ENGINE_FAIL("[", tag, "] ", tmp, ": write failed (", err, ")");
    }
    done += static_cast<size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string sync_err = synced ? "" : std::strerror(errno);
  ::close(fd);
  if (!synced) {
    ::unlink(tmp.c_str());
    ENGINE_FAIL("[", tag, "] ", tmp, ": fsync failed (", sync_err, ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    ENGINE_FAIL("[", tag, "] ", path, ": cannot rename '", tmp, "' over it (", err, ")");
  }
}

}  // namespace engine
