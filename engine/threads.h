// CPU threads per process: how many OpenMP threads the CPU kernels (and oneDNN and OpenBLAS, which
// share OpenMP's pool) use. By default one process gets the cores it may run on, and the ranks of
// an MPI job on one node share the node's cores (cores / local ranks each, at least 1), so that
// `mpirun -np 2` on 2 cores runs 1 thread per rank instead of 2 x 2 threads fighting for 2 cores.
// OMP_NUM_THREADS, when set, wins. DistributedSession applies it at start; apps print it.
#pragma once

#include <string>

namespace engine {

struct CpuThreads {
  int threads = 1;        // OpenMP threads this process uses
  int cores = 1;          // CPUs this process may run on (its affinity mask)
  int node_cores = 1;     // CPUs online on the node
  int local_ranks = 1;    // processes of the job on this node
  bool from_env = false;  // OMP_NUM_THREADS chose `threads`
};

// Sets the OpenMP thread count for a process that is one of `local_ranks` on its node (see
// above) and returns what it chose. Safe to call again (e.g. once MPI knows the local ranks).
CpuThreads configure_cpu_threads(int local_ranks);

// The last configure_cpu_threads() result (configured for a single process on first use).
const CpuThreads& cpu_threads();

// "threads: 2 per rank (2 cores, 1 local rank)" or "... (OMP_NUM_THREADS=1; 2 cores)".
std::string describe(const CpuThreads& t);

// What the apps print at start: describe(cpu_threads()) + ", CPU GEMMs: " + the library behind
// them (and the AVX-512 small-GEMM kernel when it is active; engine/cpu/gemm.h).
std::string describe_cpu_compute();

}  // namespace engine
