// The emulated CUDA runtime's internal interface, for the other shims (cuBLASLt, NCCL) and the
// emulator's tests. Engine code never includes this: it calls the CUDA runtime API
// (cuda_runtime_api.h), which emu/runtime.cpp implements over host memory.
//
// Streams are in order and *deferred*: work enqueued on a stream runs when the host waits for it
// (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a synchronous cudaMemcpy,
// cudaStreamQuery / cudaEventQuery) or when another stream waits on an event recorded after it.
// So host code that reads a result without synchronising sees stale memory, as it may on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

namespace emu {

// Appends `work` to `stream` (0 / cudaStreamLegacy: the legacy default stream, which orders
// itself against every blocking stream; cudaStreamPerThread is treated as the legacy stream).
// `what` names the work in fault reports ("kernel 'softmax_forward'", "cublasLtMatmul").
// If `work` throws emu::Fault, the fault becomes the device's sticky error
// (cudaErrorLaunchFailure, its message returned by cudaGetErrorString) and the stream's later
// work is skipped, as after a GPU fault.
void stream_enqueue(cudaStream_t stream, std::function<void()> work, const char* what);

// Runs everything enqueued on `stream` so far (and, by the ordering rules, what it waits on).
void stream_flush(cudaStream_t stream);

// The device a stream belongs to (0 for the legacy stream: the current device).
int stream_device(cudaStream_t stream);

// An error detected while device work runs: a kernel fault found by the SIMT emulator, a bad
// pointer given to a shim. Thrown inside stream work; becomes the sticky error.
struct Fault {
  std::string message;
};

// The byte range [p, p + n) lies inside one live cudaMalloc allocation (of any device).
bool is_device_range(const void* p, size_t n);

// Sets the per-thread "last error" (cudaGetLastError / cudaPeekAtLastError) and returns it: how a
// shim reports a call-time error the way the real API does.
cudaError_t set_last_error(cudaError_t err);

// The current device of the calling host thread (cudaSetDevice).
int current_device();

// Emulator tests only: clears the device's sticky error and drops its queued work, keeping its
// allocations (cudaDeviceReset frees them, as the real call does).
void clear_sticky_error();

}  // namespace emu
