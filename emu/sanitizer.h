// Fiber annotations for ThreadSanitizer and AddressSanitizer (no-ops in a plain build), so both
// understand the emulator's stack switches. Under TSan every CUDA thread is a fiber whose
// switches do *not* order memory: only barriers do (release on arrival, acquire on leaving), so
// two threads of a block touching the same shared memory without a __syncthreads between them is
// reported as the race it is on a GPU.
#pragma once

#include <cstddef>

#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#endif

#if defined(EMU_TSAN)
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
}
#endif
#if defined(EMU_ASAN)
extern "C" {
void __asan_poison_memory_region(void const volatile* addr, size_t size);
void __asan_unpoison_memory_region(void const volatile* addr, size_t size);
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                     size_t* size_old);
}
#endif

namespace emu {

#if defined(EMU_TSAN) || defined(EMU_ASAN)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

namespace san {

#if defined(EMU_TSAN)
inline constexpr bool kTsan = true;
#else
inline constexpr bool kTsan = false;
#endif

inline void* current_fiber() {
#if defined(EMU_TSAN)
  return __tsan_get_current_fiber();
#else
  return nullptr;
#endif
}
inline void* create_fiber() {
#if defined(EMU_TSAN)
  return __tsan_create_fiber(0);
#else
  return nullptr;
#endif
}
inline void destroy_fiber(void* f) {
#if defined(EMU_TSAN)
  if (f) __tsan_destroy_fiber(f);
#else
  (void)f;
#endif
}
// Before a stack switch to `fiber` (TSan) whose stack is [bottom, bottom + size) (ASan). `save`
// keeps the current context's ASan fake stack until after_switch(*save) when it is resumed; null
// when the current context dies with this switch. A switch orders memory only when `sync` (the
// first entry into a CUDA thread's fiber: what the host and the worker did before the block
// happens before the thread); CUDA threads order among themselves only through barriers.
inline void before_switch(void** save, void* fiber, const void* bottom, size_t size,
                          bool sync = false) {
#if defined(EMU_TSAN)
  __tsan_switch_to_fiber(fiber, sync ? 0 : 1 /* __tsan_switch_to_fiber_no_sync */);
#endif
  (void)sync;
#if defined(EMU_ASAN)
  __sanitizer_start_switch_fiber(save, bottom, size);
#endif
  (void)save, (void)fiber, (void)bottom, (void)size;
}
// After being switched to; reports the stack switched from (ASan).
inline void after_switch(void* save, const void** from_bottom = nullptr,
                         size_t* from_size = nullptr) {
#if defined(EMU_ASAN)
  __sanitizer_finish_switch_fiber(save, from_bottom, from_size);
#endif
  (void)save, (void)from_bottom, (void)from_size;
}
// The emulator's own bookkeeping (the scheduler, the fields a CUDA thread fills for a barrier or
// a shuffle) is not CUDA memory: TSan ignores the accesses of the current context (thread or
// fiber) inside an Ignore's scope. Synchronisation (release / acquire) is still recorded.
struct Ignore {
#if defined(EMU_TSAN)
  Ignore() { __tsan_ignore_thread_begin(); }
  ~Ignore() { __tsan_ignore_thread_end(); }
#else
  Ignore() {}
#endif
  Ignore(const Ignore&) = delete;
  // For a scope that begins in one context and ends in another (a fiber's first steps).
  static void begin() {
#if defined(EMU_TSAN)
    __tsan_ignore_thread_begin();
#endif
  }
  static void end() {
#if defined(EMU_TSAN)
    __tsan_ignore_thread_end();
#endif
  }
  Ignore& operator=(const Ignore&) = delete;
};

// ASan: bytes no kernel may touch (the rounding past a cudaMalloc'd size), and back.
inline void poison(const void* p, size_t n) {
#if defined(EMU_ASAN)
  __asan_poison_memory_region(p, n);
#else
  (void)p, (void)n;
#endif
}
inline void unpoison(const void* p, size_t n) {
#if defined(EMU_ASAN)
  __asan_unpoison_memory_region(p, n);
#else
  (void)p, (void)n;
#endif
}

inline void release(void* addr) {
#if defined(EMU_TSAN)
  __tsan_release(addr);
#else
  (void)addr;
#endif
}
inline void acquire(void* addr) {
#if defined(EMU_TSAN)
  __tsan_acquire(addr);
#else
  (void)addr;
#endif
}

}  // namespace san
}  // namespace emu
