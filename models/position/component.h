// Positional encodings as components (docs/architecture.md, "Adding a positional encoding").
//
// A family (absolute learned / sinusoidal, T5 buckets, Shaw, TUPE's untied term, the decomposed
// term, RoPE, ALiBi) is one .cpp file under models/position/ defining a PositionFamily: its name,
// its config checks and a factory for its PositionComponent, registered by ENGINE_POSITION_FAMILY.
// A component provides
//   - its parameters, registered on the model's PositionEncoding ("bert.position.<name>", drawn
//     from the model's generator at construction),
//   - its input term (added to the token embeddings before the input LayerNorm),
//   - its share of the attention terms (AttentionTerms: an additive bias, q/k additions, a q/k
//     rotation, Shaw's relative vectors, the logit scale),
//   - its poscorr matrices;
// and the family its verdict on a Hugging Face BERT export.
// A preset (models/position/presets.cpp, the one list of combinations) names its families in
// order; the layers apply the AttentionTerms without knowing which family produced them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/macros.h"
#include "engine/module.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace models {

using engine::Generator;
using engine::Tensor;
struct BertConfig;
class BertModel;
class PositionEncoding;

// The positional terms of one forward, computed once and shared by every layer. Each is
// undefined when no component of the preset produces it.
struct AttentionTerms {
  Tensor bias;        // (1, H, T, T) additive logits (TUPE's term, T5 bias, ALiBi)
  Tensor shaw_table;  // (R, d_h) relative vectors a_r (Shaw): keys k_j + a_c(j-i), values likewise
  Tensor shaw_index;  // (T, T) i64: c(j - i) + clip
  Tensor shaw_inverse;  // relative_index_inverse(shaw_index, R): made once per length
  Tensor pos_query;     // (1, H, T, d_h) added to q (bert_a_d's p U^Q)
  Tensor pos_key;       // (1, H, T, d_h) added to k (bert_a_d's p U^K)
  Tensor rotary_cos;    // (T, d_h / 2) f32: q and k rotated pairwise by these angles (RoPE)
  Tensor rotary_sin;
  // The logits are q.k / sqrt(scale_factor d_h): TUPE 2, bert_a_d 4.
  double scale_factor = 1.0;
};

// One matrix of the learned positional correlations (models/poscorr.h draws and measures them).
struct CorrelationMatrix {
  std::string name;         // the file stem: tupe_term, ape_dot, ape_qk, decomposed_term,
                            // relative_bias, rpe_dot, alibi_bias, rope_qk, probe_logits
  std::string title;        // one line for the picture
  std::string description;  // what it is, for summary.json
  Tensor values;            // (K, R, C) f32 CPU: K = heads (or 1), R x C the matrix
  bool per_head = true;     // K indexes heads; otherwise K = 1
  bool logits = false;      // in attention-logit units: the pattern classification applies
  bool per_offset = false;  // columns are relative offsets (relative_bias): measured on the
                            // Toeplitz (T, T) matrix it induces
  int64_t first = 0;        // measures skip rows/columns before this (1 under TUPE's [CLS] reset)
  double row_start = 0, col_start = 0;  // the label of row 0 / column 0 (offsets start negative)
  std::string row_axis = "query position i", col_axis = "key position j";
};

// What a component's correlations see: the model (eval mode, no gradients), the length, the
// attention terms of that length, and the title prefix ("<preset>: ").
struct CorrelationContext {
  const BertModel& bert;
  int64_t length;
  const AttentionTerms& terms;
  std::string prefix;
};

class PositionComponent {
 public:
  virtual ~PositionComponent() = default;
  // (T, e) added to the token embeddings, or undefined. `device` is the model's.
  virtual Tensor input_term(int64_t seq_len, engine::Device device) const { return Tensor(); }
  // Adds this component's terms, in the preset's order; a bias is kept (H, T, T) until every
  // component has added (PositionEncoding unsqueezes it). What it returns is handed to its
  // finish_terms, called after every component's add_terms in the same order (TUPE's [CLS]
  // reset of the summed bias).
  virtual std::vector<Tensor> add_terms(int64_t seq_len, engine::Device device,
                                        AttentionTerms& terms) const {
    return {};
  }
  virtual void finish_terms(int64_t seq_len, engine::Device device, AttentionTerms& terms,
                            const std::vector<Tensor>& saved) const {}
  // Appends this component's poscorr matrices (docs/poscorr.md).
  virtual void correlations(const CorrelationContext& ctx,
                            std::vector<CorrelationMatrix>& out) const {}
};

// Tensors that depend on the length T alone (index maps, masks, fixed sinusoids): built on the
// host once for the longest length so far and kept on the parameters' device. Each depends only
// on i, j or j - i, so a shorter length's are the leading block, copied on the device (no host
// work); derived entries (an inverted index) are recomputed from their source's block.
class LengthConstants {
 public:
  using Build = std::function<Tensor(int64_t seq_len, engine::Device device)>;
  using Derive = std::function<Tensor(const Tensor& source)>;
  // lead_dims: how many leading dims have length T (0: the tensor does not depend on T).
  int add(int lead_dims, Build build);
  int add_derived(int source, Derive derive);
  const Tensor& get(int slot, int64_t seq_len, engine::Device device) const;
  // Host builds so far (tests: once per new longest length, not per forward or per component).
  int64_t builds() const { return builds_; }

 private:
  struct Slot {
    int lead_dims = 0;
    Build build;
    int source = -1;  // derived slots: the slot they are computed from
    Derive derive;
  };
  struct Set {
    int64_t length = 0;
    engine::Device device;
    std::vector<Tensor> values;
  };
  const Set& at(int64_t seq_len, engine::Device device) const;
  std::vector<Slot> slots_;
  mutable Set longest_, recent_;
  mutable int64_t builds_ = 0;
};

// What a family's factory builds a component from.
struct PositionContext {
  const BertConfig& config;
  Generator& gen;          // parameters are drawn from it in registration order
  engine::Module& module;  // the PositionEncoding: parameters are bert.position.<name>
  LengthConstants& constants;
  Tensor table;  // the learned absolute positions p (max_positions, e), when a family uses them
  // The same family's component of the encoder whose input parameters are shared (ELECTRA's
  // generator takes its discriminator's), or null.
  const PositionComponent* shared;
};

// A family's descriptor, defined and registered by the family's own file
// (ENGINE_POSITION_FAMILY); a preset row names its families by `name`. The config readers
// (bert_config, presets.cpp) look the families up by name and link none of them: a program that
// links the config layer alone (the parsers' fuzz targets) has no family registered, and its
// configs skip the family checks, which every program with the model runs.
struct PositionFamily {
  const char* name = "";
  bool uses_table = false;  // reads the learned absolute positions (bert.position.table)
  bool input = false;  // adds an input term (the family ELECTRA's shared embeddings must agree on)
  // Why a checkpoint with this family has no Hugging Face BERT equivalent ("" when it has: bert_a's
  // learned absolute positions).
  const char* hf_blocker = "";
  void (*validate)(const BertConfig& config) = nullptr;  // clear errors for bad sizes
  std::unique_ptr<PositionComponent> (*make)(PositionContext& ctx) = nullptr;
};

// The registry (presets.cpp). Registering a name twice fails.
bool register_position_family(const PositionFamily& family);
// The family registered under `name`, or null.
const PositionFamily* find_position_family(std::string_view name);
// Whether any family is linked into this program (false in config-only programs).
bool position_families_linked();

// The usual factory: a component class constructed from the context.
template <class C>
std::unique_ptr<PositionComponent> make_component(PositionContext& ctx) {
  return std::make_unique<C>(ctx);
}

}  // namespace models

// In a family's file: defines and registers its descriptor, e.g.
//   ENGINE_POSITION_FAMILY(.name = "rope", .hf_blocker = "rotary positions inside attention",
//                          .validate = check_rope, .make = make_component<Rotary>);
// (a static initialiser, as the kernel tables are filled; the models' library is shared, so every
// family's file is linked).
#define ENGINE_POSITION_FAMILY(...)                                              \
  [[maybe_unused]] static const bool ENGINE_CONCAT(position_family_, __LINE__) = \
      ::models::register_position_family(::models::PositionFamily{__VA_ARGS__})
