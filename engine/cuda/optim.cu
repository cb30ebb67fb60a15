// The CUDA kernel of the AdamW step (engine/optim.h): one fused elementwise pass over the flat
// parameter slab (param, grad, exp_avg, exp_avg_sq f32 and the u8 decay mask: 17 bytes read and
// 12 written per element, nothing else). Every f32 operation rounds on its own in the CPU
// kernel's (PyTorch's) order: products go through mul_rn, which nvcc never contracts into an FMA,
// and sqrt and division are IEEE-rounded (nvcc's defaults, -prec-sqrt / -prec-div), so CPU and
// CUDA steps give the same bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/optim.h"

namespace engine::cuda {
namespace {

struct AdamWFloats {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size;
};

__global__ void adamw_elems(float* p, const float* g, float* m, float* v, const uint8_t* mask,
                            int64_t n, AdamWFloats s) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float gi = g[i];
    const float pi = dmath::mul_rn(p[i], mask[i] != 0 ? s.decay : 1.0f);
    const float mi = dmath::mul_rn(m[i], s.beta1) + dmath::mul_rn(s.one_minus_beta1, gi);
    const float vi =
        dmath::mul_rn(v[i], s.beta2) + dmath::mul_rn(dmath::mul_rn(s.one_minus_beta2, gi), gi);
    const float denom = dmath::sqrt(vi) / s.bc2_sqrt + s.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + dmath::mul_rn(s.neg_step_size, mi) / denom;
  }
}

void adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
           const Tensor& decay_mask, const AdamWStepScalars& s) {
  const int64_t n = param.numel();
  if (n == 0) return;
  DeviceGuard guard(param.device().index);
  // The scalars rounded to f32 on the host exactly as the CPU kernel rounds them.
  const AdamWFloats f{
      static_cast<float>(s.decay_factor), static_cast<float>(s.beta1),
      static_cast<float>(1.0 - s.beta1),  static_cast<float>(s.beta2),
      static_cast<float>(1.0 - s.beta2),  static_cast<float>(s.bias_correction2_sqrt),
      static_cast<float>(s.eps),          static_cast<float>(-s.step_size)};
  const int threads = kElementwiseThreads;
  const LaunchConfig cfg{dim3(grid_blocks(n, threads)), dim3(threads), 0,
                         compute_stream(param.device().index)};
  ENGINE_LAUNCH(adamw_elems, cfg, dptr<float>(param), dptr<const float>(grad), dptr<float>(exp_avg),
                dptr<float>(exp_avg_sq), dptr<const uint8_t>(decay_mask), n, f);
}

}  // namespace

ENGINE_REGISTER_KERNEL(adamw_kernel, DeviceType::CUDA, adamw);

}  // namespace engine::cuda
