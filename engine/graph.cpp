// DeviceGraph (graph.h): the capture's bracket and its failure path; the backends record.
#include "engine/graph.h"

#include <exception>

#include "engine/error.h"

namespace engine {

DeviceGraph DeviceGraph::capture(Device device, const std::function<void()>& work) {
  check_device(device);
  Backend& b = backend(device.type);
  b.begin_capture(device.index);
  try {
    work();
  } catch (...) {
    b.end_capture(device.index, false);  // discarded; the stream records nothing more
    throw;
  }
  DeviceGraph g;
  g.graph_ = b.end_capture(device.index, true);
  g.device_ = device;
  return g;
}

void DeviceGraph::replay() const {
  ENGINE_CHECK(graph_ != nullptr, "[graph] replay() of an empty DeviceGraph (capture one first)");
  graph_->replay();
}

int64_t DeviceGraph::launches() const { return graph_ ? graph_->launches() : 0; }

}  // namespace engine
