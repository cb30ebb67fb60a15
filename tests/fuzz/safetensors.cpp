// Fuzz target: the safetensors reader (engine/safetensors.cpp) — the length field, the JSON
// header (dtypes, shapes, data_offsets, __metadata__), the exact tiling of the data buffer and the
// file's length; then the same file through load_safetensors_into with the tensors it holds.
#include <cstdint>

#include "engine/error.h"
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_path("model.safetensors");
  fuzz::write_bytes(path, fuzz::as_view(data, size));
  try {
    (void)engine::read_safetensors_metadata(path);
    engine::SafetensorsContents c = engine::load_safetensors(path);
    // Every tensor read back into a tensor of its own shape and dtype: the file matches exactly.
    engine::NamedTensors dest;
    for (auto& [name, t] : c.tensors)
      dest.emplace_back(name, engine::Tensor::empty(t.shape(), t.dtype()));
    engine::SafetensorsContents rest = engine::load_safetensors_into(path, dest);
    if (!rest.tensors.empty() || !rest.skipped.empty()) std::abort();
  } catch (const engine::Error&) {
  }
  return 0;
}
