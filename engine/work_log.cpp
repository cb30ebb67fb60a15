// The device-work recorder (see work_log.h).
#include "engine/work_log.h"

#include <atomic>
#include <mutex>

#include "engine/tensor.h"

namespace engine {
namespace {
std::atomic<bool> g_recording{false};
std::mutex g_mutex;
std::vector<WorkRecord> g_records;
thread_local int t_depth = 0;       // open WorkScopes on this thread
thread_local size_t t_current = 0;  // index of the outermost open record
}  // namespace

bool work_recording() { return g_recording.load(std::memory_order_relaxed); }

void start_work_recording() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.clear();
  g_recording.store(true);
}

std::vector<WorkRecord> stop_work_recording() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_recording.store(false);
  return std::move(g_records);
}

void add_work_cost(WorkCost& cost, const Tensor& t) {
  if (!t.defined()) return;
  int64_t stored = 1;  // distinct elements: dims with stride 0 are read once
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.strides()[size_t(d)] != 0) stored *= t.shape()[size_t(d)];
  if (t.numel() == 0) stored = 0;
  cost.bytes += double(stored) * double(dtype_size(t.dtype()));
  if (!cost.shape.empty()) cost.shape += " ";
  cost.shape += shape_str(t.shape()) + " " + std::string(dtype_name(t.dtype()));
}

WorkScope::WorkScope(const char* op, const WorkCost& cost) {
  if (!work_recording()) return;
  counted_ = true;
  if (t_depth++ > 0) return;  // part of the outer op
  std::lock_guard<std::mutex> lock(g_mutex);
  WorkRecord r;
  r.op = op;
  r.shape = cost.shape;
  r.bytes = cost.bytes;
  r.flops = cost.flops;
  t_current = g_records.size();
  g_records.push_back(std::move(r));
}

WorkScope::~WorkScope() {
  if (counted_) --t_depth;
}

void note_work_launch(const char* kernel, bool gemm, int64_t blocks, int64_t threads) {
  if (!work_recording()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (t_depth == 0 || t_current >= g_records.size()) {
    WorkRecord r;
    r.op = kernel;
    t_current = g_records.size();
    g_records.push_back(std::move(r));
  }
  WorkRecord& r = g_records[t_current];
  (gemm ? r.gemms : r.launches) += 1;
  r.kernels.push_back({kernel, blocks, threads});
}

}  // namespace engine
