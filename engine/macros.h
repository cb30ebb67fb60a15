// Preprocessor helpers shared by the registration macros (kernel tables, positional families,
// objectives): ENGINE_CONCAT pastes after expanding, so ENGINE_CONCAT(name_, __LINE__) gives one
// static per line.
#pragma once

#define ENGINE_CONCAT_INNER(a, b) a##b
#define ENGINE_CONCAT(a, b) ENGINE_CONCAT_INNER(a, b)
