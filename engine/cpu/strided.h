// Strided iteration for CPU kernels: walks a shape with the strides of N operands, merging dims
// that are contiguous for every operand, and hands the innermost run to a callback:
//
//   strided_for<2>(shape, {&dst_strides, &src_strides},
//                  [&](const int64_t* off, int64_t n, const int64_t* step) { ... });
//
// off[k] is operand k's element offset of the run's first element, step[k] its inner stride.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "engine/shape.h"

namespace engine::cpu {

template <int N, class F>
void strided_for(const Shape& shape, std::array<const std::vector<int64_t>*, N> strides, F&& f) {
  // Drop size-1 dims, then merge dim i into i+1 when every operand steps through them as one.
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s;
    for (int k = 0; k < N; ++k) s[k] = (*strides[k])[d];
    if (!sizes.empty()) {
      bool merge = true;
      for (int k = 0; k < N; ++k) merge &= st.back()[k] == s[k] * shape[d];
      if (merge) {
        sizes.back() *= shape[d];
        st.back() = s;
        continue;
      }
    }
    sizes.push_back(shape[d]);
    st.push_back(s);
  }
  int64_t off[N] = {};
  if (sizes.empty()) {
    int64_t step[N] = {};
    f(off, int64_t{1}, step);
    return;
  }
  const int64_t nd = static_cast<int64_t>(sizes.size());
  const int64_t inner = sizes[nd - 1];
  int64_t step[N];
  for (int k = 0; k < N; ++k) step[k] = st[nd - 1][k];
  std::vector<int64_t> idx(nd, 0);
  while (true) {
    f(off, inner, step);
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      for (int k = 0; k < N; ++k) off[k] += st[d][k];
      if (++idx[d] < sizes[d]) break;
      for (int k = 0; k < N; ++k) off[k] -= st[d][k] * sizes[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace engine::cpu
