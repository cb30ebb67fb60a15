// The presets: the one list of positional-encoding combinations (docs/positional-encodings.md),
// each naming its families (models/position/*.cpp) in order, and the families' descriptors: the
// config-level part of each family (what a config reader needs, without the model). Parameters are
// drawn in that order and the attention terms added in it (TUPE's untied term before the T5 bias it
// may reset).
#include <algorithm>

#include "engine/error.h"
#include "models/bert_config.h"

namespace models {
namespace {

void check_even_width(const BertConfig& c) {
  ENGINE_CHECK(c.embedding_width() % 2 == 0,
               "[bert] sinusoidal positions need an even embedding width (model.embedding_size, "
               "or hidden_size), got ",
               c.embedding_width());
}

void check_even_head(const BertConfig& c) {
  ENGINE_CHECK(c.head_size() % 2 == 0,
               "[bert] sinusoidal relative positions need an even head size, got ", c.head_size());
}

void check_t5(const BertConfig& c) {
  const PositionConfig& p = c.position;
  ENGINE_CHECK(p.relative_buckets >= 4 && p.relative_buckets % 2 == 0,
               "[bert] model.position.relative_buckets must be even and at least 4, got ",
               p.relative_buckets);
  ENGINE_CHECK(p.relative_max_distance > p.relative_buckets / 4,
               "[bert] model.position.relative_max_distance must exceed relative_buckets / 4 "
               "(the exact range), got ",
               p.relative_max_distance);
}

void check_rope(const BertConfig& c) {
  ENGINE_CHECK(c.head_size() % 2 == 0,
               "[bert] rope rotates pairs of dimensions: it needs an even head size "
               "(hidden_size / num_heads), got ",
               c.head_size());
}

const char* const kSinusoidBlocker = "its input positions (sinusoidal, not a learned table)";
const char* const kShawBlocker = "relative positions inside attention (bert.position.shaw_*)";

}  // namespace

// The families' descriptors: name, reads the learned table, adds an input term, HF-export
// verdict, config check (component.h); each family's file attaches its component.
PositionFamily kLearnedPositions{"learned", true, true, "", nullptr};
PositionFamily kSinusoidPositions{"sinusoid", false, true, kSinusoidBlocker, check_even_width};
PositionFamily kLearnableSinusoidPositions{"learnable_sinusoid", false, true, kSinusoidBlocker,
                                           check_even_width};
PositionFamily kT5Bias{"t5_bias", false, false,
                       "relative positions inside attention (bert.position.relative_table)",
                       check_t5};
PositionFamily kShawLearned{"shaw_learned", false, false, kShawBlocker, nullptr};
PositionFamily kShawSinusoid{"shaw_sinusoid", false, false, kShawBlocker, check_even_head};
PositionFamily kShawLearnableSinusoid{"shaw_learnable_sinusoid", false, false, kShawBlocker,
                                      check_even_head};
PositionFamily kUntiedPositions{
    "untied", true, false, "TUPE's untied positional attention (bert.position.query / key / norm)",
    nullptr};
PositionFamily kDecomposedPositions{
    "decomposed", true, false, "the decomposed positional attention (bert.position.query / key)",
    nullptr};
PositionFamily kRotaryPositions{"rope", false, false, "rotary positions (RoPE) inside attention",
                                check_rope};
PositionFamily kAlibiBias{"alibi", false, false, "ALiBi's linear attention bias", nullptr};

namespace {

struct Preset {
  const char* name;
  std::vector<const PositionFamily*> families;
  bool cls_reset;  // TUPE's [CLS] reset (model.position.cls_reset: paper | code)
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> rows = {
      // The 13 rows of the second paper (absolute, relative, their combinations) ...
      {"no_pe", {}, false},
      {"bert_a", {&kLearnedPositions}, false},
      {"sin_ape", {&kSinusoidPositions}, false},
      {"learnable_sin_ape", {&kLearnableSinusoidPositions}, false},
      {"bert_r", {&kLearnedPositions, &kT5Bias}, false},
      {"learned_rpe", {&kShawLearned}, false},
      {"sin_rpe", {&kShawSinusoid}, false},
      {"learnable_sin_rpe", {&kShawLearnableSinusoid}, false},
      // ... TUPE's presets and its ablations ...
      {"tupe_a", {&kUntiedPositions}, true},
      {"tupe_r", {&kUntiedPositions, &kT5Bias}, true},
      {"tupe_a_tie_cls", {&kUntiedPositions}, false},
      {"bert_a_d", {&kDecomposedPositions}, false},
      // ... the encodings used since (RoFormer, Press et al.) ...
      {"rope", {&kRotaryPositions}, false},
      {"alibi", {&kAlibiBias}, false},
      // ... and the APE + RPE combinations of the second paper.
      {"bert_a+learned_rpe", {&kLearnedPositions, &kShawLearned}, false},
      {"bert_a+sin_rpe", {&kLearnedPositions, &kShawSinusoid}, false},
      {"bert_a+learnable_sin_rpe", {&kLearnedPositions, &kShawLearnableSinusoid}, false},
      {"learnable_sin_ape+learned_rpe", {&kLearnableSinusoidPositions, &kShawLearned}, false},
      {"learnable_sin_ape+sin_rpe", {&kLearnableSinusoidPositions, &kShawSinusoid}, false},
      {"learnable_sin_ape+learnable_sin_rpe",
       {&kLearnableSinusoidPositions, &kShawLearnableSinusoid},
       false},
  };
  return rows;
}

}  // namespace

const std::vector<std::string>& position_presets() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Preset& p : presets()) v.push_back(p.name);
    return v;
  }();
  return names;
}

bool PositionConfig::has_position_table() const {
  return std::any_of(families.begin(), families.end(),
                     [](const PositionFamily* f) { return f->uses_table; });
}

bool PositionConfig::has(const PositionFamily& family) const {
  return std::find(families.begin(), families.end(), &family) != families.end();
}

std::string PositionConfig::input_name() const {
  for (const PositionFamily* f : families)
    if (f->input) return f->name;
  return "none";
}

void apply_position_preset(PositionConfig& pc, const std::string& preset,
                           const std::string& cls_reset) {
  const auto& all = presets();
  auto it = std::find_if(all.begin(), all.end(), [&](const Preset& p) { return preset == p.name; });
  if (it == all.end()) {
    std::string list;
    for (const Preset& p : all) list += (list.empty() ? "" : ", ") + std::string(p.name);
    ENGINE_FAIL("[bert] unknown position preset '", preset, "'; expected one of: ", list);
  }
  ENGINE_CHECK(cls_reset == "paper" || cls_reset == "code",
               "[bert] cls_reset must be 'paper' or 'code', got '", cls_reset, "'");
  pc.preset = preset;
  pc.families = it->families;
  pc.cls_reset = ClsReset::none;
  if (it->cls_reset) pc.cls_reset = cls_reset == "code" ? ClsReset::code : ClsReset::paper;
}

std::string PositionConfig::hf_blocker() const {
  std::string what;
  for (const PositionFamily* f : families)
    if (*f->hf_blocker) what += (what.empty() ? "" : " and ") + std::string(f->hf_blocker);
  if (families.empty()) what = "no positions at all";
  if (cls_reset != ClsReset::none) what += " and the [CLS] reset";
  return what;
}

void PositionConfig::validate(const BertConfig& config) const {
  for (const PositionFamily* f : families)
    if (f->validate) f->validate(config);
  ENGINE_CHECK(rpe_clip >= 1, "[bert] model.position.rpe_clip must be at least 1, got ", rpe_clip);
}

}  // namespace models
