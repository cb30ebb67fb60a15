// New tensors laid out like existing ones: a result or gradient allocated in its operand's
// dimension order, so that the permutes and splits around it stay views.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace engine {

// An empty tensor of `shape` whose dims are laid out in the order of `strides` (outermost first,
// ties in dim order), contiguous in that order: permuted back to `shape`.
Tensor empty_in_stride_order(const Shape& shape, const std::vector<int64_t>& strides, DType dtype,
                             Device device);

// The tensor whose slices along a new dimension `dim` are g[0], g[1], ... (two or more; one
// storage, one dtype, shape and strides, their first elements a fixed positive step apart), as a
// view outside the graph; undefined when they are not. Views with a zero stride (an expand) are
// refused: their elements are not each their own.
Tensor stacked_view(const std::vector<Tensor>& g, int64_t dim);

}  // namespace engine
