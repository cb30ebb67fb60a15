// The backend registry and the error for kernels a device does not have.
#include "engine/backend.h"

#include <algorithm>
#include <atomic>
#include <string_view>
#include <vector>

#include "engine/error.h"
#include "engine/kernel.h"

namespace engine {
namespace {
Backend* g_backends[kNumDeviceTypes] = {};
std::atomic<int64_t> g_to_host{0}, g_from_host{0};
}  // namespace

void Backend::copy_from_host(void* dst, const void* src, size_t nbytes, int device_index) {
  g_from_host.fetch_add(1, std::memory_order_relaxed);
  write_from_host(dst, src, nbytes, device_index);
}

void Backend::copy_to_host(void* dst, const void* src, size_t nbytes, int device_index) {
  g_to_host.fetch_add(1, std::memory_order_relaxed);
  read_to_host(dst, src, nbytes, device_index);
}

void Backend::begin_capture(int) {
  ENGINE_FAIL("[graph] the ", name(),
              " backend cannot capture device work into a graph (CUDA "
              "devices can)");
}

std::unique_ptr<Backend::Graph> Backend::end_capture(int, bool keep) {
  ENGINE_CHECK(!keep, "[graph] the ", name(), " backend has no capture to end");
  return nullptr;
}

TransferCounts transfer_counts() {
  return {g_to_host.load(std::memory_order_relaxed), g_from_host.load(std::memory_order_relaxed)};
}

void register_backend(DeviceType type, Backend* b) { g_backends[static_cast<int>(type)] = b; }
bool has_backend(DeviceType type) { return g_backends[static_cast<int>(type)] != nullptr; }

Backend& backend(DeviceType type) {
  Backend* b = g_backends[static_cast<int>(type)];
  ENGINE_CHECK(b != nullptr, "[device] libengine was built without ", device_type_name(type),
               " support (nvcc was not found when CMake configured the build, or ENGINE_CUDA=OFF); "
               "rebuild with the CUDA toolkit to use ",
               device_type_name(type), " tensors");
  return *b;
}

Tensor sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  backend_for(g).sum_to(g, out);
  return out;
}

void check_device(Device device) {
  if (device.is_cpu()) return;
  ENGINE_CHECK(has_backend(device.type), "[device] ", device.str(),
               ": libengine was built without CUDA (configure with nvcc, or the emulation "
               "build -DENGINE_CUDA_EMULATE=ON)");
  const int n = backend(device.type).device_count();
  ENGINE_CHECK(n > 0, "[device] ", device.str(), ": no CUDA device is visible");
  ENGINE_CHECK(device.index >= 0 && device.index < n, "[device] ", device.str(),
               " does not exist (", n, " CUDA device", n == 1 ? "" : "s", " visible)");
}

bool cuda_available() {
  return has_backend(DeviceType::CUDA) && backend(DeviceType::CUDA).device_count() > 0;
}

namespace {
struct NotedTable {
  const void* table;
  KernelTableInfo info;
};
// Function-local: registrations run from static initialisers of any translation unit.
std::vector<NotedTable>& noted_tables() {
  static std::vector<NotedTable> tables;
  return tables;
}
}  // namespace

void note_kernel_table(const void* table, const char* op, bool (*has)(DeviceType)) {
  for (const NotedTable& t : noted_tables())
    if (t.table == table) return;
  noted_tables().push_back({table, {op, has}});
}

std::vector<KernelTableInfo> kernel_tables() {
  std::vector<KernelTableInfo> out;
  for (const NotedTable& t : noted_tables()) out.push_back(t.info);
  std::sort(out.begin(), out.end(), [](const KernelTableInfo& a, const KernelTableInfo& b) {
    return std::string_view(a.op) < std::string_view(b.op);
  });
  return out;
}

void missing_kernel(const char* op, DeviceType type) {
  if (!has_backend(type)) backend(type);  // throws the "built without" message
  ENGINE_FAIL("[", op, "] has no ", device_type_name(type), " kernel in this build");
}

}  // namespace engine
