// kernel_coverage: every kernel table (engine/kernel.h) that any backend registers into must
// have a CUDA implementation in this build. Needs the CUDA backend built in, not a device: it
// reads the tables, launches nothing. Prints each table with its devices; exits 1 naming every
// table without a CUDA kernel, 2 when the build has no CUDA backend at all.
#include <cstdio>

#include "engine/backend.h"
#include "engine/kernel.h"

int main() {
  using engine::DeviceType;
  if (!engine::has_backend(DeviceType::CUDA)) {
    std::printf("kernel_coverage: libengine was built without its CUDA backend\n");
    return 2;
  }
  const auto tables = engine::kernel_tables();
  int missing = 0;
  for (const engine::KernelTableInfo& t : tables) {
    const bool cpu = t.has(DeviceType::CPU), cuda = t.has(DeviceType::CUDA);
    std::printf("  %-24s cpu %-3s cuda %s\n", t.op, cpu ? "yes" : "NO", cuda ? "yes" : "NO");
    missing += !cuda;
  }
  std::printf("kernel_coverage: %zu kernel tables, %d without a CUDA kernel\n", tables.size(),
              missing);
  if (tables.size() < 10) {  // the registry itself broke (static initialisers dropped?)
    std::printf("kernel_coverage: expected the op library's tables, found only %zu\n",
                tables.size());
    return 1;
  }
  return missing == 0 ? 0 : 1;
}
