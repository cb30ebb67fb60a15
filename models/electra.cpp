// ELECTRA pretraining: the generator, the discriminator and the loss (see electra.h).
#include "models/electra.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/autograd.h"
#include "engine/error.h"
#include "models/bert_sop.h"
#include "models/checkpoint.h"
#include "models/objective.h"
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

PretrainModel::Output ElectraForPretraining::batch_file_forward(const data::MlmBatch& batch,
                                                                const Tensor& replacements,
                                                                Generator& gen,
                                                                engine::NamedTensors* dump) const {
  const ElectraOutput o = forward(batch, gen, replacements);
  if (dump) {
    dump->emplace_back("mlm_loss", o.mlm_loss.detach());
    dump->emplace_back("rtd_loss", o.rtd_loss.detach());
    dump->emplace_back("rtd_logits", o.rtd_logits.detach());
    dump->emplace_back("rtd_labels", o.rtd_labels);
    dump->emplace_back("sampled", o.sampled);
  }
  return Output{o.loss, o.mlm_logits, {}};
}

std::string ElectraForPretraining::describe() const {
  const BertConfig& g = generator.config();
  char line[256];
  std::snprintf(line, sizeof line,
                "ELECTRA generator: %lld layers, width %lld, %lld heads, FFN %lld (embeddings "
                "shared, width %lld); loss = MLM + %g x RTD",
                (long long)g.num_layers, (long long)g.hidden_size, (long long)g.num_heads,
                (long long)g.ffn_size, (long long)config().embedding_width(), electra_.rtd_weight);
  return line;
}

std::vector<std::pair<std::string, std::string>> ElectraForPretraining::checkpoint_metadata()
    const {
  return {{kElectraConfigKey, electra_.to_json()}};
}

namespace {

std::unique_ptr<PretrainModel> make_electra(const BertConfig& m, const PretrainConfig& c,
                                            uint64_t seed) {
  return std::make_unique<ElectraForPretraining>(m, c.electra, seed);
}
std::unique_ptr<PretrainModel> load_electra(const BertConfig& m,
                                            const engine::SafetensorsMetadata& meta,
                                            const std::string& path) {
  auto it = meta.find(kElectraConfigKey);
  ENGINE_CHECK(it != meta.end(), "[checkpoint] ", path, ": an ELECTRA checkpoint without '",
               kElectraConfigKey, "' in its metadata");
  return std::make_unique<ElectraForPretraining>(m, ElectraConfig::from_json(it->second, path), 0);
}

}  // namespace

ENGINE_OBJECTIVE_MODEL("electra", make_electra, load_electra);

}  // namespace models
