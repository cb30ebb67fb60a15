// The presets: the one list of positional-encoding combinations (docs/positional-encodings.md),
// each naming its families (models/position/*.cpp, registered by name) in order, and the family
// registry. Parameters are drawn in that order and the attention terms added in it (TUPE's untied
// term before the T5 bias it may reset).
#include <algorithm>
#include <memory>

#include "engine/error.h"
#include "models/bert_config.h"

namespace models {
namespace {

// The registered families, by name (component.h); filled by static initialisers.
std::vector<std::unique_ptr<const PositionFamily>>& registry() {
  static std::vector<std::unique_ptr<const PositionFamily>> families;
  return families;
}

struct Preset {
  const char* name;
  std::vector<std::string> families;  // by name, in order (component.h: ENGINE_POSITION_FAMILY)
  bool cls_reset;                     // TUPE's [CLS] reset (model.position.cls_reset: paper | code)
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> rows = {
      // The 13 rows of the second paper (absolute, relative, their combinations) ...
      {"no_pe", {}, false},
      {"bert_a", {"learned"}, false},
      {"sin_ape", {"sinusoid"}, false},
      {"learnable_sin_ape", {"learnable_sinusoid"}, false},
      {"bert_r", {"learned", "t5_bias"}, false},
      {"learned_rpe", {"shaw_learned"}, false},
      {"sin_rpe", {"shaw_sinusoid"}, false},
      {"learnable_sin_rpe", {"shaw_learnable_sinusoid"}, false},
      // ... TUPE's presets and its ablations ...
      {"tupe_a", {"untied"}, true},
      {"tupe_r", {"untied", "t5_bias"}, true},
      {"tupe_a_tie_cls", {"untied"}, false},
      {"bert_a_d", {"decomposed"}, false},
      // ... the encodings used since (RoFormer, Press et al.) ...
      {"rope", {"rope"}, false},
      {"alibi", {"alibi"}, false},
      // ... and the APE + RPE combinations of the second paper.
      {"bert_a+learned_rpe", {"learned", "shaw_learned"}, false},
      {"bert_a+sin_rpe", {"learned", "shaw_sinusoid"}, false},
      {"bert_a+learnable_sin_rpe", {"learned", "shaw_learnable_sinusoid"}, false},
      {"learnable_sin_ape+learned_rpe", {"learnable_sinusoid", "shaw_learned"}, false},
      {"learnable_sin_ape+sin_rpe", {"learnable_sinusoid", "shaw_sinusoid"}, false},
      {"learnable_sin_ape+learnable_sin_rpe",
       {"learnable_sinusoid", "shaw_learnable_sinusoid"},
       false},
  };
  return rows;
}

}  // namespace

bool register_position_family(const PositionFamily& family) {
  ENGINE_CHECK(*family.name && family.make, "[bert] a position family needs a name and a factory");
  ENGINE_CHECK(!find_position_family(family.name), "[bert] position family '", family.name,
               "' registered twice");
  registry().push_back(std::make_unique<const PositionFamily>(family));
  return true;
}

const PositionFamily* find_position_family(std::string_view name) {
  for (const auto& f : registry())
    if (name == f->name) return f.get();
  return nullptr;
}

bool position_families_linked() { return !registry().empty(); }

const std::vector<std::string>& position_presets() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Preset& p : presets()) v.push_back(p.name);
    return v;
  }();
  return names;
}

// A config-only program links no family: the facts below are the model's to check there.
std::vector<const PositionFamily*> PositionConfig::linked_families() const {
  std::vector<const PositionFamily*> out;
  if (!position_families_linked()) return out;
  for (const std::string& name : families) {
    const PositionFamily* f = find_position_family(name);
    ENGINE_CHECK(f, "[bert] preset ", preset, " names the position family '", name,
                 "', which no file under models/position/ registers");
    out.push_back(f);
  }
  return out;
}

bool PositionConfig::has_position_table() const {
  for (const PositionFamily* f : linked_families())
    if (f->uses_table) return true;
  return false;
}

bool PositionConfig::has(std::string_view family) const {
  return std::find(families.begin(), families.end(), family) != families.end();
}

std::string PositionConfig::input_name() const {
  for (const PositionFamily* f : linked_families())
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
  for (const PositionFamily* f : linked_families())
    if (*f->hf_blocker) what += (what.empty() ? "" : " and ") + std::string(f->hf_blocker);
  if (families.empty()) what = "no positions at all";
  return what;
}

void PositionConfig::validate(const BertConfig& config) const {
  for (const PositionFamily* f : linked_families())
    if (f->validate) f->validate(config);
  ENGINE_CHECK(rpe_clip >= 1, "[bert] model.position.rpe_clip must be at least 1, got ", rpe_clip);
}

}  // namespace models
