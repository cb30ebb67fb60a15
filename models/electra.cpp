// ELECTRA pretraining: the generator, the discriminator and the loss (see electra.h).
#include "models/electra.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/ops.h"

namespace models {

namespace {
// The generator's initial values come from a stream of their own (the discriminator's are then
// those of a BertForMaskedLM with the same seed).
constexpr uint64_t kGeneratorStream = 0x47454E45524154ull;  // "GENERAT"
}  // namespace

ElectraConfig ElectraConfig::from_config(const engine::ConfigSection& s) {
  ElectraConfig e;
  e.generator_size = s.get_double("generator_size", e.generator_size);
  e.generator_layers = s.get_int("generator_layers", e.generator_layers);
  e.rtd_weight = s.get_double("rtd_weight", e.rtd_weight);
  e.temperature = s.get_double("temperature", e.temperature);
  s.finish();
  ENGINE_CHECK(e.generator_size > 0 && e.generator_size <= 1, "[config] ",
               s.where("generator_size"), ": must be in (0, 1], got ", e.generator_size);
  ENGINE_CHECK(e.generator_layers >= 0, "[config] ", s.where("generator_layers"),
               ": must be 0 (the discriminator's) or positive, got ", e.generator_layers);
  ENGINE_CHECK(std::isfinite(e.rtd_weight) && e.rtd_weight >= 0, "[config] ", s.where("rtd_weight"),
               ": must be a finite value >= 0, got ", e.rtd_weight);
  ENGINE_CHECK(std::isfinite(e.temperature) && e.temperature > 0, "[config] ",
               s.where("temperature"), ": must be positive, got ", e.temperature);
  return e;
}

std::string ElectraConfig::to_json() const {
  nlohmann::ordered_json j;
  j["generator_size"] = generator_size;
  j["generator_layers"] = generator_layers;
  j["rtd_weight"] = rtd_weight;
  j["temperature"] = temperature;
  return j.dump();
}

ElectraConfig ElectraConfig::from_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ENGINE_FAIL("[electra] ", source, ": the ELECTRA config is not valid JSON: ", e.what());
  }
  auto num = [&](const char* key) {
    ENGINE_CHECK(j.is_object() && j.contains(key) && j[key].is_number(), "[electra] ", source,
                 ": ELECTRA config key '", key, "' is missing or not a number");
    return j[key].get<double>();
  };
  ElectraConfig e;
  e.generator_size = num("generator_size");
  e.generator_layers = static_cast<int64_t>(num("generator_layers"));
  e.rtd_weight = num("rtd_weight");
  e.temperature = num("temperature");
  return e;
}

BertConfig generator_config(const BertConfig& d, const ElectraConfig& e) {
  BertConfig g = d;
  auto scaled = [&](int64_t v) {
    return std::max<int64_t>(1, std::llround(double(v) * e.generator_size));
  };
  g.hidden_size = scaled(d.hidden_size);
  g.num_heads = scaled(d.num_heads);
  g.ffn_size = scaled(d.ffn_size);
  g.num_layers = e.generator_layers > 0 ? e.generator_layers : d.num_layers;
  g.embedding_size = d.embedding_width();
  if (g.embedding_size == g.hidden_size) g.embedding_size = 0;
  ENGINE_CHECK(g.hidden_size % g.num_heads == 0, "[electra] electra.generator_size ",
               e.generator_size, " gives the generator a hidden size of ", g.hidden_size, " and ",
               g.num_heads, " heads (", d.hidden_size, " and ", d.num_heads,
               " scaled), which do not divide; choose a size that keeps the head size whole");
  g.validate();
  return g;
}

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
  Tensor logit = rtd_out.forward(engine::gelu(rtd_dense.forward(h))).reshape({b * t, 1});
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

}  // namespace models
