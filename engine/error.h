// Errors: every failure in libengine is an engine::Error whose message names the op
// (as "[op] ..."), the shapes/dtypes involved and what was expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace engine {

class Error : public std::runtime_error {
 public:
  // `exit_code`: the status a program ends with when this error ends it (2: a bad command line).
  explicit Error(const std::string& what, int exit_code = 1)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_ = 1;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void throw_error(const std::string& msg);
}  // namespace detail

}  // namespace engine

// ENGINE_CHECK(cond, "[op] input ", shape, " does not match ...") throws engine::Error with the
// pieces streamed together. The message is the user-facing text: start it with "[op]".
#define ENGINE_CHECK(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) ::engine::detail::throw_error(::engine::detail::concat(__VA_ARGS__)); \
  } while (0)

#define ENGINE_FAIL(...) ::engine::detail::throw_error(::engine::detail::concat(__VA_ARGS__))

// Internal invariants (bugs, not user errors): name the file and line.
#define ENGINE_ASSERT(cond)                                                           \
  do {                                                                                \
    if (!(cond))                                                                      \
      ::engine::detail::throw_error(::engine::detail::concat(                         \
          "[internal] assertion '", #cond, "' failed at ", __FILE__, ":", __LINE__)); \
  } while (0)
