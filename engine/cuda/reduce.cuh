// Column sums that fill the GPU, written once for every op that reduces over rows: sum_to's
// bias-gradient shapes (rows reduced, the contiguous dim kept), layer_norm's weight and bias
// gradients, bias_gelu's bias gradient.
//
//   column_sums<V, K>(name, rows, cols, f, stream);
//
// computes, for each of K outputs and each column c < cols, the sum over rows r of f's values.
// The functor f (a struct with __device__ members, copied to the kernel) provides
//   using Acc = float | double;                                  // the accumulation type
//   void load(int64_t r, int64_t c, Acc (&v)[K][V]) const;       // columns c .. c + V - 1 of row r
//   void store(int k, int64_t c, const Acc (&v)[V]) const;       // the finished sums of output k
// (load may also write: bias_gelu's backward writes dx where it reads dy.) cols % V == 0, and
// every load of V columns is one aligned vector where the caller chose V > 1.
//
// The grid: blocks of 256 threads, bx columns (vectors) by by = 256 / bx rows, over column tiles
// x row chunks; the chunk count is chosen so that the grid has ~1024 blocks (an H200 holds 8
// blocks of 256 on each of its 132 SMs) while each thread still sums at least 4 rows (its loads
// issued together: 16 rows a thread left a bias gradient of (4096, 768) 96 blocks, several times
// the time its 6 MB take at the H200's bandwidth; docs/benchmarks.md, "Figures behind the code"). A
// block sums its rows in a fixed order (each thread its strided rows, then the by partial rows in
// order through shared memory); with more than one chunk the chunks' sums go to an Acc buffer
// and a second launch sums them per column in chunk order. The result depends only on the shape:
// the same bits on every run (not the CPU's bits: its order is another).
#pragma once

#include <cstdint>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace engine::cuda {

inline constexpr int kReduceThreads = 256;
inline constexpr int kReduceTargetBlocks = 1024;
inline constexpr int64_t kReduceMinRowsPerThread = 4;

// The vector width of a reduction's loads: up to 16 bytes, at most 8 elements (the accumulators
// live in registers).
template <class T>
constexpr int reduce_vec() {
  return 16 / sizeof(T) > 8 ? 8 : static_cast<int>(16 / sizeof(T));
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

namespace detail {

template <int V, int K, class F>
__global__ void column_sums_kernel(F f, int64_t rows, int64_t cols, int64_t chunks,
                                   typename F::Acc* part) {
  using Acc = typename F::Acc;
  __shared__ Acc sh[K][kReduceThreads][V];
  const int bx = blockDim.x, by = blockDim.y;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = (blockIdx.x * int64_t(bx) + tx) * V;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = rows * chunk / chunks, r1 = rows * (chunk + 1) / chunks;
  Acc acc[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[k][j] = Acc(0);
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + ty; r < r1; r += by) {
      Acc v[K][V];
      f.load(r, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) acc[k][j] += v[k][j];
    }
  }
  const int t = ty * bx + tx;
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) sh[k][t][j] = acc[k][j];
  __syncthreads();
  if (ty != 0 || c >= cols) return;
  for (int k = 0; k < K; ++k) {
    Acc s[V];
#pragma unroll
    for (int j = 0; j < V; ++j) s[j] = sh[k][tx][j];
    for (int y = 1; y < by; ++y)
#pragma unroll
      for (int j = 0; j < V; ++j) s[j] += sh[k][y * bx + tx][j];
    if (part) {
#pragma unroll
      for (int j = 0; j < V; ++j) part[(k * chunks + chunk) * cols + c + j] = s[j];
    } else {
      f.store(k, c, s);
    }
  }
}

// The second pass: rows = the chunks of the first, read from its buffer.
template <int K, class F>
struct ChunkSums {
  using Acc = typename F::Acc;
  const Acc* part;
  int64_t chunks, cols;
  F f;
  __device__ void load(int64_t r, int64_t c, Acc (&v)[K][1]) const {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k][0] = part[(k * chunks + r) * cols + c];
  }
  __device__ void store(int k, int64_t c, const Acc (&v)[1]) const {
    // The first pass's functor stores whole vectors; hand it one column at a time.
    f.store_one(k, c, v[0]);
  }
};

inline int pow2_at_least(int64_t n, int cap) {
  int p = 1;
  while (p < cap && p < n) p *= 2;
  return p;
}

}  // namespace detail

// See the top of the file. f must also provide store_one(k, c, value) (one column) for the second
// pass. Returns nothing; the sums are stored through f.
template <int V, int K, class F>
void column_sums(const char* name, int64_t rows, int64_t cols, const F& f, int device,
                 bool allow_chunks = true) {
  using Acc = typename F::Acc;
  if (cols == 0) return;
  const cudaStream_t stream = compute_stream(device);
  const int64_t vecs = cols / V;
  const int bx = detail::pow2_at_least(vecs, kWarpSize), by = kReduceThreads / bx;
  const int64_t tiles = (vecs + bx - 1) / bx;
  int64_t chunks = 1;
  if (allow_chunks && rows > 0) {
    const int64_t want = (kReduceTargetBlocks + tiles - 1) / tiles;
    const int64_t most = (rows + by * kReduceMinRowsPerThread - 1) / (by * kReduceMinRowsPerThread);
    chunks = want < most ? want : most;
    if (chunks < 1) chunks = 1;
    if (chunks > 65535) chunks = 65535;
  }
  ENGINE_CHECK(tiles < (int64_t{1} << 31), "[", name, "] ", cols, " columns exceed the grid");
  const LaunchConfig cfg{dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)),
                         dim3(bx, by), 0, stream};
  if (chunks == 1) {
    launch_kernel(name, detail::column_sums_kernel<V, K, F>, cfg, f, rows, cols, int64_t{1},
                  static_cast<Acc*>(nullptr));
    return;
  }
  Tensor part = Tensor::empty({K * chunks * cols}, sizeof(Acc) == 8 ? DType::f64 : DType::f32,
                              Device::cuda(device));
  Acc* p = static_cast<Acc*>(part.raw_data());
  launch_kernel(name, detail::column_sums_kernel<V, K, F>, cfg, f, rows, cols, chunks, p);
  const detail::ChunkSums<K, F> g{p, chunks, cols, f};
  const int bx2 = detail::pow2_at_least(cols, kWarpSize), by2 = kReduceThreads / bx2;
  const LaunchConfig cfg2{dim3(static_cast<unsigned>((cols + bx2 - 1) / bx2)), dim3(bx2, by2), 0,
                          stream};
  launch_kernel("column_sums_chunks", detail::column_sums_kernel<1, K, detail::ChunkSums<K, F>>,
                cfg2, g, chunks, cols, int64_t{1}, static_cast<Acc*>(nullptr));
}

// ---- parameter gradients ----------------------------------------------------------------------

// Where a column sum that is a parameter's gradient goes: written in the problem's dtype, or, for
// a 16-bit problem given an f32 tensor (the f32 .grad behind autocast's cast of the parameter,
// Node::grad_sink_f32), added into that in f32 (no 16-bit gradient, no separate add) — or
// written in f32 where that .grad's zero was deferred (`set`: the first writer).
template <class T>
struct ParamGrad {
  T* out = nullptr;
  float* add = nullptr;
  float* set = nullptr;
  __device__ explicit operator bool() const {
    return out != nullptr || add != nullptr || set != nullptr;
  }
  template <class S>
  __device__ void put(int64_t col, S s) const {
    if (add)
      add[col] += static_cast<float>(s);
    else if (set)
      set[col] = static_cast<float>(s);
    else if (out)
      out[col] = from_acc<T>(s);
  }
};

// g (undefined: not wanted) as the destination of a `problem`-dtype op's parameter gradient; an
// f32 g for a bf16 / f16 problem is added into (written when `write`: a deferred zero), another
// dtype than the problem's is an error naming `op`.
template <class T>
ParamGrad<T> param_grad(const Tensor& g, DType problem, const char* op, bool write = false) {
  ParamGrad<T> p;
  if (!g.defined()) return p;
  if (g.dtype() != problem) {
    ENGINE_CHECK(g.dtype() == DType::f32 && (problem == DType::bf16 || problem == DType::f16), "[",
                 op, "] a parameter gradient ", describe(g), " for a ", dtype_name(problem),
                 " problem: expected ", dtype_name(problem),
                 " (written) or, for bf16 / f16, f32 (added into)");
    (write ? p.set : p.add) = g.data<float>();
  } else {
    p.out = dptr<T>(g);
  }
  return p;
}

}  // namespace engine::cuda
