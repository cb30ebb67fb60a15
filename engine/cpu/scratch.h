// A CPU kernel's scratch memory, kept by each thread between calls: a fresh vector of a few hundred
// KB is a fresh mmap, and its page faults cost on every call (~30% of sum_to's batch-shared
// positional bias, ~10% of layer_norm's backward at 256 rows x 768).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace engine::cpu {

// n elements of A (not initialised) from this thread's buffer for `Slot` (a kernel that needs
// several buffers at once takes one slot each), kept between calls up to 1 MiB; a larger request
// goes to `fresh`, which the caller owns for the call.
template <class A, int Slot, class Alloc = std::allocator<A>>
A* thread_scratch(int64_t n, std::vector<A, Alloc>& fresh) {
  constexpr int64_t kKept = (int64_t(1) << 20) / int64_t(sizeof(A));
  thread_local std::vector<A, Alloc> kept;
  auto& buffer = n <= kKept ? kept : fresh;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

}  // namespace engine::cpu
