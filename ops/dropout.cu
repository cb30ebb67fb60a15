// CUDA kernels of dropout (see dropout.h): one thread per Philox block of four words, so each
// thread draws once and decides four consecutive elements (one 4-element vector load and store
// where aligned) with the same integer test as the CPU (dropout_keep on philox_word(state, i)): CPU
// and CUDA masks agree bit for bit, and x * (1 / (1 - p)) is the same single f32 (f64) product.
// bf16 / f16 scale in f32, round once.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "ops/dropout.h"

namespace engine::cuda {
namespace {

// One thread per Philox block of E elements (the CPU's stream layout): E = 4, a 32-bit word each
// (dropout's rule), or E = 8, a 16-bit halfword each (attention's rule, dropout.h).
// `write(i0, end, keep)` stores elements i0 .. i0 + end - 1 given their keep bits, 4 at a time.
template <int E, class Write>
__global__ void philox_blocks(int64_t n, uint32_t threshold, PhiloxState s, Write write) {
  static_assert(E == 4 || E == 8, "4 words or 8 halfwords a block");
  const int64_t blocks = (n + E - 1) / E;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const uint64_t offset = philox_offset(s);
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks; b += stride) {
    uint32_t w[4];
    philox_block(s.seed, offset + static_cast<uint64_t>(b), w);
    for (int g = 0; g < E / 4; ++g) {
      const int64_t i0 = E * b + 4 * g;
      if (i0 >= n) break;
      const int end = n - i0 < 4 ? static_cast<int>(n - i0) : 4;
      bool keep[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        keep[k] =
            E == 4 ? dropout_keep(w[k], threshold) : philox_halfword(w, 4 * g + k) >= threshold;
      write(i0, end, keep);
    }
  }
}

// y = keep ? x * scale : 0, four elements at a time: one vector load and store when `vec` (x and
// y aligned to four elements) and the block is whole.
template <class T>
struct DropoutWrite {
  const T* x;
  T* y;
  Acc<T> scale;
  bool vec;
  __device__ void operator()(int64_t i0, int end, const bool (&keep)[4]) const {
    if (vec && end == 4) {
      const Vec<T, 4> in = *reinterpret_cast<const Vec<T, 4>*>(x + i0);
      Vec<T, 4> out;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        out.v[k] = keep[k] ? from_acc<T>(to_acc(in.v[k]) * scale) : from_acc<T>(Acc<T>(0));
      *reinterpret_cast<Vec<T, 4>*>(y + i0) = out;
      return;
    }
    for (int k = 0; k < end; ++k)
      y[i0 + k] = keep[k] ? from_acc<T>(to_acc(x[i0 + k]) * scale) : from_acc<T>(Acc<T>(0));
  }
};

template <class T>
struct MaskWrite {
  T* mask;
  __device__ void operator()(int64_t i0, int end, const bool (&keep)[4]) const {
    for (int k = 0; k < end; ++k) mask[i0 + k] = keep[k] ? T(1) : T(0);
  }
};

template <int E>
LaunchConfig blocks_config(int64_t n, const Tensor& t) {
  const int threads = kElementwiseThreads;
  return LaunchConfig{dim3(grid_blocks((n + E - 1) / E, threads)), dim3(threads), 0,
                      compute_stream(t.device().index)};
}

// y = keep ? x / (1 - p) : 0 under the rule of E decisions a block.
template <int E>
void dropout_values(const Tensor& x, const Tensor& y, double p, PhiloxState s, const char* op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(x.device().index);
  const uint32_t threshold = E == 4 ? dropout_threshold(p) : attention_dropout_threshold(p);
  dispatch_device_floating(x.dtype(), op, [&]<class T>() {
    const Acc<T> scale = static_cast<Acc<T>>(1.0 / (1.0 - p));
    const bool vec = reinterpret_cast<uintptr_t>(x.raw_data()) % (4 * sizeof(T)) == 0 &&
                     reinterpret_cast<uintptr_t>(y.raw_data()) % (4 * sizeof(T)) == 0;
    ENGINE_LAUNCH(philox_blocks<E, DropoutWrite<T>>, blocks_config<E>(n, x), n, threshold, s,
                  DropoutWrite<T>{dptr<const T>(x), dptr<T>(y), scale, vec});
  });
}

void dropout(const Tensor& x, const Tensor& y, double p, PhiloxState s) {
  dropout_values<4>(x, y, p, s, "dropout");
}

// Attention's rule (dropout.h): a thread per Philox block of 8 elements, two 4-element writes.
void attention_dropout(const Tensor& x, const Tensor& y, double p, PhiloxState s) {
  dropout_values<8>(x, y, p, s, "attention_dropout");
}

void dropout_mask(const Tensor& mask, double p, PhiloxState s) {
  const int64_t n = mask.numel();
  if (n == 0) return;
  DeviceGuard guard(mask.device().index);
  const uint32_t threshold = dropout_threshold(p);
  auto fill = [&]<class T>() {
    ENGINE_LAUNCH(philox_blocks<4, MaskWrite<T>>, blocks_config<4>(n, mask), n, threshold, s,
                  MaskWrite<T>{static_cast<T*>(mask.raw_data())});
  };
  if (mask.dtype() == DType::u8) {
    fill.template operator()<uint8_t>();
  } else {
    dispatch_device_floating(mask.dtype(), "dropout_mask", fill);
  }
}

}  // namespace

ENGINE_REGISTER_KERNEL(dropout_kernel, DeviceType::CUDA, dropout);
ENGINE_REGISTER_KERNEL(attention_dropout_kernel, DeviceType::CUDA, attention_dropout);
ENGINE_REGISTER_KERNEL(dropout_mask_kernel, DeviceType::CUDA, dropout_mask);

}  // namespace engine::cuda
