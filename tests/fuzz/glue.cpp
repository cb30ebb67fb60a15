// Fuzz target: the GLUE .tsv reader (data/glue.cpp) for every task's train/dev and test layouts
// — header names, column counts, labels, STS-B scores, test ids, the BOM and '\r' handling — and
// the task's metrics on what it read. Input: one byte choosing the task (low 4 bits) and the
// split (bit 4: test), then the file.
#include <cstdint>

#include "data/glue.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string path = fuzz::scratch_path("glue.tsv");
  const std::vector<data::GlueTask>& tasks = data::glue_tasks();
  const data::GlueTask& task = tasks[(data[0] & 0x0f) % tasks.size()];
  const bool test_split = task.test_only || (data[0] & 0x10) != 0;
  fuzz::write_bytes(path, fuzz::as_view(data + 1, size - 1));
  try {
    data::GlueReadStats stats;
    const std::vector<data::GlueExample> examples = data::read_glue(task, path, test_split, &stats);
    if (examples.empty()) std::abort();  // an empty file is an error, never zero examples
    if (!test_split) {
      std::vector<int64_t> labels;
      std::vector<double> scores;
      for (const data::GlueExample& e : examples) {
        if (task.regression)
          scores.push_back(e.score);
        else
          labels.push_back(e.label);
      }
      for (const auto& [name, value] : data::glue_metrics(task, examples, labels, scores))
        if (!(value >= -1.0000001 && value <= 1.0000001) && value == value) std::abort();
    }
  } catch (const engine::Error&) {
  }
  return 0;
}
