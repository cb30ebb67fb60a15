// The masked-LM pretraining loop (see pretrain.h).
#include "models/pretrain.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "data/corpus.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/progress.h"
#include "engine/safetensors.h"
#include "models/objective.h"
#include "train/loop.h"

namespace models {

MlmEval evaluate_mlm(PretrainModel& model, const std::vector<data::MlmBatch>& batches,
                     engine::Communicator& comm, engine::DType compute, bool by_position_too) {
  engine::NoGrad ng;
  engine::Autocast autocast(compute);
  const bool was_training = model.training();
  model.train(false);
  engine::Generator unused(0);  // dropout is off
  MlmEval r;
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t max_len = 0;
  if (by_position_too)
    for (const data::MlmBatch& b : batches) max_len = std::max(max_len, b.inputs.input_ids.size(1));
  // Per position: the summed loss, then the count (one buffer, one all-reduce).
  std::vector<double> by_position(size_t(2 * max_len), 0.0);
  const engine::Device device = model.parameters().at(0).device();
  std::vector<std::string> part_names;
  std::vector<double> part_sums;
  for (size_t i = size_t(comm.rank()); i < batches.size(); i += size_t(comm.size())) {
    const data::MlmBatch b = batches[i].to(device);
    PretrainModel::Output out = model.pretrain_forward(b, unused);
    const int64_t m = out.mlm_logits.size(0), v = out.mlm_logits.size(1);
    const int64_t t_len = batches[i].inputs.input_ids.size(1);
    loss_sum += out.loss.item() * double(m);
    if (part_names.empty())
      for (auto& [name, t] : out.parts) part_names.push_back(name), part_sums.push_back(0.0);
    for (size_t k = 0; k < out.parts.size(); ++k)
      part_sums[k] += out.parts[k].second.item() * double(m);
    // Accuracy and the loss of each token on the host: evaluation is not in the training step.
    std::vector<float> logits = out.mlm_logits.to(engine::DType::f32).to_vector<float>();
    std::vector<int64_t> targets = batches[i].targets.to_vector<int64_t>();
    std::vector<int64_t> positions = batches[i].positions.to_vector<int64_t>();
    for (int64_t k = 0; k < m; ++k) {
      const float* row = logits.data() + k * v;
      const int64_t target = targets[size_t(k)];
      const float* top = std::max_element(row, row + v);
      correct += (top - row) == target;
      if (!by_position_too) continue;
      double sum_exp = 0;
      for (int64_t c = 0; c < v; ++c) sum_exp += std::exp(double(row[c]) - double(*top));
      const size_t t = size_t(positions[size_t(k)] % t_len);
      by_position[t] += double(*top) + std::log(sum_exp) - double(row[target]);
      by_position[size_t(max_len) + t] += 1;
    }
    r.predicted += m;
  }
  model.train(was_training);
  double sums[3] = {loss_sum, double(correct), double(r.predicted)};
  comm.all_reduce(sums);
  if (by_position_too) comm.all_reduce(by_position);
  if (!part_sums.empty()) comm.all_reduce(part_sums);
  r.loss_sum_by_position.assign(by_position.begin(), by_position.begin() + max_len);
  for (int64_t t = 0; t < max_len; ++t)
    r.predicted_by_position.push_back(static_cast<int64_t>(by_position[size_t(max_len + t)]));
  r.batches = int64_t(batches.size());
  r.predicted = static_cast<int64_t>(sums[2]);
  if (r.predicted == 0) return r;
  r.loss = sums[0] / double(r.predicted);
  for (size_t k = 0; k < part_names.size(); ++k)
    r.parts.emplace_back(part_names[k], part_sums[k] / double(r.predicted));
  r.accuracy = sums[1] / double(r.predicted);
  r.perplexity = std::exp(r.loss);
  for (auto& [name, value] : r.parts)
    if (name == "mlm_loss") r.perplexity = std::exp(value);  // ELECTRA: the generator's
  return r;
}

namespace fs = std::filesystem;
using engine::DType;
using engine::Tensor;

namespace {

std::string checkpoint_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step_%08lld.safetensors", static_cast<long long>(step));
  return buf;
}

// Checkpoints in `dir` by step, oldest first (temporary files of interrupted writes excluded).
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::is_directory(dir)) return out;
  static const std::regex re(R"(step_(\d{8,})\.safetensors)");
  for (auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, m, re))
      out.emplace_back(std::stoll(m[1]), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Removes the oldest checkpoints in `dir` past the newest `keep_last`.
void remove_past_keep_last(const fs::path& dir, int64_t keep_last) {
  const auto list = list_checkpoints(dir);
  for (size_t i = 0; i + size_t(keep_last) < list.size(); ++i) fs::remove(list[i].second);
}

Tensor i64_scalar(int64_t v) { return Tensor::from_vector<int64_t>({v}, {}); }
int64_t read_i64(const Tensor& t) { return t.to(DType::i64).to_vector<int64_t>().at(0); }

// Training state beyond the Trainer's: tokens seen (the step count is the Trainer's).
struct TrainerState {
  int64_t tokens = 0;  // non-padding tokens seen
};

void save_training_checkpoint(const fs::path& path, const PretrainModel& model,
                              const engine::Trainer& trainer, const engine::Generator& gen,
                              const TrainerState& st, const BatchSource& data,
                              const std::string& config_text, engine::SafetensorsMetadata meta) {
  engine::NamedTensors state = trainer.optimizer().state();
  for (auto& e : trainer.scaler().state()) state.push_back(e);
  const engine::PhiloxState rng = gen.state();
  state.emplace_back("trainer.step", i64_scalar(trainer.steps_taken()));
  state.emplace_back("trainer.tokens", i64_scalar(st.tokens));
  state.emplace_back("trainer.rng_seed", i64_scalar(static_cast<int64_t>(rng.seed)));
  state.emplace_back("trainer.rng_offset", i64_scalar(static_cast<int64_t>(rng.offset)));
  // Weights + state, config in the metadata; temp file, fsync, rename.
  meta["engine.data_position"] = data.position();
  meta["engine.run_config"] = config_text;
  meta["engine.optimizer"] = trainer.optimizer().name();
  save_checkpoint(path.string(), model, meta, state);
}

// Restores everything from a training checkpoint (weights and state from one read); throws when
// the file cannot be used, so the caller can fall back to an older one.
void load_training_checkpoint(const fs::path& path, PretrainModel& model, engine::Trainer& trainer,
                              engine::Generator& gen, TrainerState& st, BatchSource& data) {
  const BertConfig stored = read_checkpoint_config(path.string());
  const std::string diff = stored.first_difference(model.config());
  ENGINE_CHECK(diff.empty(), "[pretrain] ", path.string(),
               ": the checkpoint's model differs from the config at model.", diff,
               " (checkpoint vs config)");
  const engine::SafetensorsContents c = load_checkpoint(path.string(), model, /*with_state=*/true);
  for (auto& [key, value] : model.checkpoint_metadata()) {
    auto it = c.metadata.find(key);
    ENGINE_CHECK(it != c.metadata.end() && it->second == value, "[pretrain] ", path.string(),
                 ": the checkpoint's ", key, " ",
                 it == c.metadata.end() ? std::string("is missing") : it->second,
                 " differs from the config's ", value);
  }
  // Both optimizers keep the same moments: the name tells them apart (a checkpoint from before
  // LAMB has none and was AdamW's).
  auto opt = c.metadata.find("engine.optimizer");
  const std::string saved_by = opt == c.metadata.end() ? "adamw" : opt->second;
  ENGINE_CHECK(
      saved_by == trainer.optimizer().name(), "[pretrain] ", path.string(),
      ": the checkpoint was trained with optim.name ", saved_by, " but the config says ",
      trainer.optimizer().name(),
      " (resume with the same optimizer, or start a new run from its weights with --init)");
  trainer.optimizer().load_state(c.tensors);
  trainer.scaler().load_state(c.tensors);
  auto need = [&](const char* name) {
    for (auto& [n, t] : c.tensors)
      if (n == name) return read_i64(t);
    ENGINE_FAIL("[pretrain] ", path.string(), ": '", name,
                "' is missing: not a training checkpoint (a weights-only model? use --init)");
  };
  trainer.set_steps_taken(need("trainer.step"));
  st.tokens = need("trainer.tokens");
  gen.set_state({static_cast<uint64_t>(need("trainer.rng_seed")),
                 static_cast<uint64_t>(need("trainer.rng_offset"))});
  auto pos = c.metadata.find("engine.data_position");
  ENGINE_CHECK(pos != c.metadata.end(), "[pretrain] ", path.string(),
               ": no data position in the metadata");
  data.seek(pos->second);
}

// Every rank continues from rank 0's state: weights, optimizer moments, scaler, schedule and data
// position (rank 0 alone reads the checkpoint, so the ranks need no shared filesystem). Each
// rank keeps its own dropout stream (its seed), at rank 0's offset.
void sync_from_root(engine::Communicator& comm, engine::Trainer& trainer, engine::Generator& gen,
                    TrainerState& st, BatchSource& data) {
  engine::broadcast_parameters(trainer.parameters(), comm);
  for (bool optimizer : {true, false}) {
    engine::NamedTensors state = optimizer ? trainer.optimizer().state() : trainer.scaler().state();
    for (auto& [name, t] : state) {
      t = t.contiguous();
      comm.broadcast(t);
    }
    if (!comm.is_root())
      optimizer ? trainer.optimizer().load_state(state) : trainer.scaler().load_state(state);
  }
  Tensor counters = Tensor::from_vector<int64_t>(
      {trainer.steps_taken(), st.tokens, static_cast<int64_t>(gen.state().offset)}, {3});
  comm.broadcast(counters);
  const std::vector<int64_t> c = counters.to_vector<int64_t>();
  trainer.set_steps_taken(c[0]);
  st.tokens = c[1];
  gen.set_state({gen.state().seed, static_cast<uint64_t>(c[2])});
  const std::string position = comm.broadcast(comm.is_root() ? data.position() : std::string());
  if (!comm.is_root()) data.seek(position);
}

// Rewrites metrics.jsonl keeping only the lines of steps <= `step` (a resumed run re-logs the
// rest).
void truncate_metrics(const fs::path& file, int64_t step) {
  if (!fs::exists(file)) return;
  std::ifstream in(file);
  std::ostringstream kept;
  std::string line;
  static const std::regex re(R"(^\{"step":\s*(\d+))");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, re) && std::stoll(m[1]) <= step) kept << line << "\n";
  }
  in.close();
  engine::write_file_atomic(file.string(), kept.str(), "pretrain");
}

using ValidResult = MlmEval;

// Over the first `max_batches` validation batches.
ValidResult validate(PretrainModel& model, BatchSource& data, int64_t max_batches,
                     engine::Communicator& comm, engine::DType compute) {
  ValidResult r = evaluate_mlm(model, data.valid_batches(max_batches), comm, compute);
  ENGINE_CHECK(r.predicted > 0, "[pretrain] the validation split gave no predicted token");
  return r;
}

}  // namespace

std::string latest_checkpoint(const std::string& out_dir) {
  auto list = list_checkpoints(fs::path(out_dir) / "checkpoints");
  return list.empty() ? "" : list.back().second.string();
}

void report_graph_capture(const engine::Trainer& trainer, int64_t step, int64_t& captures) {
  if (trainer.graph_captures() == captures) return;
  captures = trainer.graph_captures();
  std::printf("cuda graph: step %lld captured; each later step replays it (%lld launches)\n",
              (long long)step, (long long)trainer.graph_launches());
}

PretrainResult pretrain(PretrainModel& model, BatchSource& data, const PretrainOptions& o,
                        const engine::OptimizerOptions& adam, uint64_t seed, bool resume,
                        const std::string& config_text,
                        const std::function<void(int64_t, double)>& on_step) {
  engine::Communicator& comm = engine::world();
  const bool root = comm.is_root();  // the rank that logs and writes files
  const fs::path out_dir(o.out_dir), ckpt_dir = out_dir / "checkpoints",
                                     metrics_path = out_dir / "metrics.jsonl";
  if (root) fs::create_directories(ckpt_dir);

  const int64_t warmup = o.warmup_steps >= 0
                             ? o.warmup_steps
                             : static_cast<int64_t>(std::ceil(o.warmup_ratio * double(o.steps)));
  const engine::LinearSchedule schedule(adam.lr, warmup, o.steps);
  engine::LoopOptions loop_options;
  loop_options.device = o.device;
  loop_options.precision = o.precision;
  loop_options.trainer.clip_norm = o.clip_norm;
  loop_options.trainer.loss_scale = o.loss_scale;
  loop_options.trainer.bucket_mb = o.bucket_mb;
  loop_options.trainer.grad_reduce_dtype =
      o.grad_reduce_dtype == "bf16" ? engine::DType::bf16 : engine::DType::f32;
  loop_options.trainer.cuda_graph = o.cuda_graph;
  if (o.cuda_graph) {
    ENGINE_CHECK(comm.size() == 1,
                 "[pretrain] train.cuda_graph runs on one rank (the gradient "
                 "all-reduce is not captured), got ",
                 comm.size(), " ranks: set it false under mpirun");
    const Objective* objective = objective_of_kind(model.kind());
    ENGINE_CHECK(objective == nullptr || !objective->replacements,
                 "[pretrain] train.cuda_graph: the ", objective ? objective->name : "",
                 " objective writes its generator's samples at the predicted positions, which "
                 "graph mode pads; set it false");
  }
  loop_options.decay_bias_and_norm = o.decay_bias_and_norm;
  loop_options.progress = o.progress;
  engine::TrainingLoop loop(
      model.named_parameters(), adam, [schedule](int64_t s) { return schedule.lr(s); },
      loop_options, comm);
  engine::Trainer& trainer = loop.trainer();
  const engine::DType compute = loop.compute();
  const engine::Device device = loop.device();
  // Dropout stream (the init used `seed`); each rank its own.
  engine::Generator gen = dropout_generator(seed, comm.rank());
  if (o.cuda_graph) trainer.set_graph_generator(&gen);
  // Graph mode: the micro-batches' fixed device tensors (data::StagedMlmBatch).
  std::vector<data::StagedMlmBatch> staged(o.cuda_graph ? size_t(o.accumulation) : 0);
  int64_t graph_captures = 0;  // the trainer's, at the last step
  TrainerState st;

  // Temporary files of checkpoint writes that a kill interrupted: never complete, never used.
  if (root)
    for (auto& e : fs::directory_iterator(ckpt_dir))
      if (e.path().filename().string().find(".safetensors.tmp.") != std::string::npos)
        fs::remove(e.path());

  PretrainResult result;
  if (!root) {
    // Rank 0 checks the directory and reads the checkpoint; sync_from_root below.
  } else if (resume) {
    // The newest checkpoint that loads; an unreadable one (it cannot be partial: writes are
    // atomic, but a disk can still corrupt it) is reported and the previous one is tried.
    auto list = list_checkpoints(ckpt_dir);
    ENGINE_CHECK(!list.empty(), "[pretrain] --resume: no checkpoint in ", ckpt_dir.string());
    std::string errors;
    bool loaded = false;
    for (auto it = list.rbegin(); it != list.rend() && !loaded; ++it) {
      try {
        load_training_checkpoint(it->second, model, trainer, gen, st, data);
        std::printf("resumed from %s (step %lld)\n", it->second.string().c_str(),
                    (long long)trainer.steps_taken());
        loaded = true;
        // A run stopped between writing a checkpoint and removing the ones past keep_last kept
        // one too many: remove them now (only when the newest loaded: an older one loaded means
        // the newer are unreadable, and the count would then reach the one in use).
        if (it == list.rbegin()) remove_past_keep_last(ckpt_dir, o.keep_last);
      } catch (const engine::Error& e) {
        std::fprintf(stderr, "warning: cannot resume from %s: %s\n", it->second.string().c_str(),
                     e.what());
        errors += std::string("\n  ") + e.what();
      }
    }
    ENGINE_CHECK(loaded, "[pretrain] --resume: no usable checkpoint in ", ckpt_dir.string(), ":",
                 errors);
    truncate_metrics(metrics_path, trainer.steps_taken());
  } else {
    ENGINE_CHECK(list_checkpoints(ckpt_dir).empty(), "[pretrain] ", ckpt_dir.string(),
                 " already holds checkpoints: pass --resume to continue that run, or choose "
                 "another train.out_dir");
  }
  if (comm.size() > 1) {
    if (resume)
      sync_from_root(comm, trainer, gen, st, data);
    else
      engine::broadcast_parameters(loop.flat(), comm);
  }
  result.start_step = trainer.steps_taken();

  // What a read fault in the corpus shards (data::ShardReader: a file truncated or unreadable
  // while mapped ends the process from a signal handler) says about continuing; kept current
  // with each checkpoint, cleared when the loop is left.
  auto set_fault_hint = [&](const std::string& last) {
    if (root)
      data::set_read_fault_hint(
          last.empty() ? "No checkpoint has been written yet: restore the file and start again."
                       : "The last checkpoint is " + last +
                             ": restore the file and continue with --resume.");
  };
  struct ClearHint {
    bool root;
    ~ClearHint() {
      if (root) data::set_read_fault_hint("");
    }
  } clear_hint{root};
  set_fault_hint(latest_checkpoint(o.out_dir));

  loop.open_metrics(metrics_path.string(), /*append=*/resume);
  model.train(true);
  int64_t window_steps = 0;
  double comm_exposed_s = 0;  // in the log window: gradient all-reduce time backward did not hide

  // What is pretraining's own; TrainingLoop::run decides when (validation and the checkpoint at
  // the last step too, a skipped step always logged, the validation in the step's line).
  engine::LoopHooks hooks;
  hooks.log.every = o.log_every;
  hooks.log_skipped = true;
  hooks.log_line = [&](int64_t step, const engine::StepStats& s, const engine::LoopWindow& w) {
    const double exposed_ms =
        window_steps > 0 ? 1000.0 * comm_exposed_s / double(window_steps) : 0.0;
    window_steps = 0;
    comm_exposed_s = 0;
    char line[512];
    std::snprintf(line, sizeof line,
                  ", \"loss\": %.9g, \"lr\": %.9g, \"tokens_per_s\": %.1f, \"loss_scale\": %g, "
                  "\"grad_norm\": %.9g, \"skipped_steps\": %lld, \"tokens\": %lld",
                  s.loss, s.lr, w.rate, s.loss_scale, s.grad_norm,
                  (long long)trainer.scaler().skipped_steps(), (long long)st.tokens);
    engine::LoopReport r{line, ""};
    if (comm.size() > 1) {
      std::snprintf(line, sizeof line, ", \"ranks\": %d, \"comm_exposed_ms\": %.3f", comm.size(),
                    exposed_ms);
      r.json += line;
    }
    std::snprintf(
        line, sizeof line, "step %lld/%lld loss %.4f lr %.3e %.0f tok/s grad_norm %.3f%s ETA %s",
        (long long)step, (long long)o.steps, s.loss, s.lr, w.rate, s.grad_norm,
        s.applied ? "" : " (skipped: inf/NaN gradients)", engine::format_duration(w.eta_s).c_str());
    r.text = line;
    return r;
  };
  hooks.eval.every = o.valid_every;
  hooks.eval_in_step_line = true;
  hooks.evaluate = [&](int64_t step) {
    const ValidResult vr = validate(model, data, o.valid_batches, comm, compute);
    // Validation may replace cached tensors a captured step reads (the position constants of
    // another length): the next step runs eagerly, the one after captures afresh.
    if (o.cuda_graph) trainer.drop_graph();
    result.last_valid_loss = vr.loss;
    char line[512];
    std::snprintf(line, sizeof line,
                  ", \"valid_loss\": %.9g, \"valid_ppl\": %.6g, \"valid_accuracy\": %.6f", vr.loss,
                  vr.perplexity, vr.accuracy);
    engine::LoopReport r{line, ""};
    std::string parts;
    for (auto& [name, value] : vr.parts) {
      std::snprintf(line, sizeof line, ", \"valid_%s\": %.9g", name.c_str(), value);
      r.json += line;
      parts += " " + name + " " + std::to_string(value);
    }
    std::snprintf(line, sizeof line, "valid step %lld loss %.4f ppl %.2f accuracy %.4f%s",
                  (long long)step, vr.loss, vr.perplexity, vr.accuracy, parts.c_str());
    r.text = line;
    return r;
  };
  hooks.checkpoint.every = o.save_every;
  hooks.save = [&](int64_t step) {
    const fs::path path = ckpt_dir / checkpoint_name(step);
    // A failed write (a full disk, the file-size limit) leaves no file under `path` and every
    // earlier checkpoint as it was: say so, and which one to continue from.
    try {
      save_training_checkpoint(path, model, trainer, gen, st, data, config_text,
                               o.checkpoint_metadata);
    } catch (const engine::Error& e) {
      const std::string last = latest_checkpoint(o.out_dir);
      ENGINE_FAIL("[pretrain] step ", step, ": cannot write the checkpoint ", path.string(), ": ",
                  e.what(), ". Nothing was written under that name; ",
                  last.empty() ? std::string("there is no earlier checkpoint")
                               : "the last good checkpoint is " + last,
                  " (free space, then continue with --resume)");
    }
    set_fault_hint(path.string());
    remove_past_keep_last(ckpt_dir, o.keep_last);
    result.final_checkpoint = path.string();
  };

  auto one_step = [&](int64_t) {
    // The step's loss is the mean over every masked token of every micro-batch on every rank:
    // each micro-batch's mean loss is weighted by its share of the global count, and the
    // gradients are summed over the ranks. So n ranks with batch b, or accumulation n, train
    // exactly like one rank with batch n * b. The counts come with the batches (no device read).
    std::vector<data::MlmBatch> micro(size_t(o.accumulation));
    double counts[2] = {0, 0};  // masked tokens, tokens
    bool restaged = false;      // graph mode: new device tensors, so a new capture
    for (size_t m = 0; m < micro.size(); ++m) {
      data::MlmBatch& b = micro[m];
      b = data.next_train();
      if (o.cuda_graph) {
        restaged |= staged[m].stage(b, device);
      } else {
        b = b.to(device);
      }
      counts[0] += double(b.num_predicted());
      counts[1] += double(b.num_tokens);
    }
    comm.all_reduce(counts);
    const int64_t tokens = static_cast<int64_t>(counts[1]);
    std::vector<double> weights;
    for (const auto& b : micro)
      weights.push_back(counts[0] > 0 ? double(b.num_predicted()) / counts[0] : 0.0);
    if (restaged) trainer.drop_graph();
    const auto input = [&](size_t m) -> const data::MlmBatch& {
      return o.cuda_graph ? staged[m].batch() : micro[m];
    };
    const engine::StepStats s = loop.step(
        o.accumulation,
        [&](int64_t m) { return model.pretrain_forward(input(size_t(m)), gen).loss; }, weights);
    const int64_t step = trainer.steps_taken();
    if (root) report_graph_capture(trainer, step, graph_captures);
    if (trainer.graph_launches() > 0) result.graph_launches = trainer.graph_launches();
    const double loss = s.loss;
    comm_exposed_s += s.comm_exposed_s;
    st.tokens += tokens;
    loop.count(tokens);
    ++window_steps;
    result.losses.push_back(loss);
    if ((!s.applied || !std::isfinite(loss)) && !o.loss_scale.enabled && o.on_nonfinite == "stop") {
      // Which micro-batch: forward each again (only on this path) and name the first whose loss
      // is not finite here; none on this rank means another rank's gradients were.
      std::string where = "on another rank's micro-batch";
      {
        engine::NoGrad ng;
        engine::Autocast autocast(compute);
        const bool was_training = model.training();
        model.train(false);
        engine::Generator unused(0);
        for (size_t m = 0; m < micro.size(); ++m) {
          const double l = model.pretrain_forward(input(m), unused).loss.item();
          if (std::isfinite(l)) continue;
          where = "on micro-batch " + std::to_string(m + 1) + " of " +
                  std::to_string(micro.size()) +
                  (comm.size() > 1 ? " of rank " + std::to_string(comm.rank()) : std::string()) +
                  " (loss " + std::to_string(l) + ")";
          break;
        }
        model.train(was_training);
      }
      const std::string last_good = latest_checkpoint(o.out_dir);
      ENGINE_FAIL("[pretrain] step ", step, ": the loss or the gradients are not finite (loss ",
                  loss, ") ", where, "; the run stops here with the weights of step ", step - 1,
                  " unsaved. Last good checkpoint: ",
                  last_good.empty() ? std::string("none yet") : last_good,
                  " (continue with --resume; train.on_nonfinite: skip skips such steps instead)");
    }
    if (on_step) on_step(step, loss);
    return s;
  };
  const int64_t steps_this_run = loop.run(o.steps, one_step, hooks);
  if (result.final_checkpoint.empty()) result.final_checkpoint = latest_checkpoint(o.out_dir);
  result.final_step = trainer.steps_taken();
  // A weights-only model next to the checkpoints, for --init and finetuning. A resumed run with
  // no steps left writes it too when it is missing: killed after its last checkpoint but before
  // this file, it would otherwise report a model it never wrote.
  const fs::path model_path = out_dir / "model.safetensors";
  if (root && (steps_this_run > 0 || (resume && !fs::exists(model_path)))) {
    try {
      save_checkpoint(model_path.string(), model, o.checkpoint_metadata);
    } catch (const engine::Error& e) {
      ENGINE_FAIL("[pretrain] cannot write the final model: ", e.what(), ". The checkpoint ",
                  result.final_checkpoint, " holds the same weights");
    }
  }
  return result;
}

}  // namespace models
