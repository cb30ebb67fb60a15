// Row gathers with scatter-add backward: index_select over dim 0 and the embedding lookup.
#pragma once

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

// x (N, ...) and a 1-D i32/i64 index (M) -> x's rows at index: (M, ...). The backward
// scatter-adds into a zero (N, ...) gradient, so repeated indices accumulate. unique: the caller
// knows no index value repeats (the MLM head's predicted positions, data::MlmBatch's
// positions_unique): the backward then adds each gradient row into its row in one pass (no sort
// of the index, no levels); a CPU index is checked and a repeat is an error naming it, a device
// index is the caller's word (a repeated value there would race).
Tensor index_select(const Tensor& x, const Tensor& index, bool unique = false);

// weight (V, D) and i32/i64 ids of any shape -> (*ids.shape, D). Same kernels as index_select.
// `inverted` (optional): sorted_index_keys(ids, V) made once for ids that do not change (the
// relative position maps: cached with the model's position constants), so the backward does not
// invert the index again on every call.
Tensor embedding(const Tensor& weight, const Tensor& ids, const Tensor& inverted = Tensor());

// The inverted index of an i32 / i64 index (any shape, M elements, values in [0, rows)), on its
// device: the M keys (id << 32) | position in increasing order, as an i64 (M) tensor, i.e. the
// positions of every row's ids, rows in order and each row's positions in order. What the
// device scatter of the backward works from (a GPU sums each row's gradient from its run of
// keys instead of scanning the whole index); M < 2^32 and rows < 2^31.
Tensor sorted_index_keys(const Tensor& index, int64_t rows);

// ---- kernels (one table per launch; backends register implementations) ----------------------

// out (M, D) = table (N, D) rows at index (M). All contiguous; any dtype (a row copy). Every
// index is in [0, N): the op checks CPU indices on the host before launching; a device kernel
// must still never read out of bounds (trap rather than read).
inline Kernel<void(const Tensor& table, const Tensor& index, const Tensor& out)> gather_rows_kernel{
    "gather_rows"};
// grad_table (N, D) += grad_out (M, D) row i into row index[i]; repeats accumulate. All
// contiguous, floating, one dtype; on a device grad_out may also be bf16 / f16 with an f32
// grad_table (a 16-bit table's gradient added into its f32 leaf's .grad: the same sums as of the
// widened rows; the CPU never gets such a pair). Deterministic (the same bits on every run).
// `inverted`: the index's sorted_index_keys when the caller has them, else undefined (a backend
// that needs them makes them). The CPU forms each element's sum in index order and ignores
// `inverted`; the GPU sums each row's run of keys in pieces and the pieces in order (docs/cuda.md).
inline Kernel<void(const Tensor& grad_out, const Tensor& index, const Tensor& inverted,
                   const Tensor& grad_table)>
    scatter_add_rows_kernel{"scatter_add_rows"};
// grad_table (N, D) += grad_out (M, D) row i into row index[i], index's values distinct (one
// add an element: the same bits as scatter_add_rows). All contiguous, floating.
inline Kernel<void(const Tensor& grad_out, const Tensor& index, const Tensor& grad_table)>
    add_rows_kernel{"add_rows"};
// keys (M) i64 = sorted_index_keys(index, rows); index contiguous. A device kernel must not
// produce keys from an out-of-range id (trap rather than sort it).
inline Kernel<void(const Tensor& index, int64_t rows, const Tensor& keys)> sort_index_keys_kernel{
    "sort_index_keys"};

}  // namespace engine
