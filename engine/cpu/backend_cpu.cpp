// The CPU backend: host memory, and the core's layout primitives (converting strided copy, fill,
// accumulate, sum over broadcast dims). bf16/f16 conversions use Eigen's round-to-nearest-even
// types.
#include <omp.h>

#include <Eigen/Core>
#include <cstring>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/strided.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine::cpu {
namespace {

// sum_to runs on several threads above these many source elements. Measured on 2 cores with a
// sweep of sizes and bench_ops' sum_to cases: a parallel region costs ~3 us; an inner run that
// adds a contiguous source row into contiguous outputs (a bias gradient) is vectorised at ~0.05
// ns an element, while a run summed into one output or read with a stride is a chain of
// dependent double adds at ~1.5 ns an element. Threads gained from ~8K elements for the second
// kind (1.8x on the (B, H, T, T) -> (1, H, T, T) positional-bias gradient, 2.6x on a transposed
// bias gradient). The first kind is bound by memory bandwidth: on the AMD development VM one core
// took it all (threading it at 128K elements cost 5% of the tiny model's tokens/s); on the Intel
// one (2026-11-25) 2 threads halve the positional-bias gradient (32, 12, 128, 128) -> (1, 12,
// 128, 128) (1.97 -> 0.76 ms) and a (4096, 3072) bias gradient (3.6 -> 1.7 ms), while the tiny
// model's (2048, 128) bias gradients still ran best serial (-3% tokens/s threaded): 2^19.
constexpr int64_t kSumToParallelVectorised = int64_t(1) << 19;
constexpr int64_t kSumToParallelChained = 8192;

// C++ compute type for each storage type.
template <class T>
struct Value {
  using type = T;
};
template <>
struct Value<bf16_t> {
  using type = float;
};
template <>
struct Value<f16_t> {
  using type = float;
};

template <class T>
typename Value<T>::type load(const T& x) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(x.bits));
  } else if constexpr (std::is_same_v<T, f16_t>) {
    return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(x.bits));
  } else {
    return x;
  }
}

template <class T, class V>
T store(V v) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return T{Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(static_cast<float>(v)))};
  } else if constexpr (std::is_same_v<T, f16_t>) {
    return T{Eigen::numext::bit_cast<uint16_t>(Eigen::half(static_cast<float>(v)))};
  } else {
    return static_cast<T>(v);
  }
}

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  int device_count() const override { return 1; }
  Allocator& allocator(int) override { return cpu_allocator(); }
  void synchronize(int) override {}

  void copy(const Tensor& src, const Tensor& dst) override {
    ENGINE_ASSERT(src.shape() == dst.shape());
    if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
      const size_t nbytes = src.nbytes();
      if (!nbytes || src.raw_data() == dst.raw_data()) return;
      const char* s = static_cast<const char*>(src.raw_data());
      char* d = static_cast<char*>(dst.raw_data());
      const bool overlap = s < d + nbytes && d < s + nbytes;
      if (overlap || src.numel() < kParallelMinElems) {
        std::memmove(d, s, nbytes);
        return;
      }
      // Large copies in one slice per thread (each slice stays in its core's cache for the
      // kernels that split the same rows the same way).
#pragma omp parallel
      {
        const size_t nt = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
        const size_t begin = nbytes * t / nt / 64 * 64,
                     end = t + 1 == nt ? nbytes : nbytes * (t + 1) / nt / 64 * 64;
        if (end > begin) std::memcpy(d + begin, s + begin, end - begin);
      }
      return;
    }
    dispatch_any(src.dtype(), [&]<class S>() {
      dispatch_any(dst.dtype(), [&]<class D>() {
        const S* s = static_cast<const S*>(src.raw_data());
        D* d = static_cast<D*>(dst.raw_data());
        strided_for<2>(dst.shape(), {&dst.strides(), &src.strides()},
                       [&](const int64_t* off, int64_t n, const int64_t* step) {
                         D* dp = d + off[0];
                         const S* sp = s + off[1];
                         for (int64_t i = 0; i < n; ++i)
                           dp[i * step[0]] = store<D>(load(sp[i * step[1]]));
                       });
      });
    });
  }

  void fill(const Tensor& dst, double value) override {
    dispatch_any(dst.dtype(), [&]<class D>() {
      D v = store<D>(value);
      D* d = static_cast<D*>(dst.raw_data());
      if (dst.is_contiguous()) {
        const int64_t n = dst.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMinElems)
        for (int64_t i = 0; i < n; ++i) d[i] = v;
        return;
      }
      strided_for<1>(dst.shape(), {&dst.strides()},
                     [&](const int64_t* off, int64_t n, const int64_t* step) {
                       for (int64_t i = 0; i < n; ++i) d[off[0] + i * step[0]] = v;
                     });
    });
  }

  void add_(const Tensor& dst, const Tensor& src, double alpha) override {
    ENGINE_ASSERT(src.shape() == dst.shape() && src.dtype() == dst.dtype());
    dispatch_any(dst.dtype(), [&]<class T>() {
      using V = typename Value<T>::type;
      const T* s = static_cast<const T*>(src.raw_data());
      T* d = static_cast<T*>(dst.raw_data());
      const V a = static_cast<V>(alpha);
      if (dst.is_contiguous() && src.is_contiguous()) {
        const int64_t n = dst.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMinElems)
        for (int64_t i = 0; i < n; ++i) d[i] = store<T>(load(d[i]) + a * load(s[i]));
        return;
      }
      strided_for<2>(dst.shape(), {&dst.strides(), &src.strides()},
                     [&](const int64_t* off, int64_t n, const int64_t* step) {
                       T* dp = d + off[0];
                       const T* sp = s + off[1];
                       for (int64_t i = 0; i < n; ++i)
                         dp[i * step[0]] =
                             store<T>(load(dp[i * step[0]]) + a * load(sp[i * step[1]]));
                     });
    });
  }

  void sum_to(const Tensor& src, const Tensor& dst) override {
    ENGINE_ASSERT(dst.is_contiguous() && src.dtype() == dst.dtype());
    ENGINE_CHECK(is_broadcastable_to(dst.shape(), src.shape()), "[sum_to] ", describe(dst),
                 " is not broadcastable to ", describe(src));
    // Accumulate in double in the source's element order: deterministic and accurate. Each
    // output is the sum, from 0.0, of the source elements that reduce onto it in row-major order;
    // the threads split a kept dim (one dst steps through), never a reduced one, so every output
    // is summed by one thread in that same order and the result does not depend on the thread
    // count (the golden tests compare gradients bit for bit). With no kept dim (a full sum) the
    // one output is summed serially.
    const Shape& shape = src.shape();
    // Aligned to the widest vector (64 bytes with AVX-512): a row added into an acc at malloc's
    // 16-byte alignment splits vector loads and stores across cache lines (bench_ops'
    // (4096, 768) -> (768) bias gradient: 0.18 ms with such an acc, 0.13 ms aligned).
    std::vector<double, Eigen::aligned_allocator<double>> acc(static_cast<size_t>(dst.numel()),
                                                              0.0);
    const std::vector<int64_t> dst_st = broadcast_strides(dst.shape(), dst.strides(), shape);
    const std::vector<int64_t>& src_st = src.strides();
    int split = -1;  // the largest kept dim (the outermost of equals): the most even split
    int inner = -1;  // the innermost dim of size > 1: strided_for's inner run steps along it
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      inner = static_cast<int>(d);
      if (dst_st[d] != 0 && (split < 0 || shape[d] > shape[split])) split = static_cast<int>(d);
    }
    const bool vectorised = inner >= 0 && src_st[inner] == 1 && dst_st[inner] == 1;
    const bool parallel =
        split >= 0 && src.numel() > (vectorised ? kSumToParallelVectorised : kSumToParallelChained);
    dispatch_any(src.dtype(), [&]<class T>() {
      const T* s = static_cast<const T*>(src.raw_data());
      // Sums the source elements with index [begin, end) along `split` (all when split < 0).
      auto accumulate = [&](int64_t begin, int64_t end) {
        Shape sub = shape;
        int64_t s0 = 0, a0 = 0;
        if (split >= 0) {
          sub[split] = end - begin;
          s0 = begin * src_st[split];
          a0 = begin * dst_st[split];
        }
        strided_for<2>(sub, {&src_st, &dst_st},
                       [&](const int64_t* off, int64_t n, const int64_t* step) {
                         const T* sp = s + s0 + off[0];
                         double* ap = acc.data() + a0 + off[1];
                         for (int64_t i = 0; i < n; ++i)
                           ap[i * step[1]] += static_cast<double>(load(sp[i * step[0]]));
                       });
      };
      if (!parallel) {
        accumulate(0, split < 0 ? 0 : shape[split]);
      } else {
        const int64_t len = shape[split];
#pragma omp parallel
        {
          const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
          const int64_t begin = len * t / nt, end = len * (t + 1) / nt;
          if (begin < end) accumulate(begin, end);
        }
      }
      T* d = static_cast<T*>(dst.raw_data());
      const int64_t m = static_cast<int64_t>(acc.size());
#pragma omp parallel for if (m > kSumToParallelVectorised)
      for (int64_t i = 0; i < m; ++i) d[i] = store<T>(acc[i]);
    });
  }

 protected:
  void write_from_host(void* dst, const void* src, size_t n, int) override {
    std::memcpy(dst, src, n);
  }
  void read_to_host(void* dst, const void* src, size_t n, int) override {
    std::memcpy(dst, src, n);
  }
};

CpuBackend g_cpu_backend;
[[maybe_unused]] const bool g_registered =
    (register_backend(DeviceType::CPU, &g_cpu_backend), true);

}  // namespace
}  // namespace engine::cpu
