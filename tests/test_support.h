// Helpers shared by the Catch2 test files: a scratch directory, the text of an expected error,
// the names a write left behind, and errors raised with a file size limit (a full disk).
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/error.h"

namespace engine::testing {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("engine_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string operator/(const std::string& name) const { return file(name); }
  // Writes `text` byte for byte to <dir>/<name> (creating subdirectories) and returns the path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path p = path / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
};

// The message of the engine::Error that f() throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const engine::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The names in `dir` that start with `prefix`, sorted: with prefix "ckpt.safetensors.tmp" the
// temporaries a write left behind.
inline std::vector<std::string> names_starting_with(const std::filesystem::path& dir,
                                                    const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Runs f() in a forked child that may not write files beyond `max_file_bytes` (RLIMIT_FSIZE,
// with SIGXFSZ ignored so that write() fails with EFBIG instead of killing the process): a full
// disk that also stops root, whom permission bits do not. Returns the message of the
// engine::Error f() threw, "(no error)", or "(child died: ...)". f must not use Catch2.
template <class F>
std::string error_with_file_size_limit(rlim_t max_file_bytes, F&& f) {
  int fds[2];
  if (::pipe(fds) != 0) return "(pipe failed)";
  const pid_t pid = ::fork();
  if (pid < 0) return "(fork failed)";
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{max_file_bytes, max_file_bytes};
    std::string message = "(setrlimit failed)";
    if (::setrlimit(RLIMIT_FSIZE, &limit) == 0) message = error_of(f);
    for (size_t done = 0; done < message.size();) {
      const ssize_t w = ::write(fds[1], message.data() + done, message.size() - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    ::_exit(0);  // no atexit handlers, no Catch2 reporting from the child
  }
  ::close(fds[1]);
  std::string message;
  char buf[4096];
  for (ssize_t r; (r = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    message.append(buf, static_cast<size_t>(r));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "(child died: status " + std::to_string(status) + ")";
  return message;
}

}  // namespace engine::testing
