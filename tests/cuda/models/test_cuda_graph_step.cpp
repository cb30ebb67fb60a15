// [cuda] The model's forward and backward as one captured graph (engine/graph.h): for every
// positional preset, after one eager warm-up step (which builds and caches the position
// constants), the capture makes no host read or upload, and each replay at new weights (updated
// in place) gives the eager step's loss and gradient slab bit for bit. With dropout, the
// generator hands out device offsets during the capture (Generator::begin_device_offsets), so each
// replay draws the masks the eager step at the generator's position would: different ones each
// replay. bf16 with head width 32 takes the fused attention kernels.
#include <catch2/catch.hpp>

#include <string>

#include "cuda/cuda_test_support.h"
#include "engine/autocast.h"
#include "engine/graph.h"
#include "engine/module.h"
#include "engine/rng.h"
#include "models/bert.h"
#include "models/model_support.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_equal;

namespace {

void check_graph_step(const models::BertConfig& c, DType compute) {
  models::BertForMaskedLM model(c, 3);
  model.train(true);
  FlatParameters flat(model.named_parameters(), kGpu);
  Generator gen(5);
  const data::MlmBatch batch = engine::testing::host_mlm_batch(3, 12, c.vocab_size, 1).to(kGpu);
  const auto step = [&](Tensor& loss) {
    flat.zero_grad();
    {
      Autocast autocast(compute);
      loss = model.forward(batch, gen).loss;
    }
    loss.backward();
  };
  Tensor eager_loss, graph_loss;
  step(eager_loss);  // warm-up: position constants, the allocator's cache
  // The device word of the generator's offset, set before each replay.
  const Tensor offset = Tensor::zeros({1}, DType::i64, kGpu);
  const TransferCounts t0 = transfer_counts();
  gen.begin_device_offsets(reinterpret_cast<const uint64_t*>(offset.data<int64_t>()));
  const DeviceGraph graph = DeviceGraph::capture(kGpu, [&] { step(graph_loss); });
  const uint64_t blocks = gen.end_device_offsets();
  const TransferCounts t1 = transfer_counts();
  CHECK(t1.to_host == t0.to_host);
  CHECK(t1.from_host == t0.from_host);
  CHECK(graph.launches() > 0);
  CHECK((blocks > 0) == (c.hidden_dropout > 0));
  for (int k = 0; k < 2; ++k) {
    INFO("replay " << k);
    flat.data().mul_(0.875);  // new weights, in place
    const PhiloxState at = gen.state();
    step(eager_loss);
    CHECK(gen.offset() == at.offset + blocks);
    const Tensor want_loss = eager_loss.clone(), want_grad = flat.grad().clone();
    gen.set_state(at);
    flat.grad().fill_(-1.0);
    offset.fill_(static_cast<double>(gen.offset()));
    graph.replay();
    gen.skip_blocks(blocks);
    require_equal(graph_loss, want_loss);
    require_equal(flat.grad(), want_grad);
  }
}

}  // namespace

TEST_CASE(
    "every preset's forward and backward, captured as one graph, replays the eager step, "
    "dropout included",
    "[cuda][models][graph]") {
  for (const auto& [preset, reset] : engine::testing::all_presets()) {
    INFO(preset << " cls_reset " << reset);
    check_graph_step(engine::testing::tiny_bert(preset, reset, 0.2), DType::f32);
  }
  check_graph_step(engine::testing::tiny_bert("tupe_r", "paper", 0.0), DType::f32);  // no draws
  for (const std::string preset : {"tupe_r", "bert_a"}) {
    INFO(preset << " bf16, the fused attention kernels");
    models::BertConfig c = engine::testing::tiny_bert(preset, "paper", 0.2);
    c.hidden_size = 64;  // 2 heads of width 32
    c.ffn_size = 64;
    c.validate();
    check_graph_step(c, DType::bf16);
  }
}
