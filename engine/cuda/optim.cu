// The CUDA kernel of the AdamW step (engine/optim.h): one fused elementwise pass over the flat
// parameter slab in 16-byte vectors (param, grad, exp_avg, exp_avg_sq f32 and the u8 decay mask: 17
// bytes read and 12 written per element, nothing else; with device controls, AdamW::step_on_device,
// one single-thread kernel resolves them first). Every f32 operation rounds on its own in
// the CPU kernel's (PyTorch's) order: products go through mul_rn, which nvcc never contracts into
// an FMA, and sqrt and division are IEEE-rounded (nvcc's defaults, -prec-sqrt / -prec-div), so CPU
// and CUDA steps give the same bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/optim.h"

namespace engine::cuda {
namespace {

struct AdamWFloats {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size,
      grad_scale;
};

// One element: every operation rounded on its own (see the top of the file).
__device__ inline void adamw_one(float& p, float g, float& m, float& v, uint8_t decay,
                                 const AdamWFloats& s) {
  g = dmath::mul_rn(g, s.grad_scale);  // clipping's coefficient; exact when 1
  const float pi = dmath::mul_rn(p, decay != 0 ? s.decay : 1.0f);
  const float mi = dmath::mul_rn(m, s.beta1) + dmath::mul_rn(s.one_minus_beta1, g);
  const float vi =
      dmath::mul_rn(v, s.beta2) + dmath::mul_rn(dmath::mul_rn(s.one_minus_beta2, g), g);
  const float denom = dmath::sqrt(vi) / s.bc2_sqrt + s.eps;
  m = mi;
  v = vi;
  p = pi + dmath::mul_rn(s.neg_step_size, mi) / denom;
}

// Four elements a thread: 16-byte loads and stores of p, g, m, v and 4 bytes of the mask (the
// slabs are aligned); the n % 4 tail one element a thread.
// The device controls of AdamW::step_on_device, resolved once by one thread (not by each of the
// step's threads: double sqrt and division, and a read of mapped host memory): the step's scalars
// rounded to f32 as the host rounds them, or skip. A bad index recorded by the step's kernels
// (device_error.cuh, raised at the step's one read, after AdamW) skips it too: a step that met
// one applies no update.
struct AdamWResolved {
  AdamWFloats s;
  int32_t skip;
};

__global__ void adamw_resolve(const double* controls, double clip_norm, AdamWFloats s,
                              const volatile DeviceIndexError* bad_index, AdamWResolved* out) {
  double decay, step_size, bc2_sqrt, grad_scale;
  const bool apply =
      bad_index->check == 0 &&
      resolve_adamw_controls(controls, clip_norm, decay, step_size, bc2_sqrt, grad_scale);
  if (apply) {
    s.decay = static_cast<float>(decay);
    s.neg_step_size = static_cast<float>(-step_size);
    s.bc2_sqrt = static_cast<float>(bc2_sqrt);
    s.grad_scale = static_cast<float>(grad_scale);
  }
  out->s = s;
  out->skip = apply ? 0 : 1;
}

// `resolved` (AdamW::step_on_device): the scalars adamw_resolve wrote; the whole grid returns
// when the step is skipped.
__global__ void adamw_vec4(float* p, const float* g, float* m, float* v, const uint8_t* mask,
                           int64_t n, AdamWFloats s, const AdamWResolved* resolved) {
  if (resolved != nullptr) {
    if (resolved->skip != 0) return;
    s = resolved->s;
  }
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < n / 4; i += stride) {
    Vec<float, 4> pv = reinterpret_cast<Vec<float, 4>*>(p)[i];
    const Vec<float, 4> gv = reinterpret_cast<const Vec<float, 4>*>(g)[i];
    Vec<float, 4> mv = reinterpret_cast<Vec<float, 4>*>(m)[i];
    Vec<float, 4> vv = reinterpret_cast<Vec<float, 4>*>(v)[i];
    const Vec<uint8_t, 4> dv = reinterpret_cast<const Vec<uint8_t, 4>*>(mask)[i];
#pragma unroll
    for (int j = 0; j < 4; ++j) adamw_one(pv.v[j], gv.v[j], mv.v[j], vv.v[j], dv.v[j], s);
    reinterpret_cast<Vec<float, 4>*>(p)[i] = pv;
    reinterpret_cast<Vec<float, 4>*>(m)[i] = mv;
    reinterpret_cast<Vec<float, 4>*>(v)[i] = vv;
  }
  if (first < n % 4) {
    const int64_t i = n / 4 * 4 + first;
    adamw_one(p[i], g[i], m[i], v[i], mask[i], s);
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
      static_cast<float>(s.eps),          static_cast<float>(-s.step_size),
      static_cast<float>(s.grad_scale)};
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq, &decay_mask})
    ENGINE_CHECK(reinterpret_cast<uintptr_t>(t->raw_data()) % 16 == 0,
                 "[adamw] the CUDA kernel needs 16-byte aligned slabs, got ", describe(*t));
  const int threads = kElementwiseThreads;
  const int index = param.device().index;
  cudaStream_t stream = compute_stream(index);
  Tensor resolved;  // the device controls' scalars (AdamW::step_on_device)
  if (s.controls.defined()) {
    resolved = Tensor::empty(Shape{int64_t(sizeof(AdamWResolved))}, DType::u8, param.device());
    ENGINE_LAUNCH(adamw_resolve, (LaunchConfig{dim3(1), dim3(1), 0, stream}),
                  dptr<const double>(s.controls), s.clip_norm, f,
                  static_cast<const volatile DeviceIndexError*>(device_index_error(index)),
                  static_cast<AdamWResolved*>(resolved.raw_data()));
  }
  const LaunchConfig cfg{dim3(grid_blocks(n / 4 > 0 ? n / 4 : 1, threads)), dim3(threads), 0,
                         stream};
  ENGINE_LAUNCH(
      adamw_vec4, cfg, dptr<float>(param), dptr<const float>(grad), dptr<float>(exp_avg),
      dptr<float>(exp_avg_sq), dptr<const uint8_t>(decay_mask), n, f,
      resolved.defined() ? static_cast<const AdamWResolved*>(resolved.raw_data()) : nullptr);
}

}  // namespace

ENGINE_REGISTER_KERNEL(adamw_kernel, DeviceType::CUDA, adamw);

}  // namespace engine::cuda
