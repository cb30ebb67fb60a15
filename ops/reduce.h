// Sum and mean over all elements or over chosen dims (optionally keeping them as size 1).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

// All elements -> a scalar of shape ().
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// Over `dims` (negative dims count from the end; a repeated dim is an error). keepdim leaves
// each reduced dim as size 1. An empty `dims` reduces every dim, as in PyTorch.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

// The forward is the backends' sum_to primitive (engine/backend.h) plus elementwise
// affine_kernel for mean's 1/count, and the backward is a broadcast view.

// ---- kernels (one table per launch; backends register implementations) ----------------------

// dst (n) f32 += the column sums of src (rows, n), summed in f32 in an order fixed by the shape
// (the same bits every run): a bias's gradient added into the f32 .grad behind autocast's cast of
// the bias (linear's backward, Node::grad_sink_f32), with no 16-bit gradient and no separate add.
// src f32, or bf16 / f16 on devices that compute them; both contiguous.
inline Kernel<void(const Tensor& src, const Tensor& dst)> column_sums_add_kernel{"column_sums_add"};

}  // namespace engine
