// Layer normalisation over the last dim, with an optional elementwise affine (weight, bias).
#pragma once

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

// y = (x - mean) * rstd * weight + bias, mean and rstd = 1 / sqrt(var + eps) per row of the last
// dim (biased variance, as in the usual definition). x: floating (..., C); weight, bias: (C) of
// x's dtype, either may be undefined (no scale / no shift).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-12);

// dtype of the per-row mean and rstd saved for the backward: f64 for f64 input, else f32 (half
// inputs on CUDA keep f32 statistics).
DType layer_norm_stats_dtype(DType x);

// ---- kernels (one table per launch; backends register implementations) ----------------------
// x, y: contiguous (..., C), same floating dtype; weight, bias: contiguous (C) or undefined;
// mean, rstd: contiguous (R) with R = numel / C, dtype layer_norm_stats_dtype(x.dtype()).
inline Kernel<void(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                   const Tensor& y, const Tensor& mean, const Tensor& rstd)>
    layer_norm_forward_kernel{"layer_norm"};
// From x, weight (undefined = 1), the saved mean/rstd and dy (contiguous, x's shape), writes each
// of dx (x's shape), dweight (C) and dbias (C) that is defined; undefined outputs are skipped.
// dweight and dbias are reduced over rows in a fixed order, independent of the thread count.
// For a bf16 / f16 x, dweight and dbias may be f32 (the f32 .grads behind autocast's casts of the
// parameters): the sums are added into them in f32 (devices; the CPU kernels compute in f32).
// dx must not alias x or dy (it is used as scratch for dy * weight).
inline Kernel<void(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dy, const Tensor& dx, const Tensor& dweight, const Tensor& dbias)>
    layer_norm_backward_kernel{"layer_norm_backward"};

}  // namespace engine
