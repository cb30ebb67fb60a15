// ELECTRA pretraining: the generator, the discriminator and the loss (see electra.h).
#include "models/electra.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/autograd.h"
#include "engine/error.h"
#include "models/bert_sop.h"
#include "models/checkpoint.h"
#include "models/pretrain_config.h"
#include "ops/ops.h"

namespace models {

namespace {
// The generator's initial values come from a stream of their own (the discriminator's are then
// those of a BertForMaskedLM with the same seed).
constexpr uint64_t kGeneratorStream = 0x47454E45524154ull;  // "GENERAT"
}  // namespace

ElectraForPretraining::ElectraForPretraining(const BertConfig& c, const ElectraConfig& e,
                                             uint64_t seed)
    : init_(seed),
      bert(c, init_),
      generator(generator_config(c, e), seed ^ kGeneratorStream, &bert),
      rtd_dense(c.hidden_size, c.hidden_size, init_, c.init_std),
      rtd_out(c.hidden_size, 1, init_, c.init_std),
      electra_(e) {
  register_module("bert", bert);
  register_module("generator", generator);
  rtd.register_module("dense", rtd_dense);
  rtd.register_module("out", rtd_out);
  register_module("rtd", rtd);
}

ElectraOutput ElectraForPretraining::forward(const data::MlmBatch& batch, Generator& gen,
                                             const Tensor& replacements) const {
  ElectraOutput out;
  const MlmOutput g = generator.forward(batch, gen);
  out.mlm_loss = g.loss;
  out.mlm_logits = g.logits;
  if (replacements.defined()) {
    ENGINE_CHECK(
        replacements.dtype() == engine::DType::i64 && replacements.shape() == batch.targets.shape(),
        "[electra] the replacements must be (M) i64 like the batch's targets ",
        engine::describe(batch.targets), ", got ", engine::describe(replacements));
    out.sampled = replacements.to(batch.targets.device());
  } else {
    out.sampled = engine::sample_categorical(g.logits.detach(), electra_.temperature, gen);
  }
  const engine::ReplacedTokens r =
      engine::replace_tokens(batch.inputs.input_ids, batch.inputs.attention_mask, batch.positions,
                             out.sampled, batch.targets);
  out.discriminator_ids = r.ids;
  out.rtd_labels = r.labels;
  data::EncoderInputs in = batch.inputs;
  in.input_ids = r.ids;
  Tensor h = bert.forward(in, gen);  // (B, T, d)
  const int64_t b = h.size(0), t = h.size(1);
  Tensor logit = rtd_out.forward(rtd_dense.forward_gelu(h)).reshape({b * t, 1});
  out.rtd_logits = logit.reshape({b, t});
  // Binary cross-entropy with logits as a 2-class cross-entropy over (0, x): softmax's second
  // probability is sigmoid(x), and the loss is log(1 + e^x) - y x; padding (-100) is ignored.
  Tensor zero = Tensor::zeros({b * t, 1}, logit.dtype(), logit.device());
  out.rtd_loss = engine::cross_entropy(engine::concat({zero, logit}, 1), r.labels.reshape({b * t}));
  out.loss = out.mlm_loss + out.rtd_loss * electra_.rtd_weight;
  return out;
}

PretrainModel::Output ElectraForPretraining::pretrain_forward(const data::MlmBatch& batch,
                                                              Generator& gen) const {
  ElectraOutput out = forward(batch, gen);
  return {out.loss, out.mlm_logits, {{"mlm_loss", out.mlm_loss}, {"rtd_loss", out.rtd_loss}}};
}

std::vector<std::pair<std::string, std::string>> ElectraForPretraining::checkpoint_metadata()
    const {
  return {{kElectraConfigKey, electra_.to_json()}};
}

// The objectives' models (declared in pretrain_config.h; here, with the models, so that the
// config reader links without them).
std::unique_ptr<PretrainModel> PretrainConfig::make_model(const BertConfig& m,
                                                          uint64_t seed) const {
  if (objective == "electra") return std::make_unique<ElectraForPretraining>(m, electra, seed);
  if (objective == "mlm_sop") return std::make_unique<BertForMlmSop>(m, seed);
  return std::make_unique<BertForMaskedLM>(m, seed);
}

std::unique_ptr<PretrainModel> load_pretrain_model(const std::string& checkpoint) {
  const BertConfig config = read_checkpoint_config(checkpoint);
  std::unique_ptr<PretrainModel> model;
  const std::string kind = read_checkpoint_kind(checkpoint);
  // A finetuned checkpoint (bert_classification, ...) has no pretraining head to continue from.
  ENGINE_CHECK(kind.empty() || is_pretraining_kind(kind), "[checkpoint] ", checkpoint,
               " holds a finetuned '", kind, "' model, not a pretraining one (",
               pretraining_kinds_text(), "); pretraining starts from a pretraining checkpoint");
  if (kind == "electra") {
    const engine::SafetensorsMetadata meta = engine::read_safetensors_metadata(checkpoint);
    auto it = meta.find(kElectraConfigKey);
    ENGINE_CHECK(it != meta.end(), "[checkpoint] ", checkpoint, ": an ELECTRA checkpoint without '",
                 kElectraConfigKey, "' in its metadata");
    model = std::make_unique<ElectraForPretraining>(
        config, ElectraConfig::from_json(it->second, checkpoint), 0);
  } else if (kind == "bert_mlm_sop") {
    model = std::make_unique<BertForMlmSop>(config, 0);
  } else {
    model = std::make_unique<BertForMaskedLM>(config, 0);
  }
  load_checkpoint(checkpoint, *model);
  return model;
}

}  // namespace models
