// [cuda] The model's forward and backward as one captured graph (engine/graph.h): for every
// positional preset, after one eager warm-up step (which builds and caches the position
// constants), the capture makes no host read or upload, and each replay at new weights (updated
// in place) gives the eager step's loss and gradient slab bit for bit. With dropout, the
// generator hands out device offsets during the capture (Generator::begin_device_offsets), so each
// replay draws the masks the eager step at the generator's position would: different ones each
// replay. bf16 with head width 32 takes the fused attention kernels. And the whole optimizer step
// in the Trainer's graph mode (train/trainer.h): its per-step numbers in device memory, the steps
// of the captured graph equal the eager trainer's bit for bit.
#include <catch2/catch.hpp>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.h"
#include "engine/autocast.h"
#include "engine/graph.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "engine/rng.h"
#include "models/bert.h"
#include "models/model_support.h"
#include "ops/elementwise.h"
#include "train/trainer.h"

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
    // Stale gradients: every parameter's (the slab's padding between them is never written,
    // and stays 0) — the replay must write or zero each one itself (zero_grad's deferred zeros
    // are the graph's: made at the capture's end).
    for (const FlatParameters::Entry& e : flat.entries())
      flat.grad_slice(e.offset, e.offset + e.numel).fill_(-1.0);
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

namespace {

// Copies a host batch into device tensors of the same shapes, in place (a graph's inputs keep
// their addresses).
void copy_batch(data::MlmBatch& dst, const data::MlmBatch& src) {
  dst.inputs.input_ids.copy_(src.inputs.input_ids);
  dst.inputs.attention_mask.copy_(src.inputs.attention_mask);
  dst.inputs.token_type_ids.copy_(src.inputs.token_type_ids);
  dst.positions.copy_(src.positions);
  dst.targets.copy_(src.targets);
}

}  // namespace

TEST_CASE(
    "Trainer in graph mode: forward, backward, statistics and AdamW (or LAMB) of 2 micro-batches "
    "replay the eager trainer's steps bit for bit, clipping, loss scaling and a skipped step "
    "included",
    "[cuda][models][graph]") {
  for (const char* optim : {"adamw", "lamb"}) {
    INFO(optim);
    models::BertConfig c = engine::testing::tiny_bert("tupe_r", "paper", 0.2);
    c.hidden_size = 64;  // 2 heads of width 32: bf16 takes the fused attention kernels
    c.ffn_size = 64;
    c.validate();
    models::BertForMaskedLM eager_model(c, 3), graph_model(c, 3);
    eager_model.train(true);
    graph_model.train(true);
    FlatParameters fe(eager_model.named_parameters(), kGpu),
        fg(graph_model.named_parameters(), kGpu);
    OptimizerOptions adam;
    adam.name = optim;
    const auto decay = [](const std::string& n) { return !default_no_decay(n); };
    const LinearSchedule schedule(2e-3, 3, 12);  // the learning rate changes every step
    const LearningRate lr = [&](int64_t s) { return schedule.lr(s); };
    TrainerOptions o;
    o.clip_norm = 0.5;  // active: the gradients' norm is above it
    o.loss_scale.enabled = true;
    o.loss_scale.init_scale = 1024;
    o.loss_scale.growth_interval = 2;  // the scale changes during the replays
    TrainerOptions og = o;
    og.cuda_graph = true;
    Trainer te(fe, adam, decay, lr, o), tg(fg, adam, decay, lr, og);
    Generator ge(11), gg(11);
    tg.set_graph_generator(&gg);
    // The graph's inputs: fixed device tensors, refilled in place before each step; micro-batch m
    // predicts the same positions every step (host_mlm_batch's seed % 5), other tokens and targets.
    const auto host_batch = [&](int step, int64_t m) {
      return engine::testing::host_mlm_batch(3, 12, c.vocab_size, uint64_t(1 + m + 5 * step));
    };
    std::vector<data::MlmBatch> inputs = {host_batch(0, 0).to(kGpu), host_batch(0, 1).to(kGpu)};
    Tensor poison_e = Tensor::ones({1}, DType::f32, kGpu), poison_g = poison_e.clone();
    for (int step = 0; step < 6; ++step) {
      INFO("step " << step);
      const double bad = step == 4 ? std::numeric_limits<double>::quiet_NaN() : 1.0;
      poison_e.fill_(bad);
      poison_g.fill_(bad);
      const std::vector<double> weights = {0.25 + 0.1 * step, 0.75 - 0.1 * step};
      std::vector<data::MlmBatch> eager_inputs;
      for (int64_t m = 0; m < 2; ++m) {
        const data::MlmBatch h = host_batch(step, m);
        eager_inputs.push_back(h.to(kGpu));
        copy_batch(inputs[size_t(m)], h);
      }
      // Micro-batch m's loss (bf16, times the poison) of a model on its inputs.
      const auto loss_of = [](const models::BertForMaskedLM& model,
                              const std::vector<data::MlmBatch>& in, Generator& gen,
                              const Tensor& poison) {
        return [&model, &in, &gen, &poison](int64_t m) {
          Autocast autocast(DType::bf16);
          return model.forward(in[size_t(m)], gen).loss * poison;
        };
      };
      const StepStats a = te.step(2, loss_of(eager_model, eager_inputs, ge, poison_e), weights);
      const TransferCounts t0 = transfer_counts();
      const StepStats b = tg.step(2, loss_of(graph_model, inputs, gg, poison_g), weights);
      const TransferCounts t1 = transfer_counts();
      if (step >= 1) {                        // the first builds and uploads the position constants
        CHECK(t1.to_host - t0.to_host == 1);  // the statistics, at the end
        // The step block at the start; the capture's step also zeroes the offset's word.
        CHECK(t1.from_host - t0.from_host == (step == 1 ? 2 : 1));
      }
      CHECK((tg.graph_launches() > 0) == (step >= 1));  // captured at the second step
      CHECK(b.applied == (step != 4));
      CHECK(b.applied == a.applied);
      CHECK(b.lr == a.lr);
      CHECK(b.loss_scale == a.loss_scale);
      if (b.applied) {
        CHECK(b.loss == a.loss);
        CHECK(b.grad_norm == a.grad_norm);
        CHECK(b.grad_norm > o.clip_norm);
      }
      CHECK(gg.offset() == ge.offset());
      require_equal(fg.data(), fe.data());
      CHECK(tg.optimizer().step_count() == te.optimizer().step_count());
    }
    CHECK(te.graph_launches() == 0);
    CHECK(tg.graph_captures() == 1);
    CHECK(tg.scaler().skipped_steps() == 1);
    std::printf("graph-mode trainer step (tiny BERT, 2 micro-batches, bf16, %s): %lld launches\n",
                optim, (long long)tg.graph_launches());
  }
}

TEST_CASE(
    "Trainer under bf16 autocast: the optimizer writes the parameters' bf16 copy, so a step "
    "converts nothing, a weight edited between steps is seen, eagerly and in graph mode",
    "[cuda][models][graph]") {
  // Trainer `t` keeps the copy its optimizer writes; trainer `ref` has its slab rewritten with
  // the same values before every step (an access: engine/storage.h), so it converts the slab each
  // step. Both must give the same losses and gradient norms every step (the forward of step k
  // reads the weights step k - 1 left), an edit of the weights at step 2 included, and the same
  // weights at the end; `t` converts the slab once (its first step) and again only after the
  // edit. (Nothing reads t's slab between its steps: any access would count.)
  for (const bool graph : {false, true})
    for (const char* optim : {"adamw", "lamb"}) {
      INFO((graph ? "graph mode " : "eager ") << optim);
      models::BertConfig c = engine::testing::tiny_bert("tupe_r", "paper", 0.2);
      c.hidden_size = 64;
      c.ffn_size = 64;
      c.validate();
      models::BertForMaskedLM mt(c, 3), mr(c, 3);
      mt.train(true);
      mr.train(true);
      FlatParameters ft(mt.named_parameters(), kGpu), fr(mr.named_parameters(), kGpu);
      OptimizerOptions opt;
      opt.name = optim;
      const LearningRate lr = constant_lr(1e-3);
      TrainerOptions o;
      o.cuda_graph = graph;
      Trainer t(ft, opt, {}, lr, o), ref(fr, opt, {}, lr, o);
      Generator gt(4), gr(4);
      t.set_graph_generator(&gt);
      ref.set_graph_generator(&gr);
      const data::MlmBatch batch = engine::testing::host_mlm_batch(3, 12, c.vocab_size, 2).to(kGpu);
      const auto loss_of = [&batch](const models::BertForMaskedLM& model, Generator& gen) {
        return [&model, &batch, &gen](int64_t) {
          Autocast autocast(DType::bf16);
          return model.forward(batch, gen).loss;
        };
      };
      const std::string slab = shape_str({ft.numel()});
      const std::vector<double> weights = {1.0};
      for (int step = 0; step < 5; ++step) {
        INFO("step " << step);
        if (step == 2)  // an edit of some weights, on both
          for (FlatParameters* f : {&ft, &fr}) f->data().slice(0, 0, 1000).mul_(0.5);
        fr.data().mul_(1.0);  // the same values, written
        start_work_recording();
        const StepStats a = t.step(1, loss_of(mt, gt), weights);
        int conversions = 0;  // of the whole slab from f32 to bf16
        for (const WorkRecord& r : stop_work_recording())
          conversions += r.op == "copy" && r.shape.find(slab + " f32") != std::string::npos &&
                         r.shape.find(slab + " bf16") != std::string::npos;
        const StepStats b = ref.step(1, loss_of(mr, gr), weights);
        CHECK(conversions == (step == 0 || step == 2 ? 1 : 0));
        REQUIRE(a.applied);
        CHECK(a.loss == b.loss);  // from the weights the last steps left: the copy's
        CHECK(a.grad_norm == b.grad_norm);
      }
      require_equal(ft.data(), fr.data());  // (a read of the slab: the next step would convert)
      CHECK(t.graph_captures() == (graph ? 1 : 0));
    }
}
