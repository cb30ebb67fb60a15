// Rotary position embedding (RoFormer, Su et al. 2021): each pair of dimensions (2i, 2i+1) of a
// query or key row at position t is rotated by the angle theta_{t,i}:
//   out[2i]   = x[2i] cos theta - x[2i+1] sin theta
//   out[2i+1] = x[2i] sin theta + x[2i+1] cos theta
// The backward is the rotation by -theta. The angles come as their cosines and sines (constants,
// no gradient): models/position/rope.cpp builds theta_{t,i} = t * 10000^(-2i / d_h).
#pragma once

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

// x (..., T, D), D even, any floating dtype; cos, sin (T, D / 2) f32 on x's device. Returns a
// contiguous (..., T, D) tensor of x's dtype; the rotation is computed in f32 (f64 for f64 x).
// x may be non-contiguous.
Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin);

// ---- kernel (one table; backends register implementations) ----------------------------------
// x (A, B, T, D) with its last dim contiguous and any strides on the others (the layers' q and k
// are (B, H, T, d_h) views of the fused projection, read in place), with every stride even and
// its data pair-aligned; out contiguous (A, B, T, D); cos / sin contiguous (T, D / 2) f32;
// `inverse` rotates by -theta (the backward). out is fully overwritten.
inline Kernel<void(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out,
                   bool inverse)>
    rotary_kernel{"rotary"};

}  // namespace engine
