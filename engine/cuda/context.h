// The per-device execution context of the CUDA backend: one per device, created on first use and
// kept for the process. Every kernel, copy and GEMM of the engine runs on the device's compute
// stream (so the engine's work is ordered without device-wide synchronisation); collectives run
// on the communication stream, ordered against compute by events. Included by .cu files only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace engine::cuda {

// Makes `device` current for the scope and restores the previous device after it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

struct DeviceContext {
  int device = 0;
  cudaStream_t compute = nullptr;  // non-blocking: the engine's kernels, copies and GEMMs
  cudaStream_t comm = nullptr;     // non-blocking: collectives
  cudaDeviceProp props{};
  // cuBLASLt, created on the first GEMM (cublaslt()), with its workspace on this device.
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  size_t lt_workspace_bytes = 0;
};

// The context of `device` (throws "[device] cuda:N does not exist ..." for a bad index).
DeviceContext& context(int device);
inline cudaStream_t compute_stream(int device) { return context(device).compute; }
// The context with its cuBLASLt handle and workspace created.
DeviceContext& cublaslt(int device);

// A pooled event for ordering streams (record on one, wait on another); returned to the pool
// when the Event is destroyed.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s);
  void wait(cudaStream_t s) const;  // `s` waits for the recorded point; the host does not block
  bool done() const;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace engine::cuda
