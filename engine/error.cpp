// Out-of-line throw so that ENGINE_CHECK expands to little code at each call site.
#include "engine/error.h"

namespace engine::detail {
void throw_error(const std::string& msg) { throw Error(msg); }
}  // namespace engine::detail
