// The CUDA backend: device memory (the caching allocator, allocator.h), host<->device transfers
// on the device's compute stream, and the core's layout primitives: contiguous operands through
// launch_elementwise's 16-byte vectors, strided ones through collapsed indexers (16-byte units
// where the innermost dim allows), and sum_to through reductions that fill the GPU (below).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/allocator.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/graph.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/reduce.cuh"
#include "engine/cuda/strided.cuh"
#include "engine/work_log.h"

namespace engine::cuda {
namespace {

// A grid-stride launch over n elements on the device's compute stream.
LaunchConfig grid_for(int64_t n, const Tensor& t) {
  return LaunchConfig{dim3(grid_blocks(n, kElementwiseThreads)), dim3(kElementwiseThreads), 0,
                      compute_stream(t.device().index)};
}

// ---- layout kernels (strided operands: StridedIndexer, 32-bit division below 2^31 elements) ---

template <class S, class D>
__global__ void copy_kernel(const S* src, D* dst, StridedIndexer<2> ix, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = from_acc<D>(to_acc(src[off[1]]));
  }
}

// The same copy in 16-byte units: the innermost dim is contiguous in both operands and every
// offset is a multiple of 16 bytes (the heads' split and merge, (B, T, H, d) <-> (B, H, T, d)).
__global__ void copy_vec16_kernel(const uint4* src, uint4* dst, StridedIndexer<2> ix, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = src[off[1]];
  }
}

template <class T>
__global__ void fill_kernel(T* dst, T v, StridedIndexer<1> ix, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[1];
    ix.offsets(i, off);
    dst[off[0]] = v;
  }
}

template <class T>
__global__ void add_kernel(T* dst, const T* src, double alpha, StridedIndexer<2> ix, int64_t n) {
  using V = Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = from_acc<T>(to_acc(dst[off[0]]) + static_cast<V>(alpha) * to_acc(src[off[1]]));
  }
}

// Contiguous operands: launch_elementwise's 16-byte vectors.
struct ConvertOp {
  template <class V>
  __device__ V operator()(V x) const {
    return x;
  }
};
template <class V>
struct ConstOp {
  V v;
  __device__ V operator()() const { return v; }
};
template <class V>
struct AddScaledOp {
  V alpha;
  __device__ V operator()(V d, V s) const { return d + alpha * s; }
};

// ---- sum_to ----------------------------------------------------------------------------------
// The source's layout, collapsed, is one of:
//   columns: the innermost dim (stride 1) is kept: out[o][w] = sum_r src[red(r) + outer(o) + w]
//            (bias gradients (R, C) -> (C), batch sums (B, H, T, T) -> (1, H, T, T)): column_sums
//            (reduce.cuh), 16-byte loads along w;
//   rows:    the innermost dim (stride 1) is reduced: out[o] = sum over (r, l) of
//            src[kept(o) + red(r) + l] (full sums, (H, T, T) -> (H, 1, 1), (B, H, T, T) ->
//            (1, H, 1, 1)): blocks of 256 threads over (output, chunk of the reduced run), 16-byte
//            loads along l, block_sum, the chunks' sums added per output in chunk order;
// (a layout with no stride-1 dim is made contiguous first). Sums in f32 for f32 / bf16 / f16,
// f64 for f64 and the integer types; the same bits on every run.

template <class T>
using SumAccOf = std::conditional_t<std::is_same_v<Acc<T>, float>, float, double>;

template <class T, int V>
struct SumToColumns {
  using Acc = SumAccOf<T>;
  const T* src;
  T* dst;
  StridedIndexer<1> red, outer;  // reduced dims; kept dims outside the contiguous one
  FastDiv width;                 // the contiguous kept dim's size
  bool outer_narrow;
  __device__ void load(int64_t r, int64_t c, Acc (&v)[1][V]) const {
    int64_t ro[1], oo[1];
    red.offsets(r, ro);
    int64_t o, w;
    if (outer_narrow) {
      o = width.div(static_cast<uint32_t>(c));
      w = c - o * width.divisor;
    } else {
      o = c / width.divisor;
      w = c - o * width.divisor;
    }
    outer.offsets(o, oo);
    const T* p = src + ro[0] + oo[0] + w;
    if constexpr (V > 1) {
      const Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
      for (int j = 0; j < V; ++j) v[0][j] = static_cast<Acc>(to_acc(x.v[j]));
    } else {
      v[0][0] = static_cast<Acc>(to_acc(*p));
    }
  }
  __device__ void store(int, int64_t c, const Acc (&s)[V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) dst[c + j] = from_acc<T>(s[j]);
  }
  __device__ void store_one(int, int64_t c, Acc s) const { dst[c] = from_acc<T>(s); }
};

template <class T, int V>
__global__ void sum_rows_kernel(const T* src, StridedIndexer<1> kept, StridedIndexer<1> red_outer,
                                int64_t run_vecs, FastDiv rd, int64_t n_vec, int64_t chunks,
                                SumAccOf<T>* part, T* dst) {
  using A = SumAccOf<T>;
  const int64_t o = blockIdx.x, chunk = blockIdx.y;
  const int64_t q0 = n_vec * chunk / chunks, q1 = n_vec * (chunk + 1) / chunks;
  int64_t base[1];
  kept.offsets(o, base);
  const bool narrow = n_vec < (int64_t{1} << 31);
  A acc = A(0);
  for (int64_t q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
    int64_t ro, l;
    if (narrow) {
      ro = rd.div(static_cast<uint32_t>(q));
      l = q - ro * run_vecs;
    } else {
      ro = q / run_vecs;
      l = q - ro * run_vecs;
    }
    int64_t roff[1];
    red_outer.offsets(ro, roff);
    const T* p = src + base[0] + roff[0] + l * V;
    if constexpr (V > 1) {
      const Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
      for (int j = 0; j < V; ++j) acc += static_cast<A>(to_acc(x.v[j]));
    } else {
      acc += static_cast<A>(to_acc(*p));
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x != 0) return;
  if (part)
    part[chunk * gridDim.x + o] = acc;
  else
    dst[o] = from_acc<T>(acc);
}

// The chunks' sums of sum_rows_kernel, per output in chunk order.
template <class T>
struct PartColumns {
  using Acc = SumAccOf<T>;
  const Acc* part;
  int64_t cols;
  T* dst;
  __device__ void load(int64_t r, int64_t c, Acc (&v)[1][1]) const { v[0][0] = part[r * cols + c]; }
  __device__ void store(int, int64_t c, const Acc (&s)[1]) const { dst[c] = from_acc<T>(s[0]); }
  __device__ void store_one(int, int64_t c, Acc s) const { dst[c] = from_acc<T>(s); }
};

// Every stride in `st` (but the innermost, which is 1) a multiple of v.
bool strides_multiple_of(const std::vector<int64_t>& st, size_t skip_last, int64_t v) {
  for (size_t d = 0; d + skip_last < st.size(); ++d)
    if (st[d] % v) return false;
  return true;
}

class CudaBackend final : public Backend {
 public:
  const char* name() const override { return "cuda"; }
  int device_count() const override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return n;
  }
  Allocator& allocator(int index) override {
    ENGINE_CHECK(index >= 0 && index < device_count(), "[device] cuda:", index, " does not exist (",
                 device_count(), " CUDA devices visible)");
    return caching_allocator(index);
  }
  void begin_capture(int index) override { cuda::begin_capture(index); }
  std::unique_ptr<Graph> end_capture(int index, bool keep) override {
    return cuda::end_capture(index, keep);
  }

  void synchronize(int index) override {
    refuse_in_capture(index, "synchronize()");
    ENGINE_CUDA_CHECK(cudaSetDevice(index));
    ENGINE_CUDA_CHECK(cudaDeviceSynchronize());
    raise_device_index_error(index);
  }

  void copy(const Tensor& src, const Tensor& dst) override {
    WorkCost cost;  // the performance model's record (work_log.h)
    if (work_recording()) {
      add_work_cost(cost, src);
      add_work_cost(cost, dst);
    }
    WorkScope scope("copy", cost);
    int64_t n = dst.numel();
    if (!n) return;
    const int device = dst.device().index;
    const cudaStream_t stream = compute_stream(device);
    if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
      ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                        cudaMemcpyDeviceToDevice, stream));
      return;
    }
    if (src.is_contiguous() && dst.is_contiguous()) {  // a dtype conversion
      dispatch_device_all(src.dtype(), [&]<class S>() {
        dispatch_device_all(dst.dtype(), [&]<class D>() {
          launch_elementwise("copy_convert", n, stream, ConvertOp{}, dptr<D>(dst),
                             static_cast<const S*>(dptr<S>(src)));
        });
      });
      return;
    }
    const Collapsed c = collapse_layout(dst.shape(), {&dst.strides(), &src.strides()});
    const size_t elem = dtype_size(dst.dtype());
    const int64_t v = 16 / static_cast<int64_t>(elem);
    // 16-byte units: one dtype, the innermost dim contiguous in both, every offset a multiple.
    if (src.dtype() == dst.dtype() && v > 1 && c.strides[0].back() == 1 &&
        c.strides[1].back() == 1 && c.sizes.back() % v == 0 &&
        strides_multiple_of(c.strides[0], 1, v) && strides_multiple_of(c.strides[1], 1, v) &&
        aligned16(src.raw_data()) && aligned16(dst.raw_data())) {
      Collapsed cv = c;
      cv.sizes.back() /= v;
      for (auto& st : cv.strides)
        for (size_t d = 0; d + 1 < st.size(); ++d) st[d] /= v;
      const int64_t nv = n / v;
      ENGINE_LAUNCH(copy_vec16_kernel, grid_for(nv, dst), static_cast<const uint4*>(src.raw_data()),
                    static_cast<uint4*>(dst.raw_data()), make_indexer<2>(cv), nv);
      return;
    }
    const auto ix = make_indexer<2>(c);
    dispatch_device_all(src.dtype(), [&]<class S>() {
      dispatch_device_all(dst.dtype(), [&]<class D>() {
        ENGINE_LAUNCH((copy_kernel<S, D>), grid_for(n, dst), static_cast<const S*>(src.raw_data()),
                      static_cast<D*>(dst.raw_data()), ix, n);
      });
    });
  }

  void fill(const Tensor& dst, double value) override {
    WorkCost cost;  // the performance model's record (work_log.h)
    if (work_recording()) {
      add_work_cost(cost, dst);
    }
    WorkScope scope("fill", cost);
    int64_t n = dst.numel();
    if (!n) return;
    const cudaStream_t stream = compute_stream(dst.device().index);
    dispatch_device_all(dst.dtype(), [&]<class T>() {
      const T v = from_acc<T>(value);
      if (dst.is_contiguous()) {
        launch_elementwise("fill", n, stream, ConstOp<Acc<T>>{to_acc(v)}, dptr<T>(dst));
        return;
      }
      const std::vector<int64_t>* sts[1] = {&dst.strides()};
      ENGINE_LAUNCH(fill_kernel<T>, grid_for(n, dst), static_cast<T*>(dst.raw_data()), v,
                    make_indexer<1>(dst.shape(), sts), n);
    });
  }

  void add_(const Tensor& dst, const Tensor& src, double alpha) override {
    WorkCost cost;  // the performance model's record (work_log.h)
    if (work_recording()) {
      add_work_cost(cost, dst);
      add_work_cost(cost, src);
      add_work_cost(cost, dst);
    }
    WorkScope scope("add_", cost);
    int64_t n = dst.numel();
    if (!n) return;
    const cudaStream_t stream = compute_stream(dst.device().index);
    if (src.dtype() != dst.dtype()) {  // f32 += bf16 / f16 (backend.h)
      ENGINE_ASSERT(dst.dtype() == DType::f32 && dst.is_contiguous() && src.is_contiguous() &&
                    (src.dtype() == DType::bf16 || src.dtype() == DType::f16));
      dispatch_device_floating(src.dtype(), "add_", [&]<class S>() {
        launch_elementwise("add_", n, stream, AddScaledOp<float>{static_cast<float>(alpha)},
                           dptr<float>(dst), static_cast<const float*>(dptr<float>(dst)),
                           dptr<const S>(src));
      });
      return;
    }
    dispatch_device_all(dst.dtype(), [&]<class T>() {
      if (dst.is_contiguous() && src.is_contiguous()) {
        launch_elementwise("add_", n, stream, AddScaledOp<Acc<T>>{static_cast<Acc<T>>(alpha)},
                           dptr<T>(dst), static_cast<const T*>(dptr<T>(dst)),
                           static_cast<const T*>(dptr<T>(src)));
        return;
      }
      const std::vector<int64_t>* sts[2] = {&dst.strides(), &src.strides()};
      ENGINE_LAUNCH(add_kernel<T>, grid_for(n, dst), static_cast<T*>(dst.raw_data()),
                    static_cast<const T*>(src.raw_data()), alpha, make_indexer<2>(dst.shape(), sts),
                    n);
    });
  }

  void sum_to(const Tensor& src, const Tensor& dst) override {
    WorkCost cost;  // the performance model's record (work_log.h)
    if (work_recording()) {
      add_work_cost(cost, src);
      add_work_cost(cost, dst);
    }
    WorkScope scope("sum_to", cost);
    ENGINE_CHECK(is_broadcastable_to(dst.shape(), src.shape()), "[sum_to] ", describe(dst),
                 " is not broadcastable to ", describe(src));
    ENGINE_CHECK(dst.is_contiguous() && dst.dtype() == src.dtype(),
                 "[sum_to] expects a contiguous ", dtype_name(src.dtype()), " destination, got ",
                 describe(dst));
    const int64_t n_out = dst.numel();
    if (!n_out) return;
    if (src.numel() == 0) {
      fill(dst, 0.0);
      return;
    }
    // Each src dim is kept (dst's size matches) or reduced. dst's contiguous strides stand in for
    // the kept dims and 0 for the reduced ones, so that collapsing merges only dims of one kind.
    const Shape& ss = src.shape();
    const size_t lead = ss.size() - dst.shape().size();
    std::vector<int64_t> dstx(ss.size(), 0);
    for (size_t d = lead; d < ss.size(); ++d)
      if (!(dst.shape()[d - lead] == 1 && ss[d] != 1)) dstx[d] = dst.strides()[d - lead];
    const Collapsed c = collapse_layout(ss, {&src.strides(), &dstx});
    if (c.sizes.empty()) {  // one element
      copy(src.reshape(dst.shape()), dst);
      return;
    }
    if (c.strides[0].back() != 1) {  // no contiguous innermost dim: reduce a contiguous copy
      sum_to(src.contiguous(), dst);
      return;
    }
    // The collapsed dims by kind (the innermost last in each list).
    Collapsed kept, red;
    kept.strides.resize(1);
    red.strides.resize(1);
    for (size_t d = 0; d < c.sizes.size(); ++d) {
      Collapsed& to = c.strides[1][d] != 0 ? kept : red;
      to.sizes.push_back(c.sizes[d]);
      to.strides[0].push_back(c.strides[0][d]);
    }
    if (red.sizes.empty()) {  // only size-1 dims are reduced: the values themselves
      copy(src.reshape(dst.shape()), dst);
      return;
    }
    const int device = dst.device().index;
    DeviceGuard guard(device);
    const bool innermost_kept = c.strides[1].back() != 0;
    dispatch_device_all(src.dtype(), [&]<class T>() {
      constexpr int kV = reduce_vec<T>();
      if (innermost_kept) {
        // columns: the contiguous kept dim is `width`; the other kept dims index its groups.
        const int64_t width = kept.sizes.back();
        Collapsed outer = kept;
        outer.sizes.pop_back();
        outer.strides[0].pop_back();
        const bool vec = kV > 1 && width % kV == 0 && aligned16(src.raw_data()) &&
                         strides_multiple_of(outer.strides[0], 0, kV) &&
                         strides_multiple_of(red.strides[0], 0, kV);
        auto run = [&]<int V>() {
          const SumToColumns<T, V> f{dptr<const T>(src),
                                     dptr<T>(dst),
                                     make_indexer<1>(red),
                                     make_indexer<1>(outer),
                                     FastDiv(static_cast<uint32_t>(width)),
                                     n_out < (int64_t{1} << 31)};
          column_sums<V, 1>("sum_to_columns", red.numel(), n_out, f, device);
        };
        ENGINE_CHECK(width < (int64_t{1} << 31), "[sum_to] a contiguous dim of ", width,
                     " elements exceeds the kernel's 32-bit width");
        if (vec)
          run.template operator()<kV>();
        else
          run.template operator()<1>();
        return;
      }
      // rows: the contiguous reduced run is `run`; the other reduced dims index the runs.
      const int64_t run = red.sizes.back();
      Collapsed red_outer = red;
      red_outer.sizes.pop_back();
      red_outer.strides[0].pop_back();
      const int64_t n_red = red.numel();
      const bool vec = kV > 1 && run % kV == 0 && aligned16(src.raw_data()) &&
                       strides_multiple_of(kept.strides[0], 0, kV) &&
                       strides_multiple_of(red_outer.strides[0], 0, kV);
      ENGINE_CHECK(n_out < (int64_t{1} << 31), "[sum_to] ", n_out, " outputs exceed the grid");
      auto launch = [&]<int V>() {
        using A = SumAccOf<T>;
        const int64_t n_vec = n_red / V;
        int64_t chunks = (kReduceTargetBlocks + n_out - 1) / n_out;
        const int64_t most = (n_vec + kReduceThreads * 8 - 1) / (kReduceThreads * 8);
        if (chunks > most) chunks = most;
        if (chunks < 1) chunks = 1;
        if (chunks > 65535) chunks = 65535;
        const LaunchConfig cfg{dim3(static_cast<unsigned>(n_out), static_cast<unsigned>(chunks)),
                               dim3(kReduceThreads), 0, compute_stream(device)};
        Tensor part = chunks > 1
                          ? Tensor::empty({chunks * n_out},
                                          sizeof(A) == 8 ? DType::f64 : DType::f32, dst.device())
                          : Tensor();
        A* p = chunks > 1 ? static_cast<A*>(part.raw_data()) : nullptr;
        ENGINE_LAUNCH((sum_rows_kernel<T, V>), cfg, dptr<const T>(src), make_indexer<1>(kept),
                      make_indexer<1>(red_outer), run / V,
                      FastDiv(static_cast<uint32_t>(run / V < (int64_t{1} << 31) ? run / V : 1)),
                      n_vec, chunks, p, dptr<T>(dst));
        if (chunks > 1)
          column_sums<1, 1>("sum_to_chunks", chunks, n_out,
                            PartColumns<T>{static_cast<const A*>(p), n_out, dptr<T>(dst)}, device,
                            false);
      };
      if (vec)
        launch.template operator()<kV>();
      else
        launch.template operator()<1>();
    });
  }

 protected:
  // A host->device write never waits for the device: the bytes go first into a pinned staging
  // buffer (the caller may reuse its own at once), the copy from there is queued on the compute
  // stream, and an event marks when the staging buffer is free again. A step's uploads (the next
  // micro-batch) so queue behind its work instead of draining the stream. Writes over
  // kStageMax (a whole parameter slab at start) go through pageable memory and wait.
  void write_from_host(void* dst, const void* src, size_t n, int index) override {
    refuse_in_capture(index, "a write of host values into a device tensor");
    DeviceGuard guard(index);
    cudaStream_t s = compute_stream(index);
    if (n > kStageMax) {
      ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
      ENGINE_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffer may be reused at once
      return;
    }
    std::lock_guard<std::mutex> lock(stage_mu_);  // one write at a time picks and fills a stage
    Stage& st = stage_for(index, n);
    std::memcpy(st.host, src, n);
    ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, st.host, n, cudaMemcpyHostToDevice, s));
    ENGINE_CUDA_CHECK(cudaEventRecord(st.free, s));
    st.used = true;
  }
  void read_to_host(void* dst, const void* src, size_t n, int index) override {
    refuse_in_capture(index, "a read of a device tensor on the host");
    DeviceGuard guard(index);
    cudaStream_t s = compute_stream(index);
    ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s));
    ENGINE_CUDA_CHECK(cudaStreamSynchronize(s));
    raise_device_index_error(index);  // a bad index met by the work this read waited for
  }

 private:
  // A host synchronisation cannot be part of a graph (engine/graph.h): one clear error.
  static void refuse_in_capture(int index, const char* what) {
    ENGINE_CHECK(!capturing(index), "[graph] ", what, " (cuda:", index,
                 ") inside a graph capture: a captured step may not synchronise with the host; "
                 "move it before or after DeviceGraph::capture");
  }
  static constexpr size_t kStageMax = size_t(64) << 20;     // larger writes: pageable, waited
  static constexpr size_t kStageTotal = size_t(256) << 20;  // pinned staging per device, at most
  struct Stage {
    void* host = nullptr;  // pinned
    size_t bytes = 0;
    cudaEvent_t free = nullptr;  // recorded after the copy out of it
    bool used = false;
  };
  // A staging buffer of at least n bytes whose last copy has finished: a free one, a new one
  // while the device's total stays under kStageTotal, else the oldest, waited for.
  Stage& stage_for(int index, size_t n) {  // under stage_mu_
    if (stages_.size() <= static_cast<size_t>(index))
      stages_.resize(static_cast<size_t>(index) + 1);
    std::deque<Stage>& v = stages_[static_cast<size_t>(index)];
    size_t total = 0;
    for (Stage& st : v) {
      total += st.bytes;
      if (st.bytes < n) continue;
      if (!st.used) return st;
      const cudaError_t e = cudaEventQuery(st.free);
      if (e == cudaSuccess) return st;
      if (e != cudaErrorNotReady) ENGINE_CUDA_CHECK(e);
    }
    const size_t bytes = std::max<size_t>(size_t(1) << 20, (n + 4095) / 4096 * 4096);
    if (total + bytes > kStageTotal) {
      for (Stage& st : v) {  // wait for the first big enough
        if (st.bytes < n) continue;
        ENGINE_CUDA_CHECK(cudaEventSynchronize(st.free));
        return st;
      }
    }
    Stage st;
    st.bytes = bytes;
    ENGINE_CUDA_CHECK(cudaHostAlloc(&st.host, bytes, cudaHostAllocDefault));
    ENGINE_CUDA_CHECK(cudaEventCreateWithFlags(&st.free, cudaEventDisableTiming));
    v.push_back(st);
    return v.back();
  }
  std::mutex stage_mu_;
  std::vector<std::deque<Stage>> stages_;  // per device (a deque: stages never move)
};

CudaBackend g_cuda_backend;
[[maybe_unused]] const bool g_registered =
    (register_backend(DeviceType::CUDA, &g_cuda_backend), true);

}  // namespace
}  // namespace engine::cuda
