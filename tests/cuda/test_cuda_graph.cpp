// [cuda] DeviceGraph (engine/graph.h): a captured forward and backward replays the eager step bit
// for bit on new inputs; nothing runs at capture; the capture's blocks stay the graph's; host
// synchronisation inside a capture is one clear error and leaves the device usable.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "engine/graph.h"
#include "engine/rng.h"
#include "ops/ops.h"

using namespace engine;
using namespace engine::testing;

TEST_CASE("a captured forward and backward replays the eager step bit for bit", "[cuda]") {
  Generator g(5);
  const Tensor w = Tensor::randn({16, 24}, g).to(kGpu).set_requires_grad();
  const Tensor b = Tensor::randn({16}, g).to(kGpu).set_requires_grad();
  w.set_grad(Tensor::zeros({16, 24}, DType::f32, kGpu));
  b.set_grad(Tensor::zeros({16}, DType::f32, kGpu));
  const Tensor x = Tensor::empty({8, 24}, DType::f32, kGpu);  // the step's input, updated in place
  Tensor loss;
  const auto step = [&] {
    w.zero_grad();
    b.zero_grad();
    const Tensor y = gelu(linear(x, w, b));
    loss = mean(y * y) + sum(w * w) * 1e-3;
    loss.backward();
  };
  std::vector<Tensor> inputs;
  for (int i = 0; i < 3; ++i) inputs.push_back(Tensor::randn({8, 24}, g));

  // The eager steps.
  std::vector<std::vector<Tensor>> want;
  for (const Tensor& in : inputs) {
    x.copy_(in);
    step();
    want.push_back({loss.clone(), w.grad().clone(), b.grad().clone()});
  }

  // The captured step: nothing runs at capture (the gradients keep what they hold).
  x.copy_(inputs[0]);
  w.grad().fill_(-1.0);
  const Tensor before = w.grad().clone();
  DeviceGraph graph = DeviceGraph::capture(kGpu, step);
  REQUIRE(graph.defined());
  CHECK(graph.launches() > 0);
  require_equal(w.grad(), before);
  for (int rep = 0; rep < 2; ++rep) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      INFO("replay " << rep << " input " << i);
      x.copy_(inputs[i]);
      graph.replay();
      require_equal(loss, want[i][0]);
      require_equal(w.grad(), want[i][1]);
      require_equal(b.grad(), want[i][2]);
    }
  }
  CHECK(DeviceGraph::capture(kGpu, [] {}).launches() == 0);
}

TEST_CASE("a captured graph's blocks are not handed out until the graph is destroyed", "[cuda]") {
  void* inside = nullptr;
  Tensor kept;
  DeviceGraph graph = DeviceGraph::capture(kGpu, [&] {
    const Tensor t = Tensor::empty({1000}, DType::f32, kGpu);  // freed at the capture's end
    t.fill_(2.0);
    inside = t.raw_data();
    kept = Tensor::full({1000}, 3.0, DType::f32, kGpu);  // the graph's output, held
  });
  const Tensor after = Tensor::empty({1000}, DType::f32, kGpu);
  CHECK(after.raw_data() != inside);
  CHECK(after.raw_data() != kept.raw_data());
  graph.replay();
  require_equal(kept, Tensor::full({1000}, 3.0));
  graph = DeviceGraph();  // released: its free blocks are the cache's again
  const Tensor again = Tensor::empty({1000}, DType::f32, kGpu);
  CHECK(again.raw_data() == inside);
}

TEST_CASE("host synchronisation inside a capture is one clear error, the device goes on",
          "[cuda]") {
  const Tensor x = Tensor::full({4, 4}, 1.5, DType::f32, kGpu);
  const auto fails_with = [&](const std::function<void()>& work, const std::string& what) {
    try {
      DeviceGraph::capture(kGpu, work);
      FAIL("the capture did not throw");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  fails_with([&] { (void)(x * 2.0).to_vector<float>(); },
             "[graph] a read of a device tensor on the host (cuda:0) inside a graph capture");
  fails_with(
      [&] {
        x.copy_(Tensor::ones({4, 4}));
      },
      "[graph] a write of host values into a device tensor");
  fails_with([&] { DeviceGraph::capture(kGpu, [] {}); }, "[graph] cuda:0 is capturing already");
  try {
    DeviceGraph::capture(Device::cpu(), [] {});
    FAIL("a CPU capture did not throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("the cpu backend cannot capture") != std::string::npos);
  }
  // The device runs eagerly again, and captures again.
  require_equal(x * 2.0, Tensor::full({4, 4}, 3.0));
  Tensor y;
  DeviceGraph graph = DeviceGraph::capture(kGpu, [&] { y = x + 1.0; });
  graph.replay();
  require_equal(y, Tensor::full({4, 4}, 2.5));
}
