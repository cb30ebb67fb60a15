// The CPU backend: host memory, and the core's layout primitives (converting strided copy, fill,
// accumulate, sum over broadcast dims). bf16/f16 conversions use Eigen's round-to-nearest-even
// types.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/scratch.h"
#include "engine/cpu/strided.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine::cpu {
namespace {

// sum_to's summation order, the contract tests/test_sum_to.cpp checks bit for bit (the golden
// tests compare model gradients bit for bit, so neither the thread count nor the loop the layout
// picks may change a bit). For each output, the source elements that reduce onto it, taken in
// row-major order of the source's logical index, are x_0 .. x_{R-1}. They are cut into chunks of
// kSumChunk. Within a chunk, lane j (of kSumLanes) sums the x_i with i mod kSumLanes == j, from 0,
// in order, in the accumulator type (SumAcc: float for f32, bf16 and f16, as PyTorch; double for
// f64 and the integer types); the chunk's sum is the fixed tree over its lanes (lane j plus lane
// j + 8, then + 4, + 2, + 1). The output is the sum, in double, of its chunk sums in order. Lanes
// make every layout vector adds (a full sum or a transposed bias gradient was one chain of
// dependent adds), chunks let threads split even a single output, and float lanes halve the work
// of f32 sums; each lane adds at most kSumChunk / kSumLanes = 64 elements.
constexpr int kSumLanes = 16;
constexpr int64_t kSumChunk = 1024;

// sum_to runs on several threads above these many source elements (see kParallelMinElems): it
// splits its tasks, each of which reads whole rows or long runs of the source.
constexpr int64_t kSumToParallel = kParallelMinElems;
// ... except chunks of few rows (strip_sums, all in registers), which ran best serial up to the
// (12, 128, 128) -> (1, 128, 128) positional-bias gradient (196K elements: slower on 2 threads
// than on 1) and gained from 2 threads from twice that (docs/benchmarks.md, "Figures behind the
// code").
constexpr int64_t kSumToParallelStrips = int64_t(1) << 18;

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

// sum_to's dims of one kind (kept in the output, or reduced), in the source's row-major order,
// size-1 dims dropped and neighbours merged when the source steps through them as one.
struct SumDims {
  std::vector<int64_t> size, stride;
  int64_t count = 1;
  void add(int64_t n, int64_t s) {
    count *= n;
    if (!size.empty() && stride.back() == s * n) {
      size.back() *= n;
      stride.back() = s;
      return;
    }
    size.push_back(n);
    stride.push_back(s);
  }
  int64_t inner_size() const { return size.empty() ? 1 : size.back(); }
  int64_t inner_stride() const { return size.empty() ? 0 : stride.back(); }
};

// A position in a SumDims' row-major index space: the source offset and the run left in the
// innermost dim. Fixed storage: tasks make cursors, and a heap allocation each cost more than
// the sums of a small task.
constexpr size_t kMaxSumDims = 16;
struct SumCursor {
  const SumDims* dims;
  std::array<int64_t, kMaxSumDims> idx;
  int64_t off = 0;
  int last;
  SumCursor(const SumDims& d, int64_t linear)
      : dims(&d), last(static_cast<int>(d.size.size()) - 1) {
    for (int q = last; q >= 0; --q) {
      idx[q] = linear % d.size[q];
      linear /= d.size[q];
      off += idx[q] * d.stride[q];
    }
  }
  int64_t run() const { return last < 0 ? 1 : dims->size[last] - idx[last]; }
  void advance(int64_t n) {  // n <= run()
    if (last < 0) return;
    int q = last;
    idx[q] += n;
    off += n * dims->stride[q];
    while (idx[q] == dims->size[q] && q > 0) {
      off -= dims->stride[q] * dims->size[q];
      idx[q] = 0;
      --q;
      ++idx[q];
      off += dims->stride[q];
    }
  }
};

// sum_to's accumulator type for a storage type (see kSumLanes).
template <class T>
using SumAcc = std::conditional_t<std::is_same_v<typename Value<T>::type, float>, float, double>;

// The fixed tree over a chunk's lanes (see kSumLanes) for `width` outputs: out[c] = the tree over
// lane[q][c], q < used (lane j plus lane j + 8, then + 4, + 2, + 1), where lane[q][c] is 0 plus
// an element (lanes of one element each, read straight from the source) or a lane's sum. Lanes
// at or beyond `used` were never added to and are exactly +0 (a lane that starts at +0 never
// becomes -0), so leaving them out changes no bit. Blocks of columns, in L1, one pass a level.
template <class A, class S>
void combine_lanes(const S* const* lane, int used, int64_t width, double* out) {
  constexpr int64_t kCols = 64;
  alignas(64) A v[kSumLanes][kCols];
  for (int64_t c0 = 0; c0 < width; c0 += kCols) {
    const int64_t n = std::min(kCols, width - c0);
    for (int q = 0; q < used; ++q)
      for (int64_t c = 0; c < n; ++c) v[q][c] = A(0) + static_cast<A>(load(lane[q][c0 + c]));
    int live = used;
    for (int w = kSumLanes / 2; w >= 1; w /= 2) {
      for (int j = 0; j < w && j + w < live; ++j)
        for (int64_t c = 0; c < n; ++c) v[j][c] += v[j + w][c];
      live = std::min(live, w);
    }
    for (int64_t c = 0; c < n; ++c) out[c0 + c] = v[0][c];
  }
}

// sum_to's vectors (GCC vector extensions), the native width: 64 bytes on AVX-512, 32 elsewhere.
// (64-byte vectors on AVX2, lowered to pairs of registers, spilled: strip_sums' 32 lanes of them
// on every row, and the runs' adds went through the stack; on the 2026-11-27 AVX2 EPYC the bias
// gradients and full sums ran at 0.5-0.9x of PyTorch's speed, docs/benchmarks.md.)
// Without -march=native the 64-byte vectors are passed differently than with AVX-512, which GCC
// warns about; they never cross this file, so the warning is off here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#if defined(__AVX512F__)
constexpr int kSumVecBytes = 64;
#else
constexpr int kSumVecBytes = 32;
#endif
typedef float SumVecF __attribute__((vector_size(kSumVecBytes)));
typedef double SumVecD __attribute__((vector_size(kSumVecBytes)));
template <class A>
using SumVec = std::conditional_t<std::is_same_v<A, float>, SumVecF, SumVecD>;

// The rows case for f32 and f64 with the lanes in vector registers: for each strip of kStripVecs
// vectors of outputs, the chunk's n rows (source offsets `row`) go into 16 register lanes, row i
// into lane i mod 16, then the tree runs in registers (unrolled for U = min(n, 16) lanes).
// AVX-512 (32 registers): two vectors a lane, 128 bytes of each row (1.5x faster than one vector
// on the tiny model's bias gradient, no better with four); AVX2 (16 registers): one, the 16
// lanes fill the register file and the adds take the rows from memory. Returns the outputs done
// (whole vectors); the caller does the rest.
constexpr int kStripVecs = kSumVecBytes == 64 ? 2 : 1;

// The fixed tree (see kSumLanes) over lanes v[0 .. U), in place, unrolled: lane j plus lane
// j + 8, then + 4, + 2, + 1, leaving out lanes at or beyond U (never added to: exactly +0).
// Lanes are scalars or vectors (one tree per vector element).
template <int U, class L>
inline L lane_tree(L* v) {
  static_assert(kSumLanes == 16 && U >= 1 && U <= kSumLanes);
  constexpr int L8 = U < 8 ? U : 8, L4 = U < 4 ? U : 4, L2 = U < 2 ? U : 2;
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
    if (j + 8 < U) v[j] += v[j + 8];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j)
    if (j + 4 < L8) v[j] += v[j + 4];
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j)
    if (j + 2 < L4) v[j] += v[j + 2];
  if (1 < L2) v[0] += v[1];
  return v[0];
}

template <int U, class A>
void strip_sums(const A* base, const int64_t* row, int64_t n, int64_t width, double* out) {
  using V = SumVec<A>;
  constexpr int64_t kW = sizeof(V) / sizeof(A);
  constexpr int kS = kStripVecs;  // vectors a lane per step
  auto at = [&](int64_t i, int64_t c) {
    V x;
    std::memcpy(&x, base + row[i] + c, sizeof x);
    return x;
  };
  for (int64_t c = 0; c + kS * kW <= width; c += kS * kW) {
    V v[kS][kSumLanes];
#pragma GCC unroll 16
    for (int q = 0; q < U; ++q)
#pragma GCC unroll 2
      for (int t = 0; t < kS; ++t) v[t][q] = at(q, c + t * kW) + A(0);
    int64_t i = U;
    for (; i + kSumLanes <= n; i += kSumLanes)
#pragma GCC unroll 16
      for (int q = 0; q < kSumLanes; ++q)
#pragma GCC unroll 2
        for (int t = 0; t < kS; ++t) v[t][q] += at(i + q, c + t * kW);
#pragma GCC unroll 16
    for (int q = 0; q < U; ++q)
      if (i + q < n)
#pragma GCC unroll 2
        for (int t = 0; t < kS; ++t) v[t][q] += at(i + q, c + t * kW);
#pragma GCC unroll 2
    for (int t = 0; t < kS; ++t) {
      const V sum = lane_tree<U>(v[t]);
      for (int64_t q = 0; q < kW; ++q) out[c + t * kW + q] = sum[q];
    }
  }
}

template <class T>
int64_t strip_sums(const T* base, const int64_t* row, int64_t n, int64_t width, double* out) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    [&]<int... U>(std::integer_sequence<int, U...>) {
      ((std::min<int64_t>(n, kSumLanes) == U + 1 ? strip_sums<U + 1>(base, row, n, width, out)
                                                 : void()),
       ...);
    }
    (std::make_integer_sequence<int, kSumLanes>());
    constexpr int64_t kW = kStripVecs * sizeof(SumVec<T>) / sizeof(T);
    return width / kW * kW;
  }
  return 0;
}

// The rows case for f32 and f64 on AVX2 builds (over chunks of more than kStripRows rows; n >= 16
// here), lane by lane: for each block of kB outputs (kV vectors in registers, 16 on AVX2 = the
// whole register file, the adds take the rows from memory), lane q walks rows q, q + 16, q + 32,
// ... of the chunk, each row's kB outputs once, then the 16 lanes' vectors go through the tree.
// Every row segment is read once and the lanes never leave the registers while they sum, where
// strips (one vector of outputs down all the rows) read 32 bytes of every row per strip and lanes
// in memory load and store the lanes on every row. Lane q adds its elements in the contract's
// order: the same bits. (On the AVX2 EPYC the model's bias gradients ran 1.6-2x faster this way
// than in strips or lanes in memory, at or below PyTorch's time: docs/benchmarks.md, "Figures
// behind the code".)
template <int kV, class A>
int64_t lane_walk_sums(const A* base, const int64_t* row, int64_t n, int64_t width, double* out) {
  using V = SumVec<A>;
  constexpr int64_t kW = sizeof(V) / sizeof(A), kB = kV * kW;
  int64_t c = 0;
  for (; c + kB <= width; c += kB) {
    V lanes[kSumLanes][kV];
    for (int q = 0; q < kSumLanes; ++q) {
      V acc[kV];
      const A* first = base + row[q] + c;
#pragma GCC unroll 16
      for (int t = 0; t < kV; ++t) {
        std::memcpy(&acc[t], first + t * kW, sizeof(V));
        acc[t] += A(0);  // a lane's first element is 0 + x
      }
      for (int64_t i = q + kSumLanes; i < n; i += kSumLanes) {
        const A* p = base + row[i] + c;
#pragma GCC unroll 16
        for (int t = 0; t < kV; ++t) {
          V x;
          std::memcpy(&x, p + t * kW, sizeof(V));
          acc[t] += x;
        }
      }
#pragma GCC unroll 16
      for (int t = 0; t < kV; ++t) lanes[q][t] = acc[t];
    }
    for (int t = 0; t < kV; ++t) {
      V v[kSumLanes];
      for (int q = 0; q < kSumLanes; ++q) v[q] = lanes[q][t];
      const V sum = lane_tree<kSumLanes>(v);
      for (int64_t e = 0; e < kW; ++e) out[c + t * kW + e] = sum[e];
    }
  }
  return c;
}

// The lane walk over a chunk of n >= kSumLanes rows: blocks of 16 vectors, then 8, 4 and 1 for
// the last outputs. Returns the outputs done (whole vectors); the caller does the rest. Without
// AVX (a build for any x86-64: 16 SSE registers, a 32-byte vector takes two) blocks start at 8.
#if defined(__AVX__)
constexpr int kWalkVecs = 16;
#else
constexpr int kWalkVecs = 8;
#endif
template <class T>
int64_t lane_walk_sums(const T* base, const int64_t* row, int64_t n, int64_t width, double* out) {
  int64_t done = 0;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    auto step = [&]<int kV>() {
      done += lane_walk_sums<kV>(base + done, row, n, width - done, out + done);
    };
    if constexpr (kWalkVecs >= 16) step.template operator()<16>();
    step.template operator()<8>();
    step.template operator()<4>();
    step.template operator()<1>();
  }
  return done;
}
#pragma GCC diagnostic pop

// Adds n source elements p[0], p[step], ... with reduced indices i, i + 1, ... into their lanes.
// f32 and f64 runs go through the lanes in whole vectors (SumVec): written as 16 scalar adds,
// GCC 12 for Emerald Rapids built each vector from 16 scalar loads and inserts, and a full sum
// ran at 12 GB/s a thread instead of the memory's ~25.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
template <class A, class T>
inline void add_to_lanes(A* lanes, const T* p, int64_t step, int64_t i, int64_t n) {
  int64_t m = 0;
  if (step == 1) {
    for (; m < n && ((i + m) % kSumLanes) != 0; ++m)
      lanes[(i + m) % kSumLanes] += static_cast<A>(load(p[m]));
    if constexpr (std::is_same_v<T, A>) {
      using V = SumVec<A>;
      constexpr int kW = sizeof(V) / sizeof(A), kN = kSumLanes / kW;
      static_assert(kN * kW == kSumLanes);
      V acc[kN];
      std::memcpy(acc, lanes, sizeof acc);
      for (; m + kSumLanes <= n; m += kSumLanes)
        for (int t = 0; t < kN; ++t) {
          V x;
          std::memcpy(&x, p + m + t * kW, sizeof x);
          acc[t] += x;
        }
      std::memcpy(lanes, acc, sizeof acc);
    } else if (m + kSumLanes <= n) {
      alignas(64) A acc[kSumLanes];
      for (int q = 0; q < kSumLanes; ++q) acc[q] = lanes[q];
      for (; m + kSumLanes <= n; m += kSumLanes)
        for (int q = 0; q < kSumLanes; ++q) acc[q] += static_cast<A>(load(p[m + q]));
      for (int q = 0; q < kSumLanes; ++q) lanes[q] = acc[q];
    }
  }
  for (; m < n; ++m) lanes[(i + m) % kSumLanes] += static_cast<A>(load(p[m * step]));
}

// The fixed tree over 16 lanes (see kSumLanes) in halves of a vector: lanes [0, 8) plus [8, 16),
// then [0, 4) plus [4, 8), ... — lane j plus lane j + w, the same adds as the loop in sum_to, in
// 4 vector adds instead of 15 dependent scalar ones.
template <class A>
inline A halving_tree(const A* lanes) {
  static_assert(kSumLanes == 16);
  typedef A H8 __attribute__((vector_size(8 * sizeof(A))));
  typedef A H4 __attribute__((vector_size(4 * sizeof(A))));
  typedef A H2 __attribute__((vector_size(2 * sizeof(A))));
  H8 a, b;
  std::memcpy(&a, lanes, sizeof a);
  std::memcpy(&b, lanes + 8, sizeof b);
  a += b;
  H4 c, e;
  std::memcpy(&c, &a, sizeof c);
  std::memcpy(&e, reinterpret_cast<const A*>(&a) + 4, sizeof e);
  c += e;
  H2 f, g;
  std::memcpy(&f, &c, sizeof f);
  std::memcpy(&g, reinterpret_cast<const A*>(&c) + 2, sizeof g);
  f += g;
  return f[0] + f[1];
}

// The lanes case when each output's elements lie contiguous in the source (a transposed bias
// gradient, a full sum): N runs p[0 .. N) of n elements each, starting at a chunk's first element,
// each summed exactly as add_to_lanes and the tree do (lane j takes the elements at j mod
// kSumLanes, from +0, in order, then the tree), out[r] = run r's chunk sum. The N runs' lanes are
// independent vector chains: one run at a time was one chain of dependent adds, bound by the
// add's latency (4 cycles a vector) rather than by the loads (2 a cycle).
// Not inlined: inlined into sum_to's task loop, it made GCC 12 compile the rows cases' loops there
// worse (AVX2 EPYC: the (256, 3072) bias gradient ~30% slower; docs/benchmarks.md, "Figures behind
// the code").
template <class A>
constexpr int64_t kRunPrefetch = 2048 / sizeof(A);  // 2 KB ahead
template <int N, class A>
__attribute__((noinline)) void run_sums(const A* const* p, int64_t n, A* out) {
  using V = SumVec<A>;
  constexpr int kW = sizeof(V) / sizeof(A), kN = kSumLanes / kW;
  V acc[N][kN];
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r)
#pragma GCC unroll 2
    for (int t = 0; t < kN; ++t) acc[r][t] = V{};
  int64_t m = 0;
  for (; m + kSumLanes <= n; m += kSumLanes)
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      // The runs are chunks of 4 KB (f32), a page each, and the hardware's stream prefetch does
      // not cross pages: each run starts cold. A software prefetch kRunPrefetch elements ahead,
      // within the run, every 4 cache lines: the full sum and the transposed bias gradient of
      // (4096 x 768) f32 ran ~13% faster on 2 threads (L3-resident, the AVX-512 EPYC; 1 thread:
      // the full sum too, the transposed bias unchanged; docs/benchmarks.md, "Figures behind the
      // code").
      if (m % 64 == 0 && m + kRunPrefetch<A> < n) __builtin_prefetch(p[r] + m + kRunPrefetch<A>);
#pragma GCC unroll 2
      for (int t = 0; t < kN; ++t) {
        V x;
        std::memcpy(&x, p[r] + m + t * kW, sizeof x);
        acc[r][t] += x;
      }
    }
  for (int r = 0; r < N; ++r) {
    alignas(64) A lanes[kSumLanes];
    std::memcpy(lanes, acc[r], sizeof lanes);
    for (int64_t q = m; q < n; ++q) lanes[q % kSumLanes] += p[r][q];
    out[r] = halving_tree(lanes);
  }
}
#pragma GCC diagnostic pop

// Runs summed side by side by run_sums: 8 vector chains on AVX-512 (f32: one vector a run, f64:
// two), 16 on AVX2 (two and four): every vector register an accumulator.
template <class A>
constexpr int kRunGroup = std::is_same_v<A, float> ? 8 : 4;

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
    // Operands in one storage (a view copied onto an overlapping one) keep the one-thread order.
    const int64_t min_parallel = dst.shares_storage(src) ? INT64_MAX : kParallelMinElems;
    dispatch_any(src.dtype(), [&]<class S>() {
      dispatch_any(dst.dtype(), [&]<class D>() {
        const S* s = static_cast<const S*>(src.raw_data());
        D* d = static_cast<D*>(dst.raw_data());
        strided_for_parallel<2>(dst.shape(), {&dst.strides(), &src.strides()}, min_parallel,
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
      strided_for_parallel<1>(dst.shape(), {&dst.strides()}, kParallelMinElems,
                              [&](const int64_t* off, int64_t n, const int64_t* step) {
                                for (int64_t i = 0; i < n; ++i) d[off[0] + i * step[0]] = v;
                              });
    });
  }

  void add_(const Tensor& dst, const Tensor& src, double alpha) override {
    if (src.dtype() != dst.dtype()) {  // f32 += bf16 / f16 (backend.h)
      ENGINE_ASSERT(src.shape() == dst.shape() && dst.dtype() == DType::f32 &&
                    dst.is_contiguous() && src.is_contiguous());
      dispatch_any(src.dtype(), [&]<class S>() {
        if constexpr (std::is_same_v<S, bf16_t> || std::is_same_v<S, f16_t>) {
          const S* s = static_cast<const S*>(src.raw_data());
          float* d = static_cast<float*>(dst.raw_data());
          const float a = static_cast<float>(alpha);
          const int64_t n = dst.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMinElems)
          for (int64_t i = 0; i < n; ++i) d[i] = d[i] + a * load(s[i]);
        } else {
          ENGINE_ASSERT(false);
        }
      });
      return;
    }
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
      const int64_t min_parallel = dst.shares_storage(src) ? INT64_MAX : kParallelMinElems;
      strided_for_parallel<2>(dst.shape(), {&dst.strides(), &src.strides()}, min_parallel,
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
    // The order is kSumLanes' contract. Work is cut into tasks (a chunk of the reduced index
    // times a block of outputs) that each write their chunk sums; threads take whole tasks, so
    // no sum depends on the thread count.
    const Shape& shape = src.shape();
    const std::vector<int64_t> dst_st = broadcast_strides(dst.shape(), dst.strides(), shape);
    SumDims kept, reduced;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      (dst_st[d] != 0 ? kept : reduced).add(shape[d], src.strides()[d]);
    }
    ENGINE_CHECK(kept.size.size() <= kMaxSumDims && reduced.size.size() <= kMaxSumDims, "[sum_to] ",
                 describe(src), " has more than ", kMaxSumDims, " dims that cannot be merged");
    const int64_t K = kept.count, R = reduced.count;
    if (K == 0) return;
    const int64_t chunks = std::max<int64_t>(1, (R + kSumChunk - 1) / kSumChunk);
    // One chunk (at most kSumChunk summed into each output): its sum is the output (0.0 + a chunk
    // sum, which is never -0.0, is itself), stored by the task that computes it; more: the tasks
    // write their chunk sums into `part` and a last pass adds them. (The batch-shared positional
    // bias, 196,608 outputs of 32 rows each, spent ~30% of its time in a fresh 1.5 MB `part`'s
    // page faults and the extra pass.)
    const bool direct = chunks == 1;
    // Scratch (engine/cpu/scratch.h), 64-byte aligned for the vector lanes. Slot 0: a task's
    // lanes, slot 1: the calling thread's chunk sums (the calling thread also runs tasks), slot 2:
    // a task's outputs when they go straight to the destination.
    std::vector<double, Eigen::aligned_allocator<double>> fresh_part;
    double* const part = direct ? nullptr : thread_scratch<double, 1>(chunks * K, fresh_part);
    // Rows: the source's innermost kept dim is contiguous, so each reduced index adds a row of
    // outputs at once (vectorised along the outputs); a task is a chunk times a block of one row.
    // f32 and f64 run strip_sums (lanes in registers, down the chunk's rows) or, on AVX2 builds
    // over more than kStripRows rows, lane_walk_sums; other types, and the last outputs of a row
    // that is not a whole number of vectors, read whole rows in order into lanes in memory.
    // (Lanes in memory had been chosen for chunks of over 64 rows wider than 256 on an earlier
    // CPU; on an AVX-512 VM strips were as fast or faster on the model's bias gradients and the
    // MLM decoder's, and ~8% slower only on a shape whose last 16 columns go through lanes in
    // memory: docs/benchmarks.md, "Figures behind the code".) Blocks of 4096 outputs (1024 measured
    // ~5% slower on the batch-shared bias). Lanes: each output sums its elements along the source,
    // in vector lanes when the innermost reduced dim is contiguous; a task is a run of chunks times
    // a block of outputs. AVX2 builds (16 registers: one 32-byte vector a lane) walk lane by lane
    // over more than kStripRows rows: strips read 32 bytes of each row per strip, hundreds of rows
    // apart, a pattern the prefetchers do not follow ((256, 3072): over twice PyTorch's time in
    // strips on the AVX2 EPYC, docs/benchmarks.md, "Figures behind the code"), and lanes in memory
    // load and store every lane on every row (see lane_walk_sums). AVX-512 builds keep strips (not
    // measured there).
    constexpr int64_t kStripRows = 64;
    constexpr bool kLaneWalk = kSumVecBytes == 32;
    const bool rows = !kept.size.empty() && kept.inner_stride() == 1 && kept.inner_size() >= 8;
    const int64_t inner = rows ? kept.inner_size() : 1;
    const int64_t per_chunk = std::min(R, kSumChunk);
    const int64_t threads = omp_get_max_threads();
    int64_t row_block = std::min<int64_t>(inner, 4096);
    // Fewer tasks than threads (one chunk of one row of outputs: a bias gradient over a small
    // batch, 256 rows of 3072) would leave all but one thread idle: the row is cut into as many
    // blocks as threads (whole cache lines; outputs are independent, so no bit changes).
    if (rows && chunks * (K / inner) < threads && inner >= 512 && src.numel() > kSumToParallel)
      row_block = std::min(row_block, (inner + threads - 1) / threads + 15) / 16 * 16;
    const int64_t row_blocks = (inner + row_block - 1) / row_block;
    const int64_t lane_block = std::clamp<int64_t>(4096 / std::max<int64_t>(per_chunk, 1), 1, K);
    const int64_t blocks = rows ? (K / inner) * row_blocks : (K + lane_block - 1) / lane_block;
    // Lanes tasks take runs of chunks of their outputs (a task per chunk cost a full sum 25%);
    // with contiguous runs (run_sums), at least 8 of them when there are so many chunks (a full
    // sum: one output, its chunks side by side).
    const bool contiguous_runs = !rows && reduced.size.size() == 1 && reduced.stride[0] == 1;
    const int64_t min_group =
        contiguous_runs ? std::min<int64_t>(chunks, std::max(kRunGroup<float>, kRunGroup<double>))
                        : 1;
    const int64_t group =
        rows ? 1 : std::clamp<int64_t>(chunks * blocks / 128, min_group, chunks);  // ~128 tasks
    const int64_t groups = (chunks + group - 1) / group;
    const int64_t tasks = R == 0 ? 0 : groups * blocks;
    const bool parallel = tasks > 1 && src.numel() > (per_chunk <= kStripRows ? kSumToParallelStrips
                                                                              : kSumToParallel);
    dispatch_any(src.dtype(), [&]<class T>() {
      using A = SumAcc<T>;
      const T* s = static_cast<const T*>(src.raw_data());
      T* d = static_cast<T*>(dst.raw_data());
      if (R == 0) {
        std::fill(d, d + K, store<T>(0.0));
        return;
      }
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t g = task / blocks, b = task % blocks;
        if (rows) {
          const int64_t c = g;
          const int64_t i0 = c * kSumChunk, i1 = std::min(R, i0 + kSumChunk);
          const int used = static_cast<int>(std::min<int64_t>(kSumLanes, i1 - i0));
          const int64_t o = b / row_blocks, j0 = (b % row_blocks) * row_block;
          const int64_t task_width = std::min(row_block, inner - j0);
          // This task's outputs: in `part`, or in a scratch stored to dst at the end (direct).
          std::vector<double, Eigen::aligned_allocator<double>> fresh_sums;
          double* const task_sums = direct ? thread_scratch<double, 2>(task_width, fresh_sums)
                                           : part + c * K + o * inner + j0;
          do {  // a block to break out of (a lambda here broke clang's OpenMP: a captured const)
            int64_t width = task_width;
            const T* base = s + SumCursor(kept, o * inner).off + j0;
            double* sums = task_sums;
            {
              int64_t row[kSumChunk];
              SumCursor r(reduced, i0);
              for (int64_t i = 0; i < i1 - i0; ++i, r.advance(1)) row[i] = r.off;
              const int64_t done = kLaneWalk && i1 - i0 > kStripRows
                                       ? lane_walk_sums(base, row, i1 - i0, width, sums)
                                       : strip_sums(base, row, i1 - i0, width, sums);
              // The rest (the last outputs, or a dtype without vector sums): the same order.
              base += done;
              sums += done;
              width -= done;
              if (width == 0) break;
            }
            SumCursor r(reduced, i0);
            if (i1 - i0 <= kSumLanes) {  // one element a lane: the tree straight from the rows
              std::array<const T*, kSumLanes> row;
              for (int q = 0; q < used; ++q, r.advance(1)) row[q] = base + r.off;
              combine_lanes<A>(row.data(), used, width, sums);
              break;
            }
            std::vector<A, Eigen::aligned_allocator<A>> fresh_lanes;
            A* lanes = thread_scratch<A, 0>(kSumLanes * width, fresh_lanes);
            // A lane's first element is 0 + x: stored, not added to a zeroed lane.
            for (int64_t i = i0; i < i1; ++i, r.advance(1)) {
              A* l = lanes + (i % kSumLanes) * width;
              const T* p = base + r.off;
              if (i - i0 < kSumLanes) {
                for (int64_t j = 0; j < width; ++j) l[j] = A(0) + static_cast<A>(load(p[j]));
              } else {
                for (int64_t j = 0; j < width; ++j) l[j] += static_cast<A>(load(p[j]));
              }
            }
            std::array<const A*, kSumLanes> lane;
            for (int q = 0; q < used; ++q) lane[q] = lanes + q * width;
            combine_lanes<A>(lane.data(), used, width, sums);
          } while (false);
          if (direct) {
            T* out = d + o * inner + j0;
            for (int64_t j = 0; j < task_width; ++j) out[j] = store<T>(task_sums[j]);
          }
        } else {
          const int64_t k0 = b * lane_block, k1 = std::min(K, k0 + lane_block);
          const int64_t c0 = g * group, c1 = std::min(chunks, c0 + group);
          const int64_t step = reduced.inner_stride();
          if constexpr (std::is_same_v<T, A> &&
                        (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
            if (contiguous_runs) {
              // Each (output, chunk) is one run; kRunGroup runs of one length go side by side.
              constexpr int G = kRunGroup<A>;
              const A* p[G];
              int64_t len[G], at[G];
              int pending = 0;
              auto flush = [&] {
                A sums[G];
                int r = 0;
                while (r < pending && len[r] == len[0]) ++r;
                if (r == G) {
                  run_sums<G>(p, len[0], sums);
                } else {
                  for (int q = 0; q < pending; ++q) run_sums<1>(p + q, len[q], sums + q);
                }
                for (int q = 0; q < pending; ++q) {
                  if (direct)
                    d[at[q]] = store<T>(double(sums[q]));
                  else
                    part[at[q]] = sums[q];
                }
                pending = 0;
              };
              SumCursor kc(kept, k0);
              for (int64_t k = k0; k < k1; ++k, kc.advance(1))
                for (int64_t c = c0; c < c1; ++c) {
                  const int64_t i0 = c * kSumChunk;
                  p[pending] = s + kc.off + i0;
                  len[pending] = std::min(R, i0 + kSumChunk) - i0;
                  at[pending] = direct ? k : c * K + k;
                  if (++pending == G) flush();
                }
              if (pending) flush();
              continue;
            }
          }
          SumCursor kc(kept, k0);
          for (int64_t k = k0; k < k1; ++k, kc.advance(1)) {
            SumCursor r(reduced, c0 * kSumChunk);
            for (int64_t c = c0; c < c1; ++c) {
              const int64_t i1 = std::min(R, (c + 1) * kSumChunk);
              alignas(64) A lanes[kSumLanes] = {};
              for (int64_t i = c * kSumChunk; i < i1;) {
                const int64_t n = std::min(r.run(), i1 - i);
                add_to_lanes(lanes, s + kc.off + r.off, step, i, n);
                r.advance(n);
                i += n;
              }
              // The fixed tree in halves of a vector, as in run_sums (lane_tree<16> on scalars
              // measured 0-10% slower here on the full sum).
              const A sum = halving_tree(lanes);
              if (direct)
                d[k] = store<T>(double(sum));
              else
                part[c * K + k] = sum;
            }
          }
        }
      }
      if (direct) return;
#pragma omp parallel for schedule(static) if (K > kParallelMinElems)
      for (int64_t k = 0; k < K; ++k) {
        double total = part[k];
        for (int64_t c = 1; c < chunks; ++c) total += part[c * K + k];
        d[k] = store<T>(total);
      }
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
