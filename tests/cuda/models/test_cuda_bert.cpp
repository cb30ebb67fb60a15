// [cuda] the whole BERT model on the device against the CPU backend, for every positional
// preset: the same initial weights (built on the CPU, then moved by FlatParameters), one batch
// with padding and segments, dropout off (pretrain_app's single-batch mode). Loss, logits and
// every parameter's gradient within 1e-5 relative (plus 1e-5 of the tensor's largest magnitude,
// for elements that are sums that cancel, and 1e-10 for gradients that are zero in exact
// arithmetic, such as a key bias under softmax shift invariance); then a 20-step pretraining
// (AdamW, clipping, warmup) whose losses track the CPU run's step by step.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.h"
#include "engine/module.h"
#include "models/bert.h"
#include "models/model_support.h"
#include "train/trainer.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;

TEST_CASE("every preset: loss, logits and every gradient on the device match the CPU",
          "[cuda][models]") {
  for (const auto& [preset, reset] : engine::testing::all_presets()) {
    for (bool pre_ln : {false, true}) {
      INFO(preset << " cls_reset " << reset << (pre_ln ? " pre-LN" : " post-LN"));
      models::BertConfig c = engine::testing::tiny_bert(preset, reset);
      c.pre_layer_norm = pre_ln;
      models::BertForMaskedLM cpu(c, 7), gpu(c, 7);
      FlatParameters flat_cpu(cpu.named_parameters());
      FlatParameters flat_gpu(gpu.named_parameters(), kGpu);
      REQUIRE(gpu.bert.token_embedding.device() == kGpu);
      cpu.train(false);
      gpu.train(false);
      const data::MlmBatch batch = engine::testing::host_mlm_batch(3, 11, c.vocab_size, 2);
      Generator g1(1), g2(1);
      models::MlmOutput a = cpu.forward(batch, g1), b = gpu.forward(batch.to(kGpu), g2);
      require_close(b.loss, a.loss, 1e-5);
      require_close(b.logits, a.logits, 1e-5, 0, 1e-5);
      a.loss.backward();
      b.loss.backward();
      engine::testing::require_same_gradients(gpu, cpu);
    }
  }
}

TEST_CASE("20 pretraining steps on the device track the CPU run step by step", "[cuda][models]") {
  for (std::string preset : {"tupe_r", "bert_a"}) {
    INFO(preset);
    models::BertConfig c = engine::testing::tiny_bert(preset, "paper", 0.1);
    models::BertForMaskedLM cpu(c, 3), gpu(c, 3);
    FlatParameters flat_cpu(cpu.named_parameters());
    FlatParameters flat_gpu(gpu.named_parameters(), kGpu);
    OptimizerOptions adam;
    adam.lr = 2e-3;
    adam.weight_decay = 0.01;
    const LinearSchedule schedule(adam.lr, 4, 20);
    TrainerOptions opt;
    opt.clip_norm = 1.0;
    auto decay = [](const std::string& n) { return !default_no_decay(n); };
    auto lr = [schedule](int64_t s) { return schedule.lr(s); };
    Trainer tc(flat_cpu, adam, decay, lr, opt), tg(flat_gpu, adam, decay, lr, opt);
    Generator gc(11), gg(11);  // the same dropout stream: the same masks on both devices
    const double one = 1.0;
    for (int step = 0; step < 20; ++step) {
      const data::MlmBatch batch = engine::testing::host_mlm_batch(2, 12, c.vocab_size, step);
      const data::MlmBatch on_gpu = batch.to(kGpu);
      const StepStats a =
          tc.step(1, [&](int64_t) { return cpu.forward(batch, gc).loss; }, {&one, 1});
      const StepStats b =
          tg.step(1, [&](int64_t) { return gpu.forward(on_gpu, gg).loss; }, {&one, 1});
      INFO("step " << step + 1 << ": cpu loss " << a.loss << ", cuda loss " << b.loss);
      REQUIRE(b.applied == a.applied);
      REQUIRE(std::abs(b.loss - a.loss) <= 1e-5 * std::abs(a.loss));
      REQUIRE(std::abs(b.grad_norm - a.grad_norm) <= 1e-4 * std::abs(a.grad_norm));
    }
    require_close(flat_gpu.data(), flat_cpu.data(), 1e-4, 1e-6);
  }
}
