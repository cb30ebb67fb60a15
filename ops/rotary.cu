// CUDA kernel of rotary (see rotary.h). grid.y walks the (A, B) slices (its index split once per
// block), grid.x the T x D / 2 pairs of one slice; a thread rotates P consecutive pairs, read
// where they are (the layers' q / k views, no copy first) and written as one vector: 16 bytes
// (P = 8 / sizeof(T): f32 2, bf16 / f16 4, f64 1) when the rows, strides and pointers allow it,
// else one pair (P = 1). The rotation in f32 (f64 for f64); 32-bit index math within a slice.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "ops/rotary.h"

namespace engine::cuda {
namespace {

template <class T, int P>
__global__ void rotary_pairs(const T* x, const float* cos, const float* sin, T* out, int64_t slices,
                             int64_t bdim, int64_t sa, int64_t sb, int64_t st, int t, int groups,
                             float sign) {
  const int n = t * groups;  // groups of P pairs in one slice
  const int half = groups * P;
  for (int64_t slice = blockIdx.y; slice < slices; slice += gridDim.y) {
    const int64_t a = slice / bdim;
    const T* xs = x + a * sa + (slice - a * bdim) * sb;
    T* os = out + slice * int64_t(n) * 2 * P;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
      const int r = e / groups, j = e - r * groups;
      const Vec<T, 2 * P> v = *reinterpret_cast<const Vec<T, 2 * P>*>(xs + r * st + 2 * P * j);
      const float* c = cos + r * half + P * j;
      const float* s = sin + r * half + P * j;
      Vec<T, 2 * P> o;
#pragma unroll
      for (int q = 0; q < P; ++q) {
        const Acc<T> cq = Acc<T>(c[q]), sq = Acc<T>(sign * s[q]);
        const Acc<T> x0 = to_acc(v.v[2 * q]), x1 = to_acc(v.v[2 * q + 1]);
        o.v[2 * q] = from_acc<T>(x0 * cq - x1 * sq);
        o.v[2 * q + 1] = from_acc<T>(x0 * sq + x1 * cq);
      }
      *reinterpret_cast<Vec<T, 2 * P>*>(os + int64_t(e) * 2 * P) = o;
    }
  }
}

void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out,
            bool inverse) {
  const Shape& n = x.shape();
  const int64_t slices = n[0] * n[1], t = n[2], half = n[3] / 2;
  if (slices * t * half == 0) return;
  ENGINE_CHECK(t * half < (int64_t(1) << 31), "[rotary] a slice of ", t, " x ", half,
               " pairs exceeds the kernel's 32-bit index");
  DeviceGuard guard(x.device().index);
  const cudaStream_t stream = compute_stream(x.device().index);
  dispatch_device_floating(x.dtype(), "rotary", [&]<class T>() {
    constexpr int kVec = 8 / int(sizeof(T));  // pairs in 16 bytes
    // 16-byte groups: whole groups per row, every row start (strides) and pointer aligned.
    const int64_t step = 2 * kVec;
    const bool vec = half % kVec == 0 && detail::aligned(dptr<const T>(x), 16) &&
                     detail::aligned(dptr<T>(out), 16) && (n[0] == 1 || x.stride(0) % step == 0) &&
                     (n[1] == 1 || x.stride(1) % step == 0) && (t == 1 || x.stride(2) % step == 0);
    const int p = vec ? kVec : 1;
    const int groups = int(half / p);
    const LaunchConfig cfg{dim3(grid_blocks(t * groups, kElementwiseThreads, 65535),
                                unsigned(slices < 65535 ? slices : 65535)),
                           dim3(kElementwiseThreads), 0, stream};
    auto launch = [&](auto kernel) {
      launch_kernel("rotary_pairs", kernel, cfg, dptr<const T>(x), dptr<const float>(cos),
                    dptr<const float>(sin), dptr<T>(out), slices, n[1], x.stride(0), x.stride(1),
                    x.stride(2), int(t), groups, inverse ? -1.f : 1.f);
    };
    if (vec)
      launch(rotary_pairs<T, kVec>);
    else
      launch(rotary_pairs<T, 1>);
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(rotary_kernel, DeviceType::CUDA, rotary);

}  // namespace engine::cuda
