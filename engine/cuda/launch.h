// The one way the engine launches a kernel, in both builds:
//
//   ENGINE_LAUNCH(softmax_rows<T>, LaunchConfig{grid, block, smem, stream}, x, y, rows, cols);
//
// Under nvcc it is the chevron launch kernel<<<grid, block, smem, stream>>>(args...) (with
// LaunchConfig::cluster set: cudaLaunchKernelEx with the cluster dimension); in the emulation build
// (g++ over emu/) it queues the kernel on the SIMT emulator. Either way a launch the runtime
// refuses throws engine::Error naming the kernel. A template kernel whose name has a comma is
// written in parentheses: ENGINE_LAUNCH((copy<S, D>), cfg, ...).
//
// Dynamic shared memory is declared the same way in both builds:
//   ENGINE_DYNAMIC_SHARED(float, buf);   // float* buf (checked element by element in emulation)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "engine/cuda/check.h"
#include "engine/cuda/work_counts.h"

namespace engine::cuda {

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  // Thread block clusters (sm_90; engine/cuda/cluster.cuh): blocks per cluster in each dimension,
  // at most 8 in all, dividing the grid. 1 x 1 x 1: a plain launch.
  dim3 cluster = dim3(1, 1, 1);
};

template <class... Params, class... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), const LaunchConfig& cfg,
                   Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel launched with the wrong arity");
  count_kernel_launch(name, int64_t{cfg.grid.x} * cfg.grid.y * cfg.grid.z,
                      int64_t{cfg.block.x} * cfg.block.y * cfg.block.z);
#if defined(ENGINE_CUDA_EMULATION)
  std::tuple<std::decay_t<Params>...> packed(std::forward<Args>(args)...);
  const int err =
      ::emu::launch(name, reinterpret_cast<const void*>(kernel),
                    ::emu::LaunchShape{cfg.grid, cfg.block, cfg.shared_bytes, cfg.cluster},
                    cfg.stream, [kernel, packed] { std::apply(kernel, packed); });
  if (err != cudaSuccess) cudaGetLastError();  // the launch's error is reported below, once
  const cudaError_t e = static_cast<cudaError_t>(err);
#else
  cudaError_t e;
  if (cfg.cluster.x * cfg.cluster.y * cfg.cluster.z > 1) {
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = cfg.cluster.x;
    cluster.val.clusterDim.y = cfg.cluster.y;
    cluster.val.clusterDim.z = cfg.cluster.z;
    cudaLaunchConfig_t lc{};
    lc.gridDim = cfg.grid;
    lc.blockDim = cfg.block;
    lc.dynamicSmemBytes = cfg.shared_bytes;
    lc.stream = cfg.stream;
    lc.attrs = &cluster;
    lc.numAttrs = 1;
    e = cudaLaunchKernelEx(&lc, kernel, std::forward<Args>(args)...);
    if (e == cudaSuccess) e = cudaGetLastError();
  } else {
    // clang-format reads this header as C++ and would split the chevrons.
    // clang-format off
    kernel<<<cfg.grid, cfg.block, cfg.shared_bytes, cfg.stream>>>(std::forward<Args>(args)...);
    // clang-format on
    e = cudaGetLastError();
  }
#endif
  if (e != cudaSuccess)
    ENGINE_FAIL("[cuda] launch of kernel ", name, " (grid ", cfg.grid.x, "x", cfg.grid.y, "x",
                cfg.grid.z, ", block ", cfg.block.x, "x", cfg.block.y, "x", cfg.block.z, ", ",
                cfg.shared_bytes, " bytes of dynamic shared memory",
                cfg.cluster.x * cfg.cluster.y * cfg.cluster.z > 1 ? ", clusters of " : "",
                cfg.cluster.x * cfg.cluster.y * cfg.cluster.z > 1
                    ? std::to_string(cfg.cluster.x) + "x" + std::to_string(cfg.cluster.y) + "x" +
                          std::to_string(cfg.cluster.z)
                    : std::string(),
                ") failed: ", cudaGetErrorString(e));
}

}  // namespace engine::cuda

#define ENGINE_LAUNCH(kernel, cfg, ...) \
  ::engine::cuda::launch_kernel(#kernel, kernel, cfg __VA_OPT__(, ) __VA_ARGS__)

#if defined(ENGINE_CUDA_EMULATION)
#define ENGINE_DYNAMIC_SHARED(T, name) EMU_DYNAMIC_SHARED(T, name)
#else
#define ENGINE_DYNAMIC_SHARED(T, name)                                  \
  extern __shared__ __align__(16) unsigned char engine_dynamic_smem_[]; \
  T* name = reinterpret_cast<T*>(engine_dynamic_smem_)
#endif
