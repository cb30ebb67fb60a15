// pretrain_app's single-batch and evaluation modes (see pretrain_modes.h).
#include "models/pretrain_modes.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <set>

#include "data/batches.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "engine/allocator.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/safetensors.h"
#include "models/checkpoint.h"
#include "models/objective.h"
#include "models/pretrain_config.h"
#include "ops/ops.h"
#include "train/trainer.h"

namespace models {

namespace {

// The keep masks (u8) of the dropout ops in the graph of `loss`, in forward order: each node's
// backward applied to ones gives keep / (1 - p), the mask the backward regenerates from the
// node's saved stream state.
std::vector<engine::Tensor> dropout_masks(const engine::Tensor& loss) {
  std::vector<std::shared_ptr<engine::Node>> found, todo = {loss.grad_fn()};
  std::set<const engine::Node*> seen;
  while (!todo.empty()) {
    std::shared_ptr<engine::Node> n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n.get()).second) continue;
    if (std::strcmp(n->name(), "dropout") == 0 ||
        std::strcmp(n->name(), "attention_dropout") == 0 ||
        std::strcmp(n->name(), "dropout_add_layer_norm") == 0 ||
        std::strcmp(n->name(), "layer_norm_dropout") == 0)
      found.push_back(n);
    for (const engine::Edge& e : n->next) todo.push_back(e.node);
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a->sequence_nr < b->sequence_nr; });
  engine::NoGrad ng;
  std::vector<engine::Tensor> masks;
  for (const auto& n : found) {
    // The embeddings' fused LayerNorm and dropout: its mask from its stream state.
    if (std::strcmp(n->name(), "layer_norm_dropout") == 0) {
      const engine::Tensor keep = engine::layer_norm_dropout_mask(*n);
      if (keep.defined()) masks.push_back(keep.to(engine::Device::cpu()));
      continue;
    }
    // The gradient of ones is nonzero where an element was kept: dropout's output, or the fused
    // residual join's sum (its normed output given zeros: the sum's gradient is then exactly the
    // ones, and the branch input's is ones x keep / (1 - p)).
    const engine::TensorMeta& m = n->outputs.at(0);
    std::vector<engine::Tensor> ones = {engine::Tensor::ones(m.shape, m.dtype, m.device)};
    if (n->outputs.size() == 2) {
      const engine::TensorMeta& normed = n->outputs[1];
      ones.push_back(engine::Tensor::zeros(normed.shape, normed.dtype, normed.device));
    }
    const std::vector<float> g = n->backward(ones).at(0).to(engine::DType::f32).to_vector<float>();
    std::vector<uint8_t> keep(g.size());
    for (size_t i = 0; i < g.size(); ++i) keep[i] = g[i] != 0.f;
    masks.push_back(engine::Tensor::from_vector<uint8_t>(keep, m.shape));
  }
  return masks;
}

}  // namespace

void run_single_batch(PretrainModel& model, const engine::OptimizerOptions& adam, uint64_t seed,
                      const PretrainOptions& train, const SingleBatchOptions& o) {
  const BertConfig& config = model.config();
  const engine::Device device = train.device;
  engine::check_device(device);
  const engine::DType compute = compute_dtype(device, train.precision);
  engine::FlatParameters flat(model.named_parameters(), device);
  const data::MlmBatch host_batch = load_mlm_batch(o.batch_file, config);
  const data::MlmBatch batch = host_batch.to(flat.data().device());
  // The objective's extra inputs: ELECTRA's draws from the batch file instead of sampling,
  // MLM + SOP's sentence labels; each only where the objective reads it.
  const Objective* objective = objective_of_kind(model.kind());
  engine::Tensor replacements = load_replacements(o.batch_file, host_batch, config);
  ENGINE_CHECK(!replacements.defined() || (objective && objective->replacements), "[pretrain_app] ",
               o.batch_file, ": 'replacements' is for objective: electra (this model is ",
               model.kind(), ")");
  if (replacements.defined()) replacements = replacements.to(flat.data().device());
  ENGINE_CHECK(!batch.sentence_labels.defined() || (objective && objective->sentence_order),
               "[pretrain_app] ", o.batch_file,
               ": 'sentence_labels' is for objective: mlm_sop (this model is ", model.kind(), ")");
  // One forward: the loss, the MLM logits and what the objective's dump adds.
  auto forward = [&](engine::Generator& g, engine::NamedTensors* extra) {
    engine::Autocast autocast(compute);
    return model.batch_file_forward(batch, replacements, g, extra);
  };
  // Dropout off, or (--dropout) on with the pretraining loop's stream of rank 0.
  model.train(o.dropout);
  engine::Generator gen = o.dropout ? dropout_generator(seed, 0) : engine::Generator(seed);
  const int64_t micro = o.micro_batches;
  const std::vector<double> weights(size_t(micro), 1.0 / double(micro));

  // The library's training step at a constant learning rate, without clipping (the PyTorch
  // reference runs plain AdamW); no weight decay on biases and LayerNorm parameters (BERT's rule).
  engine::TrainerOptions options;
  options.clip_norm = 0;
  options.loss_scale = train.loss_scale;  // fp16: dynamic loss scaling (train.loss_scale)
  // train.cuda_graph: the batch is the same device tensors every step, so the step replays one
  // captured graph after the first two (step 1 warms up, step 2 is captured).
  options.cuda_graph = train.cuda_graph;
  engine::Trainer trainer(
      flat, adam, [](const std::string& n) { return !engine::default_no_decay(n); },
      engine::constant_lr(adam.lr), options);
  if (train.cuda_graph) trainer.set_graph_generator(&gen);
  const int64_t first_timed = train.cuda_graph ? 3 : 2;  // after the warm-up (and the capture)
  ENGINE_CHECK(!o.timing || o.steps >= first_timed,
               "[pretrain_app] --time with "
               "train.cuda_graph needs --steps 3 or more (step 1 warms up, step 2 is captured)");

  if (!o.dump.empty()) {
    // Step 1's forwards and backwards (a copy of the stream: the steps below draw the same masks):
    // loss sum_m loss_m / M, the logits of the micro-batches one after the other.
    engine::Generator dump_gen = gen;
    engine::Tensor loss;
    std::vector<engine::Tensor> logits, masks;
    engine::NamedTensors extra;  // the first micro-batch's (ELECTRA)
    for (int64_t m = 0; m < micro; ++m) {
      PretrainModel::Output out = forward(dump_gen, m == 0 ? &extra : nullptr);
      if (o.dropout)
        for (engine::Tensor& k : dropout_masks(out.loss)) masks.push_back(k);
      engine::Tensor weighted = micro == 1 ? out.loss : out.loss * weights[size_t(m)];
      weighted.backward();
      loss = m == 0 ? weighted.detach() : loss + weighted.detach();
      logits.push_back(out.mlm_logits.detach());
    }
    engine::NamedTensors dump = {{"loss", loss},
                                 {"logits", micro == 1 ? logits[0] : engine::concat(logits, 0)},
                                 {"targets", batch.targets}};
    dump.insert(dump.end(), extra.begin(), extra.end());
    for (auto& [name, t] : model.named_parameters()) dump.emplace_back("grad." + name, t.grad());
    for (size_t k = 0; k < masks.size(); ++k)
      dump.emplace_back("dropout_mask." + std::to_string(k), masks[k]);
    engine::save_safetensors(o.dump, dump);
    flat.zero_grad();
    std::printf(
        "dump: loss, logits (%lld x %lld), %zu gradients and %zu dropout masks written to %s\n",
        (long long)dump[1].second.size(0), (long long)dump[1].second.size(1),
        model.named_parameters().size(), masks.size(), o.dump.c_str());
  }
  if (o.steps == 0) {
    engine::NoGrad ng;
    std::printf("eval loss %.9g\n", forward(gen, nullptr).loss.item());
  }
  using Clock = std::chrono::steady_clock;
  Clock::time_point timed_from;
  int64_t graph_captures = 0;
  for (int64_t k = 1; k <= o.steps; ++k) {
    if (k == first_timed) timed_from = Clock::now();  // step 1: allocator, caches
    // "step k loss v": the loss before step k's update.
    const engine::StepStats s = trainer.step(
        micro, [&](int64_t) { return forward(gen, nullptr).loss; }, weights);
    std::printf("step %lld loss %.9g%s\n", (long long)k, s.loss,
                s.applied ? "" : " (skipped: inf/NaN gradients)");
    report_graph_capture(trainer, k, graph_captures);
    std::fflush(stdout);
  }
  if (o.timing) {
    const double s = std::chrono::duration<double>(Clock::now() - timed_from).count();
    const int64_t n = o.steps - first_timed + 1;
    const double tokens = double(batch.inputs.input_ids.numel()) * double(micro) * double(n);
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("timing: %lld steps %.3f ms/step %.1f tokens/s peak_rss_mb %.1f", (long long)n,
                1e3 * s / double(n), tokens / s, double(ru.ru_maxrss) / 1024.0);
    // On a device: the most its allocator had handed out at once (parameters, gradients,
    // optimizer state, activations, scratch; PyTorch's torch.cuda.max_memory_allocated).
    if (!device.is_cpu())
      std::printf(" device_peak_mb %.1f",
                  double(engine::allocator_for(device).stats().peak_bytes) / (1 << 20));
    std::printf("\n");
  }
  if (!o.save.empty()) {
    save_checkpoint(o.save, model);
    std::printf("saved %s\n", o.save.c_str());
  }
}

MlmEval evaluate_corpus(const CorpusEvalOptions& o) {
  const BertConfig config = read_checkpoint_config(o.init);
  data::Corpus corpus(o.corpus);
  std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(corpus.meta().tokenizer_path, true);
  ENGINE_CHECK(corpus.meta().vocab_size == config.vocab_size, "[pretrain_app] the corpus ",
               o.corpus, " was prepared with a vocabulary of ", corpus.meta().vocab_size,
               " tokens but the checkpoint ", o.init, " has vocab_size ", config.vocab_size,
               ": prepare the corpus with the model's tokenizer");
  const int64_t seq_len = o.seq_len == 0 ? std::min<int64_t>(config.max_positions, 512) : o.seq_len;
  if (config.position.has_position_table() && seq_len > config.max_positions)
    throw engine::Error("eval: --seq-len " + std::to_string(seq_len) +
                            " exceeds the model's max_positions " +
                            std::to_string(config.max_positions),
                        2);
  engine::check_device(o.device);
  const engine::DType compute = compute_dtype(o.device, o.precision);
  const std::unique_ptr<PretrainModel> model = load_pretrain_model(o.init);
  engine::FlatParameters flat(model->named_parameters(), o.device);

  // MLM + sentence order is evaluated on what it was trained on: segment pairs, half swapped.
  const Objective* objective = objective_of_kind(model->kind());
  const bool sop = objective && objective->sentence_order;
  data::EvalBatches source(corpus, o.split == "valid" ? data::Split::valid : data::Split::train,
                           *tok, o.batch_size, seq_len, data::EvalBatches::kDefaultSeed, {}, sop,
                           sop);
  std::vector<data::MlmBatch> list;
  while (o.batches == 0 || int64_t(list.size()) < o.batches) {
    std::optional<data::MlmBatch> b = source.next();
    if (!b) break;
    list.push_back(std::move(*b));
  }
  ENGINE_CHECK(!list.empty(), "[pretrain_app] the ", o.split, " split of ", o.corpus,
               " gives no batch of ", seq_len, " tokens");
  engine::Communicator& comm = engine::world();
  const MlmEval r =
      evaluate_mlm(*model, list, comm, compute, /*by_position_too=*/!o.by_position.empty());
  ENGINE_CHECK(r.predicted > 0, "[pretrain_app] the ", o.split, " split of ", o.corpus,
               " gave no masked token to predict");
  std::string parts;
  for (auto& [name, value] : r.parts) parts += " " + name + " " + std::to_string(value);
  if (comm.is_root())
    std::printf(
        "eval %s on %s (%s split): %lld batches of %lld x %lld, %lld predicted tokens: loss %.4f "
        "perplexity %.2f accuracy %.4f%s\n",
        o.init.c_str(), o.corpus.c_str(), o.split.c_str(), (long long)r.batches,
        (long long)o.batch_size, (long long)seq_len, (long long)r.predicted, r.loss, r.perplexity,
        r.accuracy, parts.c_str());
  if (comm.is_root() && !o.by_position.empty()) {
    std::string csv = "position,predicted,loss\n";
    for (size_t t = 0; t < r.predicted_by_position.size(); ++t) {
      const int64_t n = r.predicted_by_position[t];
      char loss[32] = "";
      if (n) std::snprintf(loss, sizeof loss, "%.6f", r.loss_sum_by_position[t] / double(n));
      csv += std::to_string(t) + "," + std::to_string(n) + "," + loss + "\n";
    }
    engine::write_file_atomic(o.by_position, csv, "pretrain_app");
    std::printf("wrote the loss by position to %s\n", o.by_position.c_str());
  }
  return r;
}

}  // namespace models
