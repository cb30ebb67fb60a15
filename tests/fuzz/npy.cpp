// Fuzz target: the .npy reader (engine/npy.cpp) — magic, version, header length, the Python-dict
// header ('descr', 'fortran_order', 'shape') and the data size. A file that loads must survive a
// save and load unchanged.
#include <cstdint>
#include <cstring>

#include "engine/error.h"
#include "engine/npy.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_path("array.npy");
  static const std::string again = fuzz::scratch_path("again.npy");
  fuzz::write_bytes(path, fuzz::as_view(data, size));
  try {
    engine::Tensor t = engine::load_npy(path);
    engine::save_npy(again, t);
    engine::Tensor u = engine::load_npy(again);
    if (u.shape() != t.shape() || u.dtype() != t.dtype() ||
        (t.nbytes() > 0 && std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) != 0))
      std::abort();
  } catch (const engine::Error&) {
  }
  return 0;
}
