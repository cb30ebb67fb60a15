// Absolute positions added to the input: a learned table (bert_a), fixed sinusoids (sin_ape) and
// sinusoids with learnable frequencies (learnable_sin_ape). docs/positional-encodings.md.
#include <cmath>

#include "engine/error.h"
#include "models/bert.h"
#include "models/position/common.h"
#include "ops/ops.h"

namespace models {
namespace {

void check_even_width(const BertConfig& c) {
  ENGINE_CHECK(c.embedding_width() % 2 == 0,
               "[bert] sinusoidal positions need an even embedding width (model.embedding_size, "
               "or hidden_size), got ",
               c.embedding_width());
}

using position::cpu_f32;
using position::heads_of;

// The input term's poscorr matrices: P P^T, and the first layer's per-head (p_i W^Q)(p_j W^K) in
// logit units (/ sqrt(d_h)), no biases.
void input_correlations(const Tensor& input, const CorrelationContext& ctx,
                        std::vector<CorrelationMatrix>& out) {
  const BertModel& bert = ctx.bert;
  const BertConfig& c = bert.config();
  const int64_t h = c.num_heads, d = c.hidden_size, dh = c.head_size();
  out.push_back(position::ape_dot(input, ctx));
  Tensor pe = cpu_f32(input);
  if (bert.embedding_project)  // an embedding width of its own: into the layers' width first
    pe = engine::matmul(pe, cpu_f32(bert.embedding_project->weight).transpose(0, 1));
  const Tensor w = cpu_f32(bert.layers.at(0)->qkv.weight);  // (3d, d): Q | K | V rows
  Tensor q = heads_of(engine::matmul(pe, w.slice(0, 0, d).transpose(0, 1)), h);
  Tensor k = heads_of(engine::matmul(pe, w.slice(0, d, 2 * d).transpose(0, 1)), h);
  CorrelationMatrix qk;
  qk.name = "ape_qk";
  qk.title = ctx.prefix + "first layer (p_i W^Q)(p_j W^K) / sqrt(d_h)";
  qk.description =
      "per head, the first layer's query and key projections (no biases) of the absolute position "
      "vectors, divided by sqrt(d_h) as the layer scales its logits";
  qk.values = engine::matmul(q, k.transpose(1, 2)) * (1.0 / std::sqrt(double(dh)));
  qk.logits = true;
  out.push_back(qk);
}

class InputPositions : public PositionComponent {
 public:
  void correlations(const CorrelationContext& ctx,
                    std::vector<CorrelationMatrix>& out) const override {
    input_correlations(input_term(ctx.length, ctx.bert.token_embedding.device()), ctx, out);
  }
};

// bert_a: p_t, a learned row per position (the encoding's table).
class Learned : public InputPositions {
 public:
  explicit Learned(const PositionContext& ctx) : table_(ctx.table) {}
  Tensor input_term(int64_t t, engine::Device) const override { return table_.slice(0, 0, t); }

 private:
  Tensor table_;
};

// sin_ape: [sin(w_k t), cos(w_k t)], w_k = 10000^(-2k/e), fixed.
class Sinusoid : public InputPositions {
 public:
  explicit Sinusoid(PositionContext& ctx) {
    const int64_t e = ctx.config.embedding_width();
    slot_ = ctx.constants.add(1, [e](int64_t t, engine::Device dev) {
      return position::sinusoid(position::range_f32(0, t, engine::Device::cpu()),
                                position::sinusoid_freqs(e))
          .to(dev);
    });
    constants_ = &ctx.constants;
  }
  Tensor input_term(int64_t t, engine::Device dev) const override {
    return constants_->get(slot_, t, dev);
  }

 private:
  const LengthConstants* constants_;
  int slot_;
};

// learnable_sin_ape: the same with the frequencies w_k trained ("bert.position.freq").
class LearnableSinusoid : public InputPositions {
 public:
  explicit LearnableSinusoid(PositionContext& ctx) {
    if (ctx.shared)
      freq = static_cast<const LearnableSinusoid*>(ctx.shared)->freq;
    else
      freq = ctx.module.register_parameter("freq",
                                           position::sinusoid_freqs(ctx.config.embedding_width()));
    slot_ = ctx.constants.add(
        1, [](int64_t t, engine::Device dev) { return position::range_f32(0, t, dev); });
    constants_ = &ctx.constants;
  }
  Tensor input_term(int64_t t, engine::Device dev) const override {
    return position::sinusoid(constants_->get(slot_, t, dev), freq);
  }
  Tensor freq;

 private:
  const LengthConstants* constants_;
  int slot_;
};

}  // namespace

const char* const kSinusoidBlocker = "its input positions (sinusoidal, not a learned table)";

ENGINE_POSITION_FAMILY(.name = "learned", .uses_table = true, .input = true,
                       .make = make_component<Learned>);
ENGINE_POSITION_FAMILY(.name = "sinusoid", .input = true, .hf_blocker = kSinusoidBlocker,
                       .validate = check_even_width, .make = make_component<Sinusoid>);
ENGINE_POSITION_FAMILY(.name = "learnable_sinusoid", .input = true, .hf_blocker = kSinusoidBlocker,
                       .validate = check_even_width, .make = make_component<LearnableSinusoid>);

}  // namespace models
