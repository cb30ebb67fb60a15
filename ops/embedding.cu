// CUDA kernels of index_select / embedding (see embedding.h).
//
// gather_rows: one thread per output element, a copy in the storage type (any dtype). An index
// outside [0, N) traps (the launch faults, the error is sticky) instead of reading elsewhere:
// device ids are never read back on the host to be checked.
//
// scatter_add_rows, deterministic without atomics: thread (c, part) owns column c of the table
// rows r with r % parts == part and walks the whole index in order, adding row i's element
// into row index[i] when that row is its own. Every element's sum is therefore formed in index
// order, as on the CPU (same f32 / f64 bits), whatever the grid, and no two threads write one
// element. `parts` spreads a narrow table over enough threads; each thread rereads the (M)
// index, which is small next to the M x D values. bf16 / f16 gradients add in f32 and round
// after each addition (the stored value is the running sum).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "ops/embedding.h"

namespace engine::cuda {
namespace {

template <class T, class I>
__global__ void gather_rows_elems(const T* table, const I* index, T* out, int64_t m, int64_t d,
                                  int64_t rows) {
  const int64_t n = m * d;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += stride) {
    const int64_t i = e / d, c = e - i * d;
    const int64_t r = static_cast<int64_t>(index[i]);
    if (r < 0 || r >= rows) __trap();
    out[e] = table[r * d + c];
  }
}

template <class T, class I>
__global__ void scatter_add_rows_cols(const T* grad_out, const I* index, T* grad_table, int64_t m,
                                      int64_t d, int64_t rows, int parts) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int part = blockIdx.y;
  if (c >= d) return;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = static_cast<int64_t>(index[i]);
    if (r < 0 || r >= rows) __trap();
    if (r % parts != part) continue;
    T& dst = grad_table[r * d + c];
    dst = from_acc<T>(to_acc(dst) + to_acc(grad_out[i * d + c]));
  }
}

void gather_rows(const Tensor& table, const Tensor& index, const Tensor& out) {
  const int64_t m = out.shape()[0], d = out.shape()[1], rows = table.shape()[0];
  if (m == 0 || d == 0) return;
  DeviceGuard guard(out.device().index);
  const int threads = kElementwiseThreads;
  const LaunchConfig cfg{dim3(grid_blocks(m * d, threads)), dim3(threads), 0,
                         compute_stream(out.device().index)};
  cuda::dispatch_all(table.dtype(), [&]<class T>() {
    dispatch_index(index.dtype(), "gather_rows", [&]<class I>() {
      ENGINE_LAUNCH((gather_rows_elems<T, I>), cfg, dptr<const T>(table), dptr<const I>(index),
                    dptr<T>(out), m, d, rows);
    });
  });
}

void scatter_add_rows(const Tensor& grad_out, const Tensor& index, const Tensor& grad_table) {
  const int64_t m = grad_out.shape()[0], d = grad_out.shape()[1], rows = grad_table.shape()[0];
  if (m == 0 || d == 0 || rows == 0) return;
  DeviceGuard guard(grad_table.device().index);
  const int threads = static_cast<int>(d < 128 ? (d + kWarpSize - 1) / kWarpSize * kWarpSize : 128);
  const int64_t col_blocks = (d + threads - 1) / threads;
  // About 32K threads in all, never more parts than rows.
  int64_t parts = (32768 + col_blocks * threads - 1) / (col_blocks * threads);
  parts = parts < 1 ? 1 : (parts > rows ? rows : (parts > 1024 ? 1024 : parts));
  const LaunchConfig cfg{dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(parts)),
                         dim3(threads), 0, compute_stream(grad_table.device().index)};
  cuda::dispatch_floating(grad_table.dtype(), "scatter_add_rows", [&]<class T>() {
    dispatch_index(index.dtype(), "scatter_add_rows", [&]<class I>() {
      ENGINE_LAUNCH((scatter_add_rows_cols<T, I>), cfg, dptr<const T>(grad_out),
                    dptr<const I>(index), dptr<T>(grad_table), m, d, rows, static_cast<int>(parts));
    });
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(gather_rows_kernel, DeviceType::CUDA, gather_rows);
ENGINE_REGISTER_KERNEL(scatter_add_rows_kernel, DeviceType::CUDA, scatter_add_rows);

}  // namespace engine::cuda
