// The CUDA backend's graph capture (engine/graph.h): the device's compute stream captured in the
// relaxed mode (the caching allocator may cudaMalloc during it), the allocations of the capture
// in a private pool, and the instantiated graph replayed on the compute stream. Included by .cu
// files only.
#pragma once

#include <memory>

#include "engine/backend.h"

namespace engine::cuda {

void begin_capture(int device);
std::unique_ptr<Backend::Graph> end_capture(int device, bool keep);
// A capture is open on `device`: the backend's host transfers and synchronize() refuse to run.
bool capturing(int device);

}  // namespace engine::cuda
