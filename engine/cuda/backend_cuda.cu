// The CUDA backend: device memory (the caching allocator, allocator.h), host<->device transfers
// on the device's compute stream, and the core's layout primitives as grid-stride kernels over
// strided indexers.
#include <atomic>
#include <mutex>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/allocator.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/strided.cuh"
#include "engine/work_log.h"

namespace engine::cuda {
namespace {

// A grid-stride launch over n elements on the device's compute stream.
LaunchConfig grid_for(int64_t n, const Tensor& t) {
  return LaunchConfig{dim3(grid_blocks(n, kElementwiseThreads)), dim3(kElementwiseThreads), 0,
                      compute_stream(t.device().index)};
}

template <class S, class D>
__global__ void copy_kernel(const S* src, D* dst, StridedIndexer<2> ix, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = from_acc<D>(to_acc(src[off[1]]));
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

// One thread per output element sums the source elements that broadcast onto it: the source is
// viewed as (out, reduced) through an indexer over [kept dims..., reduced dims...]. The order is
// the CPU backend's contract (engine/cpu/backend_cpu.cpp, kSumLanes), so both give the same bits:
// chunks of 1024 reduced elements, 16 interleaved lanes per chunk in float for f32/bf16/f16 and
// double otherwise, the fixed tree over the lanes, chunk sums added in double.
template <class T>
__global__ void sum_to_kernel(const T* src, T* dst, StridedIndexer<1> kept,
                              StridedIndexer<1> reduced, int64_t n_out, int64_t n_red) {
  using Acc = decltype(to_acc(src[0]));
  using A = std::conditional_t<std::is_same_v<Acc, float>, float, double>;
  constexpr int kLanes = 16;
  constexpr int64_t kChunk = 1024;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n_out;
       o += int64_t(gridDim.x) * blockDim.x) {
    int64_t base[1];
    kept.offsets(o, base);
    double total = 0;
    for (int64_t c0 = 0; c0 < n_red; c0 += kChunk) {
      A lane[kLanes];
      for (int q = 0; q < kLanes; ++q) lane[q] = A(0);
      const int64_t c1 = n_red < c0 + kChunk ? n_red : c0 + kChunk;
      for (int64_t r = c0; r < c1; ++r) {
        int64_t off[1];
        reduced.offsets(r, off);
        lane[r % kLanes] += static_cast<A>(to_acc(src[base[0] + off[0]]));
      }
      for (int w = kLanes / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
      total += static_cast<double>(lane[0]);
    }
    dst[o] = from_acc<T>(total);
  }
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
  void synchronize(int index) override {
    ENGINE_CUDA_CHECK(cudaSetDevice(index));
    ENGINE_CUDA_CHECK(cudaDeviceSynchronize());
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
    if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
      ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                        cudaMemcpyDeviceToDevice,
                                        compute_stream(dst.device().index)));
      return;
    }
    const std::vector<int64_t>* sts[2] = {&dst.strides(), &src.strides()};
    auto ix = make_indexer<2>(dst.shape(), sts);
    dispatch_all(src.dtype(), [&]<class S>() {
      dispatch_all(dst.dtype(), [&]<class D>() {
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
    const std::vector<int64_t>* sts[1] = {&dst.strides()};
    auto ix = make_indexer<1>(dst.shape(), sts);
    dispatch_all(dst.dtype(), [&]<class T>() {
      const T v = from_acc<T>(value);
      ENGINE_LAUNCH(fill_kernel<T>, grid_for(n, dst), static_cast<T*>(dst.raw_data()), v, ix, n);
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
    const std::vector<int64_t>* sts[2] = {&dst.strides(), &src.strides()};
    auto ix = make_indexer<2>(dst.shape(), sts);
    dispatch_all(dst.dtype(), [&]<class T>() {
      ENGINE_LAUNCH(add_kernel<T>, grid_for(n, dst), static_cast<T*>(dst.raw_data()),
                    static_cast<const T*>(src.raw_data()), alpha, ix, n);
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
    int64_t n_out = dst.numel();
    if (!n_out) return;
    // Split src's dims into kept (size matches dst) and reduced (dst has 1 or lacks the dim).
    const Shape& ss = src.shape();
    size_t lead = ss.size() - dst.shape().size();
    Shape kept_shape, red_shape;
    std::vector<int64_t> kept_st, red_st;
    for (size_t d = 0; d < ss.size(); ++d) {
      bool reduced = d < lead || (dst.shape()[d - lead] == 1 && ss[d] != 1);
      (reduced ? red_shape : kept_shape).push_back(ss[d]);
      (reduced ? red_st : kept_st).push_back(src.strides()[d]);
    }
    const std::vector<int64_t>* ks[1] = {&kept_st};
    const std::vector<int64_t>* rs[1] = {&red_st};
    auto kept = make_indexer<1>(kept_shape, ks);
    auto red = make_indexer<1>(red_shape, rs);
    int64_t n_red = shape_numel(red_shape);
    dispatch_all(src.dtype(), [&]<class T>() {
      ENGINE_LAUNCH(sum_to_kernel<T>, grid_for(n_out, dst), static_cast<const T*>(src.raw_data()),
                    static_cast<T*>(dst.raw_data()), kept, red, n_out, n_red);
    });
  }

 protected:
  void write_from_host(void* dst, const void* src, size_t n, int index) override {
    DeviceGuard guard(index);
    cudaStream_t s = compute_stream(index);
    ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
    ENGINE_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffer may be reused at once
  }
  void read_to_host(void* dst, const void* src, size_t n, int index) override {
    DeviceGuard guard(index);
    cudaStream_t s = compute_stream(index);
    ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s));
    ENGINE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
};

CudaBackend g_cuda_backend;
[[maybe_unused]] const bool g_registered =
    (register_backend(DeviceType::CUDA, &g_cuda_backend), true);

}  // namespace
}  // namespace engine::cuda
