// DeviceGraph (graph.h): the capture's bracket and its failure path; the backends record.
#include "engine/graph.h"

#include <exception>
#include <vector>

#include "engine/error.h"

namespace engine {
namespace {

thread_local std::vector<std::function<void()>>* t_capture_end = nullptr;

}  // namespace

bool at_capture_end(std::function<void()> f) {
  if (!t_capture_end) return false;
  t_capture_end->push_back(std::move(f));
  return true;
}

DeviceGraph DeviceGraph::capture(Device device, const std::function<void()>& work) {
  check_device(device);
  Backend& b = backend(device.type);
  b.begin_capture(device.index);
  std::vector<std::function<void()>> at_end;
  struct Scope {
    std::vector<std::function<void()>>* prev;
    ~Scope() { t_capture_end = prev; }
  } scope{t_capture_end};
  t_capture_end = &at_end;
  try {
    work();
    for (size_t i = 0; i < at_end.size(); ++i) {  // one may add more
      const std::function<void()> f = std::move(at_end[i]);
      f();
    }
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
