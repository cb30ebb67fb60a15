// The SIMT emulator (see simt.h): blocks on worker threads, CUDA threads as fibers, barriers and
// warp intrinsics as scheduler rendezvous that check how they are used.
#include "emu/simt.h"

#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "emu/runtime.h"
#include "emu/sanitizer.h"

namespace ctx = boost::context;

namespace emu {

thread_local uint3 t_thread_idx;
thread_local uint3 t_block_idx;
thread_local dim3 t_block_dim;
thread_local dim3 t_grid_dim;

namespace {

std::atomic<uint64_t> g_threads{0}, g_blocks{0}, g_barriers{0}, g_warp_ops{0}, g_launches{0};

Schedule initial_schedule() {
  const char* s = std::getenv("EMU_SCHEDULE");
  if (!s || !*s || std::strcmp(s, "forward") == 0) return Schedule::forward;
  if (std::strcmp(s, "reverse") == 0) return Schedule::reverse;
  if (std::strcmp(s, "random") == 0) return Schedule::random;
  std::fprintf(stderr, "[emu] EMU_SCHEDULE=%s: expected forward, reverse or random\n", s);
  std::exit(2);
}
std::atomic<int> g_schedule{static_cast<int>(initial_schedule())};
std::atomic<uint64_t> g_seed{[] {
  const char* s = std::getenv("EMU_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 1ull;
}()};

// ---- fiber stacks: a per-worker pool of mmap'd stacks with a guard page below each ----------

size_t stack_bytes() {
  static const size_t bytes = [] {
    const char* s = std::getenv("EMU_STACK_KB");
    size_t kb = s ? std::strtoull(s, nullptr, 10) : (kSanitized ? 256 : 64);
    return std::max<size_t>(kb, 16) * 1024;
  }();
  return bytes;
}

class StackPool {
 public:
  ~StackPool() {
    for (void* p : free_) ::munmap(p, stack_bytes() + page());
  }
  ctx::stack_context allocate() {
    void* base;
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    } else {
      base = ::mmap(nullptr, stack_bytes() + page(), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      ::mprotect(base, page(), PROT_NONE);  // guard page: a stack overflow faults at once
    }
    ctx::stack_context sc;
    sc.size = stack_bytes();
    sc.sp = static_cast<char*>(base) + page() + stack_bytes();
    return sc;
  }
  void deallocate(ctx::stack_context& sc) {
    free_.push_back(static_cast<char*>(sc.sp) - stack_bytes() - page());
  }
  static size_t page() {
    static const size_t p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return p;
  }

 private:
  std::vector<void*> free_;
};

thread_local StackPool t_stacks;

struct PoolAllocator {
  const void** bottom_out = nullptr;  // where the stack's lowest address is reported (ASan)
  ctx::stack_context allocate() {
    ctx::stack_context sc = t_stacks.allocate();
    if (bottom_out) *bottom_out = static_cast<char*>(sc.sp) - sc.size;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) noexcept { t_stacks.deallocate(sc); }
};

// ---- a block in flight ---------------------------------------------------------------------

enum class State : int { runnable, at_barrier, at_warp, at_cluster, done };

struct Slot;
struct Cluster;

struct Thread {
  Slot* slot = nullptr;  // the worker's fiber that runs this CUDA thread
  uint3 idx{};
  int linear = 0;
  State state = State::runnable;
  Site site{};
  // warp op
  WarpOp op{};
  unsigned mask = 0;
  int arg = 0, width = 32;
  size_t n = 0;
  unsigned char in[16]{}, out[16]{};
  int predicate = 0, reduced = 0;  // __syncthreads_count/and/or
  int reduce_kind = -1;
  bool entered = false;  // the first switch into the fiber in this block orders memory (TSan)
};

// Dynamic shared memory starts 128-byte aligned, as a block's shared memory window does on the
// GPU (the warp matrix functions need 32-byte aligned tiles; malloc gives 16).
template <class T>
struct SmemAllocator {
  using value_type = T;
  SmemAllocator() = default;
  template <class U>
  SmemAllocator(const SmemAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(128)));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(128)); }
  bool operator==(const SmemAllocator&) const { return true; }
  bool operator!=(const SmemAllocator&) const { return false; }
};

struct Block {
  const char* kernel = nullptr;
  uint3 idx{};
  dim3 dim{};
  std::vector<Thread> threads;
  Thread* current = nullptr;
  const std::function<void()>* body = nullptr;
  // dynamic shared memory: the region, a canary after it, and which bytes were written
  std::vector<unsigned char, SmemAllocator<unsigned char>> smem;
  std::vector<unsigned char> written;
  size_t smem_bytes = 0;
  bool faulted = false;
  std::string fault;
  // Sanitizer happens-before objects for __syncthreads, one per parity of the block's barriers
  // (`barriers` released so far): a thread released from barrier k acquires what the arrivals
  // at k released, never what a thread released since on arriving at k + 1 (it may run first).
  char barrier_sync[2] = {};
  uint64_t barriers = 0;
  char warp_sync[32] = {};
  Cluster* cluster = nullptr;  // the block's cluster (null: a launch without clusters)
  unsigned rank = 0;           // its rank in the cluster
  bool secondary = false;      // faulted because another block of its cluster did
};

// The blocks of a cluster in flight, each run by a thread of its own (run_clusters), and their
// barrier: a block arrives once every live thread of it waits in cluster_sync; the last arrival
// releases them all (a new generation). A block that ends (done or faulted) is marked exited;
// the others then fault instead of waiting for it.
struct Cluster {
  dim3 dim;
  std::vector<Block*> blocks;  // by rank
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::atomic<uint64_t> generation{0};          // barriers released (written under mu)
  std::unique_ptr<std::atomic<bool>[]> exited;  // by rank (set under mu)
  char sync[2] = {};  // sanitizer happens-before objects for cluster_sync, by generation parity

  unsigned size() const { return static_cast<unsigned>(blocks.size()); }
  // The first other block that has exited (-1: none), under mu.
  int exited_other(unsigned self) const {
    for (unsigned r = 0; r < size(); ++r)
      if (r != self && exited[r].load(std::memory_order_acquire)) return static_cast<int>(r);
    return -1;
  }
  void mark_exited(unsigned rank) {
    std::lock_guard<std::mutex> lock(mu);
    exited[rank].store(true, std::memory_order_release);
    cv.notify_all();
  }
};

thread_local Block* t_block = nullptr;

// A worker's scheduler and its fibers. Each fiber is a thread slot: it runs CUDA thread i of
// every block the worker runs, in a loop, and never returns (a fiber that returned would switch
// away inside its own epilogue, which TSan's shadow stacks cannot follow; reusing fibers also
// spares a fiber creation per CUDA thread).
struct Scheduler {
  ctx::fiber resume;                   // to return to the scheduler
  void* tsan = nullptr;                // its TSan identity
  const void* stack_bottom = nullptr;  // and its stack (ASan)
  size_t stack_size = 0;
};
thread_local Scheduler t_scheduler;

struct Slot {
  ctx::fiber fiber;
  void* tsan = nullptr;
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
};
constexpr size_t kCanary = 64;

std::string dim_str(uint3 d) {
  std::ostringstream os;
  os << "(" << d.x << "," << d.y << "," << d.z << ")";
  return os.str();
}

std::string where(const Block& b, const Thread* t) {
  std::ostringstream os;
  os << "[emu] kernel '" << b.kernel << "' block " << dim_str(b.idx);
  if (t) os << " thread " << dim_str(t->idx);
  return os.str();
}

std::string site_str(Site s) { return std::string(s.file) + ":" + std::to_string(s.line); }

// Thrown inside a fiber to leave the kernel body after a fault was recorded.
struct FaultUnwind {};

// Inside a fiber: back to the scheduler until it resumes this fiber. Runs under a TSan ignore
// (the switch is the emulator's business), which the caller holds.
void yield_to_scheduler() {
  void* save = nullptr;
  san::before_switch(&save, t_scheduler.tsan, t_scheduler.stack_bottom, t_scheduler.stack_size);
  t_scheduler.resume = std::move(t_scheduler.resume).resume();
  san::after_switch(save);
}

void switch_to_scheduler(Block& b, Thread& t) {
  san::Ignore ignore;
  yield_to_scheduler();
  t_thread_idx = t.idx;
  t_block = &b;
  if (b.faulted) throw FaultUnwind{};
}

// Called inside the running fiber: park it in `state` until the scheduler releases it.
void park(State state) {
  san::Ignore ignore;
  Block& b = *t_block;
  Thread& t = *b.current;
  t.state = state;
  switch_to_scheduler(b, t);
}

void record_fault(Block& b, std::string msg) {
  san::Ignore ignore;
  if (!b.faulted) {
    b.faulted = true;
    b.fault = std::move(msg);
  }
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::shfl:
      return "__shfl_sync";
    case WarpOp::shfl_up:
      return "__shfl_up_sync";
    case WarpOp::shfl_down:
      return "__shfl_down_sync";
    case WarpOp::shfl_xor:
      return "__shfl_xor_sync";
    case WarpOp::ballot:
      return "__ballot_sync";
    case WarpOp::any:
      return "__any_sync";
    case WarpOp::all:
      return "__all_sync";
    case WarpOp::sync:
      return "__syncwarp";
  }
  return "?";
}

std::string hex(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", m);
  return buf;
}

// Completes the warp ops whose lanes have all arrived; returns whether any thread was released.
bool resolve_warps(Block& b) {
  bool released = false;
  const int n = static_cast<int>(b.threads.size());
  for (int w0 = 0; w0 < n; w0 += 32) {
    const int lanes = std::min(32, n - w0);
    for (int l = 0; l < lanes; ++l) {
      Thread& t = b.threads[w0 + l];
      if (t.state != State::at_warp) continue;
      const unsigned mask = t.mask;
      if (!(mask & (1u << l))) {
        record_fault(b, where(b, &t) + ": " + op_name(t.op) + " at " + site_str(t.site) +
                            " with mask " + hex(mask) + " that does not include the calling lane " +
                            std::to_string(l));
        return false;
      }
      bool complete = true;
      for (int k = 0; k < 32; ++k) {
        if (!(mask & (1u << k))) continue;
        if (k >= lanes) {
          record_fault(b, where(b, &t) + ": " + op_name(t.op) + " at " + site_str(t.site) +
                              " with mask " + hex(mask) + " names lane " + std::to_string(k) +
                              ", which the block does not have");
          return false;
        }
        Thread& o = b.threads[w0 + k];
        if (o.state == State::done) {
          record_fault(b, where(b, &t) + ": " + op_name(t.op) + " at " + site_str(t.site) +
                              " with mask " + hex(mask) + " waits for lane " + std::to_string(k) +
                              ", which has exited");
          return false;
        }
        if (o.state != State::at_warp) {
          complete = false;
          continue;
        }
        if (o.mask != mask || o.op != t.op) {
          record_fault(b, where(b, &t) + ": " + op_name(t.op) + " at " + site_str(t.site) +
                              " with mask " + hex(mask) + " meets lane " + std::to_string(k) +
                              " in " + op_name(o.op) + " at " + site_str(o.site) + " with mask " +
                              hex(o.mask) + ": the lanes a mask names must all " +
                              "call the same intrinsic with the same mask");
          return false;
        }
      }
      if (!complete) continue;
      // Everyone named is here: exchange.
      unsigned votes = 0;
      for (int k = 0; k < 32; ++k)
        if ((mask & (1u << k)) && b.threads[w0 + k].predicate != 0) votes |= 1u << k;
      for (int k = 0; k < 32; ++k) {
        if (!(mask & (1u << k))) continue;
        Thread& me = b.threads[w0 + k];
        switch (me.op) {
          case WarpOp::ballot:
          case WarpOp::any:
          case WarpOp::all: {
            unsigned r = me.op == WarpOp::ballot ? votes
                         : me.op == WarpOp::any  ? (votes != 0)
                                                 : (votes == mask);
            std::memcpy(me.out, &r, sizeof r);
            break;
          }
          case WarpOp::sync:
            break;
          default: {
            const int width = me.width;
            const int seg = (k / width) * width;
            int src = k;
            switch (me.op) {
              case WarpOp::shfl:
                src = seg + (me.arg & (width - 1));
                break;
              case WarpOp::shfl_up:
                src = k - me.arg >= seg ? k - me.arg : k;
                break;
              case WarpOp::shfl_down:
                src = k + me.arg < seg + width ? k + me.arg : k;
                break;
              case WarpOp::shfl_xor:
                src = (k ^ me.arg) < seg + width ? (k ^ me.arg) : k;
                break;
              default:
                break;
            }
            if (!(mask & (1u << src))) {
              record_fault(b, where(b, &me) + ": " + op_name(me.op) + " at " + site_str(me.site) +
                                  " reads lane " + std::to_string(src) +
                                  ", which is not in the mask " + hex(mask) +
                                  " (an inactive lane: its value is undefined)");
              return false;
            }
            std::memcpy(me.out, b.threads[w0 + src].in, me.n);
          }
        }
      }
      for (int k = 0; k < 32; ++k)
        if (mask & (1u << k)) b.threads[w0 + k].state = State::runnable;
      released = true;
      g_warp_ops.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return released;
}

std::string describe_waits(Block& b) {
  std::ostringstream os;
  int shown = 0;
  for (Thread& t : b.threads) {
    if (t.state == State::done) continue;
    if (shown++ == 6) {
      os << "; ...";
      break;
    }
    os << (shown > 1 ? "; " : "") << "thread " << dim_str(t.idx) << " waits in "
       << (t.state == State::at_barrier   ? "__syncthreads"
           : t.state == State::at_cluster ? "cluster.sync"
                                          : op_name(t.op))
       << " at " << site_str(t.site);
    if (t.state == State::at_warp) os << " (mask " << hex(t.mask) << ")";
  }
  return os.str();
}

// Whether every live thread of the block waits in `state` (a block barrier, or the cluster's:
// `what` names it) at one call site; `first` is the first of them. A thread waiting at another
// site, or one that has exited, is a fault (and false).
bool all_wait(Block& b, State state, const char* what, Thread*& first) {
  first = nullptr;
  Thread* exited = nullptr;
  for (Thread& t : b.threads) {
    if (t.state == State::done) {
      if (!exited) exited = &t;
      continue;
    }
    if (t.state != state) return false;
    if (!first) {
      first = &t;
    } else if (t.site.line != first->site.line || std::strcmp(t.site.file, first->site.file) != 0) {
      record_fault(b, where(b, &t) + ": " + what + " at " + site_str(t.site) + " while thread " +
                          dim_str(first->idx) + " waits at " + site_str(first->site) +
                          ": a barrier reached at different call sites (divergent " + what + ")");
      return false;
    }
  }
  if (!first) return false;
  if (exited) {
    record_fault(b, where(b, first) + ": " + what + " at " + site_str(first->site) +
                        " is not reached by thread " + dim_str(exited->idx) +
                        ", which has exited (a " + what + " in a branch not every thread takes)");
    return false;
  }
  return true;
}

// Releases the block barrier if every live thread waits at it; returns whether it did.
bool resolve_barrier(Block& b) {
  Thread* first = nullptr;
  if (!all_wait(b, State::at_barrier, "__syncthreads", first)) return false;
  int count = 0, all = 1, any = 0;
  for (Thread& t : b.threads) {
    count += t.predicate != 0;
    all &= t.predicate != 0;
    any |= t.predicate != 0;
  }
  const int kind = first->reduce_kind;
  for (Thread& t : b.threads) {
    t.reduced = kind == 0 ? count : kind == 1 ? all : any;
    t.state = State::runnable;
  }
  ++b.barriers;
  g_barriers.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Once every live thread of the block waits in cluster_sync: the block arrives at its cluster's
// barrier, this worker waits for the cluster's other blocks and the threads are released; returns
// whether they were. A thread that has exited, or a block of the cluster that ends without
// arriving, is a fault (the GPU would wait for ever).
bool resolve_cluster(Block& b) {
  Thread* first = nullptr;
  if (!all_wait(b, State::at_cluster, "cluster.sync", first)) return false;
  if (Cluster* c = b.cluster) {
    std::unique_lock<std::mutex> lock(c->mu);
    const uint64_t generation = c->generation.load(std::memory_order_relaxed);
    if (++c->arrived == static_cast<int>(c->size())) {
      c->arrived = 0;
      c->generation.store(generation + 1, std::memory_order_release);
      c->cv.notify_all();
    } else {
      int gone = -1;
      c->cv.wait(lock, [&] {
        gone = c->exited_other(b.rank);
        return c->generation.load(std::memory_order_relaxed) != generation || gone >= 0;
      });
      if (c->generation.load(std::memory_order_relaxed) == generation) {
        const Block& o = *c->blocks[gone];
        b.secondary = o.faulted;  // its fault is the one to report
        record_fault(b, where(b, first) + ": cluster.sync at " + site_str(first->site) +
                            " waits for block " + dim_str(o.idx) + " of its cluster, which " +
                            (o.faulted ? "faulted" : "has exited without reaching it"));
        return false;
      }
    }
  }
  if (!b.cluster) ++b.barriers;  // a cluster of one block: the block's barrier
  for (Thread& t : b.threads) t.state = State::runnable;
  g_barriers.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void run_thread(Block& b, Thread& t) {
  b.current = &t;  // the fiber sets t_thread_idx itself once it runs
  void* save = nullptr;
  Slot& s = *t.slot;
  const bool first = !t.entered;
  t.entered = true;
  // From here TSan sees the fiber as running: the rest of the switch is its code, which it
  // ignores (every fiber parks inside an ignore).
  san::before_switch(&save, s.tsan, s.stack_bottom, s.stack_size, first);
  s.fiber = std::move(s.fiber).resume();
  san::after_switch(save);
  t_block = &b;
}

std::vector<int> order_for(size_t n, Schedule s, std::mt19937_64& rng) {
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int>(i);
  if (s == Schedule::reverse) std::reverse(order.begin(), order.end());
  if (s == Schedule::random) std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// The body of a thread slot's fiber: one CUDA thread of each block, for ever. The scheduler
// sets t_block and the block's current thread before it resumes the fiber.
void slot_loop() {
  for (;;) {
    Block& b = *t_block;
    Thread& t = *b.current;
    t_thread_idx = t.idx;
    san::Ignore::end();  // the kernel's accesses are checked
    try {
      if (!b.faulted) (*b.body)();
    } catch (const FaultUnwind&) {
    } catch (const std::exception& e) {
      record_fault(b, where(b, &t) + ": " + e.what());
    }
    san::Ignore::begin();
    t.state = State::done;
    san::release(&g_threads);  // after this thread's last access to the block
    yield_to_scheduler();      // until the next block
  }
}

// Thread slot i of this worker, created on first use; never destroyed (see Scheduler).
Slot& slot(int i) {
  static thread_local std::vector<Slot*> slots;
  while (static_cast<int>(slots.size()) <= i) {
    auto* s = new Slot;
    s->stack_size = stack_bytes();
    san::Ignore::end();  // a TSan fiber inherits its creator's ignores: create it without
    s->tsan = san::create_fiber();
    san::Ignore::begin();
    s->fiber = ctx::fiber(
        std::allocator_arg, PoolAllocator{&s->stack_bottom}, [](ctx::fiber&& sched) -> ctx::fiber {
          san::Ignore::begin();  // as every fiber is when it is resumed
          t_scheduler.resume = std::move(sched);
          san::after_switch(nullptr, &t_scheduler.stack_bottom, &t_scheduler.stack_size);
          slot_loop();
          return {};  // never reached
        });
    slots.push_back(s);
  }
  return *slots[i];
}

void run_block(Block& b, const std::function<void()>& body, Schedule sched, uint64_t seed) {
  san::Ignore ignore;  // the scheduler's bookkeeping; the kernel runs in the fibers
  t_block = &b;
  t_block_idx = b.idx;
  const int n = static_cast<int>(b.dim.x * b.dim.y * b.dim.z);
  b.threads.clear();
  b.threads.resize(n);
  t_scheduler.tsan = san::current_fiber();
  b.body = &body;
  san::acquire(&g_threads);  // what earlier blocks on this worker did happens before this one
  for (int i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.linear = i;
    t.idx =
        uint3{static_cast<unsigned>(i % b.dim.x), static_cast<unsigned>((i / b.dim.x) % b.dim.y),
              static_cast<unsigned>(i / (b.dim.x * b.dim.y))};
    t.slot = &slot(i);
  }
  std::mt19937_64 rng(seed ^ (uint64_t(b.idx.x) * 0x9E3779B97F4A7C15ull) ^
                      (uint64_t(b.idx.y) << 20) ^ (uint64_t(b.idx.z) << 40));
  for (;;) {
    bool ran = false;
    for (int i : order_for(b.threads.size(), sched, rng)) {
      Thread& t = b.threads[i];
      if (t.state != State::runnable) continue;
      run_thread(b, t);
      ran = true;
      if (b.faulted) break;
    }
    if (b.faulted) break;
    bool released = resolve_warps(b);
    if (b.faulted) break;
    if (released || ran) continue;
    if (resolve_barrier(b)) continue;
    if (b.faulted) break;
    if (resolve_cluster(b)) continue;
    if (b.faulted) break;
    bool all_done = true;
    for (Thread& t : b.threads) all_done &= t.state == State::done;
    if (all_done) break;
    record_fault(b, where(b, nullptr) + ": deadlock: no thread can proceed: " + describe_waits(b));
    break;
  }
  // Abandon the fibers of a faulted block (their stacks unwind) and check the canary.
  for (Thread& t : b.threads) {
    if (t.entered && t.state != State::done) {
      b.current = &t;
      run_thread(b, t);  // resumes with b.faulted set: the fiber unwinds via FaultUnwind
    }
  }
  if (!b.faulted && b.smem_bytes) {
    for (size_t i = 0; i < kCanary; ++i)
      if (b.smem[b.smem_bytes + i] != 0xA5) {
        record_fault(b, where(b, nullptr) + ": dynamic shared memory overflow: a write past the " +
                            std::to_string(b.smem_bytes) + " bytes the launch gave, at byte " +
                            std::to_string(b.smem_bytes + i));
        break;
      }
  }
  g_threads.fetch_add(n, std::memory_order_relaxed);
  g_blocks.fetch_add(1, std::memory_order_relaxed);
  t_block = nullptr;
  san::acquire(&g_threads);  // what the block's threads did happens before what follows it
}

// ---- the worker pool ------------------------------------------------------------------------

class Pool {
 public:
  Pool() {
    const char* s = std::getenv("EMU_WORKERS");
    unsigned n = s ? static_cast<unsigned>(std::atoi(s)) : std::thread::hardware_concurrency();
    n = std::max(1u, std::min(n, 64u));
    for (unsigned i = 1; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  // Runs job(worker) on every worker (and the caller) until it returns.
  void run(const std::function<void()>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = workers_.size();
      ++generation_;
    }
    cv_.notify_all();
    job();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)();
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_, launch_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void()>* job_ = nullptr;
  size_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;

 public:
  std::mutex& launch_mutex() { return launch_mu_; }
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

// ---- device side ------------------------------------------------------------------------------

void device_fault(const std::string& what) {
  san::Ignore ignore;
  Block& b = *t_block;
  record_fault(b, where(b, b.current) + ": " + what);
  throw FaultUnwind{};
}

void syncthreads(Site site) { syncthreads_reduce(site, -1, 0); }

int syncthreads_reduce(Site site, int kind, int predicate) {
  san::Ignore ignore;  // the emulator's fields; the barrier's ordering is release / acquire
  Block& b = *t_block;
  Thread& t = *b.current;
  t.site = site;
  t.reduce_kind = kind;
  t.predicate = predicate;
  char* sync = &b.barrier_sync[b.barriers % 2];
  san::release(sync);
  park(State::at_barrier);
  san::acquire(sync);
  return t.reduced;
}

void syncwarp(Site site, unsigned mask) {
  warp_exchange(site, WarpOp::sync, mask == 0 ? 0xffffffffu : mask, nullptr, 0, 0, 32, nullptr);
}

void warp_exchange(Site site, WarpOp op, unsigned mask, const void* in, size_t n, int arg,
                   int width, void* out) {
  san::Ignore ignore;
  Block& b = *t_block;
  Thread& t = *b.current;
  if (width <= 0 || width > 32 || (width & (width - 1)))
    device_fault(std::string(op_name(op)) + " at " + site_str(site) + ": width " +
                 std::to_string(width) + " is not a power of two in [1, 32]");
  t.site = site;
  t.op = op;
  t.mask = mask;
  t.arg = arg;
  t.width = width;
  t.n = n;
  if (n) std::memcpy(t.in, in, n);
  if (op == WarpOp::ballot || op == WarpOp::any || op == WarpOp::all)
    std::memcpy(&t.predicate, in, sizeof(int));
  char* sync = &b.warp_sync[(t.linear / 32) % 32];
  san::release(sync);
  park(State::at_warp);
  san::acquire(sync);
  if (out)
    std::memcpy(
        out, t.out,
        op == WarpOp::ballot || op == WarpOp::any || op == WarpOp::all ? sizeof(unsigned) : n);
}

void* dynamic_shared_base() {
  Block& b = *t_block;
  return b.smem.data();
}
size_t dynamic_shared_bytes() { return t_block->smem_bytes; }

namespace {
bool holds(const Block& o, const unsigned char* q, size_t n) {
  const auto* base = o.smem.data();
  return q >= base && q + n <= base + o.smem_bytes;
}
}  // namespace

void shared_check(const void* p, size_t n, bool write) {
  san::Ignore ignore;
  Block& b = *t_block;
  const auto* q = static_cast<const unsigned char*>(p);
  // The owner: this block, or (distributed shared memory) another block of its cluster.
  Block* o = &b;
  if (!holds(b, q, n) && b.cluster)
    for (Block* c : b.cluster->blocks)
      if (c != &b && holds(*c, q, n)) o = c;
  if (!holds(*o, q, n)) {
    const long long off = q - b.smem.data();
    device_fault(std::string(write ? "write" : "read") + " of " + std::to_string(n) +
                 " bytes at dynamic shared memory offset " + std::to_string(off) +
                 ", outside the " + std::to_string(b.smem_bytes) +
                 " bytes the launch gave (dynamic shared memory overflow)");
  }
  const size_t off = static_cast<size_t>(q - o->smem.data());
  const std::string whose = o == &b ? "" : " of block " + dim_str(o->idx) + " of the cluster";
  if (o != &b && b.cluster->exited[o->rank].load(std::memory_order_acquire)) {
    b.secondary = o->faulted;  // its fault is the one to report
    device_fault(std::string(write ? "write" : "read") + " of dynamic shared memory" + whose +
                 " after that block exited (a block must wait in cluster.sync until the others "
                 "are done with its shared memory)");
  }
  // Relaxed atomics: another block of the cluster may check these bytes at the same time.
  if (write) {
    for (size_t i = 0; i < n; ++i)
      std::atomic_ref<unsigned char>(o->written[off + i]).store(1, std::memory_order_relaxed);
    return;
  }
  for (size_t i = 0; i < n; ++i)
    if (!std::atomic_ref<unsigned char>(o->written[off + i]).load(std::memory_order_relaxed))
      device_fault("read of dynamic shared memory" + whose + " at offset " +
                   std::to_string(off + i) + " before any thread of " +
                   (o == &b ? "the block" : "that block") + " wrote it");
}

void cluster_sync(Site site) {
  san::Ignore ignore;  // the emulator's fields; the barrier's ordering is release / acquire
  Block& b = *t_block;
  Thread& t = *b.current;
  t.site = site;
  // This barrier's object (its generation's parity; see Block::barrier_sync).
  char* sync = b.cluster
                   ? &b.cluster->sync[b.cluster->generation.load(std::memory_order_acquire) % 2]
                   : &b.barrier_sync[b.barriers % 2];
  san::release(sync);
  park(State::at_cluster);
  san::acquire(sync);
}

unsigned cluster_block_rank() { return t_block->rank; }

dim3 cluster_dim() { return t_block->cluster ? t_block->cluster->dim : dim3(1, 1, 1); }

dim3 cluster_block_index() {
  const dim3 d = cluster_dim();
  const unsigned r = t_block->rank;
  return dim3(r % d.x, (r / d.x) % d.y, r / (d.x * d.y));
}

void* cluster_map_shared(const void* p, unsigned rank) {
  san::Ignore ignore;
  Block& b = *t_block;
  const unsigned n = b.cluster ? b.cluster->size() : 1;
  if (rank >= n)
    device_fault("map_shared_rank to rank " + std::to_string(rank) + ", outside the cluster of " +
                 std::to_string(n) + " block" + (n == 1 ? "" : "s"));
  const auto* q = static_cast<const unsigned char*>(p);
  if (!holds(b, q, 1))
    device_fault(
        "map_shared_rank of an address outside the block's dynamic shared memory (the "
        "emulator maps dynamic shared memory only)");
  Block& o = b.cluster ? *b.cluster->blocks[rank] : b;
  return o.smem.data() + (q - b.smem.data());
}

// ---- host side --------------------------------------------------------------------------------

int max_dynamic_shared(const void* kernel);  // runtime.cpp

namespace {

constexpr uint64_t kMaxClusterBlocks = 8;  // the portable cluster size

// A block about to run at idx, with fresh dynamic shared memory (NaN bytes until written, the
// canary after them).
void prepare(Block& b, uint3 idx, size_t shared_bytes) {
  b.idx = idx;
  b.faulted = false;
  b.secondary = false;
  b.fault.clear();
  b.smem_bytes = shared_bytes;
  if (shared_bytes) {
    b.smem.assign(shared_bytes + kCanary, 0xFF);
    std::memset(b.smem.data() + shared_bytes, 0xA5, kCanary);
    b.written.assign(shared_bytes, 0);
  }
}

// Threads that run the blocks of a cluster beside the caller (rank r > 0 on thread r - 1), so
// that they run at the same time, each block's fibers on a thread of its own; made on first use,
// kept for the process.
class Crew {
 public:
  ~Crew() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Runs job(r) for r in [0, n), r = 0 on the caller; returns when all have returned.
  void run(unsigned n, const std::function<void(unsigned)>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (threads_.size() + 1 < n) {
        const unsigned rank = static_cast<unsigned>(threads_.size()) + 1;
        threads_.emplace_back([this, rank] { loop(rank); });
      }
      job_ = &job;
      n_ = n;
      pending_ = n - 1;
      ++generation_;
    }
    cv_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop(unsigned rank) {
    uint64_t seen = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen = generation_ - 1;  // made for the run in progress: take part in it
    }
    for (;;) {
      const std::function<void(unsigned)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && rank < n_); });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(rank);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(unsigned)>* job_ = nullptr;
  unsigned n_ = 0;
  size_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Crew& crew() {
  static Crew c;
  return c;
}

// The clusters of a launch one after another, each cluster's blocks at the same time (Crew);
// the first fault (a block's own rather than one it took from another block of its cluster) or
// exception is reported and the launch stops there.
void run_clusters(const char* kernel, const LaunchShape& shape, const std::function<void()>& body,
                  Schedule sched, uint64_t seed, std::string& fault, std::exception_ptr& error) {
  const dim3 g = shape.grid, c = shape.cluster;
  const unsigned size = c.x * c.y * c.z;
  const dim3 n(g.x / c.x, g.y / c.y, g.z / c.z);  // clusters in each dimension
  const uint64_t clusters = uint64_t(n.x) * n.y * n.z;
  std::vector<Block> blocks(size);
  std::mutex error_mu;
  for (uint64_t k = 0; k < clusters && fault.empty() && !error; ++k) {
    const uint3 at{static_cast<unsigned>(k % n.x), static_cast<unsigned>((k / n.x) % n.y),
                   static_cast<unsigned>(k / (uint64_t(n.x) * n.y))};
    Cluster cl;
    cl.dim = c;
    cl.exited = std::make_unique<std::atomic<bool>[]>(size);
    for (unsigned r = 0; r < size; ++r) {
      Block& b = blocks[r];
      b.kernel = kernel;
      b.dim = shape.block;
      b.cluster = &cl;
      b.rank = r;
      cl.exited[r].store(false, std::memory_order_relaxed);
      prepare(
          b,
          uint3{at.x * c.x + r % c.x, at.y * c.y + (r / c.x) % c.y, at.z * c.z + r / (c.x * c.y)},
          shape.shared_bytes);
      cl.blocks.push_back(&b);
    }
    crew().run(size, [&](unsigned r) {
      t_block_dim = shape.block;
      t_grid_dim = shape.grid;
      try {
        run_block(blocks[r], body, sched, seed);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        blocks[r].faulted = true;  // its cluster's other blocks stop waiting for it
        blocks[r].secondary = true;
      }
      cl.mark_exited(r);
    });
    for (const Block& b : blocks)
      if (b.faulted && !b.secondary && fault.empty()) fault = b.fault;
    for (const Block& b : blocks)
      if (b.faulted && fault.empty() && !b.fault.empty()) fault = b.fault;
    for (Block& b : blocks) b.cluster = nullptr;
  }
}

}  // namespace

int launch(const char* kernel, const void* fn, const LaunchShape& shape, void* stream,
           std::function<void()> body) {
  const dim3 g = shape.grid, b = shape.block;
  const uint64_t threads = uint64_t(b.x) * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 ||
      g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
    return set_last_error(cudaErrorInvalidConfiguration);
  if (shape.shared_bytes > static_cast<size_t>(max_dynamic_shared(fn)))
    return set_last_error(cudaErrorInvalidValue);
  const dim3 c = shape.cluster;
  const uint64_t cluster_blocks = uint64_t(c.x) * c.y * c.z;
  if (cluster_blocks == 0 || cluster_blocks > kMaxClusterBlocks || g.x % c.x || g.y % c.y ||
      g.z % c.z)
    return set_last_error(cudaErrorInvalidClusterSize);
  auto work = [kernel, shape, cluster_blocks, body = std::move(body)] {
    const uint64_t nblocks = uint64_t(shape.grid.x) * shape.grid.y * shape.grid.z;
    const Schedule sched = schedule();
    const uint64_t seed = g_seed.load();
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex fault_mu;
    std::string fault;
    std::exception_ptr error;
    std::lock_guard<std::mutex> one_launch(pool().launch_mutex());
    if (cluster_blocks > 1) {
      run_clusters(kernel, shape, body, sched, seed, fault, error);
    } else {
      pool().run([&] {
        Block b;
        b.kernel = kernel;
        b.dim = shape.block;
        t_block_dim = shape.block;
        t_grid_dim = shape.grid;
        for (;;) {
          const uint64_t i = next.fetch_add(1);
          if (i >= nblocks || failed.load()) break;
          prepare(b,
                  uint3{static_cast<unsigned>(i % shape.grid.x),
                        static_cast<unsigned>((i / shape.grid.x) % shape.grid.y),
                        static_cast<unsigned>(i / (uint64_t(shape.grid.x) * shape.grid.y))},
                  shape.shared_bytes);
          try {
            run_block(b, body, sched, seed);
          } catch (...) {
            std::lock_guard<std::mutex> lock(fault_mu);
            if (!error) error = std::current_exception();
            failed = true;
          }
          if (b.faulted) {
            std::lock_guard<std::mutex> lock(fault_mu);
            if (fault.empty()) fault = b.fault;
            failed = true;
          }
        }
      });
    }
    g_launches.fetch_add(1, std::memory_order_relaxed);
    if (!fault.empty()) throw Fault{fault};
    if (error) std::rethrow_exception(error);
  };
  stream_enqueue(static_cast<cudaStream_t>(stream), std::move(work), kernel);
  return cudaSuccess;
}

void set_schedule(Schedule s, uint64_t seed) {
  g_schedule = static_cast<int>(s);
  g_seed = seed;
}
Schedule schedule() { return static_cast<Schedule>(g_schedule.load()); }

Stats stats() {
  return Stats{g_threads.load(), g_blocks.load(), g_barriers.load(), g_warp_ops.load(),
               g_launches.load()};
}

}  // namespace emu
