// The finetuning loop, prediction and sweep summaries (see finetune.h).
#include "models/finetune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/data_parallel.h"
#include "engine/error.h"
#include "engine/progress.h"
#include "engine/rng.h"
#include "models/pretrain.h"
#include "train/loop.h"

namespace models {

using engine::DType;

std::vector<std::vector<float>> predict(BertForFinetuning& model,
                                        const std::vector<EncodedExample>& examples,
                                        int64_t batch_size) {
  ENGINE_CHECK(batch_size >= 1, "[finetune] the evaluation batch size must be at least 1");
  engine::Communicator& comm = engine::world();
  engine::NoGrad ng;
  const bool was_training = model.training();
  model.train(false);
  engine::Generator unused(0);  // dropout is off
  const engine::Device device = model.bert.token_embedding.device();
  const bool with_types = model.config().type_vocab_size > 0;
  const HeadKind kind = model.kind();
  auto width = [&](const EncodedExample& e) {
    return kind == HeadKind::span         ? int64_t(2 * e.ids.size())
           : kind == HeadKind::regression ? 1
                                          : model.num_labels();
  };
  // Offsets of each example's row in one flat buffer, reduced over the ranks at the end.
  std::vector<int64_t> offset(examples.size() + 1, 0);
  for (size_t i = 0; i < examples.size(); ++i) offset[i + 1] = offset[i] + width(examples[i]);
  std::vector<double> flat(size_t(offset.back()), 0.0);
  // By length (stable), so a batch pads little.
  std::vector<int64_t> order(examples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return examples[size_t(a)].ids.size() < examples[size_t(b)].ids.size();
  });
  int64_t batch_index = 0;
  for (size_t start = 0; start < order.size(); start += size_t(batch_size), ++batch_index) {
    if (batch_index % comm.size() != comm.rank()) continue;
    std::vector<int64_t> rows(
        order.begin() + int64_t(start),
        order.begin() + int64_t(std::min(order.size(), start + size_t(batch_size))));
    const data::TaskBatch batch =
        data::make_task_batch(examples, rows, kind, with_types).to(device);
    FinetuneOutput out = model.forward(batch.inputs, Tensor(), unused);
    const std::vector<float> logits = out.logits.to(DType::f32).contiguous().to_vector<float>();
    const int64_t t = batch.inputs.input_ids.size(1);
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t r = rows[i];
      double* dst = flat.data() + offset[size_t(r)];
      if (kind == HeadKind::span) {
        const int64_t len = int64_t(examples[size_t(r)].ids.size());
        for (int64_t j = 0; j < len; ++j) {
          dst[j] = logits[size_t((int64_t(i) * t + j) * 2)];
          dst[len + j] = logits[size_t((int64_t(i) * t + j) * 2 + 1)];
        }
      } else {
        const int64_t w = width(examples[size_t(r)]);
        for (int64_t j = 0; j < w; ++j) dst[j] = logits[size_t(int64_t(i) * w + j)];
      }
    }
  }
  comm.all_reduce(flat);  // each value written by exactly one rank
  model.train(was_training);
  std::vector<std::vector<float>> result(examples.size());
  for (size_t i = 0; i < examples.size(); ++i)
    result[i].assign(flat.begin() + offset[i], flat.begin() + offset[i + 1]);
  return result;
}

namespace {

std::string metrics_json(const EvalResult& r) {
  std::string s;
  char buf[96];
  for (auto& [name, v] : r.metrics) {
    std::snprintf(buf, sizeof buf, ", \"%s\": %.6f", name.c_str(), v);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, ", \"score\": %.6f", r.score);
  return s + buf;
}

std::string metrics_text(const EvalResult& r) {
  std::string s;
  char buf[96];
  for (auto& [name, v] : r.metrics) {
    std::snprintf(buf, sizeof buf, "%s%s %.4f", s.empty() ? "" : " ", name.c_str(), v);
    s += buf;
  }
  return s;
}

}  // namespace

FinetuneResult finetune(BertForFinetuning& model, const std::vector<EncodedExample>& train,
                        const FinetuneOptions& o, const Evaluator& evaluate) {
  engine::Communicator& comm = engine::world();
  const int64_t n = int64_t(train.size()), ranks = comm.size();
  ENGINE_CHECK(n > 0, "[finetune] no training example");
  ENGINE_CHECK(o.batch_size >= ranks, "[finetune] the batch size ", o.batch_size,
               " is smaller than the ", ranks,
               " ranks: every rank needs at least one example per batch");
  ENGINE_CHECK(o.epochs >= 1 && o.evals_per_epoch >= 1,
               "[finetune] epochs and evals_per_epoch must be at least 1");
  // Batches per epoch; a last batch with fewer examples than ranks is dropped.
  const int64_t rest = n % o.batch_size;
  const int64_t per_epoch = n / o.batch_size + (rest >= ranks ? 1 : 0);
  ENGINE_CHECK(per_epoch > 0, "[finetune] ", n, " training examples make no batch for ", ranks,
               " ranks");
  const int64_t total = per_epoch * o.epochs;
  const int64_t steps = o.max_steps > 0 ? std::min(o.max_steps, total) : total;

  engine::OptimizerOptions adam;
  adam.lr = o.lr;
  adam.beta1 = o.beta1;
  adam.beta2 = o.beta2;
  adam.eps = o.eps;
  adam.weight_decay = o.weight_decay;
  adam.name = o.optimizer;
  const engine::LinearSchedule schedule =
      engine::LinearSchedule::with_warmup_ratio(o.lr, o.warmup_ratio, total);
  engine::LoopOptions loop_options;
  loop_options.device = o.device;
  loop_options.precision = o.precision;
  loop_options.trainer.clip_norm = o.clip_norm;
  loop_options.trainer.bucket_mb = o.bucket_mb;
  // fp16: dynamic loss scaling.
  loop_options.trainer.loss_scale.enabled = engine::precision_dtype(o.precision) == DType::f16;
  loop_options.progress = o.verbose && o.progress;
  engine::TrainingLoop loop(
      model.named_parameters(), adam, [schedule](int64_t s) { return schedule.lr(s); },
      loop_options, comm);
  engine::FlatParameters& flat = loop.flat();
  if (ranks > 1) engine::broadcast_parameters(flat, comm);
  // Each rank its own dropout stream; the batch order is the same on every rank.
  engine::Generator dropout_gen =
      engine::dropout_generator(o.seed, comm.rank(), engine::RunKind::finetuning);
  const engine::Device device = loop.device();
  const bool with_types = model.config().type_vocab_size > 0;

  loop.open_metrics(o.metrics_path, /*append=*/false);
  // The fields after "step" of every metrics line; ostream's precision 9 for the numbers.
  auto fields = [&](int64_t done) {
    std::ostringstream line;
    line.precision(9);
    line << ", \"epoch\": " << double(done) / double(per_epoch);
    return line;
  };
  FinetuneResult result;
  Tensor best_weights;  // a copy of the slab at the best evaluation
  bool have_best = false;
  std::vector<int64_t> order(static_cast<size_t>(n));
  double window_loss = 0;
  int64_t window = 0;

  // What is finetuning's own; TrainingLoop::run decides when (the evaluation after the step's
  // line, in a line of its own).
  engine::LoopHooks hooks;
  hooks.log.every = o.log_every;
  hooks.log_line = [&](int64_t done, const engine::StepStats& s, const engine::LoopWindow& w) {
    const double mean = window_loss / double(window);
    result.last_loss = mean;
    window_loss = 0;
    window = 0;
    std::ostringstream line = fields(done);
    line << ", \"loss\": " << mean << ", \"lr\": " << s.lr << ", \"grad_norm\": " << s.grad_norm;
    engine::LoopReport r{line.str(), ""};
    // The pretraining loop's progress line: rate over this log window, ETA of this run.
    if (o.verbose) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "  step %lld/%lld epoch %.2f loss %.4f lr %.3e grad_norm %.3f %.1f ex/s ETA %s",
                    (long long)done, (long long)steps, double(done) / double(per_epoch), mean, s.lr,
                    s.grad_norm, w.rate, engine::format_duration(w.eta_s).c_str());
      r.text = text;
    }
    return r;
  };
  // Evaluation steps: evals_per_epoch evenly spaced per epoch, the last at the epoch's end, and
  // always at the final step.
  for (int64_t e = 0; e < o.epochs; ++e)
    for (int64_t k = 1; k <= o.evals_per_epoch; ++k)
      hooks.eval.at.push_back(e * per_epoch +
                              std::max<int64_t>(1, (per_epoch * k) / o.evals_per_epoch));
  hooks.evaluate = [&](int64_t done) {
    EvalResult r = [&] {
      engine::Autocast autocast(loop.compute());  // evaluation runs no backward
      return evaluate(model);
    }();
    model.train(true);
    result.history.emplace_back(done, r);
    const bool better = !have_best || r.score > result.best.score;
    if (better) {
      result.best = r;
      result.best_step = done;
      result.best_epoch = double(done) / double(per_epoch);
      best_weights = flat.data().clone();
      have_best = true;
    }
    std::ostringstream line = fields(done);
    line << ", \"eval\": true" << metrics_json(r);
    engine::LoopReport report{line.str(), ""};
    if (o.verbose) {
      char text[64];
      std::snprintf(text, sizeof text, "  eval step %lld epoch %.2f: ", (long long)done,
                    double(done) / double(per_epoch));
      report.text =
          text + metrics_text(r) + (better ? " (best)" : "") +
          (r.one_class.empty() ? "" : " [one class: every dev prediction is " + r.one_class + "]");
    }
    return report;
  };

  auto one_step = [&](int64_t step) {
    const int64_t epoch = step / per_epoch, in_epoch = step % per_epoch;
    if (in_epoch == 0) {
      // A fresh order each epoch: Fisher-Yates from Philox keyed by (seed, epoch).
      std::iota(order.begin(), order.end(), 0);
      engine::Generator shuffle(o.seed ^ (0xA0761D6478BD642Full * uint64_t(epoch + 1)));
      const std::vector<float> u = Tensor::rand({n}, shuffle).to_vector<float>();
      for (int64_t i = n - 1; i > 0; --i) {
        const int64_t j = std::min<int64_t>(i, int64_t(double(u[size_t(i)]) * double(i + 1)));
        std::swap(order[size_t(i)], order[size_t(j)]);
      }
    }
    // This step's global batch, then this rank's share of it.
    const int64_t begin = in_epoch * o.batch_size, count = std::min(o.batch_size, n - begin);
    const int64_t lo = begin + count * comm.rank() / ranks,
                  hi = begin + count * (comm.rank() + 1) / ranks;
    std::vector<int64_t> rows(order.begin() + lo, order.begin() + hi);
    loop.count(count);
    const data::TaskBatch batch =
        data::make_task_batch(train, rows, model.kind(), with_types).to(device);
    const double weight = double(hi - lo) / double(count);  // this rank's share of the global mean
    const engine::StepStats s = loop.step(
        1, [&](int64_t) { return model.forward(batch.inputs, batch.labels, dropout_gen).loss; },
        {&weight, 1});
    window_loss += s.loss;
    ++window;
    return s;
  };
  model.train(true);
  loop.run(steps, one_step, hooks);
  result.steps = steps;
  if (have_best) {
    engine::NoGrad ng;
    flat.data().copy_(best_weights);
  }
  model.train(false);
  return result;
}

double median(std::vector<double> v) {
  ENGINE_CHECK(!v.empty(), "[finetune] median of nothing");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

SweepSummary summarize_sweep(const std::vector<SweepRun>& runs) {
  ENGINE_CHECK(!runs.empty(), "[finetune] a sweep with no run");
  SweepSummary s;
  std::vector<std::vector<size_t>> members;
  for (size_t i = 0; i < runs.size(); ++i) {
    size_t row = 0;
    while (row < s.rows.size() && s.rows[row].lr != runs[i].lr) ++row;
    if (row == s.rows.size()) {
      s.rows.push_back(SweepRow{runs[i].lr, {}, {}, 0});
      members.emplace_back();
    }
    s.rows[row].scores.push_back(runs[i].result.best.score);
    members[row].push_back(i);
  }
  for (size_t r = 0; r < s.rows.size(); ++r) {
    SweepRow& row = s.rows[r];
    row.median_score = median(row.scores);
    for (auto& [name, v0] : runs[members[r][0]].result.best.metrics) {
      (void)v0;
      std::vector<double> values;
      for (size_t i : members[r])
        for (auto& [n2, v] : runs[i].result.best.metrics)
          if (n2 == name) values.push_back(v);
      row.median_metrics.emplace_back(name, median(values));
    }
    if (row.median_score > s.rows[s.best_row].median_score) s.best_row = r;
  }
  const std::vector<size_t>& best = members[s.best_row];
  s.best_run = best[0];
  for (size_t i : best)
    if (runs[i].result.best.score > runs[s.best_run].result.best.score) s.best_run = i;
  return s;
}

}  // namespace models
