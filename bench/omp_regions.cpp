// omp_regions: an LD_PRELOAD profiler of OpenMP parallel regions (libgomp), for
// bench/thread_scaling.py. It wraps libgomp's entry points for `#pragma omp parallel` (and the
// combined `parallel for` forms), and for every outermost region started by the process's main
// thread records its wall time and how long each team thread spent in the region's body; nested
// regions and regions of other threads count inside their parent. The first OMP_REGIONS_SKIP
// outermost regions (default 0: a warm-up's) run unrecorded. At exit it writes, to the file
// named by OMP_REGIONS_OUT (nothing when unset):
//   outermost <the main thread's outermost regions, skipped ones included>
//   span <seconds from the first recorded region's start to the last one's end>
//   outside <seconds of that span outside any region: the main thread alone>
//   region <library path> <offset of the body in it> <calls> <wall s> <team-thread s> <busy s>
// per region body (the compiler's outlined function), where team-thread s = wall x the threads
// that ran it, and busy s = the threads' time inside the body: the difference is the time threads
// waited at the region's end for the slowest one. Nothing here names an op: the script maps the
// offsets to symbols.
#include <dlfcn.h>

#include <pthread.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <unordered_map>

namespace {

using Body = void (*)(void*);

double now() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct Stats {
  long calls = 0;
  double wall = 0, team = 0, busy = 0;
};

struct Profile {
  std::mutex mu;
  std::unordered_map<Body, Stats> by_body;
  double first = 0, last = 0, inside = 0;
  long outermost = 0, skip = 0;
  pthread_t main_thread{};
  bool have_main = false;
};

Profile& profile() {
  static Profile* p = new Profile;  // never destroyed: the destructor below still reads it
  return *p;
}

thread_local int depth = 0;

struct Wrapped {
  Body body;
  void* data;
  std::atomic<double>* busy;
  std::atomic<int>* threads;
};

void run_body(void* p) {
  auto* w = static_cast<Wrapped*>(p);
  const double t0 = now();
  ++depth;
  w->body(w->data);
  --depth;
  const double dt = now() - t0;
  double cur = w->busy->load();
  while (!w->busy->compare_exchange_weak(cur, cur + dt)) {
  }
  w->threads->fetch_add(1);
}

bool outermost_on_main() {
  if (depth > 0) return false;
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.have_main) {
    p.main_thread = pthread_self();
    p.have_main = true;
    const char* skip = std::getenv("OMP_REGIONS_SKIP");
    p.skip = skip ? std::atol(skip) : 0;
  }
  if (!pthread_equal(p.main_thread, pthread_self())) return false;
  return ++p.outermost > p.skip;
}

// Runs `start(wrapped body)` and records it when it is an outermost region of the main thread.
template <class Start>
void record(Body body, void* data, Start&& start) {
  if (!outermost_on_main()) {
    ++depth;
    start(body, data);
    --depth;
    return;
  }
  std::atomic<double> busy{0.0};
  std::atomic<int> threads{0};
  Wrapped w{body, data, &busy, &threads};
  const double t0 = now();
  start(&run_body, &w);
  const double t1 = now();
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.first == 0) p.first = t0;
  p.last = t1;
  p.inside += t1 - t0;
  Stats& s = p.by_body[body];
  ++s.calls;
  s.wall += t1 - t0;
  s.team += (t1 - t0) * threads.load();
  s.busy += busy.load();
}

template <class F>
F real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) {
    std::fprintf(stderr, "omp_regions: libgomp has no %s\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

__attribute__((destructor)) void write_profile() {
  const char* out = std::getenv("OMP_REGIONS_OUT");
  if (!out || !*out) return;
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  FILE* f = std::fopen(out, "w");
  if (!f) {
    std::fprintf(stderr, "omp_regions: cannot write %s\n", out);
    return;
  }
  std::fprintf(f, "outermost %ld\nspan %.9f\noutside %.9f\n", p.outermost, p.last - p.first,
               p.last - p.first - p.inside);
  for (const auto& [body, s] : p.by_body) {
    Dl_info info{};
    const char* lib = "?";
    unsigned long offset = reinterpret_cast<unsigned long>(body);
    if (dladdr(reinterpret_cast<void*>(body), &info) && info.dli_fname) {
      lib = info.dli_fname;
      offset -= reinterpret_cast<unsigned long>(info.dli_fbase);
    }
    std::fprintf(f, "region %s 0x%lx %ld %.9f %.9f %.9f\n", lib, offset, s.calls, s.wall, s.team,
                 s.busy);
  }
  std::fclose(f);
}

}  // namespace

// libgomp's entry points (GCC's outlining of `#pragma omp parallel` and `parallel for`).
extern "C" {

void GOMP_parallel(Body fn, void* data, unsigned num_threads, unsigned flags) {
  static auto next = real<void (*)(Body, void*, unsigned, unsigned)>("GOMP_parallel");
  record(fn, data, [&](Body b, void* d) { next(b, d, num_threads, flags); });
}

#define OMP_REGIONS_LOOP(name)                                                                 \
  void name(Body fn, void* data, unsigned num_threads, long start, long end, long incr,        \
            long chunk, unsigned flags) {                                                      \
    static auto next =                                                                         \
        real<void (*)(Body, void*, unsigned, long, long, long, long, unsigned)>(#name);        \
    record(fn, data,                                                                           \
           [&](Body b, void* d) { next(b, d, num_threads, start, end, incr, chunk, flags); }); \
  }
OMP_REGIONS_LOOP(GOMP_parallel_loop_static)
OMP_REGIONS_LOOP(GOMP_parallel_loop_dynamic)
OMP_REGIONS_LOOP(GOMP_parallel_loop_guided)
OMP_REGIONS_LOOP(GOMP_parallel_loop_nonmonotonic_dynamic)
OMP_REGIONS_LOOP(GOMP_parallel_loop_nonmonotonic_guided)
#undef OMP_REGIONS_LOOP

}  // extern "C"
