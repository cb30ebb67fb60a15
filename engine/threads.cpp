// The CPU thread count per process (engine/threads.h).
#include "engine/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "engine/cpu/gemm.h"

namespace engine {
namespace {

std::mutex g_mutex;
CpuThreads g_threads;
bool g_configured = false;

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

int positive_env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  // OpenMP reads the variable itself; a list ("2,1") or junk leaves the runtime's own reading.
  return (end && (*end == '\0' || *end == ',') && n > 0 && n < 4096) ? static_cast<int>(n) : 0;
}

}  // namespace

CpuThreads configure_cpu_threads(int local_ranks) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CpuThreads t;
  t.local_ranks = std::max(1, local_ranks);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  t.node_cores = online > 0 ? static_cast<int>(online) : 1;
  const int mask = affinity_cores();
  t.cores = mask > 0 ? mask : t.node_cores;
  if (const int n = positive_env("OMP_NUM_THREADS")) {
    t.threads = n;
    t.from_env = true;
  } else {
    // The node's cores shared by its ranks, and never more than this process may run on (a
    // launcher that binds each rank to one core gets 1).
    t.threads = std::max(1, std::min(t.cores, t.node_cores / t.local_ranks));
    omp_set_num_threads(t.threads);
  }
  g_threads = t;
  g_configured = true;
  return t;
}

const CpuThreads& cpu_threads() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_configured) return g_threads;
  }
  configure_cpu_threads(1);
  return g_threads;
}

std::string describe(const CpuThreads& t) {
  std::string s = "threads: " + std::to_string(t.threads) + " per rank (";
  if (t.from_env) s += "OMP_NUM_THREADS=" + std::to_string(t.threads) + "; ";
  s += std::to_string(t.cores) + (t.cores == 1 ? " core" : " cores");
  if (t.cores != t.node_cores) s += " of the node's " + std::to_string(t.node_cores);
  s += ", " + std::to_string(t.local_ranks) + (t.local_ranks == 1 ? " local rank" : " local ranks");
  return s + ")";
}

std::string describe_cpu_compute() {
  return describe(cpu_threads()) + ", CPU GEMMs: " + describe_cpu_gemms();
}

}  // namespace engine
