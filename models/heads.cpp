// Finetuning heads (see heads.h).
#include "models/heads.h"

#include <algorithm>
#include <map>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "models/checkpoint.h"
#include "ops/ops.h"

namespace models {

BertForFinetuning::BertForFinetuning(const BertConfig& c, HeadKind kind, int64_t num_labels,
                                     uint64_t seed)
    : init_(seed), bert(c, init_), kind_(kind), num_labels_(num_labels) {
  register_module("bert", bert);
  // The head's own stream: the same seed gives the same head whatever the encoder's size.
  Generator head(seed ^ 0x6A09E667F3BCC909ull);
  const int64_t d = c.hidden_size;
  if (kind == HeadKind::span) {
    ENGINE_CHECK(num_labels == 2, "[heads] a span head has 2 outputs (start, end), got ",
                 num_labels);
    out = std::make_unique<Linear>(d, 2, head, c.init_std);
    qa.register_module("out", *out);
    register_module("qa", qa);
    return;
  }
  if (kind == HeadKind::regression)
    ENGINE_CHECK(num_labels == 1, "[heads] a regression head has 1 output, got ", num_labels);
  else
    ENGINE_CHECK(num_labels >= 2, "[heads] a classification head needs at least 2 classes, got ",
                 num_labels);
  dense = std::make_unique<Linear>(d, d, head, c.init_std);
  out = std::make_unique<Linear>(d, num_labels, head, c.init_std);
  classifier.register_module("dense", *dense);
  classifier.register_module("out", *out);
  register_module("classifier", classifier);
}

FinetuneOutput BertForFinetuning::forward(const BertInputs& inputs, const Tensor& labels,
                                          Generator& gen) const {
  const BertConfig& c = config();
  Tensor hidden = bert.forward(inputs, gen);  // (B, T, d)
  const int64_t b = hidden.size(0);
  FinetuneOutput o;
  if (kind_ == HeadKind::span) {
    o.logits = out->forward(hidden);  // (B, T, 2)
    if (!labels.defined()) return o;
    ENGINE_CHECK(labels.dim() == 2 && labels.size(0) == b && labels.size(1) == 2,
                 "[heads] span labels must be (B, 2) ", "start/end positions, got ",
                 engine::describe(labels));
    Tensor start = o.logits.select(2, 0).contiguous(),
           end = o.logits.select(2, 1).contiguous();  // (B, T)
    Tensor lab = labels.to(engine::DType::i64);
    o.loss = (engine::cross_entropy(start, lab.select(1, 0).contiguous()) +
              engine::cross_entropy(end, lab.select(1, 1).contiguous())) *
             0.5;
    return o;
  }
  const bool training = this->training();
  Tensor cls = hidden.select(1, 0);  // (B, d): the [CLS] position
  Tensor x = engine::dropout(engine::tanh(dense->forward(cls)), c.hidden_dropout, training, gen);
  o.logits = out->forward(x);  // (B, C)
  if (kind_ == HeadKind::regression) o.logits = o.logits.reshape({b});
  if (!labels.defined()) return o;
  ENGINE_CHECK(labels.dim() == 1 && labels.size(0) == b, "[heads] labels must be (B) = (", b,
               "), got ", engine::describe(labels));
  if (kind_ == HeadKind::regression) {
    Tensor diff = o.logits - labels.to(o.logits.dtype());
    o.loss = engine::mean(diff * diff);
  } else {
    o.loss = engine::cross_entropy(o.logits, labels.to(engine::DType::i64));
  }
  return o;
}

int64_t load_encoder(const std::string& path, BertForFinetuning& model) {
  BertConfig stored = read_checkpoint_config(path);
  // Dropout is a finetuning choice, not part of the architecture.
  stored.hidden_dropout = model.config().hidden_dropout;
  stored.attention_dropout = model.config().attention_dropout;
  const std::string diff = stored.first_difference(model.config());
  ENGINE_CHECK(diff.empty(), "[finetune] ", path, ": the checkpoint's model differs at model.",
               diff, " (checkpoint vs the model being finetuned)");
  // The MLM head and any training state are allowed and left out.
  const engine::SafetensorsContents rest = load_bert_encoder(path, model.bert);
  int64_t loaded = static_cast<int64_t>(model.bert.named_parameters().size());
  if (model.dense) {
    for (const std::string prefix : {"sop.dense.", "hf.bert.pooler.dense.", "hf.pooler.dense."}) {
      if (std::find(rest.skipped.begin(), rest.skipped.end(), prefix + "weight") ==
          rest.skipped.end())
        continue;
      engine::load_safetensors_into(
          path, {{prefix + "weight", model.dense->weight}, {prefix + "bias", model.dense->bias}},
          engine::ExtraTensors::skip);
      loaded += 2;
      break;
    }
  }
  return loaded;
}

}  // namespace models
