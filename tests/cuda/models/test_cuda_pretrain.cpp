// [cuda] The pretraining loop with train.device cuda: a run interrupted after step 10 resumes
// from its step-8 checkpoint with bit-identical losses on the same device, and checkpoints are
// portable: one saved by a device run resumes on the CPU (and a CPU one on the device), and the
// continued losses track the uninterrupted run of the other device within f32 rounding. And the
// same loop with train.cuda_graph.
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.h"
#include "engine/error.h"
#include "models/bert.h"
#include "models/model_support.h"
#include "models/pretrain.h"

using namespace models;
using Catch::Contains;
using engine::Tensor;
using engine::testing::kGpu;
namespace fs = std::filesystem;

namespace {

BertConfig tiny() { return engine::testing::synthetic_bert(); }
using Synthetic = engine::testing::SyntheticSource;

fs::path fresh_dir(const std::string& name) {
  return engine::testing::fresh_dir("cuda_pretrain_" + name);
}
// `graph`: train.cuda_graph (each step after the second replays one captured graph).
PretrainOptions options(const fs::path& dir, engine::Device device, bool graph = false) {
  PretrainOptions o = engine::testing::short_pretrain(dir, device);
  o.cuda_graph = graph;
  return o;
}
engine::OptimizerOptions adam() { return engine::testing::short_pretrain_adam(); }

PretrainResult full_run(engine::Device device, bool graph = false) {
  const fs::path dir = fresh_dir("full_" + device.str() + (graph ? "_graph" : ""));
  BertForMaskedLM model(tiny(), 5);
  Synthetic data;
  PretrainResult r = pretrain(model, data, options(dir, device, graph), adam(), 5, false);
  fs::remove_all(dir);
  return r;
}

// Trains on `first` until a simulated crash after step 10, then resumes on `second` from the
// step-8 checkpoint; the losses of steps 9..12.
std::vector<double> crash_and_resume(engine::Device first, engine::Device second,
                                     bool graph = false) {
  const fs::path dir =
      fresh_dir("resume_" + first.str() + "_" + second.str() + (graph ? "_graph" : ""));
  {
    BertForMaskedLM model(tiny(), 5);
    Synthetic data;
    REQUIRE_THROWS_WITH(pretrain(model, data, options(dir, first, graph), adam(), 5, false, "",
                                 [](int64_t step, double) {
                                   if (step == 10) throw engine::Error("simulated crash");
                                 }),
                        Contains("simulated crash"));
  }
  BertForMaskedLM model(tiny(), 999);  // a different init: everything comes from the checkpoint
  Synthetic data;
  PretrainResult r = pretrain(model, data, options(dir, second, graph), adam(), 5, true);
  REQUIRE(r.start_step == 8);
  fs::remove_all(dir);
  return r.losses;
}

void require_tracks(const std::vector<double>& got, const std::vector<double>& want, size_t offset,
                    double rel) {
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << offset + i + 1 << ": got " << got[i] << ", want " << want[offset + i]);
    REQUIRE(std::abs(got[i] - want[offset + i]) <= rel * std::abs(want[offset + i]));
  }
}

}  // namespace

TEST_CASE("device pretraining resumes bit for bit, and checkpoints move between devices",
          "[cuda][models][pretrain]") {
  const std::vector<double> gpu = full_run(kGpu).losses,
                            cpu = full_run(engine::Device::cpu()).losses;
  REQUIRE(gpu.size() == 12);
  REQUIRE(gpu.back() < gpu.front());  // it learns
  require_tracks(gpu, cpu, 0, 1e-5);  // the two devices agree step by step

  const std::vector<double> same = crash_and_resume(kGpu, kGpu);
  REQUIRE(same.size() == 4);
  for (size_t i = 0; i < 4; ++i) REQUIRE(same[i] == gpu[8 + i]);  // bit for bit

  // Saved on the device, resumed on the CPU; and the other way round.
  const std::vector<double> to_cpu = crash_and_resume(kGpu, engine::Device::cpu());
  const std::vector<double> to_gpu = crash_and_resume(engine::Device::cpu(), kGpu);
  require_tracks(to_cpu, cpu, 8, 1e-5);
  require_tracks(to_gpu, gpu, 8, 1e-5);
}

TEST_CASE(
    "train.cuda_graph: pretraining replays one captured step, tracks the eager run, resumes bit "
    "for bit",
    "[cuda][models][pretrain][graph]") {
  // Dropout on, 2 micro-batches whose predicted counts vary (the staged batches pad them to a
  // capacity: the loss is the same mean, its sum in another order), validation and checkpoints
  // between replays.
  const PretrainResult eager_run = full_run(kGpu), graph_run = full_run(kGpu, true);
  const std::vector<double>&eager = eager_run.losses, &graph = graph_run.losses;
  REQUIRE(eager_run.graph_launches == 0);
  REQUIRE(graph_run.graph_launches > 0);
  REQUIRE(graph.size() == 12);
  require_tracks(graph, eager, 0, 1e-5);
  // Resumed in graph mode from step 8: step 9 runs eagerly, 10 is captured, 11-12 replay; the
  // same bits as the uninterrupted graph run (step 1 eager, 2 captured, validation after 6, 7
  // eager, 8 captured).
  const std::vector<double> resumed = crash_and_resume(kGpu, kGpu, true);
  REQUIRE(resumed.size() == 4);
  for (size_t i = 0; i < 4; ++i) REQUIRE(resumed[i] == graph[8 + i]);
}

TEST_CASE("train.device names an existing device or the run stops with one clear error",
          "[cuda][models][pretrain][errors]") {
  BertForMaskedLM model(tiny(), 5);
  Synthetic data;
  const fs::path dir = fresh_dir("bad_device");
  REQUIRE_THROWS_WITH(
      pretrain(model, data, options(dir, engine::Device::cuda(7)), adam(), 5, false),
      Contains("cuda:7 does not exist"));
  fs::remove_all(dir);
}
