// Fuzz target: the SQuAD v1.1/v2.0 JSON reader (data/squad.cpp) — structure and types, unique
// ids, answers at their answer_start in code points, impossible questions — and the official
// evaluation of each question's first gold answer as its prediction.
#include <cstdint>
#include <map>

#include "data/squad.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_path("squad.json");
  fuzz::write_bytes(path, fuzz::as_view(data, size));
  try {
    const std::vector<data::SquadExample> examples = data::read_squad(path);
    std::map<std::string, std::string> predictions;
    std::map<std::string, double> na_probs;
    for (const data::SquadExample& e : examples) {
      predictions[e.id] = e.answer_texts.empty() ? "" : e.answer_texts[0];
      // The reader's promise: each answer is in the context at its byte offset.
      for (size_t k = 0; k < e.answer_texts.size(); ++k)
        if (e.context.compare(size_t(e.answer_byte_starts.at(k)), e.answer_texts[k].size(),
                              e.answer_texts[k]) != 0)
          std::abort();
      na_probs[e.id] = e.is_impossible ? 1.0 : 0.0;
    }
    const data::SquadScores s = data::evaluate_squad(examples, predictions, &na_probs, 0.5);
    if (!(s.exact >= 0 && s.exact <= 100 && s.f1 >= 0 && s.f1 <= 100)) std::abort();
  } catch (const engine::Error&) {
  }
  return 0;
}
