// CUDA kernels of index_select / embedding (see embedding.h).
//
// gather_rows: a grid-stride copy of 16-byte units (rows whose bytes are a multiple of 16 and
// aligned), else element by element; any dtype. An index outside [0, N) is never read with: its
// row is zeros and the index is reported (device_error.cuh: raised at the next host read).
//
// scatter_add_rows, deterministic and without atomics, from the inverted index (the M keys
// (id << 32) | position in increasing order: each table row's positions as one run):
//   1. sort_index_keys (once per call, or once for an index that never changes: the relative
//      position maps): tiles of 2048 keys sorted in shared memory by a bitonic network, then
//      merge passes that place each key by a binary search in its partner run (the keys are
//      unique, so every element's rank is exact and the result does not depend on the order).
//   2. a segmented sum in levels: the sorted keys are cut into pieces (32 keys at the first level,
//      8 entries at the later ones: kFirstPiece, kLaterPiece); thread (piece,
//      16-byte column slice) sums each run of one row's keys inside its piece (the gradient rows
//      gathered from their positions). A run that holds its row's first and last key is the
//      whole sum: added into the table. Otherwise it is a part: the piece's first run (if its row
//      began earlier) and last run (if its row goes on) become the two entries of the piece at
//      the next level, with the flags "holds the first / the last". Each level has 2 entries per
//      piece of the level below; one piece holds everything at the last level. BERT's [MASK]
//      token (~12% of a batch's ids) or a 2-row segment table are summed by many threads, not a
//      chain of thousands of additions in one.
// Sums in f32 (f64 for f64), in a fixed order: the same bits on every run. A row whose keys fit
// in one piece is summed in index order like the CPU; longer runs as pieces in order (within
// float tolerance of the CPU, not bit for bit).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/cuda/context.h"
#include "engine/cuda/device_error.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/reduce.cuh"
#include "engine/cuda/strided.cuh"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "ops/embedding.h"

namespace engine::cuda {
namespace {

// ---- gather ------------------------------------------------------------------------------------

template <class T, class I>
__global__ void gather_rows_elems(const T* table, const I* index, T* out, int64_t m, int64_t d,
                                  int64_t rows, DeviceIndexError* err) {
  const int64_t n = m * d;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += stride) {
    const int64_t i = e / d, c = e - i * d;
    const int64_t r = static_cast<int64_t>(index[i]);
    if (r < 0 || r >= rows) {
      if (c == 0) report_bad_index(err, IndexCheck::embedding_id, i, r, rows);
      out[e] = T();
      continue;
    }
    out[e] = table[r * d + c];
  }
}

// Rows of dv 16-byte units.
template <class I>
__global__ void gather_rows_vec16(const uint4* table, const I* index, uint4* out, int64_t m,
                                  int64_t dv, int64_t rows, FastDiv units, DeviceIndexError* err) {
  const int64_t n = m * dv;
  const bool narrow = n < (int64_t{1} << 31);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += stride) {
    const int64_t i = narrow ? units.div(static_cast<uint32_t>(e)) : e / dv, c = e - i * dv;
    const int64_t r = static_cast<int64_t>(index[i]);
    if (r < 0 || r >= rows) {
      if (c == 0) report_bad_index(err, IndexCheck::embedding_id, i, r, rows);
      out[e] = uint4{0, 0, 0, 0};
      continue;
    }
    out[e] = table[r * dv + c];
  }
}

void gather_rows(const Tensor& table, const Tensor& index, const Tensor& out) {
  const int64_t m = out.shape()[0], d = out.shape()[1], rows = table.shape()[0];
  if (m == 0 || d == 0) return;
  DeviceGuard guard(out.device().index);
  const cudaStream_t stream = compute_stream(out.device().index);
  const int64_t row_bytes = d * static_cast<int64_t>(dtype_size(table.dtype()));
  DeviceIndexError* err = device_index_error(out.device().index);
  auto cfg = [&](int64_t n) {
    return LaunchConfig{dim3(grid_blocks(n, kElementwiseThreads)), dim3(kElementwiseThreads), 0,
                        stream};
  };
  dispatch_index(index.dtype(), "gather_rows", [&]<class I>() {
    if (row_bytes % 16 == 0 && aligned16(table.raw_data()) && aligned16(out.raw_data())) {
      const int64_t dv = row_bytes / 16;
      ENGINE_LAUNCH((gather_rows_vec16<I>), cfg(m * dv),
                    static_cast<const uint4*>(table.raw_data()), dptr<const I>(index),
                    static_cast<uint4*>(out.raw_data()), m, dv, rows,
                    FastDiv(static_cast<uint32_t>(dv < (int64_t{1} << 31) ? dv : 1)), err);
      return;
    }
    cuda::dispatch_device_all(table.dtype(), [&]<class T>() {
      ENGINE_LAUNCH((gather_rows_elems<T, I>), cfg(m * d), dptr<const T>(table),
                    dptr<const I>(index), dptr<T>(out), m, d, rows, err);
    });
  });
}

// ---- the inverted index: sorted keys -----------------------------------------------------------

constexpr int kSortTile = 2048;
constexpr int kSortThreads = 1024;
constexpr uint64_t kNoKey = ~uint64_t{0};

// Keys of tile blockIdx.x (kSortTile ids) made and sorted in shared memory (bitonic network). A
// bad id is reported and keyed as row `rows`, which the scatter skips.
template <class I>
__global__ void sort_key_tiles(const I* index, int64_t m, int64_t rows, uint64_t* keys,
                               DeviceIndexError* err) {
  __shared__ uint64_t sh[kSortTile];
  const int64_t base = blockIdx.x * int64_t(kSortTile);
  for (int i = threadIdx.x; i < kSortTile; i += blockDim.x) {
    const int64_t e = base + i;
    uint64_t key = kNoKey;
    if (e < m) {
      int64_t id = static_cast<int64_t>(index[e]);
      if (id < 0 || id >= rows) {
        report_bad_index(err, IndexCheck::embedding_id, e, id, rows);
        id = rows;
      }
      key = (static_cast<uint64_t>(id) << 32) | static_cast<uint64_t>(e);
    }
    sh[i] = key;
  }
  __syncthreads();
  for (int k = 2; k <= kSortTile; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < kSortTile; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner > i) {
          const uint64_t a = sh[i], b = sh[partner];
          const bool ascending = (i & k) == 0;
          if ((a > b) == ascending) {
            sh[i] = b;
            sh[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < kSortTile; i += blockDim.x)
    if (base + i < m) keys[base + i] = sh[i];
}

// Merges sorted runs of `width` pairwise: a key's place is its rank in its own run plus the
// number of smaller keys in the partner run (the keys are unique).
__global__ void merge_key_runs(const uint64_t* src, uint64_t* dst, int64_t m, int64_t width) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m; i += stride) {
    const int64_t s = i / (2 * width) * (2 * width);
    const int64_t mid = s + width < m ? s + width : m, end = s + 2 * width < m ? s + 2 * width : m;
    const uint64_t key = src[i];
    int64_t lo, hi, own;
    if (i < mid) {
      lo = mid, hi = end, own = i - s;
    } else {
      lo = s, hi = mid, own = i - mid;
    }
    int64_t a = lo, b = hi;
    while (a < b) {
      const int64_t h = a + (b - a) / 2;
      if (src[h] < key)
        a = h + 1;
      else
        b = h;
    }
    dst[s + own + (a - lo)] = key;
  }
}

void sort_index_keys(const Tensor& index, int64_t rows, const Tensor& keys) {
  const int64_t m = index.numel();
  if (m == 0) return;
  const int device = index.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = compute_stream(device);
  const int64_t tiles = (m + kSortTile - 1) / kSortTile;
  int passes = 0;
  for (int64_t w = kSortTile; w < m; w *= 2) ++passes;
  // Ping-pong so that the last pass writes `keys`.
  Tensor scratch = passes > 0 ? Tensor::empty({m}, DType::i64, index.device()) : Tensor();
  uint64_t* out = static_cast<uint64_t*>(keys.raw_data());
  uint64_t* other = passes > 0 ? static_cast<uint64_t*>(scratch.raw_data()) : nullptr;
  uint64_t* cur = passes % 2 ? other : out;
  uint64_t* next = passes % 2 ? out : other;
  dispatch_index(index.dtype(), "sort_index_keys", [&]<class I>() {
    ENGINE_LAUNCH(sort_key_tiles<I>,
                  (LaunchConfig{dim3(static_cast<unsigned>(tiles)), dim3(kSortThreads), 0, stream}),
                  dptr<const I>(index), m, rows, cur, device_index_error(device));
  });
  const LaunchConfig cfg{dim3(grid_blocks(m, kElementwiseThreads)), dim3(kElementwiseThreads), 0,
                         stream};
  for (int64_t w = kSortTile; w < m; w *= 2) {
    ENGINE_LAUNCH(merge_key_runs, cfg, static_cast<const uint64_t*>(cur), next, m, w);
    uint64_t* t = cur;
    cur = next;
    next = t;
  }
}

// ---- the scatter: a segmented sum in levels ----------------------------------------------------

// Keys (entries) a thread sums: 32 at the first level, 8 at the later ones. A level's time is
// its serial rounds of dependent loads (piece / kAhead of them, each an L2 miss); the later levels
// hold 2 entries per piece of the level below, so small pieces there cost a level or two more
// and a few rounds each instead of 16 (pieces of 64 everywhere until 2026-12-06: three levels at
// BERT-Large's 16,384 ids, the last two of 16 rounds for a handful of entries).
constexpr int kFirstPiece = 32, kLaterPiece = 8;
constexpr int kAhead = 4;  // entries a thread loads before summing them
constexpr uint8_t kHoldsFirst = 1, kHoldsLast = 2;

template <class T>
using ScatterAcc = std::conditional_t<std::is_same_v<Acc<T>, double>, double, float>;

// One level. Level 0 (keys set): entry k is gradient row (keys[k] & 0xffffffff) of table row
// keys[k] >> 32; its flags come from its neighbours. Later levels: entry k is (ids[k] (-1: none),
// flags[k], vals[k]). Writes the complete sums into `table` and, when next_ids is set, the two
// part entries of each piece.
// G: the gradient rows' dtype (T, or 16 bits into an f32 table: widened as loaded).
template <class T, class G, int V>
__global__ void scatter_level(const uint64_t* keys, const G* grad, const int32_t* ids,
                              const uint8_t* flags, const ScatterAcc<T>* vals, int64_t n, int64_t d,
                              int64_t rows, T* table, int32_t* next_ids, uint8_t* next_flags,
                              ScatterAcc<T>* next_vals, int piece) {
  using A = ScatterAcc<T>;
  const int64_t p = blockIdx.x * int64_t(blockDim.y) + threadIdx.y;
  const int64_t c = (blockIdx.y * int64_t(blockDim.x) + threadIdx.x) * V;
  const int64_t b = p * piece;
  if (b >= n) return;
  const int64_t e = b + piece < n ? b + piece : n;
  const bool active = c < d;
  const bool writer = threadIdx.x == 0 && blockIdx.y == 0;  // writes the piece's entry ids
  int32_t cur = -1;
  uint8_t held = 0;
  A acc[V];
  int32_t head_id = -1, tail_id = -1;
  uint8_t head_flags = 0;
  auto flush = [&]() {
    if (cur < 0) return;
    if (held == (kHoldsFirst | kHoldsLast)) {  // the whole sum
      if (active) {
        T* row = table + static_cast<int64_t>(cur) * d + c;
#pragma unroll
        for (int j = 0; j < V; ++j) row[j] = from_acc<T>(static_cast<A>(to_acc(row[j])) + acc[j]);
      }
      return;
    }
    // A part: the piece's first run (its row began earlier) or its last (its row goes on).
    const int64_t slot = (held & kHoldsFirst) ? 2 * p + 1 : 2 * p;
    if (held & kHoldsFirst)
      tail_id = cur;
    else
      head_id = cur, head_flags = held;
    if (active)
#pragma unroll
      for (int j = 0; j < V; ++j) next_vals[slot * d + c + j] = acc[j];
  };
  // kAhead entries at a time: their ids, flags and values are all loaded before any is summed,
  // so a thread has kAhead loads in flight instead of one (a piece of 64 dependent loads, each
  // an L2 miss, set each level's time on the H200; docs/benchmarks.md, "Figures behind the code").
  // The sums run in entry order as before.
  for (int64_t k0 = b; k0 < e; k0 += kAhead) {
    int32_t idb[kAhead];
    uint8_t fb[kAhead];
    A xb[kAhead][V];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int64_t k = k0 + u;
      idb[u] = -1;
      fb[u] = 0;
#pragma unroll
      for (int j = 0; j < V; ++j) xb[u][j] = A(0);
      if (k >= e) continue;
      if (keys) {
        const int32_t id = static_cast<int32_t>(keys[k] >> 32);
        if (id >= rows) continue;  // a bad id (reported by the sort), keyed past the table
        uint8_t f = 0;
        if (k == 0 || static_cast<int32_t>(keys[k - 1] >> 32) != id) f |= kHoldsFirst;
        if (k == n - 1 || static_cast<int32_t>(keys[k + 1] >> 32) != id) f |= kHoldsLast;
        idb[u] = id;
        fb[u] = f;
        if (!active) continue;
        const int64_t pos = static_cast<int64_t>(keys[k] & 0xffffffffu);
        const G* g = grad + pos * d + c;
        if constexpr (V > 1) {
          const Vec<G, V> x = *reinterpret_cast<const Vec<G, V>*>(g);
#pragma unroll
          for (int j = 0; j < V; ++j) xb[u][j] = static_cast<A>(to_acc(x.v[j]));
        } else {
          xb[u][0] = static_cast<A>(to_acc(*g));
        }
      } else {
        const int32_t id = ids[k];
        if (id < 0) continue;
        idb[u] = id;
        fb[u] = flags[k];
        if (!active) continue;
        const A* v = vals + k * d + c;
#pragma unroll
        for (int j = 0; j < V; ++j) xb[u][j] = v[j];
      }
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (idb[u] < 0) continue;
      if (idb[u] != cur) {
        flush();
        cur = idb[u];
        held = 0;
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = A(0);
      }
      held |= fb[u];
      if (!active) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += xb[u][j];
    }
  }
  flush();
  if (writer && next_ids) {
    next_ids[2 * p] = head_id;
    next_flags[2 * p] = head_flags;
    next_ids[2 * p + 1] = tail_id;
    next_flags[2 * p + 1] = kHoldsFirst;
  }
}

void scatter_add_rows(const Tensor& grad_out, const Tensor& index, const Tensor& inverted,
                      const Tensor& grad_table) {
  const int64_t m = grad_out.shape()[0], d = grad_out.shape()[1], rows = grad_table.shape()[0];
  if (m == 0 || d == 0 || rows == 0) return;
  const int device = grad_table.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = compute_stream(device);
  const Tensor keys = inverted.defined() ? inverted : sorted_index_keys(index, rows);
  ENGINE_CHECK(keys.numel() == m && keys.dtype() == DType::i64, "[scatter_add_rows] the inverted ",
               "index ", describe(keys), " does not have one i64 key per id (", m, ")");
  const bool widen = grad_out.dtype() != grad_table.dtype();
  ENGINE_CHECK(!widen || (grad_table.dtype() == DType::f32 &&
                          (grad_out.dtype() == DType::bf16 || grad_out.dtype() == DType::f16)),
               "[scatter_add_rows] gradient rows ", describe(grad_out), " into a table ",
               describe(grad_table), ": expected one dtype, or 16-bit rows into an f32 table");
  cuda::dispatch_device_floating(grad_table.dtype(), "scatter_add_rows", [&]<class T>() {
    using A = ScatterAcc<T>;
    constexpr int kV = reduce_vec<T>();
    auto run = [&]<class G, int V>() {
      const int bx = [&] {
        int x = 1;
        while (x < kWarpSize && x < d / V) x *= 2;
        return x;
      }();
      const int by = kReduceThreads / bx;
      const unsigned col_blocks = static_cast<unsigned>((d / V + bx - 1) / bx);
      int64_t n = m;
      Tensor ids, flags, vals;  // the current level's entries (undefined at level 0)
      for (int level = 0;; ++level) {
        const int piece = level == 0 ? kFirstPiece : kLaterPiece;
        const int64_t pieces = (n + piece - 1) / piece;
        const bool last = pieces == 1;
        Tensor nids, nflags, nvals;
        if (!last) {
          nids = Tensor::empty({2 * pieces}, DType::i32, grad_table.device());
          nflags = Tensor::empty({2 * pieces}, DType::u8, grad_table.device());
          nvals = Tensor::empty({2 * pieces * d}, sizeof(A) == 8 ? DType::f64 : DType::f32,
                                grad_table.device());
        }
        const LaunchConfig cfg{dim3(static_cast<unsigned>((pieces + by - 1) / by), col_blocks),
                               dim3(bx, by), 0, stream};
        // named for the performance model: pieces of kFirstPiece, then kLaterPiece
        launch_kernel("scatter_pieces", scatter_level<T, G, V>, cfg,
                      level == 0 ? static_cast<const uint64_t*>(keys.raw_data()) : nullptr,
                      static_cast<const G*>(grad_out.raw_data()), dptr<const int32_t>(ids),
                      dptr<const uint8_t>(flags),
                      static_cast<const A*>(vals.defined() ? vals.raw_data() : nullptr), n, d, rows,
                      dptr<T>(grad_table), dptr<int32_t>(nids), dptr<uint8_t>(nflags),
                      static_cast<A*>(nvals.defined() ? nvals.raw_data() : nullptr), piece);
        if (last) break;
        ids = nids, flags = nflags, vals = nvals;
        n = 2 * pieces;
      }
    };
    // 16-byte table columns (8-byte rows of a 16-bit gradient), or one element a thread
    const bool vec =
        d % kV == 0 && aligned16(grad_out.raw_data()) && aligned16(grad_table.raw_data());
    auto with_rows = [&]<class G>() {
      if (vec)
        run.template operator()<G, kV>();
      else
        run.template operator()<G, 1>();
    };
    if constexpr (std::is_same_v<T, float>) {
      if (grad_out.dtype() == DType::bf16) return with_rows.template operator()<__nv_bfloat16>();
      if (grad_out.dtype() == DType::f16) return with_rows.template operator()<__half>();
    }
    with_rows.template operator()<T>();
  });
}

// ---- add_rows: a scatter whose rows are distinct -----------------------------------------------

// table[index[i]] += grad[i], V elements a thread (16 bytes when the rows allow), in the scatter's
// accumulation type: the bits scatter_level gives a row of one key.
template <class T, class I, int V>
__global__ void add_rows_vec(const T* grad, const I* index, T* table, int64_t m, int64_t dv,
                             int64_t rows) {
  using A = ScatterAcc<T>;
  const int64_t n = m * dv;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / dv, c = e - i * dv;
    const int64_t r = static_cast<int64_t>(index[i]);
    if (r < 0 || r >= rows) continue;  // gather_rows reported it; the row gets nothing
    const Vec<T, V> g = reinterpret_cast<const Vec<T, V>*>(grad)[e];
    Vec<T, V>& dst = reinterpret_cast<Vec<T, V>*>(table)[r * dv + c];
    Vec<T, V> o = dst;
#pragma unroll
    for (int j = 0; j < V; ++j)
      o.v[j] = from_acc<T>(static_cast<A>(to_acc(o.v[j])) + static_cast<A>(to_acc(g.v[j])));
    dst = o;
  }
}

void add_rows(const Tensor& grad_out, const Tensor& index, const Tensor& grad_table) {
  const int64_t m = grad_out.shape()[0], d = grad_out.shape()[1], rows = grad_table.shape()[0];
  if (m == 0 || d == 0) return;
  DeviceGuard guard(grad_out.device().index);
  const cudaStream_t stream = compute_stream(grad_out.device().index);
  dispatch_index(index.dtype(), "add_rows", [&]<class I>() {
    dispatch_device_floating(grad_table.dtype(), "add_rows", [&]<class T>() {
      constexpr int kV = sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T));
      const bool vec =
          d % kV == 0 && aligned16(grad_out.raw_data()) && aligned16(grad_table.raw_data());
      auto launch = [&](auto kernel, int v) {
        const LaunchConfig cfg{dim3(grid_blocks(m * (d / v), kElementwiseThreads)),
                               dim3(kElementwiseThreads), 0, stream};
        launch_kernel("add_rows_vec", kernel, cfg, dptr<const T>(grad_out), dptr<const I>(index),
                      dptr<T>(grad_table), m, d / v, rows);
      };
      if (vec)
        launch(add_rows_vec<T, I, kV>, kV);
      else
        launch(add_rows_vec<T, I, 1>, 1);
    });
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(gather_rows_kernel, DeviceType::CUDA, gather_rows);
ENGINE_REGISTER_KERNEL(add_rows_kernel, DeviceType::CUDA, add_rows);
ENGINE_REGISTER_KERNEL(scatter_add_rows_kernel, DeviceType::CUDA, scatter_add_rows);
ENGINE_REGISTER_KERNEL(sort_index_keys_kernel, DeviceType::CUDA, sort_index_keys);

}  // namespace engine::cuda
