// Device-side strided indexing: a tensor's sizes and (up to N operands') strides packed in a
// struct passed by value, so a kernel maps a linear index to element offsets.
//
// make_indexer first collapses the layout (size-1 dims dropped, neighbours merged where every
// operand steps through them as one dim: a contiguous tensor is one dim, a (B, T, H, d) ->
// (B, H, T, d) permute is four), and when the element count is below 2^31 the kernel divides in
// 32 bits by multiply-high and shift (FastDiv) instead of a 64-bit divide per dim per element:
// the strided copies of the first H200 run spent most of their time in those divides.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/error.h"
#include "engine/tensor.h"

namespace engine::cuda {

inline constexpr int kMaxDims = 8;

// n / d for 0 <= n < 2^31 and a fixed divisor 1 <= d < 2^31, as (mulhi(n, magic) + n) >> shift
// (Granlund & Montgomery; PyTorch's IntDivider): exact over that range.
struct FastDiv {
  uint32_t divisor = 1, magic = 1, shift = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t d) : divisor(d) {
    shift = 0;
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __host__ __device__ uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(n, magic);
#else
    const uint32_t t = static_cast<uint32_t>((uint64_t{n} * magic) >> 32);
#endif
    return (t + n) >> shift;
  }
};

// A layout with dims collapsed: sizes and each operand's strides, outermost first.
struct Collapsed {
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides;  // [operand][dim]
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
};

// Drops size-1 dims and merges dim d into d + 1 when every operand has stride[d] ==
// stride[d + 1] * size[d + 1] (one dim to every operand). An empty layout has one dim of 0.
inline Collapsed collapse_layout(const Shape& shape,
                                 const std::vector<const std::vector<int64_t>*>& st) {
  Collapsed c;
  c.strides.resize(st.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !c.sizes.empty();
    for (size_t k = 0; merge && k < st.size(); ++k)
      merge = c.strides[k].back() == (*st[k])[d] * shape[d];
    if (merge) {
      c.sizes.back() *= shape[d];
      for (size_t k = 0; k < st.size(); ++k) c.strides[k].back() = (*st[k])[d];
    } else {
      c.sizes.push_back(shape[d]);
      for (size_t k = 0; k < st.size(); ++k) c.strides[k].push_back((*st[k])[d]);
    }
  }
  for (int64_t s : shape)
    if (s == 0) {
      c.sizes.assign(1, 0);
      for (auto& v : c.strides) v.assign(1, 0);
    }
  return c;
}

template <int N>
struct StridedIndexer {
  int ndim = 0;
  bool narrow = false;  // fewer than 2^31 elements: 32-bit FastDiv
  int64_t sizes[kMaxDims] = {};
  FastDiv div[kMaxDims];
  int64_t strides[N][kMaxDims] = {};

  __host__ __device__ void offsets(int64_t linear, int64_t* off) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (narrow) {
      uint32_t l = static_cast<uint32_t>(linear);
      for (int d = ndim - 1; d >= 0; --d) {
        const uint32_t q = div[d].div(l);
        const int64_t i = static_cast<int64_t>(l - q * div[d].divisor);
        l = q;
        for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
      }
      return;
    }
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }
};

template <int N>
StridedIndexer<N> make_indexer(const Collapsed& c) {
  ENGINE_CHECK(c.sizes.size() <= static_cast<size_t>(kMaxDims), "[cuda] layouts of more than ",
               kMaxDims, " dims (after merging contiguous dims) are not supported, got ",
               c.sizes.size());
  StridedIndexer<N> ix{};
  ix.ndim = static_cast<int>(c.sizes.size());
  ix.narrow = c.numel() < (int64_t{1} << 31);
  for (size_t d = 0; d < c.sizes.size(); ++d) {
    ix.sizes[d] = c.sizes[d];
    if (ix.narrow) ix.div[d] = FastDiv(static_cast<uint32_t>(c.sizes[d] > 0 ? c.sizes[d] : 1));
    for (int k = 0; k < N; ++k) ix.strides[k][d] = c.strides[size_t(k)][d];
  }
  return ix;
}

template <int N>
StridedIndexer<N> make_indexer(const Shape& shape, const std::vector<int64_t>* const (&st)[N]) {
  return make_indexer<N>(
      collapse_layout(shape, std::vector<const std::vector<int64_t>*>(st, st + N)));
}

}  // namespace engine::cuda
