// CUDA kernel of column_sums_add (ops/reduce.h): a bias's gradient added in f32 into the f32
// .grad behind autocast's cast of the bias, by column_sums (engine/cuda/reduce.cuh: 16-byte loads
// along the columns, enough row chunks to fill the GPU, a fixed order).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/reduce.cuh"
#include "engine/error.h"
#include "ops/reduce.h"

namespace engine::cuda {
namespace {

// Rows of a contiguous (rows, n) source, V columns at a time, summed in f32.
template <class T, int V>
struct ColumnsAdd {
  using Acc = float;
  const T* src;
  float* dst;  // added into
  int64_t n;
  __device__ void load(int64_t r, int64_t c, Acc (&v)[1][V]) const {
    if constexpr (V > 1) {
      const Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(src + r * n + c);
#pragma unroll
      for (int q = 0; q < V; ++q) v[0][q] = static_cast<Acc>(to_acc(x.v[q]));
    } else {
      v[0][0] = static_cast<Acc>(to_acc(src[r * n + c]));
    }
  }
  __device__ void store(int, int64_t c, const Acc (&s)[V]) const {
#pragma unroll
    for (int q = 0; q < V; ++q) dst[c + q] += s[q];
  }
  __device__ void store_one(int, int64_t c, Acc s) const { dst[c] += s; }
};

void column_sums_add(const Tensor& src, const Tensor& dst) {
  ENGINE_CHECK(src.dim() == 2 && dst.dim() == 1 && src.size(1) == dst.size(0) &&
                   src.is_contiguous() && dst.is_contiguous() && dst.dtype() == DType::f32 &&
                   src.device() == dst.device(),
               "[column_sums_add] expects a contiguous (rows, n) source and an (n) f32 "
               "destination on one device, got ",
               describe(src), " and ", describe(dst));
  const int64_t rows = src.size(0), n = src.size(1);
  if (rows == 0 || n == 0) return;  // nothing to add
  const int index = src.device().index;
  DeviceGuard guard(index);
  ENGINE_CHECK(src.dtype() == DType::f32 || src.dtype() == DType::bf16 || src.dtype() == DType::f16,
               "[column_sums_add] the source must be f32, bf16 or f16, got ", describe(src));
  dispatch_device_floating(src.dtype(), "column_sums_add", [&]<class T>() {
    if constexpr (sizeof(T) <= 4) {
      constexpr int kV = reduce_vec<T>();
      auto run = [&]<int V>() {
        column_sums<V, 1>("column_sums_add", rows, n,
                          ColumnsAdd<T, V>{dptr<const T>(src), dst.data<float>(), n}, index);
      };
      if (n % kV == 0 && aligned16(src.raw_data()))
        run.template operator()<kV>();
      else
        run.template operator()<1>();
    }
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(column_sums_add_kernel, DeviceType::CUDA, column_sums_add);

}  // namespace engine::cuda
