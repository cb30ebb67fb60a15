// NCCL for the MPI communicator's CUDA tensors (engine/comm.cpp). Plain C++ header: the NCCL and
// CUDA types stay in nccl.cu. Only built with ENGINE_WITH_NCCL.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/comm.h"

namespace engine::cuda {

class NcclChannel {
 public:
  // Collective over the job: rank 0 makes the unique id, `broadcast_bytes` (MPI) hands it to the
  // others, then every rank joins on `device`. Collectives run on a stream of their own.
  static std::unique_ptr<NcclChannel> create(
      int rank, int size, int device, const std::function<void(void*, size_t)>& broadcast_bytes);
  virtual ~NcclChannel() = default;
  // The collective is ordered after the work already queued on the engine's stream; wait() makes
  // that stream wait for it (the host does not block).
  virtual std::unique_ptr<CommWork> all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;
  // A non-empty text once NCCL reports an asynchronous error (a peer died, a network fault);
  // safe to call from the watchdog thread.
  virtual std::string async_error() = 0;
  // Ends the NCCL communicator without waiting for peers (before MPI_Abort).
  virtual void abort() = 0;
};

}  // namespace engine::cuda
