// A backend is what a device contributes to the core: its allocator, host<->device transfers and
// the few layout primitives the core itself needs (strided copy with dtype conversion, fill,
// accumulate, sum over broadcast dims). Ops register their own per-device kernels (kernel.h).
//
// The CPU backend is always built in. The CUDA backend registers itself from engine/cuda/ when
// libengine is built with CUDA; otherwise asking for it raises a clear error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/allocator.h"
#include "engine/tensor.h"

namespace engine {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int device_count() const = 0;
  virtual Allocator& allocator(int device_index) = 0;
  virtual void synchronize(int device_index) = 0;

  // dst and src have the same shape and live on this backend's device; any strides (src may be
  // a stride-0 broadcast view); the dtypes may differ (converting copy).
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, double value) = 0;
  // dst += alpha * src; same shape and dtype; src may be strided or broadcast. One mixed case: an
  // f32 dst and a bf16 / f16 src, both contiguous (autocast's gradient into an f32 master .grad
  // in one pass: the bits of converting src to f32, exactly, and adding).
  virtual void add_(const Tensor& dst, const Tensor& src, double alpha) = 0;
  // dst (contiguous; its shape broadcastable to src's) = src summed over the broadcast dims.
  virtual void sum_to(const Tensor& src, const Tensor& dst) = 0;

  // Contiguous byte transfers between host memory and this device, counted (transfer_counts()).
  void copy_from_host(void* dst, const void* src, size_t nbytes, int device_index);
  void copy_to_host(void* dst, const void* src, size_t nbytes, int device_index);

  // Graph capture (engine/graph.h has the rules): between begin_capture and end_capture the
  // device work queued on the device is recorded instead of run, and end_capture returns it as a
  // Graph (keep = false: discards it, never throws). A backend without graphs throws from
  // begin_capture (the default).
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual void replay() = 0;             // queues the recorded work once more
    virtual int64_t launches() const = 0;  // its kernels, copies and library calls
  };
  virtual void begin_capture(int device_index);
  virtual std::unique_ptr<Graph> end_capture(int device_index, bool keep);

 protected:
  virtual void write_from_host(void* dst, const void* src, size_t nbytes, int device_index) = 0;
  virtual void read_to_host(void* dst, const void* src, size_t nbytes, int device_index) = 0;
};

// Host <-> device transfers of tensor values, counted where every one of them passes: the
// backends' copy_from_host / copy_to_host. On the CPU a "transfer" is the host reading a tensor's
// values (item(), to_vector(), copy_to_host()) or building one from host values (from_vector(),
// from_host()); on a GPU each is a copy that synchronises with the device. Tests use the counts
// to hold the training step to its budget (no read per micro-batch, at most one per step).
struct TransferCounts {
  int64_t to_host = 0;    // tensor values read by the host (device-to-host copies)
  int64_t from_host = 0;  // host values written into tensors (host-to-device copies)
};
TransferCounts transfer_counts();  // since the process started (all threads)

void register_backend(DeviceType type, Backend* backend);
bool has_backend(DeviceType type);
// Throws "[device] libengine was built without CUDA ..." when the backend is absent.
Backend& backend(DeviceType type);
inline Backend& backend_for(const Tensor& t) { return backend(t.device().type); }

// `g` summed over the dims that broadcast `shape` up to g's shape (g itself when the shapes are
// equal): the gradient of a broadcast. Not recorded.
Tensor sum_to_shape(const Tensor& g, const Shape& shape);

// A CUDA backend is built in and at least one device is visible.
bool cuda_available();

// Throws unless `device` can hold tensors here: "[device] cuda:1 does not exist (1 CUDA device
// visible)", "... libengine was built without CUDA", "... no CUDA device is visible".
void check_device(Device device);

}  // namespace engine
