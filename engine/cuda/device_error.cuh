// A bad index met by a device kernel -- an embedding id, a relative bucket, a class target, a
// position to write -- is never read back per call to be checked (that would cost a
// synchronisation per op) and never traps (a trap is a sticky context failure that ends every
// later CUDA call). The kernel skips the element and records the first bad index of the device
// here, in mapped (zero-copy) host memory; the CUDA backend raises it as one engine::Error
// naming the op, the index, its position and the valid range at its next host read or
// synchronisation. The training step's AdamW reads this record and skips its update when it
// holds an index (engine/cuda/optim.cu), and the step's one host read, after AdamW, raises it: a
// step that met a bad index applies no update. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace engine::cuda {

enum class IndexCheck : int32_t {
  none = 0,
  embedding_id,     // gather_rows / the scatter's inverted index: id in [0, rows)
  relative_bucket,  // relative_gather / relative_scatter: bucket in [0, R)
  bucket_lookup,    // bucket_lookup and its backward: bucket in [0, R)
  class_target,     // cross_entropy: target in [0, classes) or the ignore index
  write_position,   // the sampling ops: position in [0, n)
};

struct DeviceIndexError {
  int32_t check = 0;  // an IndexCheck; 0: nothing recorded
  int32_t unused = 0;
  int64_t position = 0, value = 0, bound = 0;
};

// Records the first bad index of the device (later ones are dropped: the first is reported).
__device__ inline void report_bad_index(DeviceIndexError* e, IndexCheck what, int64_t position,
                                        int64_t value, int64_t bound) {
  if (atomicCAS(&e->check, int32_t{0}, static_cast<int32_t>(what)) == 0) {
    e->position = position;
    e->value = value;
    e->bound = bound;
  }
}

// The device's record, as a pointer kernels write through (created on first use).
DeviceIndexError* device_index_error(int device);
// Throws the device's recorded bad index as an engine::Error (and clears it); nothing when none.
// Call after a synchronisation with the device's compute stream.
void raise_device_index_error(int device);

}  // namespace engine::cuda
