// The CUDA kernels of the AdamW step (engine/optim.h; LAMB's at the end): one fused elementwise
// pass over the flat parameter slab in 16-byte vectors (param, grad, exp_avg, exp_avg_sq f32 and
// the decay bits, a bit an element: 16 bytes and a bit read and 12 written per element (and the
// 16-bit copy's 2), nothing else; with device controls,
// AdamW::step_on_device, one single-thread kernel resolves them first). Every f32 operation rounds
// on its own in the CPU kernel's (PyTorch's) order: products go through mul_rn, which nvcc never
// contracts into an FMA, and sqrt and division are IEEE-rounded (nvcc's defaults, -prec-sqrt /
// -prec-div), so CPU and CUDA steps give the same bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/optim.h"

namespace engine::cuda {
namespace {

// Both optimizers' kernels read the slabs in 16-byte vectors.
void require_aligned_slabs(const char* op, std::initializer_list<const Tensor*> slabs) {
  for (const Tensor* t : slabs)
    ENGINE_CHECK(!t->defined() || reinterpret_cast<uintptr_t>(t->raw_data()) % 16 == 0, "[", op,
                 "] the CUDA kernels need 16-byte aligned slabs, got ", describe(*t));
}

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

// Four elements a thread: 16-byte loads and stores of p, g, m, v and their 4 decay bits (half a
// byte; the slabs are aligned); the n % 4 tail one element a thread.
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

// Both optimizers' copy of 4 updated elements (vector i of 4): one 8-byte store.
template <class H>
__device__ inline void store_copy4(H* copy, int64_t i, const Vec<float, 4>& pv) {
  Vec<H, 4> hv;
#pragma unroll
  for (int j = 0; j < 4; ++j) hv.v[j] = from_acc<H>(pv.v[j]);
  reinterpret_cast<Vec<H, 4>*>(copy)[i] = hv;
}

// `resolved` (AdamW::step_on_device): the scalars adamw_resolve wrote; the whole grid returns
// when the step is skipped. `copy` (null: none): the updated parameters converted to H, 8 bytes
// stored per 4 elements (AdamWStepScalars::copy).
template <class H>
__global__ void adamw_vec4(float* p, const float* g, float* m, float* v, const uint8_t* bits,
                           int64_t n, AdamWFloats s, const AdamWResolved* resolved, H* copy) {
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
    const unsigned d4 = decay_bits4(bits, 4 * i);
#pragma unroll
    for (int j = 0; j < 4; ++j) adamw_one(pv.v[j], gv.v[j], mv.v[j], vv.v[j], (d4 >> j) & 1u, s);
    reinterpret_cast<Vec<float, 4>*>(p)[i] = pv;
    reinterpret_cast<Vec<float, 4>*>(m)[i] = mv;
    reinterpret_cast<Vec<float, 4>*>(v)[i] = vv;
    if (copy != nullptr) store_copy4(copy, i, pv);
  }
  if (first < n % 4) {
    const int64_t i = n / 4 * 4 + first;
    adamw_one(p[i], g[i], m[i], v[i], decay_bit(bits, i), s);
    if (copy != nullptr) copy[i] = from_acc<H>(p[i]);
  }
}

// The copy's element type on the device (bf16 when there is none: the pointer is then null) and
// the launch with it.
template <class F>
void with_copy_type(const Tensor& copy, const char* op, F&& f) {
  if (!copy.defined()) return f.template operator()<__nv_bfloat16>();
  dispatch_device_float(copy.dtype(), op, [&]<class H>() {
    if constexpr (std::is_same_v<H, float>)
      ENGINE_FAIL("[", op, "] the parameters' copy must be bf16 or f16, got ", describe(copy));
    else
      f.template operator()<H>();
  });
}

template <class H>
H* copy_ptr(const Tensor& copy) {
  return copy.defined() ? static_cast<H*>(copy.raw_data()) : nullptr;
}

void adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
           const Tensor& decay_bits, const AdamWStepScalars& s) {
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
  require_aligned_slabs("adamw", {&param, &grad, &exp_avg, &exp_avg_sq, &decay_bits, &s.copy});
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
  const AdamWResolved* r =
      resolved.defined() ? static_cast<const AdamWResolved*>(resolved.raw_data()) : nullptr;
  with_copy_type(s.copy, "adamw", [&]<class H>() {
    ENGINE_LAUNCH(adamw_vec4<H>, cfg, dptr<float>(param), dptr<const float>(grad),
                  dptr<float>(exp_avg), dptr<float>(exp_avg_sq), dptr<const uint8_t>(decay_bits), n,
                  f, r, copy_ptr<H>(s.copy));
  });
}

// ---- LAMB -------------------------------------------------------------------------------------
// Three launches (engine/optim.h): lamb_moments (a block per chunk of kLambChunk elements: the
// moments, and the chunk's sums of p^2 and u^2), lamb_ratios (a block per tensor: its chunks'
// sums, the trust ratio, -(lr x ratio)), lamb_apply (a block per chunk: the update). A chunk is
// 1,024 16-byte vectors, 4 per thread of 256: coalesced, and BERT-Base's slab makes ~27,000 blocks.
// The sums are f64 with products rounded on their own (mul_rn) in block_sum's order, the order
// the CPU kernel follows, so both give the same bits.

struct LambFloats {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bc1, bc2, eps, wd, grad_scale;
};

struct LambResolved {
  LambFloats f;
  double lr;
  int32_t skip;
};

static_assert(kLambLanes == 256 && kLambChunk == 4 * 4 * kLambLanes,
              "a chunk is 4 vectors of 4 elements per thread");

__device__ inline float lamb_adam(float m, float v, const LambFloats& f) {
  return (m / f.bc1) / (dmath::sqrt(v / f.bc2) + f.eps);
}

// One element: its moments updated in place; returns u.
__device__ inline float lamb_one(float p, float g, float& m, float& v, uint8_t decay,
                                 const LambFloats& f) {
  g = dmath::mul_rn(g, f.grad_scale);
  m = dmath::mul_rn(m, f.beta1) + dmath::mul_rn(f.one_minus_beta1, g);
  v = dmath::mul_rn(v, f.beta2) + dmath::mul_rn(dmath::mul_rn(f.one_minus_beta2, g), g);
  const float adam = lamb_adam(m, v, f);
  return decay != 0 ? adam + dmath::mul_rn(f.wd, p) : adam;
}

__device__ inline float lamb_stored(float p, float m, float v, uint8_t decay, const LambFloats& f) {
  const float adam = lamb_adam(m, v, f);
  return decay != 0 ? adam + dmath::mul_rn(f.wd, p) : adam;
}

__global__ void lamb_resolve(const double* controls, double clip_norm, LambFloats f,
                             const volatile DeviceIndexError* bad_index, LambResolved* out) {
  double lr = 0, bc1 = 1, bc2 = 1, grad_scale = 1;
  const bool apply = bad_index->check == 0 &&
                     resolve_adamw_controls(controls, clip_norm, lr, bc1, bc2, grad_scale);
  if (apply) {
    f.bc1 = static_cast<float>(bc1);
    f.bc2 = static_cast<float>(bc2);
    f.grad_scale = static_cast<float>(grad_scale);
  }
  out->f = f;
  out->lr = lr;
  out->skip = apply ? 0 : 1;
}

__global__ void lamb_moments(const float* p, const float* g, float* m, float* v,
                             const uint8_t* bits, const int64_t* chunks, double* partials,
                             LambFloats f, const LambResolved* resolved) {
  if (resolved != nullptr) {
    if (resolved->skip != 0) return;
    f = resolved->f;
  }
  const int64_t c = blockIdx.x;
  const int64_t start = chunks[3 * c], len = chunks[3 * c + 1];
  double a = 0, b = 0;
  auto add = [&](float pf, float uf) {
    const double pd = pf, ud = uf;
    a = a + dmath::mul_rn(pd, pd);
    b = b + dmath::mul_rn(ud, ud);
  };
  for (int k = 0; k < 4; ++k) {
    const int64_t e = 4 * (threadIdx.x + int64_t(kLambLanes) * k);  // within the chunk
    if (e >= len) break;
    const int64_t i = start + e;
    if (e + 4 <= len) {  // a whole 16-byte vector (chunks start 16-byte aligned)
      const Vec<float, 4> pv = *reinterpret_cast<const Vec<float, 4>*>(p + i);
      const Vec<float, 4> gv = *reinterpret_cast<const Vec<float, 4>*>(g + i);
      Vec<float, 4> mv = *reinterpret_cast<Vec<float, 4>*>(m + i);
      Vec<float, 4> vv = *reinterpret_cast<Vec<float, 4>*>(v + i);
      const unsigned d4 = decay_bits4(bits, i);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        add(pv.v[j], lamb_one(pv.v[j], gv.v[j], mv.v[j], vv.v[j], (d4 >> j) & 1u, f));
      *reinterpret_cast<Vec<float, 4>*>(m + i) = mv;
      *reinterpret_cast<Vec<float, 4>*>(v + i) = vv;
    } else {  // the chunk's last, partial vector
      for (int64_t j = 0; e + j < len; ++j)
        add(p[i + j], lamb_one(p[i + j], g[i + j], m[i + j], v[i + j], decay_bit(bits, i + j), f));
    }
  }
  a = block_sum(a);
  b = block_sum(b);
  if (threadIdx.x == 0) {
    partials[2 * c] = a;
    partials[2 * c + 1] = b;
  }
}

__global__ void lamb_ratios(const int64_t* first, const uint8_t* trust, const double* partials,
                            float* step_scales, double lr, const LambResolved* resolved) {
  if (resolved != nullptr) {
    if (resolved->skip != 0) return;
    lr = resolved->lr;
  }
  const int64_t k = blockIdx.x;
  double a = 0, b = 0;
  for (int64_t c = first[k] + threadIdx.x; c < first[k + 1]; c += kLambLanes) {
    a = a + partials[2 * c];
    b = b + partials[2 * c + 1];
  }
  a = block_sum(a);
  b = block_sum(b);
  if (threadIdx.x == 0)
    step_scales[k] = static_cast<float>(-(lr * lamb_trust_ratio(a, b, trust[k] != 0)));
}

template <class H>
__global__ void lamb_apply(float* p, const float* m, const float* v, const uint8_t* bits,
                           const int64_t* chunks, const float* step_scales, LambFloats f,
                           const LambResolved* resolved, H* copy) {
  if (resolved != nullptr) {
    if (resolved->skip != 0) return;
    f = resolved->f;
  }
  const int64_t c = blockIdx.x;
  const int64_t start = chunks[3 * c], len = chunks[3 * c + 1];
  const float scale = step_scales[chunks[3 * c + 2]];
  for (int k = 0; k < 4; ++k) {
    const int64_t e = 4 * (threadIdx.x + int64_t(kLambLanes) * k);
    if (e >= len) break;
    const int64_t i = start + e;
    if (e + 4 <= len) {
      Vec<float, 4> pv = *reinterpret_cast<Vec<float, 4>*>(p + i);
      const Vec<float, 4> mv = *reinterpret_cast<const Vec<float, 4>*>(m + i);
      const Vec<float, 4> vv = *reinterpret_cast<const Vec<float, 4>*>(v + i);
      const unsigned d4 = decay_bits4(bits, i);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        pv.v[j] = pv.v[j] +
                  dmath::mul_rn(scale, lamb_stored(pv.v[j], mv.v[j], vv.v[j], (d4 >> j) & 1u, f));
      *reinterpret_cast<Vec<float, 4>*>(p + i) = pv;
      if (copy != nullptr) store_copy4(copy, i / 4, pv);
    } else {
      for (int64_t j = 0; e + j < len; ++j) {
        p[i + j] = p[i + j] + dmath::mul_rn(scale, lamb_stored(p[i + j], m[i + j], v[i + j],
                                                               decay_bit(bits, i + j), f));
        if (copy != nullptr) copy[i + j] = from_acc<H>(p[i + j]);
      }
    }
  }
}

void lamb(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
          const Tensor& decay_bits, const LambLayout& layout, const LambStepScalars& s) {
  if (layout.num_chunks == 0) return;
  DeviceGuard guard(param.device().index);
  const LambFloats f{static_cast<float>(s.beta1),
                     static_cast<float>(1.0 - s.beta1),
                     static_cast<float>(s.beta2),
                     static_cast<float>(1.0 - s.beta2),
                     static_cast<float>(s.bias_correction1),
                     static_cast<float>(s.bias_correction2),
                     static_cast<float>(s.eps),
                     static_cast<float>(s.weight_decay),
                     static_cast<float>(s.grad_scale)};
  require_aligned_slabs("lamb", {&param, &grad, &exp_avg, &exp_avg_sq, &decay_bits, &s.copy});
  const int index = param.device().index;
  cudaStream_t stream = compute_stream(index);
  Tensor resolved;
  if (s.controls.defined()) {
    resolved = Tensor::empty(Shape{int64_t(sizeof(LambResolved))}, DType::u8, param.device());
    ENGINE_LAUNCH(lamb_resolve, (LaunchConfig{dim3(1), dim3(1), 0, stream}),
                  dptr<const double>(s.controls), s.clip_norm, f,
                  static_cast<const volatile DeviceIndexError*>(device_index_error(index)),
                  static_cast<LambResolved*>(resolved.raw_data()));
  }
  const LambResolved* r =
      resolved.defined() ? static_cast<const LambResolved*>(resolved.raw_data()) : nullptr;
  const dim3 threads(kLambLanes);
  const dim3 chunk_grid(static_cast<unsigned>(layout.num_chunks));
  ENGINE_LAUNCH(lamb_moments, (LaunchConfig{chunk_grid, threads, 0, stream}),
                dptr<const float>(param), dptr<const float>(grad), dptr<float>(exp_avg),
                dptr<float>(exp_avg_sq), dptr<const uint8_t>(decay_bits),
                dptr<const int64_t>(layout.chunks), dptr<double>(layout.partials), f, r);
  ENGINE_LAUNCH(lamb_ratios,
                (LaunchConfig{dim3(static_cast<unsigned>(layout.num_tensors)), threads, 0, stream}),
                dptr<const int64_t>(layout.tensor_chunks), dptr<const uint8_t>(layout.trust),
                dptr<const double>(layout.partials), dptr<float>(layout.step_scales), s.lr, r);
  with_copy_type(s.copy, "lamb", [&]<class H>() {
    ENGINE_LAUNCH(lamb_apply<H>, (LaunchConfig{chunk_grid, threads, 0, stream}), dptr<float>(param),
                  dptr<const float>(exp_avg), dptr<const float>(exp_avg_sq),
                  dptr<const uint8_t>(decay_bits), dptr<const int64_t>(layout.chunks),
                  dptr<const float>(layout.step_scales), f, r, copy_ptr<H>(s.copy));
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(adamw_kernel, DeviceType::CUDA, adamw);
ENGINE_REGISTER_KERNEL(lamb_kernel, DeviceType::CUDA, lamb);

}  // namespace engine::cuda
