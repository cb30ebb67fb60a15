// [cuda] What a training step costs the host on the device, for every positional preset: after
// the first step (which builds the position constants and fills the allocator's cache), a step of
// 3 micro-batches reads back one small tensor (the trainer's statistics), uploads one (the
// trainer's step block: learning-rate scalars, loss scale, weights; staged, no wait), and
// asks the driver for no memory (every block comes from the caching allocator). Also reports the
// kernel launches and GEMMs per step and per encoder layer (the difference between a 2-layer and
// a 1-layer model), which are figures, not assertions.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.h"
#include "engine/backend.h"
#include "engine/cuda/work_counts.h"
#include "engine/module.h"
#include "models/bert.h"
#include "models/model_support.h"
#include "train/trainer.h"

using namespace engine;
using engine::testing::kGpu;

namespace {

struct StepCost {
  int64_t to_host = 0, from_host = 0, driver_allocs = 0, kernels = 0, gemms = 0;
};

// Runs 1 warm-up step and `steps` measured steps of `micro` micro-batches; the measured steps'
// costs, per step.
StepCost measure(const models::BertConfig& c, int steps, int64_t micro) {
  models::BertForMaskedLM model(c, 3);
  model.train(true);
  FlatParameters flat(model.named_parameters(), kGpu);
  Trainer trainer(flat, OptimizerOptions{}, {}, constant_lr(1e-3));
  Generator gen(5);
  std::vector<data::MlmBatch> batches;
  for (int64_t m = 0; m < micro; ++m)
    batches.push_back(engine::testing::host_mlm_batch(3, 12, c.vocab_size, uint64_t(m)).to(kGpu));
  const std::vector<double> weights(size_t(micro), 1.0 / double(micro));
  auto loss_of = [&](int64_t m) { return model.forward(batches[size_t(m)], gen).loss; };
  REQUIRE(trainer.step(micro, loss_of, weights).applied);
  Allocator& alloc = backend(DeviceType::CUDA).allocator(0);
  const TransferCounts t0 = transfer_counts();
  const int64_t d0 = alloc.stats().driver_allocs;
  const cuda::WorkCounts w0 = cuda::work_counts();
  for (int s = 0; s < steps; ++s) REQUIRE(trainer.step(micro, loss_of, weights).applied);
  const TransferCounts t1 = transfer_counts();
  const cuda::WorkCounts w1 = cuda::work_counts();
  StepCost cost;
  cost.to_host = (t1.to_host - t0.to_host) / steps;
  cost.from_host = (t1.from_host - t0.from_host) / steps;
  cost.driver_allocs = alloc.stats().driver_allocs - d0;
  cost.kernels = (w1.kernels - w0.kernels) / steps;
  cost.gemms = (w1.gemms - w0.gemms) / steps;
  return cost;
}

}  // namespace

TEST_CASE("a device training step reads back one tensor, uploads one, allocates nothing new",
          "[cuda][models][host_sync]") {
  std::printf("%-44s %8s %8s %10s %10s  (per step of 1 micro-batch; per encoder layer)\n", "preset",
              "kernels", "gemms", "k/layer", "gemm/layer");
  for (const auto& [preset, reset] : engine::testing::all_presets()) {
    INFO(preset << " cls_reset " << reset);
    models::BertConfig c = engine::testing::tiny_bert(preset, reset, 0.1);
    const StepCost three = measure(c, 1, 3);
    CHECK(three.to_host == 1);    // the trainer's one read per optimizer step
    CHECK(three.from_host == 1);  // the step block (staged, no wait); batches arrive on the device
    CHECK(three.driver_allocs == 0);  // the caching allocator serves every block after step 1
    // Launches per layer: a 2-layer model against a 1-layer one, one micro-batch.
    const StepCost two_layers = measure(c, 1, 1);
    c.num_layers = 1;
    const StepCost one_layer = measure(c, 1, 1);
    std::printf("%-44s %8lld %8lld %10lld %10lld\n", (preset + " (" + reset + ")").c_str(),
                (long long)two_layers.kernels, (long long)two_layers.gemms,
                (long long)(two_layers.kernels - one_layer.kernels),
                (long long)(two_layers.gemms - one_layer.gemms));
  }
}
