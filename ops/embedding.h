// Row gathers with scatter-add backward: index_select over dim 0 and the embedding lookup.
#pragma once

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

// x (N, ...) and a 1-D i32/i64 index (M) -> x's rows at index: (M, ...). The backward
// scatter-adds into a zero (N, ...) gradient, so repeated indices accumulate.
Tensor index_select(const Tensor& x, const Tensor& index);

// weight (V, D) and i32/i64 ids of any shape -> (*ids.shape, D). Same kernels as index_select.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// ---- kernels (one table per launch; backends register implementations) ----------------------

// out (M, D) = table (N, D) rows at index (M). All contiguous; any dtype (a row copy). Every
// index is in [0, N): the op checks CPU indices on the host before launching; a device kernel
// must still never read out of bounds (trap rather than read).
inline Kernel<void(const Tensor& table, const Tensor& index, const Tensor& out)> gather_rows_kernel{
    "gather_rows"};
// grad_table (N, D) += grad_out (M, D) row i into row index[i]; repeats accumulate. All
// contiguous, floating. Deterministic: each element's sum is formed in index order.
inline Kernel<void(const Tensor& grad_out, const Tensor& index, const Tensor& grad_table)>
    scatter_add_rows_kernel{"scatter_add_rows"};

}  // namespace engine
