// Ops over a gradient slab for the training step (train/trainer.h): unscaling with the
// non-finite check and the squared norm in one pass, and in-place scaling (clipping). They run on
// the gradients' device and leave their results there: deciding to skip a step or how much to
// clip needs one small read of the (2) statistics, never a copy of the gradients.
#pragma once

#include "engine/kernel.h"
#include "engine/tensor.h"

namespace engine {

// Multiplies the contiguous floating tensor `grad` in place by `inv_scale` (skipped when it is 1;
// the factor is rounded to grad's dtype first, then each element is multiplied once) and returns
// a (2) f64 tensor on grad's device: [sum of the squares of the (unscaled) elements, number of
// non-finite elements]. The sum is accumulated in double over fixed chunks of 2^15 elements
// added in order, so it does not depend on the thread count (a resumed run clips identically).
// Not recorded by autograd.
Tensor unscale_and_check_(const Tensor& grad, double inv_scale = 1.0);

// The same with the factor read on the device, where the kernel runs, from `inv_scale` (a (1) f64
// tensor on grad's device: a graph-captured step sets it before each replay, train/trainer.h), and
// the statistics written into `stats` ((2) f64, contiguous, on grad's device). The factor is not
// checked on the host: it must be finite and > 0; unscaling is skipped when it is 1, as above.
void unscale_and_check_(const Tensor& grad, const Tensor& inv_scale, const Tensor& stats);

// grad *= factor in place (contiguous floating; the factor rounded to grad's dtype, as
// torch.nn.utils.clip_grad_norm_ multiplies by its coefficient). Not recorded by autograd.
void scale_(const Tensor& grad, double factor);

// ---- kernels (one table per launch; backends register implementations) ----------------------
// stats (2) f64 contiguous on x's device; x contiguous floating, scaled in place first when the
// factor != 1. The factor is inv_scale_device[0] (f64 on x's device) when that is defined, else
// inv_scale.
inline Kernel<void(const Tensor& x, double inv_scale, const Tensor& inv_scale_device,
                   const Tensor& stats)>
    unscale_check_kernel{"unscale_and_check_"};
inline Kernel<void(const Tensor& x, double factor)> scale_kernel{"scale_"};

}  // namespace engine
