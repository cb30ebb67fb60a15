// The training loops' shared scaffolding (loop.h).
#include "train/loop.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "engine/autocast.h"
#include "engine/backend.h"
#include "engine/error.h"

namespace engine {

DType compute_dtype(Device device, const std::string& precision) {
  const DType dt = precision_dtype(precision);
  ENGINE_CHECK(dt == DType::f32 || device.is_cuda(), "[pretrain] train.precision ", precision,
               " computes in ", dtype_name(dt), " on ", device.str(),
               ", whose kernels compute in f32 and f64 only; set train.device: cuda (--device "
               "cuda), or train.precision: f32");
  return dt;
}

Generator dropout_generator(uint64_t seed, int rank, RunKind kind) {
  if (kind == RunKind::finetuning)
    return Generator(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull + uint64_t(rank));
  return Generator(seed ^ 0x9E3779B97F4A7C15ull ^ (uint64_t(rank) * 0xD1B54A32D192ED03ull));
}

namespace {

const LoopOptions& checked(const LoopOptions& o) {
  check_device(o.device);
  return o;
}

}  // namespace

TrainingLoop::TrainingLoop(const NamedTensors& params, const OptimizerOptions& adam,
                           LearningRate lr, const LoopOptions& o, Communicator& comm)
    : comm_(comm),
      compute_(compute_dtype(checked(o).device, o.precision)),
      flat_(params, o.device),
      trainer_(
          flat_, adam,
          [all = o.decay_bias_and_norm](const std::string& n) {
            return all || !default_no_decay(n);
          },
          std::move(lr), o.trainer, comm),
      progress_(comm.is_root() && o.progress),
      start_(std::chrono::steady_clock::now()),
      window_start_(start_) {}

StepStats TrainingLoop::step(int64_t micro_batches, const std::function<Tensor(int64_t)>& loss_of,
                             std::span<const double> weights) {
  return trainer_.step(
      micro_batches,
      [&](int64_t m) {
        Autocast autocast(compute_);  // the forward only: backward follows its graph
        return loss_of(m);
      },
      weights);
}

void TrainingLoop::start_clock() {
  start_ = window_start_ = std::chrono::steady_clock::now();
  window_units_ = 0;
}

LoopWindow TrainingLoop::window(int64_t done, int64_t left) {
  const auto now = std::chrono::steady_clock::now();
  LoopWindow w;
  const double window_s = std::chrono::duration<double>(now - window_start_).count();
  w.rate = window_s > 0 ? double(window_units_) / window_s : 0.0;
  w.elapsed_s = std::chrono::duration<double>(now - start_).count();
  w.eta_s = done > 0 ? w.elapsed_s / double(done) * double(left) : 0.0;
  window_start_ = now;
  window_units_ = 0;
  return w;
}

bool Cadence::due(int64_t step, bool last) const {
  return (every > 0 && step % every == 0) || (last && at_end) ||
         std::find(at.begin(), at.end(), step) != at.end();
}

int64_t TrainingLoop::run(int64_t last_step, const std::function<StepStats(int64_t)>& one_step,
                          const LoopHooks& hooks) {
  auto metrics_line = [&](int64_t step, const std::string& fields) {
    write_metrics("{\"step\": " + std::to_string(step) + fields + "}");
  };
  // An evaluation's line on stdout ends the progress line first.
  auto print_evaluation = [&](const LoopReport& r) {
    progress_.end_line();
    if (!r.text.empty()) std::printf("%s\n", r.text.c_str());
  };
  start_clock();
  int64_t steps_run = 0;
  while (trainer_.steps_taken() < last_step) {
    const StepStats s = one_step(trainer_.steps_taken());
    const int64_t step = trainer_.steps_taken();
    const bool last = step == last_step;
    ++steps_run;
    const bool evaluate = hooks.evaluate && hooks.eval.due(step, last);
    const bool joined = evaluate && hooks.eval_in_step_line;
    const LoopReport joined_eval = joined ? hooks.evaluate(step) : LoopReport();
    if (root() && hooks.log_line &&
        (hooks.log.due(step, last) || joined || (hooks.log_skipped && !s.applied))) {
      const LoopReport line = hooks.log_line(step, s, window(steps_run, last_step - step));
      metrics_line(step, line.json + joined_eval.json);
      if (!line.text.empty()) progress_.print(line.text);
      if (joined) print_evaluation(joined_eval);
      std::fflush(stdout);  // a log read while the run goes on holds every line
    }
    if (evaluate && !joined) {
      const LoopReport eval = hooks.evaluate(step);
      if (root()) {
        metrics_line(step, eval.json);
        print_evaluation(eval);
        std::fflush(stdout);
      }
    }
    if (root() && hooks.save && hooks.checkpoint.due(step, last)) hooks.save(step);
  }
  progress_.end_line();
  return steps_run;
}

void TrainingLoop::open_metrics(const std::string& path, bool append) {
  if (!root() || path.empty()) return;
  metrics_path_ = path;
  metrics_.open(path, append ? std::ios::app : std::ios::trunc);
  ENGINE_CHECK(metrics_.good(), "[train] cannot write ", path);
}

void TrainingLoop::write_metrics(const std::string& json_line) {
  if (!metrics_.is_open()) return;
  metrics_ << json_line << "\n";
  metrics_.flush();
  ENGINE_CHECK(metrics_.good(), "[train] ", metrics_path_, ": write failed (", std::strerror(errno),
               "); the checkpoints are unaffected");
}

}  // namespace engine
