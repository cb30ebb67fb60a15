// CUDA kernel of rotary (see rotary.h): one thread per pair (row, i), the two elements read and
// written together, the rotation in f32 (f64 for f64).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "ops/rotary.h"

namespace engine::cuda {
namespace {

template <class T>
__global__ void rotary_pairs(const T* x, const float* cos, const float* sin, T* out, int64_t rows,
                             int64_t t, int64_t half, float sign) {
  const int64_t n = rows * half;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += stride) {
    const int64_t row = e / half, i = e - row * half;
    const int64_t a = (row % t) * half + i;
    const Acc<T> c = Acc<T>(cos[a]), s = Acc<T>(sign * sin[a]);
    const Acc<T> x0 = to_acc(x[2 * e]), x1 = to_acc(x[2 * e + 1]);
    out[2 * e] = from_acc<T>(x0 * c - x1 * s);
    out[2 * e + 1] = from_acc<T>(x0 * s + x1 * c);
  }
}

void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out,
            bool inverse) {
  const int64_t rows = x.shape()[0] * x.shape()[1], t = x.shape()[1], half = x.shape()[2] / 2;
  if (rows * half == 0) return;
  DeviceGuard guard(x.device().index);
  const LaunchConfig cfg{dim3(grid_blocks(rows * half, kElementwiseThreads)),
                         dim3(kElementwiseThreads), 0, compute_stream(x.device().index)};
  dispatch_device_floating(x.dtype(), "rotary", [&]<class T>() {
    ENGINE_LAUNCH(rotary_pairs<T>, cfg, dptr<const T>(x), dptr<const float>(cos),
                  dptr<const float>(sin), dptr<T>(out), rows, t, half, inverse ? -1.f : 1.f);
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(rotary_kernel, DeviceType::CUDA, rotary);

}  // namespace engine::cuda
