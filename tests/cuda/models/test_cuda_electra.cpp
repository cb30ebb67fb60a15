// [cuda] ELECTRA on the device against the CPU backend: the same initial weights, one batch, the
// generator's draws from the same stream (sample_categorical on each backend), dropout on. The
// draws, the discriminator's input and labels must be identical; the loss, its parts, both
// models' logits and every gradient (the shared embeddings' summed over both models) within 1e-5.
#include <catch2/catch.hpp>

#include "cuda/cuda_test_support.h"
#include "engine/module.h"
#include "models/electra.h"
#include "models/model_support.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;
using engine::testing::require_equal;

TEST_CASE("ELECTRA on the device: the CPU's draws, losses and gradients", "[cuda][models]") {
  for (std::string preset : {"tupe_r", "learnable_sin_ape", "learned_rpe"}) {
    INFO(preset);
    models::BertConfig c = engine::testing::tiny_bert(preset, "paper", 0.1);
    c.hidden_size = 32;
    c.num_heads = 4;
    c.embedding_size = 24;
    models::ElectraConfig e;
    e.generator_size = 0.5;
    models::ElectraForPretraining cpu(c, e, 5), gpu(c, e, 5);
    FlatParameters flat_cpu(cpu.named_parameters());
    FlatParameters flat_gpu(gpu.named_parameters(), kGpu);
    const data::MlmBatch batch = engine::testing::host_mlm_batch(3, 11, c.vocab_size, 3);
    Generator g1(17), g2(17);
    models::ElectraOutput a = cpu.forward(batch, g1), b = gpu.forward(batch.to(kGpu), g2);
    REQUIRE(g1.offset() == g2.offset());
    require_equal(b.sampled, a.sampled);
    require_equal(b.discriminator_ids, a.discriminator_ids);
    require_equal(b.rtd_labels, a.rtd_labels);
    require_close(b.mlm_loss, a.mlm_loss, 1e-5);
    require_close(b.rtd_loss, a.rtd_loss, 1e-5);
    require_close(b.loss, a.loss, 1e-5);
    require_close(b.mlm_logits, a.mlm_logits, 1e-5, 0, 1e-5);
    require_close(b.rtd_logits, a.rtd_logits, 1e-5, 0, 1e-5);
    a.loss.backward();
    b.loss.backward();
    engine::testing::require_same_gradients(gpu, cpu);
  }
}
