// Device work recorded once and replayed with one launch: CUDA graphs, behind the backend
// interface (the CUDA backend; the CPU has none). The step of a training loop issues hundreds of
// small kernels a layer; replaying them as one graph takes the host's launch cost and the gaps
// between launches off the GPU.
//
//   engine::DeviceGraph g = engine::DeviceGraph::capture(Device::cuda(0), [&] {
//     out.copy_(some_op(in));  // any ops on device tensors: recorded, not run
//   });
//   for (...) { in.copy_(next_input); g.replay(); use(out); }
//
// The rules, as CUDA's (the emulator applies them too):
// - Capturing runs `work` on the host once: every op queues its kernels, copies and GEMMs as it
//   always does, and they are recorded in order instead of run. Nothing is computed during the
//   capture; each replay() runs the whole recorded sequence, in order with the device's other
//   work (asynchronously, like any op).
// - A replay reads and writes the same addresses as the capture did: the tensors `work` reads
//   (inputs, parameters) must stay alive and be updated in place (copy_) between replays; the
//   tensors it creates are the graph's own: every block allocated or freed during the capture
//   belongs to the graph's private memory pool (engine/cuda/allocator.h) until the graph is
//   destroyed, so nothing else is handed one of them.
// - Everything a kernel takes as an argument is fixed at capture: shapes, scalars, pointers. What
//   must change per replay has to live in device memory. Random draws: a generator put in its
//   device-offset mode for the capture (Generator::begin_device_offsets, engine/rng.h) hands out
//   states whose offset the kernels read from a device word, which the caller sets to the
//   generator's offset before each replay; each replay then draws what the eager step at that
//   offset would (tests/cuda/models/test_cuda_graph_step.cpp). Without it every replay draws the
//   capture's masks.
// - No host synchronisation inside `work`: reading a device tensor on the host (item(),
//   to_vector(), to(cpu)), writing one from host values (from_vector, to(cuda)), synchronize()
//   throw "[graph] ..."; the capture is then discarded and the exception passed on.
// - One capture at a time per device, on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "engine/backend.h"
#include "engine/device.h"

namespace engine {

// Work to queue at the end of the capture in progress on this thread, inside it, after its
// `work`: what a deferred operation still owes the recorded sequence (FlatParameters::zero_grad's
// deferred zeros, for the gradients no recorded backward wrote). Returns false, and keeps
// nothing, when no capture is in progress on this thread.
bool at_capture_end(std::function<void()> f);

class DeviceGraph {
 public:
  DeviceGraph() = default;
  // Records the device work `work` queues on `device` (throws for the CPU, or when `work` throws
  // or breaks a rule above).
  static DeviceGraph capture(Device device, const std::function<void()>& work);

  void replay() const;
  // Kernel launches, copies, memsets and library calls (GEMMs) one replay runs.
  int64_t launches() const;
  bool defined() const { return graph_ != nullptr; }
  Device device() const { return device_; }

 private:
  std::shared_ptr<Backend::Graph> graph_;
  Device device_ = Device::cpu();
};

}  // namespace engine
