// Relative-position gather and scatter for Shaw-style relative position encodings. With q
// (B, H, T, D) and R relative vectors A (R, D), the logit term q_i . a_{c(j-i)} is
// relative_gather(matmul(q, A^T), index) and the value term sum_j p_ij a_{c(j-i)} is
// matmul(relative_scatter(p, index, R), A): both work on (T, R) rows instead of materialising
// a (T, T, D) tensor of relative vectors. The two ops are adjoint, so each one's backward is the
// other's kernel.
#pragma once

#include <cstdint>

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

// The inverse of an index (Tq, Tk) of i64 in [0, R) that relative_scatter's device kernel reads:
// per query row, the keys j naming each bucket in increasing j (a CSR), as one i32 tensor of
// Tq (R + 1) offsets then Tq Tk keys, on index's device. An index that never changes (the Shaw
// component's, cached with it: models/position/shaw.cpp) is inverted once and its inverse passed
// to the ops below; without one, every device scatter (the gather's backward included) inverts
// the index again, one thread per query row walking its keys.
Tensor relative_index_inverse(const Tensor& index, int64_t num_buckets);

// Shaw's index: the (Tq, Tk) i64 map of key j's bucket for query i, clamp(j - i, -clip, clip) +
// clip (R = 2 clip + 1 buckets), built on the host and placed on `device`.
Tensor relative_clip_index(int64_t tq, int64_t tk, int64_t clip, Device device);

// x (..., Tq, R) and index (Tq, Tk) of i64 in [0, R) -> (..., Tq, Tk) with
//   out[..., i, j] = x[..., i, index[i, j]].
// Any number of leading dims (0 included); x may be non-contiguous. `inverse`, if given, is
// relative_index_inverse(index, R), for the backward's scatter.
Tensor relative_gather(const Tensor& x, const Tensor& index, const Tensor& inverse = Tensor());

// y (..., Tq, Tk) and index (Tq, Tk) of i64 in [0, num_buckets) -> (..., Tq, num_buckets) with
//   out[..., i, r] = sum_j y[..., i, j] * (index[i, j] == r)
// (buckets no index names are 0). Any number of leading dims; y may be non-contiguous.
// `inverse`, if given, is relative_index_inverse(index, num_buckets).
Tensor relative_scatter(const Tensor& y, const Tensor& index, int64_t num_buckets,
                        const Tensor& inverse = Tensor());

// ---- kernels (one table per launch; backends register implementations) ----------------------
// All tensors contiguous and 3-D, the leading dims flattened into L (L = 1 when there are none);
// index (Tq, Tk) i64 on the same device. Every index value must be in [0, R): a kernel checks
// this itself (the CPU one raises "[relative_gather] ..." / "[relative_scatter] ..." naming the
// value and its position before touching out; a device kernel must trap rather than read or
// write out of bounds), since the ops do not read device memory on the host.

// out (L, Tq, Tk) = x (L, Tq, R) at index. A pure copy: any floating dtype.
inline Kernel<void(const Tensor& x, const Tensor& index, const Tensor& out)> relative_gather_kernel{
    "relative_gather"};
// out (L, Tq, R) = y (L, Tq, Tk) summed into buckets; out is preallocated and fully overwritten.
// Sums are accumulated in f32 (f64 for f64 tensors), never in bf16/f16, and formed in j order,
// so results do not depend on the thread count.
// inverse: relative_index_inverse's for (index, R), or undefined (a device kernel inverts the
// index itself; the CPU's needs none).
inline Kernel<void(const Tensor& y, const Tensor& index, const Tensor& inverse, const Tensor& out)>
    relative_scatter_kernel{"relative_scatter"};
// inverse (Tq (R + 1) + Tq Tk) i32, fully written: index's CSR per row (relative_index_inverse).
// An index value outside [0, R) is an error (the CPU) or reported (a device) and left out.
inline Kernel<void(const Tensor& index, int64_t num_buckets, const Tensor& inverse)>
    relative_invert_kernel{"relative_invert"};

}  // namespace engine
