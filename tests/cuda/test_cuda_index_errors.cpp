// [cuda] Device-side index checks: the ops never read device ids back on the host to check them,
// and a kernel that meets an index outside its range never reads or writes with it and never traps
// (a trap is a sticky context failure). It records the index (engine/cuda/device_error.cuh) and the
// backend raises one clear error at its next host read, naming the op, the index, its position
// and the range; the device stays usable. Each case runs the op with one bad index, reads, and
// expects the error, then checks that a good call afterwards works. And the training step: one
// that meets a bad index applies no update.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/module.h"
#include "ops/ops.h"
#include "train/trainer.h"

using namespace engine;
using Catch::Contains;

namespace {

const Device kGpu = Device::cuda(0);

// The next host read raises the recorded error; the one after it and the device are clean.
void expect_index_error(const Tensor& t, const std::string& what) {
  REQUIRE_THROWS_WITH(t.to(Device::cpu()), Contains(what));
  // No sticky error: the device keeps working, and the error was raised once.
  REQUIRE(Tensor::ones({2}, DType::f32, kGpu).to(Device::cpu()).to_vector<float>() ==
          std::vector<float>{1, 1});
}

}  // namespace

TEST_CASE("an out-of-range id in the device gather and scatter-add is one clear error", "[cuda]") {
  Tensor table = Tensor::zeros({5, 3}, DType::f32, kGpu).set_requires_grad();
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 9, 2}, {3}).to(kGpu);
  Tensor y = embedding(table, ids);
  expect_index_error(y,
                     "[embedding] id 9 at position 1 of the (flattened) ids is out of range for "
                     "a table of 5 rows (expected 0 <= id < 5");
  y.backward(Tensor::ones({3, 3}, DType::f32, kGpu));
  expect_index_error(table.grad(), "[embedding] id 9 at position 1");
  // The good rows' gradients were summed; the bad id wrote nowhere.
  const std::vector<float> g = table.grad().to(Device::cpu()).to_vector<float>();
  REQUIRE(g == std::vector<float>{0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0});
  // A 16-byte-row table (the vector gather) and a negative id.
  Tensor wide = Tensor::zeros({4, 8}, DType::f32, kGpu);
  Tensor neg = Tensor::from_vector(std::vector<int32_t>{0, 3, -2}, {3}).to(kGpu);
  expect_index_error(embedding(wide, neg), "[embedding] id -2 at position 2");
}

TEST_CASE("an out-of-range bucket in relative_gather and relative_scatter is one clear error",
          "[cuda]") {
  Tensor index = Tensor::from_vector(std::vector<int64_t>{0, 1, 7, 2}, {2, 2}).to(kGpu);
  Tensor x = Tensor::zeros({1, 2, 5}, DType::f32, kGpu);
  expect_index_error(relative_gather(x, index),
                     "[relative_gather] bucket 7 at position 2 of the (flattened) relative index "
                     "is out of range for 5 buckets");
  expect_index_error(relative_scatter(Tensor::zeros({1, 2, 2}, DType::f32, kGpu), index, 5),
                     "[relative_gather] bucket 7 at position 2");
}

TEST_CASE("a target outside the classes in cross_entropy is one clear error", "[cuda]") {
  Tensor logits = Tensor::zeros({2, 5}, DType::f32, kGpu);
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 50}, {2}).to(kGpu);
  expect_index_error(cross_entropy(logits, targets),
                     "[cross_entropy] target 50 of row 1 is out of range for 5 classes");
}

TEST_CASE("a training step that meets a bad index applies no update, eagerly and in a graph",
          "[cuda][trainer]") {
  // AdamW runs before the step's one host read; it reads the device's index record and skips
  // (engine/cuda/optim.cu), so the read raises the error with the weights as they were.
  for (const bool graph : {false, true}) {
    INFO("cuda_graph " << graph);
    NamedTensors params = {{"table", Tensor::ones({5, 3}, DType::f32).set_requires_grad()},
                           {"w", Tensor::ones({3}, DType::f32).set_requires_grad()}};
    FlatParameters flat(params, kGpu);
    TrainerOptions o;
    o.cuda_graph = graph;
    Trainer trainer(flat, OptimizerOptions{}, {}, constant_lr(0.1), o);
    const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3}, {3}).to(kGpu);
    const Tensor good = ids.clone();
    const Tensor table = params[0].second, w = params[1].second;  // re-pointed at the slab
    const auto loss_of = [&](int64_t) { return sum(embedding(table, ids) * w); };
    const double one = 1.0;
    for (int step = 0; step < 3; ++step) trainer.step(1, loss_of, {&one, 1});  // eager, capture
    const std::vector<float> before = flat.data().to(Device::cpu()).to_vector<float>();
    ids.copy_(Tensor::from_vector(std::vector<int64_t>{1, 9, 3}, {3}));  // in place
    REQUIRE_THROWS_WITH(trainer.step(1, loss_of, {&one, 1}),
                        Contains("[embedding] id 9 at position 1"));
    REQUIRE(flat.data().to(Device::cpu()).to_vector<float>() == before);
    REQUIRE(trainer.optimizer().step_count() == 3);
    ids.copy_(good);  // the device and the trainer go on
    REQUIRE(trainer.step(1, loss_of, {&one, 1}).applied);
    REQUIRE(flat.data().to(Device::cpu()).to_vector<float>() != before);
  }
}
