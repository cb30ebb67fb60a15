// Batch construction and moves (see batch.h).
#include "data/batch.h"

#include <algorithm>
#include <vector>

#include "engine/dtype.h"
#include "engine/error.h"

namespace data {

using engine::DType;
using engine::Tensor;

namespace {

Tensor moved(const Tensor& t, engine::Device device) { return t.defined() ? t.to(device) : t; }

}  // namespace

EncoderInputs EncoderInputs::to(engine::Device device) const {
  return {moved(input_ids, device), moved(attention_mask, device), moved(token_type_ids, device)};
}

MlmBatch MlmBatch::to(engine::Device device) const {
  MlmBatch b = *this;
  b.inputs = inputs.to(device);
  b.positions = moved(positions, device);
  b.targets = moved(targets, device);
  b.sentence_labels = moved(sentence_labels, device);
  return b;
}

bool StagedMlmBatch::stage(const MlmBatch& host, engine::Device device) {
  ENGINE_CHECK(host.positions.defined() && host.positions.device().is_cpu() &&
                   host.targets.defined() && host.targets.device().is_cpu(),
               "[batch] a staged batch is copied from a host batch with positions and targets");
  const int64_t m = host.num_predicted();
  const auto same = [](const Tensor& dst, const Tensor& src) {
    return dst.defined() == src.defined() &&
           (!src.defined() || (dst.shape() == src.shape() && dst.dtype() == src.dtype()));
  };
  const int64_t capacity = positions_.defined() ? positions_.numel() : 0;
  const bool fresh = !batch_.inputs.input_ids.defined() || m > capacity ||
                     !same(batch_.inputs.input_ids, host.inputs.input_ids) ||
                     !same(batch_.inputs.attention_mask, host.inputs.attention_mask) ||
                     !same(batch_.inputs.token_type_ids, host.inputs.token_type_ids) ||
                     !same(batch_.sentence_labels, host.sentence_labels);
  if (m > capacity) {
    const int64_t grown = (m + std::max<int64_t>(8, m / 8) + 7) / 8 * 8;
    positions_ = Tensor::empty(engine::Shape{grown}, DType::i64);
    targets_ = Tensor::empty(engine::Shape{grown}, DType::i64);
  }
  // The padded host tensors, written through their pointers (host memory: no transfer).
  const Tensor pos = host.positions.to(DType::i64).contiguous();
  const Tensor tgt = host.targets.to(DType::i64).contiguous();
  int64_t* p = positions_.data<int64_t>();
  int64_t* t = targets_.data<int64_t>();
  std::copy_n(pos.data<int64_t>(), m, p);
  std::copy_n(tgt.data<int64_t>(), m, t);
  std::fill(t + m, t + targets_.numel(), int64_t{-100});
  // Unique positions padded with the smallest positions none of them takes (their rows' gradient
  // is 0: the loss ignores the targets), so the padded tensor is unique too; else position 0.
  const int64_t pad = positions_.numel() - m, slots = host.inputs.input_ids.numel();
  const bool unique = host.positions_unique && slots - m >= pad;
  if (unique) {
    std::vector<int64_t> taken(p, p + m);
    std::sort(taken.begin(), taken.end());
    int64_t next = 0;  // the smallest position not yet checked
    size_t k = 0;      // the first taken position >= next
    for (int64_t i = m; i < positions_.numel(); ++i) {
      for (; k < taken.size() && taken[k] <= next; ++k)
        if (taken[k] == next) ++next;
      p[i] = next++;
    }
  } else {
    std::fill(p + m, p + positions_.numel(), int64_t{0});
  }
  const bool recapture = fresh || unique != batch_.positions_unique;
  if (fresh) {
    MlmBatch padded = host;
    padded.positions = positions_;
    padded.targets = targets_;
    batch_ = padded.to(device);
    if (device.is_cpu()) {  // to() to the host shares the tensors: the staged ones are our own
      const auto own = [](Tensor& x) {
        if (x.defined()) x = x.clone();
      };
      for (Tensor* x :
           {&batch_.inputs.input_ids, &batch_.inputs.attention_mask, &batch_.inputs.token_type_ids,
            &batch_.sentence_labels, &batch_.positions, &batch_.targets})
        own(*x);
    }
  } else {
    const auto refill = [](const Tensor& dst, const Tensor& src) {
      if (src.defined()) dst.copy_(src);
    };
    refill(batch_.inputs.input_ids, host.inputs.input_ids);
    refill(batch_.inputs.attention_mask, host.inputs.attention_mask);
    refill(batch_.inputs.token_type_ids, host.inputs.token_type_ids);
    refill(batch_.sentence_labels, host.sentence_labels);
    batch_.positions.copy_(positions_);
    batch_.targets.copy_(targets_);
  }
  batch_.labels = host.labels;
  batch_.num_tokens = host.num_tokens;
  batch_.positions_unique = unique;
  return recapture;
}

MlmBatch make_mlm_batch(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& labels,
                        const Tensor& token_type_ids, int64_t vocab_size,
                        const std::string& source) {
  ENGINE_CHECK(input_ids.defined() && input_ids.dim() == 2, "[batch] ", source,
               ": input_ids must be (B, T), got ",
               input_ids.defined() ? engine::describe(input_ids) : std::string("nothing"));
  ENGINE_CHECK(labels.defined() && labels.shape() == input_ids.shape(), "[batch] ", source,
               ": labels ", labels.defined() ? engine::describe(labels) : std::string("(none)"),
               " must match input_ids ", engine::describe(input_ids));
  MlmBatch b;
  const engine::Device host = engine::Device::cpu();
  b.inputs.input_ids = input_ids.to(host).to(DType::i64).contiguous();
  if (attention_mask.defined())
    b.inputs.attention_mask = attention_mask.to(host).to(DType::i64).contiguous();
  if (token_type_ids.defined())
    b.inputs.token_type_ids = token_type_ids.to(host).to(DType::i64).contiguous();
  b.labels = labels.to(host).to(DType::i64).contiguous();
  const int64_t n = b.labels.numel();
  const int64_t* lab = b.labels.data<int64_t>();
  std::vector<int64_t> positions, targets;
  for (int64_t i = 0; i < n; ++i) {
    if (lab[i] == -100) continue;
    ENGINE_CHECK(lab[i] >= 0 && lab[i] < vocab_size, "[batch] ", source, ": labels[",
                 i / labels.size(1), ", ", i % labels.size(1), "] = ", lab[i],
                 " is not -100 or a token id in [0, vocab_size ", vocab_size, ")");
    positions.push_back(i);
    targets.push_back(lab[i]);
  }
  const int64_t m = int64_t(positions.size());
  b.positions = Tensor::from_vector(positions, {m});
  b.targets = Tensor::from_vector(targets, {m});
  b.positions_unique = true;  // ascending: one a label
  if (b.inputs.attention_mask.defined()) {
    const int64_t* mask = b.inputs.attention_mask.data<int64_t>();
    b.num_tokens = int64_t(std::count_if(mask, mask + n, [](int64_t v) { return v != 0; }));
  } else {
    b.num_tokens = n;
  }
  return b;
}

// ---- finetuning --------------------------------------------------------------------------------

const char* task_kind_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::classification:
      return "classification";
    case TaskKind::regression:
      return "regression";
    case TaskKind::span:
      return "span";
  }
  return "?";
}

TaskBatch TaskBatch::to(engine::Device device) const {
  return {inputs.to(device), moved(labels, device)};
}

TaskBatch make_task_batch(const std::vector<EncodedExample>& examples,
                          const std::vector<int64_t>& rows, TaskKind kind, bool with_types) {
  ENGINE_CHECK(!rows.empty(), "[finetune] empty batch");
  size_t t = 0;
  for (int64_t r : rows) t = std::max(t, examples[size_t(r)].ids.size());
  ENGINE_CHECK(t > 0, "[finetune] an example has no tokens");
  const int64_t b = int64_t(rows.size()), tt = int64_t(t);
  std::vector<int64_t> ids(size_t(b) * t, 0), mask(size_t(b) * t, 0), types(size_t(b) * t, 0);
  std::vector<int64_t> labels;
  std::vector<float> scores;
  for (int64_t i = 0; i < b; ++i) {
    const EncodedExample& e = examples[size_t(rows[size_t(i)])];
    for (size_t j = 0; j < e.ids.size(); ++j) {
      ids[size_t(i) * t + j] = e.ids[j];
      mask[size_t(i) * t + j] = 1;
      if (j < e.types.size()) types[size_t(i) * t + j] = e.types[j];
    }
    switch (kind) {
      case TaskKind::classification:
        labels.push_back(e.label);
        break;
      case TaskKind::regression:
        scores.push_back(float(e.score));
        break;
      case TaskKind::span:
        ENGINE_CHECK(e.label >= 0 && e.end >= e.label && e.end < int64_t(e.ids.size()),
                     "[finetune] span target [", e.label, ", ", e.end, "] outside the example's ",
                     e.ids.size(), " tokens");
        labels.push_back(e.label);
        labels.push_back(e.end);
        break;
    }
  }
  TaskBatch out;
  out.inputs.input_ids = Tensor::from_vector<int64_t>(ids, {b, tt});
  out.inputs.attention_mask = Tensor::from_vector<int64_t>(mask, {b, tt});
  if (with_types) out.inputs.token_type_ids = Tensor::from_vector<int64_t>(types, {b, tt});
  if (kind == TaskKind::regression)
    out.labels = Tensor::from_vector<float>(scores, {b});
  else if (kind == TaskKind::span)
    out.labels = Tensor::from_vector<int64_t>(labels, {b, 2});
  else
    out.labels = Tensor::from_vector<int64_t>(labels, {b});
  return out;
}

}  // namespace data
