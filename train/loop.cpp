// The training loops' shared scaffolding (loop.h).
#include "train/loop.h"

#include <cerrno>
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

TrainingLoop::TrainingLoop(const NamedTensors& params, const AdamWOptions& adam, LearningRate lr,
                           const LoopOptions& o, Communicator& comm)
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

TrainingLoop::Window TrainingLoop::window(int64_t done, int64_t left) {
  const auto now = std::chrono::steady_clock::now();
  Window w;
  const double window_s = std::chrono::duration<double>(now - window_start_).count();
  w.rate = window_s > 0 ? double(window_units_) / window_s : 0.0;
  w.elapsed_s = std::chrono::duration<double>(now - start_).count();
  w.eta_s = done > 0 ? w.elapsed_s / double(done) * double(left) : 0.0;
  window_start_ = now;
  window_units_ = 0;
  return w;
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
