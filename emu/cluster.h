// cooperative_groups' thread block clusters (sm_90) in the emulation build: the subset of
// cluster_group the engine's kernels use, over the SIMT emulator's clusters (emu/simt.h). Kernels
// include engine/cuda/cluster.cuh, which gives <cooperative_groups.h> under nvcc and this header
// here, and write ordinary CUDA: `cg::this_cluster().sync()`, `cluster.map_shared_rank(p, r)`.
#pragma once

#include <source_location>

#include "emu/simt.h"

namespace cooperative_groups {

class cluster_group {
 public:
  // The barrier of every thread of every block of the cluster (barrier.cluster.arrive + wait).
  void sync(std::source_location at = std::source_location::current()) const {
    ::emu::cluster_sync(::emu::Site{at.file_name(), static_cast<int>(at.line())});
  }
  unsigned int block_rank() const { return ::emu::cluster_block_rank(); }
  unsigned int num_blocks() const {
    const dim3 d = ::emu::cluster_dim();
    return d.x * d.y * d.z;
  }
  dim3 dim_blocks() const { return ::emu::cluster_dim(); }
  dim3 block_index() const { return ::emu::cluster_block_index(); }
  // The same byte of (dynamic) shared memory in block `rank` of the cluster; the emulator's
  // checked pointer keeps its checks (the other block's bounds and written bytes).
  template <class T>
  T* map_shared_rank(T* addr, int rank) const {
    return static_cast<T*>(::emu::cluster_map_shared(addr, static_cast<unsigned>(rank)));
  }
  template <class T>
  ::emu::SharedPtr<T> map_shared_rank(const ::emu::SharedPtr<T>& addr, int rank) const {
    return ::emu::SharedPtr<T>(
        static_cast<T*>(::emu::cluster_map_shared(addr.get(), static_cast<unsigned>(rank))));
  }
};

inline cluster_group this_cluster() { return cluster_group(); }

}  // namespace cooperative_groups
