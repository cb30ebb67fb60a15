// main for the [cuda] tests: without a visible GPU (or in a build without CUDA) it says so and
// exits 77, which CTest reports as "Skipped".
#include <cstdio>

#include "catch_run.h"
#include "engine/backend.h"

int main(int argc, char** argv) {
  if (!engine::has_backend(engine::DeviceType::CUDA)) {
    std::printf("SKIPPED: libengine was built without CUDA; [cuda] tests not run\n");
    return 77;
  }
  if (!engine::cuda_available()) {
    std::printf("SKIPPED: no CUDA device visible; [cuda] tests not run\n");
    return 77;
  }
  return run_catch(argc, argv);
}
