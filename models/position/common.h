// Helpers the positional families share: sinusoids, position ranges, the per-head view, and the
// poscorr matrices of absolute position vectors.
#pragma once

#include <cstdint>
#include <vector>

#include "models/position/component.h"

namespace models::position {

// (N, 2K) rows [sin(w_0 x), cos(w_0 x), sin(w_1 x), ...] for positions x (N) and frequencies
// w (K); differentiable in w. Always f32, also under mixed precision.
Tensor sinusoid(const Tensor& positions, const Tensor& freqs);
// w_k = 10000^(-2k / width), k < width / 2 (CPU f32).
Tensor sinusoid_freqs(int64_t width);
// start, start + 1, ..., end - 1 as f32 on `device`.
Tensor range_f32(int64_t start, int64_t end, engine::Device device);
// (n, H d_h) rows -> (H, n, d_h), a view.
Tensor heads_of(const Tensor& x, int64_t heads);
// A contiguous CPU copy (poscorr's matrices).
Tensor cpu_f32(const Tensor& x);
// The poscorr matrix P P^T of absolute position vectors (T, e): "ape_dot".
CorrelationMatrix ape_dot(const Tensor& positions, const CorrelationContext& ctx);

}  // namespace models::position
