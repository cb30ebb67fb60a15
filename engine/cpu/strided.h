// Strided iteration for CPU kernels: walks a shape with the strides of N operands, merging dims
// that are contiguous for every operand, and hands each innermost run to a callback:
//
//   strided_for_parallel<2>(shape, {&dst_strides, &src_strides}, min_parallel,
//                           [&](const int64_t* off, int64_t n, const int64_t* step) { ... });
//
// off[k] is operand k's element offset of the run's first element, step[k] its inner stride.
// The walk is shared out over the OpenMP threads (each thread a contiguous range of the runs, or
// of every run's elements when there are fewer runs than threads) once the shape has more than
// min_parallel elements (INT64_MAX: the calling thread alone). For element-wise kernels whose
// operand 0 is written: it stays on one thread when operand 0 repeats an element (a zero stride),
// so no element is written by two threads.
#pragma once

#include <omp.h>

#include <array>
#include <cstdint>
#include <vector>

#include "engine/shape.h"

namespace engine::cpu {

namespace detail {

// The shape with size-1 dims dropped and dim i merged into i+1 when every operand steps through
// them as one. Returns false when the shape is empty (a zero dim).
template <int N>
bool merge_dims(const Shape& shape, std::array<const std::vector<int64_t>*, N> strides,
                std::vector<int64_t>& sizes, std::vector<std::array<int64_t, N>>& st) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return false;
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
  return true;
}

// Runs [r0, r1) of the merged shape (a run: the inner dim at fixed outer indices), each from
// element e0 to e1 of the inner dim.
template <int N, class F>
void walk_runs(const std::vector<int64_t>& sizes, const std::vector<std::array<int64_t, N>>& st,
               int64_t r0, int64_t r1, int64_t e0, int64_t e1, F& f) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  int64_t step[N], off[N];
  for (int k = 0; k < N; ++k) {
    step[k] = st[nd - 1][k];
    off[k] = e0 * step[k];
  }
  std::vector<int64_t> idx(nd, 0);
  for (int64_t d = nd - 2, r = r0; d >= 0; --d) {  // run r0's outer indices, innermost first
    idx[d] = r % sizes[d];
    r /= sizes[d];
    for (int k = 0; k < N; ++k) off[k] += idx[d] * st[d][k];
  }
  for (int64_t r = r0; r < r1; ++r) {
    f(static_cast<const int64_t*>(off), e1 - e0, static_cast<const int64_t*>(step));
    for (int64_t d = nd - 2; d >= 0; --d) {
      for (int k = 0; k < N; ++k) off[k] += st[d][k];
      if (++idx[d] < sizes[d]) break;
      for (int k = 0; k < N; ++k) off[k] -= st[d][k] * sizes[d];
      idx[d] = 0;
    }
  }
}

}  // namespace detail

template <int N, class F>
void strided_for_parallel(const Shape& shape, std::array<const std::vector<int64_t>*, N> strides,
                          int64_t min_parallel, F&& f) {
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> st;
  if (!detail::merge_dims<N>(shape, strides, sizes, st)) return;
  if (sizes.empty()) {
    const int64_t off[N] = {}, step[N] = {};
    f(off, int64_t{1}, step);
    return;
  }
  int64_t runs = 1, numel = sizes.back();
  bool repeats = false;  // operand 0 visits an element twice
  for (size_t d = 0; d < sizes.size(); ++d) {
    repeats |= st[d][0] == 0;
    if (d + 1 < sizes.size()) runs *= sizes[d];
  }
  numel *= runs;
  const int64_t inner = sizes.back();
  if (numel <= min_parallel || repeats || omp_in_parallel() || omp_get_max_threads() < 2) {
    detail::walk_runs<N>(sizes, st, 0, runs, 0, inner, f);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    if (runs >= nt)
      detail::walk_runs<N>(sizes, st, runs * t / nt, runs * (t + 1) / nt, 0, inner, f);
    else
      detail::walk_runs<N>(sizes, st, 0, runs, inner * t / nt, inner * (t + 1) / nt, f);
  }
}

}  // namespace engine::cpu
