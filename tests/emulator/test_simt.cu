// [emulator] The SIMT emulator on kernels that are right (barriers, shuffles of every width,
// votes, atomics across blocks, dynamic shared memory) and on kernels with each bug class it must
// catch, seeded: every fault is reported at synchronisation as cudaErrorLaunchFailure whose text
// names the kernel, the block and the thread.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "emu/runtime.h"
#include "engine/cuda/cluster.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/wmma.cuh"

using engine::cuda::LaunchConfig;
namespace wmma = nvcuda::wmma;
namespace cg = cooperative_groups;

namespace {

LaunchConfig cfg(unsigned grid, unsigned block, size_t smem = 0) {
  return LaunchConfig{dim3(grid), dim3(block), smem, nullptr};
}

template <class T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n, T fill = T()) : n(n) {
    REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
    std::vector<T> h(n, fill);
    REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  T* p = nullptr;
  size_t n;
};

// Synchronises, expects a fault whose text contains every piece, and clears the device.
void expect_fault(const std::vector<std::string>& pieces) {
  const cudaError_t e = cudaDeviceSynchronize();
  REQUIRE(e == cudaErrorLaunchFailure);
  const std::string text = cudaGetErrorString(e);
  INFO(text);
  for (const std::string& p : pieces) CHECK(text.find(p) != std::string::npos);
  emu::clear_sticky_error();
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

// ---- right kernels ---------------------------------------------------------------------------

__global__ void block_reduce(const float* x, float* out, int n) {
  __shared__ float warp_sums[32];
  float a = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) a += x[i];
  for (int o = 16; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = a;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o /= 2) w += __shfl_down_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) atomicAdd(out, w);
  }
}

__global__ void shuffles(int* out) {
  const int lane = threadIdx.x;
  out[0 * 32 + lane] = __shfl_sync(0xffffffffu, lane * 10, 3);      // broadcast lane 3
  out[1 * 32 + lane] = __shfl_sync(0xffffffffu, lane * 10, 1, 8);   // lane 1 of each 8
  out[2 * 32 + lane] = __shfl_up_sync(0xffffffffu, lane, 2);        // lanes 0, 1 keep theirs
  out[3 * 32 + lane] = __shfl_down_sync(0xffffffffu, lane, 4, 16);  // within halves
  out[4 * 32 + lane] = __shfl_xor_sync(0xffffffffu, lane, 5);
  out[5 * 32 + lane] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  out[6 * 32 + lane] = __any_sync(0xffffffffu, lane == 17);
  out[7 * 32 + lane] = __all_sync(0xffffffffu, lane < 31);
  out[8 * 32 + lane] = __syncthreads_count(lane % 4 == 0);
  if (lane < 16) out[9 * 32 + lane] = __shfl_xor_sync(0x0000ffffu, lane, 1);  // half a warp
}

__global__ void dynamic_scan(const int* x, int* out, int n) {
  ENGINE_DYNAMIC_SHARED(int, buf);
  const int t = threadIdx.x;
  buf[t] = t < n ? x[t] : 0;
  __syncthreads();
  for (int off = 1; off < blockDim.x; off *= 2) {  // Hillis-Steele, two barriers per step
    int v = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += v;
    __syncthreads();
  }
  if (t < n) out[t] = buf[t];
}

// A cluster's blocks sum their rows through distributed shared memory: each block writes a row
// of its own (rank-dependent values) into its shared memory, then block r adds element t of every
// block's row in rank order and writes it, with the block's place in the cluster, for the host.
// Twice over the same buffer (the second round's writes wait for the first round's reads: the
// second cluster.sync), and a last sync before exit (the others read this block's memory).
__global__ void cluster_row_sums(int* out, int* where) {
  ENGINE_DYNAMIC_SHARED(int, row);
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), n = cluster.num_blocks();
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  for (int round = 0; round < 2; ++round) {
    row[threadIdx.x] = int(rank + 1) * 100 * (round + 1) + int(threadIdx.x);
    cluster.sync();  // every row written
    int s = 0;
    for (unsigned r = 0; r < n; ++r) s += cluster.map_shared_rank(row, int(r))[threadIdx.x];
    out[(round * gridDim.x * gridDim.y * gridDim.z + block) * blockDim.x + threadIdx.x] = s;
    cluster.sync();  // every row read before it is written again, or the block exits
  }
  if (threadIdx.x == 0) {
    const dim3 d = cluster.dim_blocks(), i = cluster.block_index();
    int* w = where + block * 7;
    w[0] = int(rank), w[1] = int(n), w[2] = int(d.x), w[3] = int(d.y), w[4] = int(i.x);
    w[5] = int(i.y), w[6] = int(d.z * 10 + i.z);
  }
}

// ---- seeded bugs -----------------------------------------------------------------------------

// Cluster misuse: what 0: block rank 1 returns before the cluster barrier the others wait in;
// 1: a rank outside the cluster; 2: a read of another block's bytes it never wrote; 3: a block
// reads its neighbour's memory after the neighbour exited (no sync before exit): rank 1 waits
// for rank 0's flag (out[63], raised as it leaves) and a while longer, so that rank 0 is gone.
__global__ void cluster_misuse(int* out, int what) {
  ENGINE_DYNAMIC_SHARED(int, buf);
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), n = cluster.num_blocks();
  if (what == 0) {
    buf[threadIdx.x] = 1;
    if (rank == 1) return;
    cluster.sync();
    out[threadIdx.x] = buf[threadIdx.x];
  }
  if (what == 1) out[threadIdx.x] = cluster.map_shared_rank(buf, int(n))[threadIdx.x];
  if (what == 2) {
    if (threadIdx.x != 0) buf[threadIdx.x] = 1;
    cluster.sync();
    out[threadIdx.x] = cluster.map_shared_rank(buf, int((rank + 1) % n))[threadIdx.x];
    cluster.sync();
  }
  if (what == 3) {
    buf[threadIdx.x] = 1;
    cluster.sync();
    if (rank == 0) {  // leaves; block 1 reads its memory afterwards
      if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(out + 63, 1);
      return;
    }
    if (blockIdx.x == 1) {
      while (!__syncthreads_or(atomicAdd(out + 63, 0) != 0)) {
      }
      for (int spin = 0; spin < 200; ++spin) __syncthreads();
    }
    out[threadIdx.x] = cluster.map_shared_rank(buf, 0)[threadIdx.x];
  }
}

__global__ void divergent_barrier(float* x) {
  if (threadIdx.x % 2 == 0) {
    x[threadIdx.x] = 1;
    __syncthreads();
  } else {
    x[threadIdx.x] = 2;
    __syncthreads();
  }
}

__global__ void barrier_after_early_exit(float* x, int n) {
  const int i = threadIdx.x;
  if (i >= n) return;
  x[i] = 1;
  __syncthreads();
}

__global__ void warp_vs_block_deadlock(float* x) {
  float v = threadIdx.x;
  if (threadIdx.x == 5) {
    __syncthreads();
  } else {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    __syncthreads();
  }
  x[threadIdx.x] = v;
}

__global__ void mask_names_exited_lane(float* x) {
  if (threadIdx.x >= 16) return;
  x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void mask_without_caller(float* x) {
  if (threadIdx.x < 16) x[threadIdx.x] = __shfl_xor_sync(0xffff0000u, 1.0f, 1);
}

__global__ void shuffle_from_inactive_lane(float* x) {
  if (threadIdx.x < 16) x[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 20);
}

__global__ void dynamic_overflow(float* x) {
  ENGINE_DYNAMIC_SHARED(float, buf);
  buf[threadIdx.x + 1] = 1.0f;  // one past the end for the last thread
  __syncthreads();
  x[threadIdx.x] = buf[threadIdx.x + 1];
}

__global__ void dynamic_overflow_raw(float* x) {
  ENGINE_DYNAMIC_SHARED(float, buf);
  float* raw = buf;  // unchecked: the canary after the region catches it when the block ends
  raw[threadIdx.x + 2] = 1.0f;
  x[threadIdx.x] = 0;
}

__global__ void read_before_write(float* x) {
  ENGINE_DYNAMIC_SHARED(float, buf);
  if (threadIdx.x != 3) buf[threadIdx.x] = 1.0f;
  __syncthreads();
  x[threadIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];  // thread 2 reads slot 3
}

// Thread i reads what thread i - 1 wrote, with no barrier: the answer depends on the schedule.
__global__ void racy_neighbour(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = 0;
  __syncthreads();
  s[threadIdx.x] = threadIdx.x + 1;
  out[threadIdx.x] = threadIdx.x ? s[threadIdx.x - 1] : 0;
}

// Warp matrix functions misused (what: 0 a pointer off 256-bit alignment, 1 an ldm of 12
// elements, 2 a pointer that differs between lanes, 3 half the warp calling).
__global__ void wmma_misuse(const __nv_bfloat16* a, float* out, int what) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> f;
  const int lane = threadIdx.x % 32;
  if (what == 0) wmma::load_matrix_sync(f, a + 8, 16);
  if (what == 1) wmma::load_matrix_sync(f, a, 12);
  if (what == 2) wmma::load_matrix_sync(f, a + (lane % 2) * 256, 16);
  if (what == 3 && lane < 16) wmma::load_matrix_sync(f, a, 16);
  out[threadIdx.x] = static_cast<float>(f.x[0]);
}

}  // namespace

TEST_CASE(
    "seeded: warp matrix functions with a misaligned pointer, a bad ldm, non-uniform "
    "arguments, half a warp",
    "[emulator]") {
  DeviceBuffer<__nv_bfloat16> a(1024);
  DeviceBuffer<float> out(32);
  ENGINE_LAUNCH(wmma_misuse, cfg(1, 32), a.p, out.p, 0);
  expect_fault({"kernel 'wmma_misuse'", "wmma::load_matrix_sync", "not 256-bit aligned"});
  ENGINE_LAUNCH(wmma_misuse, cfg(1, 32), a.p, out.p, 1);
  expect_fault({"wmma::load_matrix_sync", "ldm 12 is not a multiple of 8"});
  ENGINE_LAUNCH(wmma_misuse, cfg(1, 32), a.p, out.p, 2);
  expect_fault({"wmma::load_matrix_sync", "lane 1 passed another pointer", "warp-uniform"});
  ENGINE_LAUNCH(wmma_misuse, cfg(1, 32), a.p, out.p, 3);
  expect_fault({"kernel 'wmma_misuse'", "thread ("});
}

TEST_CASE("a block reduction with shuffles, shared memory and atomics across blocks",
          "[emulator]") {
  const int n = 10000;
  DeviceBuffer<float> x(n, 0.5f), out(1, 0.0f);
  ENGINE_LAUNCH(block_reduce, cfg(7, 128), x.p, out.p, n);
  REQUIRE(out.host()[0] == 5000.0f);
}

TEST_CASE("shuffles of every kind and width, votes and __syncthreads_count", "[emulator]") {
  DeviceBuffer<int> out(10 * 32, -1);
  ENGINE_LAUNCH(shuffles, cfg(1, 32), out.p);
  std::vector<int> h = out.host();
  for (int l = 0; l < 32; ++l) {
    INFO("lane " << l);
    CHECK(h[0 * 32 + l] == 30);
    CHECK(h[1 * 32 + l] == ((l / 8) * 8 + 1) * 10);
    CHECK(h[2 * 32 + l] == (l >= 2 ? l - 2 : l));
    CHECK(h[3 * 32 + l] == (l % 16 + 4 < 16 ? l + 4 : l));
    CHECK(h[4 * 32 + l] == (l ^ 5));
    CHECK(static_cast<unsigned>(h[5 * 32 + l]) == 0x49249249u);
    CHECK(h[6 * 32 + l] == 1);
    CHECK(h[7 * 32 + l] == 0);
    CHECK(h[8 * 32 + l] == 8);
    CHECK(h[9 * 32 + l] == (l < 16 ? (l ^ 1) : -1));
  }
}

TEST_CASE("dynamic shared memory: a scan within the launch's bytes", "[emulator]") {
  const int n = 100;
  std::vector<int> in(n);
  for (int i = 0; i < n; ++i) in[i] = i % 7;
  DeviceBuffer<int> x(n), out(n, 0);
  REQUIRE(cudaMemcpy(x.p, in.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  ENGINE_LAUNCH(dynamic_scan, cfg(1, 128, 128 * sizeof(int)), x.p, out.p, n);
  std::vector<int> h = out.host();
  int acc = 0;
  for (int i = 0; i < n; ++i) REQUIRE(h[i] == (acc += in[i]));
}

TEST_CASE("launch configurations the real runtime refuses", "[emulator]") {
  DeviceBuffer<float> x(64);
  REQUIRE_THROWS_WITH(
      ENGINE_LAUNCH(divergent_barrier, cfg(1, 1025), x.p),
      Catch::Contains("divergent_barrier") && Catch::Contains("invalid configuration argument"));
  REQUIRE_THROWS_WITH(ENGINE_LAUNCH(dynamic_overflow, cfg(1, 32, 64 * 1024), x.p),
                      Catch::Contains("invalid argument"));
  REQUIRE(cudaFuncSetAttribute(reinterpret_cast<const void*>(&dynamic_scan),
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               64 * 1024) == cudaSuccess);
  DeviceBuffer<int> in(64, 1), out(64);
  ENGINE_LAUNCH(dynamic_scan, cfg(1, 64, 64 * 1024), in.p, out.p, 64);
  REQUIRE(out.host()[63] == 64);
}

TEST_CASE("thread block clusters: ranks, the cluster barrier, distributed shared memory",
          "[emulator]") {
  const int threads = 64;
  // 1-D clusters of 4 over 8 blocks, and 2 x 2 clusters over a (4, 2, 1) grid.
  for (const auto& [grid, cluster] :
       {std::pair{dim3(8), dim3(4)}, std::pair{dim3(4, 2), dim3(2, 2)}}) {
    const unsigned blocks = grid.x * grid.y * grid.z, n = cluster.x * cluster.y * cluster.z;
    DeviceBuffer<int> out(2 * blocks * threads, -1), where(blocks * 7, -1);
    LaunchConfig c{grid, dim3(threads), threads * sizeof(int), nullptr, cluster};
    ENGINE_LAUNCH(cluster_row_sums, c, out.p, where.p);
    const std::vector<int> h = out.host(), w = where.host();
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        const unsigned block = bx + grid.x * by;
        const unsigned ix = bx % cluster.x, iy = by % cluster.y, rank = ix + cluster.x * iy;
        INFO("block " << bx << "," << by);
        CHECK(w[block * 7 + 0] == int(rank));
        CHECK(w[block * 7 + 1] == int(n));
        CHECK(w[block * 7 + 2] == int(cluster.x));
        CHECK(w[block * 7 + 3] == int(cluster.y));
        CHECK(w[block * 7 + 4] == int(ix));
        CHECK(w[block * 7 + 5] == int(iy));
        CHECK(w[block * 7 + 6] == 10);
        for (int round = 0; round < 2; ++round)
          for (int t = 0; t < threads; ++t)
            REQUIRE(h[(round * blocks + block) * threads + t] ==
                    int(n * (n + 1) / 2) * 100 * (round + 1) + int(n) * t);
      }
  }
  // A launch without clusters is a cluster of one block.
  DeviceBuffer<int> out(2 * 3 * threads), where(3 * 7);
  ENGINE_LAUNCH(cluster_row_sums, cfg(3, threads, threads * sizeof(int)), out.p, where.p);
  CHECK(out.host()[threads + 5] == 100 + 5);
  CHECK(where.host()[7 + 1] == 1);
}

TEST_CASE("cluster launches the real runtime refuses", "[emulator]") {
  DeviceBuffer<int> out(1024), where(64 * 7);
  for (const auto& [grid, cluster] : {std::pair{dim3(6), dim3(4)}, std::pair{dim3(16), dim3(16)},
                                      std::pair{dim3(4, 3), dim3(2, 2)}}) {
    LaunchConfig c{grid, dim3(32), 32 * sizeof(int), nullptr, cluster};
    REQUIRE_THROWS_WITH(ENGINE_LAUNCH(cluster_row_sums, c, out.p, where.p),
                        Catch::Contains("cluster_row_sums") && Catch::Contains("clusters of") &&
                            Catch::Contains("invalid cluster size"));
  }
}

TEST_CASE("seeded: cluster misuse", "[emulator]") {
  DeviceBuffer<int> out(64);
  const LaunchConfig c{dim3(4), dim3(32), 32 * sizeof(int), nullptr, dim3(2)};
  ENGINE_LAUNCH(cluster_misuse, c, out.p, 0);
  expect_fault({"kernel 'cluster_misuse'", "block (0,0,0)", "cluster.sync at",
                "waits for block (1,0,0) of its cluster, which has exited without reaching it"});
  ENGINE_LAUNCH(cluster_misuse, c, out.p, 1);
  expect_fault({"kernel 'cluster_misuse'", "map_shared_rank to rank 2, outside the cluster of 2"});
  ENGINE_LAUNCH(cluster_misuse, c, out.p, 2);
  expect_fault({"kernel 'cluster_misuse'", "thread (0,0,0)",
                "read of dynamic shared memory of block (",
                "at offset 0 before any thread of "
                "that block wrote it"});
  // Block 1 reads after block 0 is gone unless the host thread running block 0 stalls past
  // block 1's wait: up to 5 tries, the first fault's text checked.
  std::string text;
  const LaunchConfig one{dim3(2), dim3(32), 32 * sizeof(int), nullptr, dim3(2)};
  for (int attempt = 0; attempt < 5 && text.empty(); ++attempt) {
    REQUIRE(cudaMemset(out.p, 0, 64 * sizeof(int)) == cudaSuccess);
    ENGINE_LAUNCH(cluster_misuse, one, out.p, 3);
    const cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) continue;
    REQUIRE(e == cudaErrorLaunchFailure);
    text = cudaGetErrorString(e);
    emu::clear_sticky_error();
    REQUIRE(cudaGetLastError() == cudaSuccess);
  }
  INFO(text);
  for (const char* piece : {"kernel 'cluster_misuse'", "block (1,0,0)",
                            "read of dynamic shared memory of block (0,0,0) of the cluster after "
                            "that block exited"})
    CHECK(text.find(piece) != std::string::npos);
}

TEST_CASE("seeded: __syncthreads reached at different call sites", "[emulator]") {
  DeviceBuffer<float> x(64);
  ENGINE_LAUNCH(divergent_barrier, cfg(1, 64), x.p);
  expect_fault({"kernel 'divergent_barrier'", "block (0,0,0)", "thread (", "different call sites"});
}

TEST_CASE("seeded: __syncthreads after some threads returned", "[emulator]") {
  DeviceBuffer<float> x(64);
  ENGINE_LAUNCH(barrier_after_early_exit, cfg(1, 64), x.p, 40);
  expect_fault({"kernel 'barrier_after_early_exit'", "block (0,0,0)", "thread (0,0,0)",
                "not reached by thread (40,0,0)", "exited"});
}

TEST_CASE("seeded: a deadlock between a warp shuffle and a block barrier", "[emulator]") {
  DeviceBuffer<float> x(64);
  ENGINE_LAUNCH(warp_vs_block_deadlock, cfg(1, 64), x.p);
  expect_fault({"kernel 'warp_vs_block_deadlock'", "block (0,0,0)", "deadlock",
                "thread (5,0,0) waits in __syncthreads", "__shfl_xor_sync"});
}

TEST_CASE("seeded: wrong warp masks", "[emulator]") {
  DeviceBuffer<float> x(32);
  ENGINE_LAUNCH(mask_names_exited_lane, cfg(1, 32), x.p);
  expect_fault({"kernel 'mask_names_exited_lane'", "block (0,0,0)", "thread (0,0,0)",
                "mask 0xffffffff", "lane 16, which has exited"});
  ENGINE_LAUNCH(mask_without_caller, cfg(1, 32), x.p);
  expect_fault(
      {"kernel 'mask_without_caller'", "thread (0,0,0)", "does not include the calling lane 0"});
}

TEST_CASE("seeded: a shuffle from a lane outside the mask", "[emulator]") {
  DeviceBuffer<float> x(32);
  ENGINE_LAUNCH(shuffle_from_inactive_lane, cfg(1, 32), x.p);
  expect_fault({"kernel 'shuffle_from_inactive_lane'", "block (0,0,0)", "thread (0,0,0)",
                "reads lane 20", "not in the mask 0x0000ffff"});
}

TEST_CASE("seeded: dynamic shared memory overflow", "[emulator]") {
  DeviceBuffer<float> x(32);
  ENGINE_LAUNCH(dynamic_overflow, cfg(1, 32, 32 * sizeof(float)), x.p);
  expect_fault({"kernel 'dynamic_overflow'", "block (0,0,0)", "thread (31,0,0)",
                "offset 128, outside the 128 bytes"});
  ENGINE_LAUNCH(dynamic_overflow_raw, cfg(1, 32, 32 * sizeof(float)), x.p);
  expect_fault({"kernel 'dynamic_overflow_raw'", "block (0,0,0)", "overflow"});
}

TEST_CASE("seeded: dynamic shared memory read before any thread wrote it", "[emulator]") {
  DeviceBuffer<float> x(32);
  ENGINE_LAUNCH(read_before_write, cfg(1, 32, 32 * sizeof(float)), x.p);
  expect_fault({"kernel 'read_before_write'", "block (0,0,0)", "thread (2,0,0)",
                "offset 12 before any thread of the block wrote it"});
}

TEST_CASE("seeded: a missing barrier gives different answers in forward and reverse order",
          "[emulator]") {
  DeviceBuffer<int> out(64, -1);
  std::vector<std::vector<int>> results;
  for (emu::Schedule s : {emu::Schedule::forward, emu::Schedule::reverse}) {
    const emu::Schedule saved = emu::schedule();
    emu::set_schedule(s);
    ENGINE_LAUNCH(racy_neighbour, cfg(1, 64), out.p);
    results.push_back(out.host());
    emu::set_schedule(saved);
  }
  REQUIRE(results[0][5] == 5);  // forward: thread 4 already wrote
  REQUIRE(results[1][5] == 0);  // reverse: it had not
}

TEST_CASE("a fault leaves the device's sticky error until reset, later work is skipped",
          "[emulator]") {
  DeviceBuffer<float> x(32, 3.0f);
  ENGINE_LAUNCH(mask_names_exited_lane, cfg(1, 32), x.p);
  float h = 0;
  REQUIRE(cudaMemcpy(&h, x.p, 4, cudaMemcpyDeviceToHost) == cudaErrorLaunchFailure);
  REQUIRE(cudaGetLastError() == cudaErrorLaunchFailure);  // sticky: still there
  REQUIRE(cudaDeviceReset() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  x.p = nullptr;  // freed by the reset
}
