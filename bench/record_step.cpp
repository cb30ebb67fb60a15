// record_step: the device work of one training step, launch by launch, for the GPU performance
// model (docs/performance-model.md, bench/perf_model.py). Builds the model of a pretraining
// config, moves it to cuda:0, and records one optimizer step (after a warm-up step) of a random
// MLM batch of B x T tokens with 15% predicted: every kernel-table call and layout call with its
// shapes, minimum bytes, FLOPs and kernel launches (engine/work_log.h), as CSV.
//
// In the emulation build, run it with EMU_DRY_RUN=1: the work is walked through (queued, ordered,
// recorded) without being executed, so BERT-Large at s = 512 takes seconds and no device memory
// is touched. On a GPU it records a real step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "data/batch.h"
#include "engine/allocator.h"
#include "engine/autocast.h"
#include "engine/backend.h"
#include "engine/config.h"
#include "engine/error.h"
#include "engine/module.h"
#include "engine/work_log.h"
#include "models/bert.h"
#include "models/pretrain_config.h"
#include "train/trainer.h"

namespace {

const char* kUsage = R"(usage: record_step --config CFG --batch-size B --seq-len T --out FILE.csv
                   [--precision bf16|fp16|f32] [--set KEY=VALUE ...]

Records the device work of one training step of the config's model (forward, backward,
gradient statistics, clipping, AdamW) on cuda:0 as CSV: index, op, kernel launches, library
GEMMs, minimum bytes, FLOPs, shapes, and each launch as kernel:blocks:threads; prints the
device memory held between steps and the peak during the step (the allocator's counts), and
the launches an encoder layer makes (a second step recorded at one layer fewer) and those of
the step captured as one CUDA graph (the trainer's graph mode, a third step recorded). In
build-emu/, run with EMU_DRY_RUN=1 (nothing executes; the record and the memory counts are
exact, the values are not). bench/perf_model.py turns the CSV into predicted times.
--version prints the version and git commit; -h, --help this text.
)";

struct Args {
  std::string config, out, precision = "bf16";
  std::vector<std::string> sets;
  int64_t batch = 0, seq = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  cli::ArgParser p("record_step", kUsage, argc, argv);
  while (p.next()) {
    if (p.arg() == "--config")
      a.config = p.value();
    else if (p.arg() == "--out")
      a.out = p.value();
    else if (p.arg() == "--batch-size")
      a.batch = p.int_value(1);
    else if (p.arg() == "--seq-len")
      a.seq = p.int_value(2);
    else if (p.arg() == "--precision")
      a.precision = p.value();
    else if (p.arg() == "--set")
      a.sets.push_back(p.value());
    else
      p.unknown();
  }
  if (a.config.empty() || a.out.empty() || a.batch == 0 || a.seq == 0)
    p.fail("--config, --batch-size, --seq-len and --out are required");
  return a;
}

data::MlmBatch random_batch(int64_t b, int64_t t, int64_t vocab, bool segments) {
  std::vector<int64_t> ids(size_t(b * t)), mask(ids.size(), 1), labels(ids.size(), -100),
      types(ids.size(), 0);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < ids.size(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ids[i] = 5 + int64_t(x % uint64_t(vocab - 5));
    if (x % 100 < 15) labels[i] = ids[i];
    types[i] = int64_t(i % size_t(t)) >= t / 2;
  }
  return data::make_mlm_batch(
      engine::Tensor::from_vector(ids, {b, t}), engine::Tensor::from_vector(mask, {b, t}),
      engine::Tensor::from_vector(labels, {b, t}),
      segments ? engine::Tensor::from_vector(types, {b, t}) : engine::Tensor(), vocab,
      "record_step");
}

// One optimizer step of a model of config `mc` on cuda:0, recorded after a warm-up step.
struct Recorded {
  std::vector<engine::WorkRecord> records;
  engine::StepStats stats;
  double seconds = 0;
  int64_t held = 0, peak = 0, predicted = 0;  // device bytes; the batch's predicted tokens
  int64_t graph_launches = 0;                 // graph mode: the launches one replay runs
};

// `graph`: the trainer's graph mode (train/trainer.h): the recorded step is the capture, then
// its replay.
Recorded record(const models::PretrainConfig& pc, const models::BertConfig& mc, const Args& a,
                engine::DType compute, bool graph = false) {
  const engine::Device gpu = engine::Device::cuda(0);
  models::BertForMaskedLM model(mc, pc.seed);
  model.train(true);
  engine::FlatParameters flat(model.named_parameters(), gpu);
  engine::TrainerOptions opt;
  opt.clip_norm = pc.train.clip_norm;
  opt.loss_scale.enabled = compute == engine::DType::f16;
  opt.cuda_graph = graph;
  engine::Trainer trainer(flat, pc.optim, {}, engine::constant_lr(pc.optim.lr), opt);
  const data::MlmBatch batch =
      random_batch(a.batch, a.seq, mc.vocab_size, mc.type_vocab_size > 0).to(gpu);
  engine::Generator gen(1);
  trainer.set_graph_generator(&gen);
  const double one = 1.0;
  auto step = [&] {
    return trainer.step(1,
                        [&](int64_t) {
                          engine::Autocast autocast(compute);
                          return model.forward(batch, gen).loss;
                        },
                        {&one, 1});
  };
  step();  // warm-up: position constants, the allocator's cache
  engine::Backend& device = engine::backend(engine::DeviceType::CUDA);
  device.synchronize(0);
  engine::Allocator& memory = engine::allocator_for(gpu);
  memory.reset_peak();
  Recorded r;
  r.held = memory.stats().live_bytes;  // between steps: the state of the run
  const auto t0 = std::chrono::steady_clock::now();
  engine::start_work_recording();
  r.stats = step();
  r.records = engine::stop_work_recording();
  device.synchronize(0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.peak = memory.stats().peak_bytes;
  r.predicted = batch.num_predicted();
  r.graph_launches = trainer.graph_launches();
  ENGINE_CHECK(r.stats.applied,
               "[record_step] the recorded step was skipped (non-finite gradients), "
               "so its record lacks the optimizer");
  return r;
}

int64_t launches_of(const std::vector<engine::WorkRecord>& records) {
  int64_t n = 0;
  for (const engine::WorkRecord& r : records) n += r.launches + r.gemms;
  return n;
}

int run(const Args& a) {
  engine::Config cfg = engine::Config::load_file(a.config);
  for (const auto& s : a.sets) cfg.set_assignment(s);
  const models::PretrainConfig pc = models::PretrainConfig::read(cfg);
  models::BertConfig mc = pc.model;
  mc.max_positions = std::max(mc.max_positions, a.seq);
  engine::check_device(engine::Device::cuda(0));
  const engine::DType compute = engine::precision_dtype(a.precision);

  std::printf("building %lld layers, width %lld, vocab %lld on the CPU...\n",
              (long long)mc.num_layers, (long long)mc.hidden_size, (long long)mc.vocab_size);
  const Recorded main = record(pc, mc, a, compute);
  const std::vector<engine::WorkRecord>& records = main.records;
  const double seconds = main.seconds;
  const int64_t held = main.held, peak = main.peak;

  std::ofstream out(a.out);
  ENGINE_CHECK(out, "[record_step] cannot write ", a.out);
  out << "index,op,launches,gemms,bytes,flops,shape,kernels\n";
  double bytes = 0, flops = 0;
  int64_t launches = 0, gemms = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const engine::WorkRecord& r = records[i];
    out << i << ',' << r.op << ',' << r.launches << ',' << r.gemms << ',' << r.bytes << ','
        << r.flops << ",\"" << r.shape << "\",\"";
    // name:blocks:threads per launch (the kernel's template arguments dropped)
    for (size_t k = 0; k < r.kernels.size(); ++k) {
      const engine::LaunchRecord& l = r.kernels[k];
      std::string name = l.kernel.substr(0, l.kernel.find('<'));
      name.erase(std::remove(name.begin(), name.end(), '('), name.end());
      out << (k ? ";" : "") << name << ':' << l.blocks << ':' << l.threads;
    }
    out << "\"\n";
    bytes += r.bytes, flops += r.flops, launches += r.launches, gemms += r.gemms;
  }
  std::printf(
      "%s: %zu ops, %lld kernel launches, %lld GEMMs, %.3f GB moved at least, %.3f TFLOP "
      "(B %lld, T %lld, %s)\n",
      a.out.c_str(), records.size(), (long long)launches, (long long)gemms, bytes / 1e9,
      flops / 1e12, (long long)a.batch, (long long)a.seq, a.precision.c_str());
  // The textbook count (docs/performance.md), forward + backward = 3 x forward: per token the
  // encoder's linear layers 6 (4 d^2 + 2 d ffn) L and attention 12 T d L; per predicted token the
  // MLM head 6 (d^2 + d V). Positional terms and the gradient slab ops are not in it.
  const double d = double(mc.hidden_size), ffn = double(mc.ffn_size), l = double(mc.num_layers);
  const double tokens = double(a.batch * a.seq), t = double(a.seq), v = double(mc.vocab_size);
  const double predicted = double(main.predicted);
  const double analytic = tokens * (6 * (4 * d * d + 2 * d * ffn) * l + 12 * t * d * l) +
                          predicted * 6 * (d * d + d * v);
  // Device memory: the allocator's own counts, the same on a GPU and in the emulation's dry run
  // (no allocation depends on the device's speed); comparable with PyTorch's
  // torch.cuda.max_memory_allocated.
  const double gib = double(int64_t(1) << 30);
  std::printf(
      "device memory: %.2f GiB held between steps (parameters, gradients, optimizer state, the "
      "batch, cached constants), peak %.2f GiB during the step: %.2f GiB of activations and "
      "scratch, %.1f MiB a sequence\n",
      double(held) / gib, double(peak) / gib, double(peak - held) / gib,
      double(peak - held) / double(1 << 20) / double(a.batch));
#if defined(ENGINE_CUDA_EMULATION)
  std::printf("wall clock of the recorded step: %.3f s (the emulated device: not a GPU time)\n",
              seconds);
#else
  std::printf("measured step: %.3f ms, %.1f sequences/s (one step, recording on)\n", seconds * 1e3,
              double(a.batch) / seconds);
#endif
  std::printf("analytic model FLOPs %.4e, recorded GEMM FLOPs %.4e, ratio %.4f\n", analytic, flops,
              flops / analytic);
  // Launches per encoder layer: the same step at one layer fewer, the difference (every layer
  // issues the same work); the rest is the embeddings, the head, the loss and the optimizer.
  if (mc.num_layers >= 2) {
    models::BertConfig fewer = mc;
    fewer.num_layers = mc.num_layers - 1;
    const int64_t all = launches_of(records),
                  less = launches_of(record(pc, fewer, a, compute).records);
    std::printf(
        "launches: %lld a step (kernels and GEMMs), %lld an encoder layer (forward and backward), "
        "%lld outside the layers (a step at %lld layers: %lld)\n",
        (long long)all, (long long)(all - less), (long long)(all - (all - less) * mc.num_layers),
        (long long)fewer.num_layers, (long long)less);
  }
  // The same step in the trainer's graph mode: forward, backward, statistics and AdamW captured
  // once and replayed with one launch; the host's work a step is then one upload (the step
  // block), one graph launch and one read.
  const int64_t captured = record(pc, mc, a, compute, true).graph_launches;
  std::printf(
      "captured step: %lld launches replayed as one CUDA graph (the eager step: %lld); the host "
      "issues 3 calls a step: the step block's upload, the graph's launch, the statistics' read\n",
      (long long)captured, (long long)launches_of(records));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return engine::run_job("record_step", [&] { return run(parse(argc, argv)); });
}
