// bench_comm: what data parallelism costs. Run it under the launcher, e.g.
//
//   mpirun -np 2 build/bin/bench_comm                       # CPU tensors through MPI
//   mpirun -np 8 build/bin/bench_comm --device cuda         # GPU tensors through NCCL
//
// 1. All-reduce (sum) over sizes from 4 KiB to --max-mb: median time, algorithm bandwidth
//    (bytes / time) and bus bandwidth (algbw * 2 (n - 1) / n, the nccl-tests convention: the
//    per-link traffic of a ring all-reduce, comparable across rank counts).
// 2. A BERT MLM training step (forward + backward) on each rank: without communication, with the
//    gradient all-reduce started bucket by bucket during backward (what pretrain_app does), and
//    with one all-reduce after backward; and the forward alone (backward = step - forward, for
//    bench/scaling_model.py --check-bench-comm). "exposed" is the communication time backward did
//    not hide, also as a share of the step.
// Rank 0 prints; every rank runs the same work.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "engine/comm.h"
#include "engine/data_parallel.h"
#include "engine/error.h"
#include "engine/module.h"
#include "models/bert.h"

namespace {

const char* kUsage =
    R"(usage: [mpirun -np N] bench_comm [--device cpu|cuda] [--max-mb M] [--iters K]
                      [--layers L] [--hidden H] [--heads A] [--seq T] [--batch B] [--vocab V]
                      [--bucket-mb MB] [--skip-model] [--version]

  --device     where the tensors live (cuda: one GPU per local rank, NCCL)      default cpu
  --max-mb     largest all-reduce, MiB                                           default 64
  --iters      timed repetitions per measurement (median reported)              default 10
  --layers/--hidden/--heads/--seq/--batch/--vocab
               the BERT (tupe_r) of the step measurement       default 2/256/4/128/8/8192
  --bucket-mb  gradient bucket size, MiB                                         default 25
  --skip-model only the all-reduce sweep
)";

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Waits for the work queued on `device` (a copy back to the host follows it on the stream).
void device_sync(engine::Device device) {
  if (device.is_cuda())
    engine::Tensor::zeros({1}, engine::DType::f32, device).to(engine::Device::cpu());
}

// Median over ranks' slowest: each timing is reduced with max so every rank reports the same.
double timed_ms(engine::Communicator& comm, engine::Device device, int iters,
                const std::function<void()>& f) {
  f();
  device_sync(device);
  comm.barrier();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = clock_type::now();
    f();
    device_sync(device);
    ms.push_back(
        comm.all_reduce(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(),
                        engine::ReduceOp::max));
  }
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    engine::DistributedSession session;
    try {
      engine::Communicator& comm = engine::world();
      std::string device_name = "cpu";
      double max_mb = 64, bucket_mb = 25;
      int iters = 10;
      bool skip_model = false;
      models::BertConfig cfg;
      cfg.num_layers = 2;
      cfg.hidden_size = 256;
      cfg.num_heads = 4;
      cfg.ffn_size = 1024;
      cfg.vocab_size = 8192;
      models::apply_position_preset(cfg.position, "tupe_r");
      int64_t seq = 128, batch = 8;
      for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
          if (i + 1 >= argc) {
            std::fprintf(stderr, "bench_comm: %s needs a value\n%s", a.c_str(), kUsage);
            std::exit(2);
          }
          return argv[++i];
        };
        if (a == "-h" || a == "--help") {
          std::printf("%s", kUsage);
          return 0;
        } else if (a == "--version") {
          std::printf("bench_comm %s\n", cli::version());
          return 0;
        } else if (a == "--device")
          device_name = value();
        else if (a == "--max-mb")
          max_mb = std::stod(value());
        else if (a == "--iters")
          iters = std::stoi(value());
        else if (a == "--layers")
          cfg.num_layers = std::stoll(value());
        else if (a == "--hidden")
          cfg.hidden_size = std::stoll(value());
        else if (a == "--heads")
          cfg.num_heads = std::stoll(value());
        else if (a == "--seq")
          seq = std::stoll(value());
        else if (a == "--batch")
          batch = std::stoll(value());
        else if (a == "--vocab")
          cfg.vocab_size = std::stoll(value());
        else if (a == "--bucket-mb")
          bucket_mb = std::stod(value());
        else if (a == "--skip-model")
          skip_model = true;
        else {
          std::fprintf(stderr, "bench_comm: unknown option '%s'\n%s", a.c_str(), kUsage);
          return 2;
        }
      }
      ENGINE_CHECK(device_name == "cpu" || device_name == "cuda",
                   "[bench_comm] --device cpu|cuda, got ", device_name);
      ENGINE_CHECK(iters >= 1 && max_mb > 0 && bucket_mb > 0,
                   "[bench_comm] --iters, --max-mb and --bucket-mb must be positive");
      const engine::Device device =
          device_name == "cuda" ? engine::Device::cuda(comm.local_rank()) : engine::Device::cpu();
      const bool root = comm.is_root();
      const int n = comm.size();
      if (root)
        std::printf("bench_comm: %d rank%s, %s tensors through %s\n\n", n, n == 1 ? "" : "s",
                    device.str().c_str(), comm.backend(device).c_str());

      // ---- 1. all-reduce sweep ----
      if (root)
        std::printf("%12s %10s %12s %12s\n", "bytes", "time_ms", "algbw_GB/s", "busbw_GB/s");
      for (int64_t bytes = 4096; bytes <= int64_t(max_mb * 1048576.0); bytes *= 4) {
        engine::Tensor t = engine::Tensor::ones({bytes / 4}, engine::DType::f32, device);
        const double ms = timed_ms(comm, device, iters, [&] { comm.all_reduce(t); });
        const double algbw = double(bytes) / (ms * 1e-3) / 1e9;
        if (root)
          std::printf("%12lld %10.3f %12.3f %12.3f\n", (long long)bytes, ms, algbw,
                      algbw * 2.0 * (n - 1) / std::max(n, 1));
      }
      if (skip_model) return 0;
      if (device.is_cuda()) {
        // The BERT model runs where its parameters are; its CUDA ops come with the CUDA issue.
        if (root)
          std::printf(
              "\n(the training-step measurement runs on the CPU model only; skipped for --device "
              "cuda)\n");
        return 0;
      }

      // ---- 2. a training step ----
      cfg.ffn_size = 4 * cfg.hidden_size;
      cfg.max_positions = std::max<int64_t>(seq, 128);
      cfg.hidden_dropout = cfg.attention_dropout = 0.0;
      cfg.validate();
      models::BertForMaskedLM model(cfg, 1);
      engine::FlatParameters flat(model.named_parameters());
      engine::GradReducer reducer(flat, comm, int64_t(bucket_mb * 1048576.0));
      engine::Generator gen(7 + uint64_t(comm.rank()));
      std::vector<int64_t> ids(size_t(batch * seq)), labels(size_t(batch * seq), -100);
      for (size_t k = 0; k < ids.size(); ++k) {
        ids[k] =
            int64_t(5 + (k * 7919 + size_t(comm.rank()) * 104729) % size_t(cfg.vocab_size - 5));
        if (k % 7 == 3) labels[k] = ids[k];
      }
      const data::MlmBatch mlm =
          data::make_mlm_batch(engine::Tensor::from_vector<int64_t>(ids, {batch, seq}), {},
                               engine::Tensor::from_vector<int64_t>(labels, {batch, seq}), {},
                               cfg.vocab_size, "bench_comm");
      std::vector<double> exposed;
      auto step = [&](int mode) {  // 0: local, 1: overlapped, 2: after backward, 3: forward only
        flat.zero_grad();
        models::MlmOutput out = model.forward(mlm, gen);
        if (mode == 3) return;
        if (mode == 1) reducer.begin();
        out.loss.backward();
        if (mode != 0) {
          reducer.finish();
          exposed.push_back(reducer.last_exposed_s() * 1e3);
        }
      };
      const double local = timed_ms(comm, device, iters, [&] { step(0); });
      const double forward = timed_ms(comm, device, iters, [&] { step(3); });
      exposed.clear();
      const double overlapped = timed_ms(comm, device, iters, [&] { step(1); });
      const double exp_overlapped = comm.all_reduce(median(exposed), engine::ReduceOp::max);
      exposed.clear();
      const double after = timed_ms(comm, device, iters, [&] { step(2); });
      const double exp_after = comm.all_reduce(median(exposed), engine::ReduceOp::max);
      if (root) {
        std::printf(
            "\nBERT step: %lld layers, hidden %lld, %lld heads, batch %lld x %lld tokens, %lld "
            "parameters "
            "(%.1f MiB of f32 gradients), %lld bucket%s of %g MiB, vocab %lld\n",
            (long long)cfg.num_layers, (long long)cfg.hidden_size, (long long)cfg.num_heads,
            (long long)batch, (long long)seq, (long long)flat.numel(),
            double(flat.numel()) * 4 / 1048576.0, (long long)reducer.num_buckets(),
            reducer.num_buckets() == 1 ? "" : "s", bucket_mb, (long long)cfg.vocab_size);
        std::printf("%-34s %10s %12s %10s\n", "mode", "step_ms", "exposed_ms", "exposed");
        std::printf("%-34s %10.2f %12s %10s\n", "no communication", local, "-", "-");
        std::printf("%-34s %10.2f %12s %10s\n", "forward only", forward, "-", "-");
        std::printf("%-34s %10.2f %12.2f %9.1f%%\n", "all-reduce in buckets, overlapped",
                    overlapped, exp_overlapped, 100.0 * exp_overlapped / overlapped);
        std::printf("%-34s %10.2f %12.2f %9.1f%%\n", "one all-reduce after backward", after,
                    exp_after, 100.0 * exp_after / after);
      }
      return 0;
    } catch (const std::exception& e) {
      return engine::fail_job("bench_comm", e.what(), 1);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm: %s\n", e.what());
    return 1;
  }
}
