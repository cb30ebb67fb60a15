// Concatenation along a dim and its inverse, split into views.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace engine {

// Joins tensors of one dtype and device whose shapes agree except along `dim` (negative counts
// from the end). The backward hands each input its slice of the gradient (a view).
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);

// Views of x along `dim` of the given sizes, which must sum to x.size(dim). Each piece is a
// differentiable slice, so no data is copied.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// Pieces of `split_size` along `dim`, the last one smaller when the size does not divide (as
// torch.split). Note: split(x, {5}) picks this overload (a braced scalar), which agrees with the
// sizes overload whenever {5} would be valid there.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);

// No kernel tables: the forward is one strided copy per input through the backend's copy
// primitive (engine/backend.h), and the backward is views.

}  // namespace engine
