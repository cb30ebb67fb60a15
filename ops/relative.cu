// CUDA kernels of relative_gather / relative_scatter (see relative.h).
//
// gather: one thread per output element, a copy in the storage type.
//
// scatter, deterministic and without atomics: the (Tq, Tk) index inverted into a CSR per query
// row (bucket -> the keys j that name it, in increasing j; relative_invert: one thread per row,
// serial over its keys — made once for a constant index, relative_index_inverse, which the Shaw
// component caches; only an op called without it inverts per call); then one thread per output
// element (l, i, r) sums y[l, i, j] over its bucket's keys in that order, in f32 (f64 for f64),
// and writes once. A bucket's sum is thus formed in j order, as on the CPU (the same f32 bits),
// and buckets no key names are 0.
//
// An index value outside [0, R) is never read with: it is reported (device_error.cuh: raised at
// the next host read), gathered as 0 and left out of the scatter's buckets.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "ops/relative.h"

namespace engine::cuda {
namespace {

template <class T>
__global__ void relative_gather_elems(const T* x, const int64_t* index, T* out, int64_t rows,
                                      int64_t tq, int64_t tk, int64_t r, DeviceIndexError* err) {
  const int64_t n = rows * tk;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += stride) {
    const int64_t row = e / tk, j = e - row * tk;
    const int64_t b = index[(row % tq) * tk + j];
    if (b < 0 || b >= r) {
      report_bad_index(err, IndexCheck::relative_bucket, (row % tq) * tk + j, b, r);
      out[e] = T();
      continue;
    }
    out[e] = x[row * r + b];
  }
}

// offsets (Tq, R + 1): bucket b of row i holds keys[i * tk + offsets[i][b] .. offsets[i][b+1]);
// cursor (Tq, R) is scratch.
__global__ void relative_invert_index(const int64_t* index, int64_t tq, int64_t tk, int64_t r,
                                      int32_t* offsets, int32_t* cursor, int32_t* keys,
                                      DeviceIndexError* err) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tq) return;
  const int64_t* ir = index + i * tk;
  int32_t* off = offsets + i * (r + 1);
  int32_t* cur = cursor + i * r;
  for (int64_t b = 0; b <= r; ++b) off[b] = 0;
  for (int64_t j = 0; j < tk; ++j) {
    const int64_t b = ir[j];
    if (b < 0 || b >= r) {  // reported, and left out of every bucket
      report_bad_index(err, IndexCheck::relative_bucket, i * tk + j, b, r);
      continue;
    }
    ++off[b + 1];
  }
  for (int64_t b = 0; b < r; ++b) {
    off[b + 1] += off[b];
    cur[b] = off[b];
  }
  for (int64_t j = 0; j < tk; ++j)
    if (ir[j] >= 0 && ir[j] < r) keys[i * tk + cur[ir[j]]++] = static_cast<int32_t>(j);
}

template <class T>
__global__ void relative_scatter_elems(const T* y, const int32_t* offsets, const int32_t* keys,
                                       T* out, int64_t rows, int64_t tq, int64_t tk, int64_t r) {
  const int64_t n = rows * r;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += stride) {
    const int64_t row = e / r, b = e - row * r, i = row % tq;
    const int32_t* off = offsets + i * (r + 1);
    const int32_t* ki = keys + i * tk;
    const T* yr = y + row * tk;
    Acc<T> sum = 0;
    for (int32_t k = off[b]; k < off[b + 1]; ++k) sum += to_acc(yr[ki[k]]);
    out[e] = from_acc<T>(sum);
  }
}

LaunchConfig flat_config(int64_t n, const Tensor& t) {
  const int threads = kElementwiseThreads;
  return LaunchConfig{dim3(grid_blocks(n, threads)), dim3(threads), 0,
                      compute_stream(t.device().index)};
}

void relative_gather(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t tq = x.shape()[1], r = x.shape()[2], tk = out.shape()[2];
  const int64_t rows = x.shape()[0] * tq;
  if (rows == 0 || tk == 0) return;
  DeviceGuard guard(x.device().index);
  dispatch_device_all(x.dtype(), [&]<class T>() {
    ENGINE_LAUNCH(relative_gather_elems<T>, flat_config(rows * tk, x), dptr<const T>(x),
                  dptr<const int64_t>(index), dptr<T>(out), rows, tq, tk, r,
                  device_index_error(x.device().index));
  });
}

// inverse (Tq (R + 1) + Tq Tk) i32: the offsets, then the keys.
void relative_invert(const Tensor& index, int64_t r, const Tensor& inverse) {
  const int64_t tq = index.shape()[0], tk = index.shape()[1];
  if (tq == 0) return;
  DeviceGuard guard(index.device().index);
  const Device dev = index.device();
  Tensor cursor = Tensor::empty({tq, r > 0 ? r : 1}, DType::i32, dev);
  const int threads = 128;
  const LaunchConfig invert{dim3(static_cast<unsigned>((tq + threads - 1) / threads)),
                            dim3(threads), 0, compute_stream(dev.index)};
  int32_t* offsets = dptr<int32_t>(inverse);
  ENGINE_LAUNCH(relative_invert_index, invert, dptr<const int64_t>(index), tq, tk, r, offsets,
                dptr<int32_t>(cursor), offsets + tq * (r + 1), device_index_error(dev.index));
}

void relative_scatter(const Tensor& y, const Tensor& index, const Tensor& inverse,
                      const Tensor& out) {
  const int64_t tq = y.shape()[1], tk = y.shape()[2], r = out.shape()[2];
  const int64_t rows = y.shape()[0] * tq;
  if (rows == 0 || r == 0) return;
  ENGINE_CHECK(tk < (int64_t(1) << 31) && (r + 1) * tq + tq * tk < (int64_t(1) << 31),
               "[relative_scatter] index (", tq, ", ", tk, ") with ", r,
               " buckets is too large for the 32-bit inverted index");
  DeviceGuard guard(y.device().index);
  const Device dev = y.device();
  Tensor inv = inverse;
  if (!inv.defined()) {  // no cached inverse: made now, for this call
    inv = Tensor::empty({tq * (r + 1) + tq * tk}, DType::i32, dev);
    relative_invert(index, r, inv);
  }
  const int32_t* offsets = dptr<const int32_t>(inv);
  dispatch_device_floating(y.dtype(), "relative_scatter", [&]<class T>() {
    ENGINE_LAUNCH(relative_scatter_elems<T>, flat_config(rows * r, y), dptr<const T>(y), offsets,
                  offsets + tq * (r + 1), dptr<T>(out), rows, tq, tk, r);
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(relative_gather_kernel, DeviceType::CUDA, relative_gather);
ENGINE_REGISTER_KERNEL(relative_scatter_kernel, DeviceType::CUDA, relative_scatter);
ENGINE_REGISTER_KERNEL(relative_invert_kernel, DeviceType::CUDA, relative_invert);

}  // namespace engine::cuda
