// The building blocks of an attention bias every sequence of a batch shares, (C, T, T) with C the
// heads: a per-bucket table looked up through a constant index map with the channels first (T5's
// relative bias, models/position/t5.cpp), TUPE's [CLS] reset, and TUPE's whole untied term from
// its product (scale, reset and the other terms' sum in one pass; models/position/untied.cpp).
// Each is one pass over the bias each way, where the compositions they replace were an embedding
// lookup into (T, T, C) rows, a permuted copy, a sort-keyed scatter, and three broadcast
// products with 0/1 masks and two sums.
#pragma once

#include "engine/kernel.h"
#include "engine/tensor.h"
#include "engine/work_log.h"

namespace engine {

// table (R, C) floating and index (...) of i64 in [0, R) on table's device -> (C, ...index's
// shape), table's dtype, contiguous, with
//   out[c, p] = table[index[p], c]          (p the flat position in index).
// The gradient of table: dtable[r, c] = the sum of dout[c, p] over the p with index[p] == r
// (0 where none does), in f32 (f64 for f64), in a fixed order: the same bits on every run of a
// backend (the CPU adds in p order, the CUDA backend in pieces of p order; they agree to
// rounding). An index value outside [0, R) is an error naming it and its position.
Tensor bucket_lookup(const Tensor& table, const Tensor& index);

// v (C, T, U) floating with T, U >= 1, and row, col (C) of v's dtype on v's device -> (C, T, U)
// contiguous, v with its first row replaced by row[c] and the rest of its first column by col[c]:
//   out[c, 0, j] = row[c],  out[c, i, 0] = col[c] (i >= 1),  out[c, i, j] = v[c, i, j] elsewhere.
// Gradients: dv = dout with that row and column zeroed, drow[c] = sum_j dout[c, 0, j],
// dcol[c] = sum_{i >= 1} dout[c, i, 0] (in f32 for 16-bit dtypes, fixed order). v may be
// non-contiguous.
Tensor cls_reset(const Tensor& v, const Tensor& row, const Tensor& col);

// TUPE's untied positional bias from its product, one pass each way (models/position/untied.cpp):
// product P floating, (C, T + 2, T + 2) with the [CLS] reset (rows and columns T and T + 1 are
// the reset's two vectors: theta1 = s P[c, T, T], theta2 = s P[c, T + 1, T + 1]) or (C, T, T)
// without; add (C, T, T) floating or undefined, on P's device -> (C, T, T) contiguous in the
// promoted dtype of P and add (f32 for 16-bit ones with at_least_f32), computed in f32 (f64 for
// f64) and rounded once, s = scale:
//   out[c, i, j] = s P[c, i, j] + add[c, i, j]
//   reset: out[c, 0, j] = theta1[c] and out[c, i, 0] = theta2[c] (i >= 1), plus add there only
//          when add_at_reset (TUPE-R's cls_reset: code resets the term, then adds the relative
//          bias; paper resets the sum).
// Gradients: dP = s dout off the reset, s times the sum of dout's first row at (T, T) and of the
// rest of its first column at (T + 1, T + 1) (cls_reset's sums), 0 elsewhere; dadd = dout, zeroed
// at the reset unless add_at_reset. P and add may be non-contiguous.
struct UntiedBiasOptions {
  double scale = 1;
  bool reset = false;
  bool add_at_reset = false;
  // The term in f32 at least (a 16-bit P read into an f32 term): what the fused attention reads
  // and sums the gradient of across layers without a cast a layer (models/position/untied.cpp).
  bool at_least_f32 = false;
};
Tensor untied_bias(const Tensor& product, const Tensor& add, const UntiedBiasOptions& options);

// ---- kernels (one table each; backends register implementations) ----------------------------
// Every tensor contiguous; index flattened to (N), the bias viewed as (C, N).

// out (C, N) = table (R, C) at index (N). A device kernel reports an index value outside [0, R)
// (raised at the next host read) and writes 0 there; the CPU raises before writing.
inline Kernel<void(const Tensor& table, const Tensor& index, const Tensor& out)>
    bucket_lookup_kernel{"bucket_lookup"};
// dtable (R, C), fully overwritten, = the sums of grad (C, N) per bucket of index (N).
inline Kernel<void(const Tensor& grad, const Tensor& index, const Tensor& dtable)>
    bucket_lookup_backward_kernel{"bucket_lookup_backward"};

// out (C, T, U) = v with the first row row[c] and the rest of the first column col[c]; row and
// col undefined: zeros there (the backward's dv).
inline Kernel<void(const Tensor& v, const Tensor& row, const Tensor& col, const Tensor& out)>
    cls_reset_kernel{"cls_reset"};
// drow (C) = the sums of grad's first rows, dcol (C) = of the rest of its first columns; either
// may be undefined (not wanted).
inline Kernel<void(const Tensor& grad, const Tensor& drow, const Tensor& dcol)>
    cls_reset_sums_kernel{"cls_reset_sums"};

// untied_bias: P (C, T + k, T + k) and add (C, T, T, or undefined) of out's dtype or, for P, a
// 16-bit dtype when out is f32; out (C, T, T). k = 2 with options.reset, else 0.
struct UntiedBiasForward {
  Tensor product, add, out;
  UntiedBiasOptions options;
};
inline Kernel<void(const UntiedBiasForward&)> untied_bias_kernel{"untied_bias"};
// grad (C, T, T); dproduct (C, T + k, T + k) of P's dtype, every element written; dadd (C, T, T)
// of grad's dtype or undefined (not wanted); with the reset, row_sums / col_sums (C) of grad's
// dtype: cls_reset_sums of grad (read for dP's two diagonal entries).
struct UntiedBiasBackward {
  Tensor grad, dproduct, dadd, row_sums, col_sums;
  UntiedBiasOptions options;
};
inline Kernel<void(const UntiedBiasBackward&)> untied_bias_backward_kernel{"untied_bias_backward"};
// The performance model's cost of a launch (engine/work_log.h): each defined tensor once.
void add_work_cost(WorkCost& cost, const UntiedBiasForward& a);
void add_work_cost(WorkCost& cost, const UntiedBiasBackward& a);

}  // namespace engine
