// Data parallelism over a Communicator: every rank holds the whole model in FlatParameters and
// computes gradients on its own shard of the batch; GradReducer sums those gradients over the
// ranks in buckets while backward is still running.
//
// Buckets are contiguous ranges of the flat gradient slab, taken from its end (the parameters
// registered last, whose gradients backward produces first), each about `bucket_bytes`. The
// autograd leaf hook (engine/autograd.h) tells when each parameter's gradient is complete; when a
// bucket's parameters are all complete its all-reduce starts (non-blocking: MPI on the
// communicator's thread, or NCCL on its own stream), strictly in bucket order so every rank issues
// the same collectives in the same order. finish() starts what is left and waits; the time it waits
// is the communication that backward did not hide.
//
//   engine::GradReducer reducer(flat, engine::world());
//   for (micro-batches) {
//     if (last) reducer.begin();     // only the last micro-batch of an accumulation reduces
//     loss.backward();
//   }
//   reducer.finish();                 // gradients are now summed over the ranks
//
// reduce_dtype bf16 sends each bucket as bf16 (half the bytes of the f32 slab): the bucket is
// rounded into a bf16 copy as it starts, reduced (NCCL: bf16 natively; MPI: widened to f32,
// reduced, rounded once) and widened back into the f32 slab at finish(). The slab, the
// accumulation of micro-batches into it, clipping and the optimizer stay f32. One rank reduces
// nothing and rounds nothing. Bucket sizes count the slab's f32 bytes either way.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/autograd.h"
#include "engine/comm.h"
#include "engine/module.h"

namespace engine {

class GradReducer {
 public:
  GradReducer(const FlatParameters& flat, Communicator& comm, int64_t bucket_bytes = 25 << 20,
              ReduceOp op = ReduceOp::sum, DType reduce_dtype = DType::f32);

  // Installs the leaf hook for the backward(s) that follow on this thread.
  void begin();
  // Starts the buckets not started yet, waits for all, removes the hook. Without begin() it
  // reduces the whole slab (one bucket after another).
  void finish();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // Seconds the last finish() waited: communication not overlapped with backward.
  double last_exposed_s() const { return exposed_s_; }
  // Buckets the last backward started before finish() (overlapped with backward).
  int64_t last_started_early() const { return started_early_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // element range of the slab
    int params = 0;              // parameters whose gradients it holds
    int ready = 0;
  };
  void on_leaf_ready(const TensorImpl* leaf);
  void start_ready_buckets(bool all);

  const FlatParameters& flat_;
  Communicator& comm_;
  ReduceOp op_;
  Tensor wire_;  // reduce_dtype bf16: the slab's bf16 copy that travels (undefined for f32)
  std::vector<Bucket> buckets_;  // in launch order
  std::unordered_map<const TensorImpl*, int> bucket_of_;
  std::vector<std::unique_ptr<CommWork>> works_;
  size_t next_ = 0;  // the next bucket to start
  std::optional<LeafGradHookScope> hook_;
  double exposed_s_ = 0;
  int64_t started_early_ = 0;
};

// Copies rank `root`'s parameter values to every rank (start of training, after a resume).
void broadcast_parameters(const FlatParameters& flat, Communicator& comm, int root = 0);

}  // namespace engine
