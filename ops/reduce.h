// Sum and mean over all elements or over chosen dims (optionally keeping them as size 1).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace engine {

// All elements -> a scalar of shape ().
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// Over `dims` (negative dims count from the end; a repeated dim is an error). keepdim leaves
// each reduced dim as size 1. An empty `dims` reduces every dim, as in PyTorch.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

// No kernel tables: the forward is the backends' sum_to primitive (engine/backend.h) plus
// elementwise affine_kernel for mean's 1/count, and the backward is a broadcast view.

}  // namespace engine
