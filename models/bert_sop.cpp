// BERT's masked LM + sentence-order prediction (see bert_sop.h).
#include "models/bert_sop.h"

#include <vector>

#include "engine/error.h"
#include "models/objective.h"
#include "ops/ops.h"

namespace models {

namespace {
constexpr uint64_t kSopStream = 0x534F5048454144ull;  // "SOPHEAD"
}  // namespace

BertForMlmSop::BertForMlmSop(const BertConfig& c, uint64_t seed)
    : BertForMaskedLM(c, seed),
      sop_init_(seed ^ kSopStream),
      sop_dense(c.hidden_size, c.hidden_size, sop_init_, c.init_std),
      sop_out(c.hidden_size, 2, sop_init_, c.init_std) {
  sop.register_module("dense", sop_dense);
  sop.register_module("out", sop_out);
  register_module("sop", sop);
}

MlmSopOutput BertForMlmSop::forward_sop(const data::MlmBatch& batch, Generator& gen) const {
  const Tensor& labels = batch.sentence_labels;
  const int64_t b = batch.inputs.input_ids.size(0), t = batch.inputs.input_ids.size(1);
  ENGINE_CHECK(labels.defined() && labels.dim() == 1 && labels.size(0) == b,
               "[bert] objective mlm_sop needs the batch's sentence_labels (", b,
               ") (data.segment_pairs with sentence order), got ",
               labels.defined() ? engine::describe(labels) : std::string("none"));
  check_predicted(batch);
  Tensor hidden = bert.forward(batch.inputs, gen);  // (B, T, d)
  Tensor flat = hidden.reshape({b * t, hidden.size(2)});
  MlmSopOutput out;
  const MlmOutput mlm = head(flat, batch);  // exactly BertForMaskedLM's
  out.mlm_logits = mlm.logits;
  out.mlm_loss = mlm.loss;
  Tensor cls = hidden.select(1, 0);  // (B, d): the [CLS] position of every row, a view
  out.sop_logits = sop_out.forward(engine::tanh(sop_dense.forward(cls)));
  out.sop_loss = engine::cross_entropy(out.sop_logits, labels);
  out.loss = out.mlm_loss + out.sop_loss;
  return out;
}

PretrainModel::Output BertForMlmSop::batch_file_forward(const data::MlmBatch& batch,
                                                        const Tensor& replacements, Generator& gen,
                                                        engine::NamedTensors* dump) const {
  const MlmSopOutput o = forward_sop(batch, gen);
  if (dump) {
    dump->emplace_back("mlm_loss", o.mlm_loss.detach());
    dump->emplace_back("sop_loss", o.sop_loss.detach());
    dump->emplace_back("sop_logits", o.sop_logits.detach());
  }
  return Output{o.loss, o.mlm_logits, {}};
}

PretrainModel::Output BertForMlmSop::pretrain_forward(const data::MlmBatch& batch,
                                                      Generator& gen) const {
  MlmSopOutput o = forward_sop(batch, gen);
  Output r{o.loss, o.mlm_logits, {{"mlm_loss", o.mlm_loss}, {"sop_loss", o.sop_loss}}};
  if (!training()) {
    const std::vector<float> logits = o.sop_logits.to(engine::DType::f32).to_vector<float>();
    const std::vector<int64_t> labels =
        batch.sentence_labels.to(engine::Device::cpu()).to_vector<int64_t>();
    int64_t right = 0, pairs = 0;
    for (size_t k = 0; k < labels.size(); ++k) {
      if (labels[k] == -100) continue;
      ++pairs;
      right += (logits[2 * k + 1] > logits[2 * k]) == (labels[k] == 1);
    }
    const float accuracy = pairs ? float(right) / float(pairs) : 0.f;
    r.parts.emplace_back("sop_accuracy", Tensor::from_vector(std::vector<float>{accuracy}, {}));
  }
  return r;
}

ENGINE_OBJECTIVE_MODEL("mlm_sop", make_encoder_objective<BertForMlmSop>,
                       encoder_objective_for_checkpoint<BertForMlmSop>);

}  // namespace models
