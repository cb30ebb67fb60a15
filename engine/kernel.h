// Per-op kernel tables. An op declares, in its header, one table per kernel it launches:
//
//   inline Kernel<void(const Tensor& x, const Tensor& y)> gelu_forward_kernel{"gelu"};
//
// and each backend's source file registers an implementation beside the op:
//
//   ENGINE_REGISTER_KERNEL(gelu_forward_kernel, DeviceType::CPU, cpu::gelu_forward);   // gelu.cpp
//   ENGINE_REGISTER_KERNEL(gelu_forward_kernel, DeviceType::CUDA, cuda::gelu_forward); // gelu.cu
//
// The op calls gelu_forward_kernel(x.device(), x, y). A device without an implementation raises
// "[gelu] has no CUDA kernel ..." instead of failing to link, so a CPU-only build needs no stubs.
// Tables are constant-initialised (constexpr constructor), so registration from static
// initialisers in any translation unit is safe.
//
// Every table some backend registers into is listed by kernel_tables(), so a test can require
// that each one has an implementation for a given device (tests/cuda: kernel_coverage).
#pragma once

#include <vector>

#include "engine/device.h"
#include "engine/macros.h"
#include "engine/work_log.h"

namespace engine {

[[noreturn]] void missing_kernel(const char* op, DeviceType type);

struct KernelTableInfo {
  const char* op;
  bool (*has)(DeviceType);  // whether the table holds an implementation for that device
};
// Every kernel table with at least one registered implementation, once each, sorted by op name.
std::vector<KernelTableInfo> kernel_tables();
// Called by ENGINE_REGISTER_KERNEL; duplicates (one table, several backends) are recorded once.
void note_kernel_table(const void* table, const char* op, bool (*has)(DeviceType));

template <class Sig>
class Kernel;

template <class R, class... Args>
class Kernel<R(Args...)> {
 public:
  using Fn = R (*)(Args...);
  constexpr explicit Kernel(const char* op) : op_(op) {}

  void set(DeviceType type, Fn fn) { fns_[static_cast<int>(type)] = fn; }
  Fn get(DeviceType type) const {
    Fn fn = fns_[static_cast<int>(type)];
    if (!fn) missing_kernel(op_, type);
    return fn;
  }
  bool has(DeviceType type) const { return fns_[static_cast<int>(type)] != nullptr; }
  R operator()(Device device, Args... args) const {
    if (work_recording() && !device.is_cpu()) {  // the performance model's record (work_log.h)
      WorkCost cost;
      (add_work_cost(cost, args), ...);
      WorkScope scope(op_, cost);
      return get(device.type)(args...);
    }
    return get(device.type)(args...);
  }
  const char* op() const { return op_; }

 private:
  const char* op_;
  Fn fns_[kNumDeviceTypes] = {};
};

}  // namespace engine

#define ENGINE_REGISTER_KERNEL(table, device_type, fn)                                      \
  [[maybe_unused]] static const bool ENGINE_CONCAT(engine_kernel_reg_, __LINE__) =          \
      ((table).set((device_type), (fn)),                                                    \
       ::engine::note_kernel_table(                                                         \
           &(table), (table).op(), +[](::engine::DeviceType t) { return (table).has(t); }), \
       true)
