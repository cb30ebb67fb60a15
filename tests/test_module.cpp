// Named parameters and the flat parameter/gradient slabs.
#include <catch2/catch.hpp>

#include "ops/ops.h"

using namespace engine;
using Catch::Contains;

namespace {
struct Layer : Module {
  Tensor w, b;
  Layer(int in, int out) {
    Generator g(static_cast<uint64_t>(in * 100 + out));
    w = register_parameter("weight", Tensor::randn({out, in}, g, 0, 0.02));
    b = register_parameter("bias", Tensor::zeros({out}));
  }
};
struct Net : Module {
  Layer l1{3, 5}, l2{5, 2};
  Tensor scale;
  Net() {
    register_module("l1", l1);
    register_module("l2", l2);
    scale = register_parameter("scale", Tensor::ones({1}));
  }
};
}  // namespace

TEST_CASE("parameters are registered and walked by name", "[module]") {
  Net net;
  NamedTensors ps = net.named_parameters();
  std::vector<std::string> names;
  for (auto& [n, t] : ps) names.push_back(n);
  REQUIRE(names ==
          std::vector<std::string>{"scale", "l1.weight", "l1.bias", "l2.weight", "l2.bias"});
  REQUIRE(net.num_parameters() == 1 + 15 + 5 + 10 + 2);
  for (auto& [n, t] : ps) REQUIRE(t.requires_grad());
  REQUIRE(ps[1].second.impl() == net.l1.w.impl());  // handles share the TensorImpl
  net.train(false);
  REQUIRE_FALSE(net.l2.training());

  Layer extra(1, 1);
  REQUIRE_THROWS_WITH(net.register_parameter("scale", Tensor::ones({1})),
                      Contains("[module] name 'scale' is already a parameter"));
  REQUIRE_THROWS_WITH(net.register_module("l1", extra), Contains("already a submodule"));
  REQUIRE_THROWS_WITH(net.register_parameter("a.b", Tensor::ones({1})), Contains("only letters"));
}

TEST_CASE("flat slabs hold the parameters and receive the gradients", "[module]") {
  Net net;
  std::vector<float> w_before = net.l1.w.to_vector<float>();
  FlatParameters flat(net.named_parameters());
  REQUIRE(flat.entries().size() == 5);
  // Each entry is 16-element aligned; the model's own handles now view the slab.
  for (auto& e : flat.entries()) REQUIRE(e.offset % 16 == 0);
  REQUIRE(net.l1.w.shares_storage(flat.data()));
  REQUIRE(net.l1.w.to_vector<float>() == w_before);
  REQUIRE(flat.numel() == 16 + 16 + 16 + 16 + 16);

  // Forward/backward: gradients land in the slab.
  Tensor x = Tensor::ones({5});
  Tensor y =
      (net.l2.b * net.scale + net.l1.b.slice(0, 0, 2)) * Tensor::from_vector<float>({2, 3}, {2});
  y.backward(Tensor::ones({2}));
  REQUIRE(net.l2.b.grad().shares_storage(flat.grad()));
  REQUIRE(net.l2.b.grad().to_vector<float>() == std::vector<float>{2, 3});
  REQUIRE(net.l1.b.grad().to_vector<float>() == std::vector<float>{2, 3, 0, 0, 0});
  std::vector<float> g = flat.grad().to_vector<float>();
  const auto& e = flat.entries()[4];  // l2.bias
  REQUIRE(g[e.offset] == 2.0f);
  REQUIRE(g[e.offset + 1] == 3.0f);
  REQUIRE(g[e.offset + 2] == 0.0f);  // padding stays zero

  flat.zero_grad();
  REQUIRE(net.l2.b.grad().to_vector<float>() == std::vector<float>{0, 0});
  // An update of the slab is an update of the model.
  {
    NoGrad ng;
    flat.data().fill_(1.0);
  }
  REQUIRE(net.l2.w.to_vector<float>() == std::vector<float>(10, 1.0f));
}

TEST_CASE("flat slab errors", "[module][errors]") {
  NamedTensors mixed = {{"a", Tensor::ones({2}).set_requires_grad()},
                        {"b", Tensor::ones({2}, DType::f64).set_requires_grad()}};
  REQUIRE_THROWS_WITH(FlatParameters(mixed), Contains("[flat_parameters] parameter 'b'"));
  REQUIRE_THROWS_WITH(FlatParameters(NamedTensors{}), Contains("no parameters"));
}
