// Thread block clusters (sm_90) for the engine's kernels: cooperative_groups' cluster_group from
// <cooperative_groups.h> under nvcc, the emulator's implementation of the same names in the
// emulation build (emu/cluster.h: blocks of a cluster run at the same time; the cluster barrier,
// block ranks and map_shared_rank into another block's dynamic shared memory, checked). Kernels
// write `cg::this_cluster()` and work in both builds; a launch asks for clusters through
// LaunchConfig::cluster (engine/cuda/launch.h).
//
// nvcc compiles cluster code for sm_90 and later only: a kernel that uses clusters puts its body
// under `#if ENGINE_CLUSTERS` (the sm_80 build gets a body that traps) and its host code launches
// it only where clusters_run() says it runs.
#pragma once

#include <cuda_runtime.h>

#if defined(ENGINE_CUDA_EMULATION)
#include "emu/cluster.h"
#define ENGINE_CLUSTERS 1
#else
#include <cooperative_groups.h>
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define ENGINE_CLUSTERS 1
#else
#define ENGINE_CLUSTERS 0
#endif
#endif

#include "engine/cuda/context.h"

namespace engine::cuda {
namespace cg = cooperative_groups;

// Whether `kernel` runs as a cluster launch on `device`: the device is of compute capability 9.0
// or later and the build holds sm_90 code for the kernel (its PTX version: a build for compute_80
// alone gives it the trapping body only). The emulator's device and kernels are 9.0.
template <class K>
bool clusters_run(K* kernel, int device) {
  if (context(device).props.major < 9) return false;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, reinterpret_cast<const void*>(kernel)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return fa.ptxVersion >= 90;
}

}  // namespace engine::cuda
