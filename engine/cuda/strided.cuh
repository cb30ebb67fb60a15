// Device-side strided indexing: a tensor's sizes and (up to two operands') strides packed in a
// struct passed by value, so a kernel maps a linear index to element offsets.
#pragma once

#include <cstdint>

#include "engine/error.h"
#include "engine/tensor.h"

namespace engine::cuda {

inline constexpr int kMaxDims = 8;

template <int N>
struct StridedIndexer {
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];

  __device__ void offsets(int64_t linear, int64_t* off) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t i = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }
};

template <int N>
StridedIndexer<N> make_indexer(const Shape& shape, const std::vector<int64_t>* const (&st)[N]) {
  ENGINE_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "[cuda] tensors of more than ",
               kMaxDims, " dims are not supported, got ", shape_str(shape));
  StridedIndexer<N> ix{};
  ix.ndim = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    ix.sizes[d] = shape[d];
    for (int k = 0; k < N; ++k) ix.strides[k][d] = (*st[k])[d];
  }
  return ix;
}

}  // namespace engine::cuda
