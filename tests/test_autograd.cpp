// The tape: recording only when needed, reuse of a tensor, NoGrad, detach, repeated backward,
// retain_graph, freeing of dropped graphs, gradients through every view.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using namespace engine::testing;
using Catch::Contains;

namespace {
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }
}  // namespace

TEST_CASE("nothing is recorded unless an input requires grad", "[autograd]") {
  size_t base = tape_size();
  Tensor a = Tensor::ones({3});
  Tensor b = (a + a) * a;
  REQUIRE_FALSE(b.requires_grad());
  REQUIRE(b.grad_fn() == nullptr);
  REQUIRE(tape_size() == base);

  Tensor x = Tensor::ones({3}).set_requires_grad();
  {
    NoGrad ng;
    Tensor y = x * x;
    REQUIRE_FALSE(y.requires_grad());
    REQUIRE(tape_size() == base);
  }
  REQUIRE(GradMode::is_enabled());
  Tensor y = x * x;
  REQUIRE(y.requires_grad());
  REQUIRE(y.grad_fn() != nullptr);
  REQUIRE(std::string(y.grad_fn()->name()) == "mul");
  REQUIRE(tape_size() == base + 1);
}

TEST_CASE("a tensor used twice accumulates both gradients", "[autograd]") {
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3}).set_requires_grad();
  Tensor y = x * x + x;  // dy/dx = 2x + 1
  y.backward(Tensor::ones({3}, DType::f64));
  REQUIRE(vals(x.grad()) == std::vector<double>{3, 5, 7});
}

TEST_CASE("gradients accumulate across backward calls until zeroed", "[autograd]") {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2}).set_requires_grad();
  Tensor w = Tensor::from_vector<double>({3, 4}, {2});
  auto step = [&] { (x * w).backward(Tensor::ones({2}, DType::f64)); };
  step();
  REQUIRE(vals(x.grad()) == std::vector<double>{3, 4});
  step();  // a second graph: sums into the same .grad
  REQUIRE(vals(x.grad()) == std::vector<double>{6, 8});
  x.zero_grad();
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 0});
  step();  // a second backward after zeroing gives the first result again
  REQUIRE(vals(x.grad()) == std::vector<double>{3, 4});
}

TEST_CASE("retain_graph allows a second backward, otherwise it is a clear error", "[autograd]") {
  Tensor x = Tensor::from_vector<double>({2}, {1}).set_requires_grad();
  Tensor y = x * x * x;  // 3x^2 = 12
  y.backward(Tensor(), /*retain_graph=*/true);
  REQUIRE(vals(x.grad()) == std::vector<double>{12});
  x.zero_grad();
  y.backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{12});
  REQUIRE_THROWS_WITH(y.backward(), Contains("[backward]") && Contains("already freed") &&
                                        Contains("retain_graph"));
}

TEST_CASE("detach cuts the graph and NoGrad records nothing", "[autograd]") {
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3}).set_requires_grad();
  Tensor c = x.detach();
  REQUIRE(c.shares_storage(x));
  REQUIRE_FALSE(c.requires_grad());
  Tensor y = c * x;  // d/dx = c, not 2x
  y.backward(Tensor::ones({3}, DType::f64));
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 2, 3});

  Tensor z;
  {
    NoGrad ng;
    z = x * x;
  }
  REQUIRE_THROWS_WITH(z.backward(Tensor::ones({3}, DType::f64)),
                      Contains("[backward]") && Contains("does not require grad"));
}

TEST_CASE("backward argument errors", "[autograd][errors]") {
  Tensor x = Tensor::ones({2, 2}, DType::f64).set_requires_grad();
  Tensor y = x * x;
  REQUIRE_THROWS_WITH(y.backward(), Contains("[backward] root has shape (2, 2)"));
  REQUIRE_THROWS_WITH(y.backward(Tensor::ones({3}, DType::f64)),
                      Contains("[backward] gradient shape (3) does not match root shape (2, 2)"));
  REQUIRE_THROWS_WITH(y.set_requires_grad(false), Contains("only leaves"));
  REQUIRE_THROWS_WITH(x.fill_(0.0),
                      Contains("[fill_] in-place update of a tensor that requires grad"));
  NoGrad ng;
  x.fill_(0.0);  // allowed under NoGrad (optimizer steps)
}

TEST_CASE("a graph dropped without backward frees its nodes", "[autograd]") {
  size_t base = tape_size();
  Tensor x = Tensor::ones({4}, DType::f64).set_requires_grad();
  std::weak_ptr<Node> node;
  {
    Tensor y = (x * x) * x;
    node = y.grad_fn();
    REQUIRE(tape_size() == base + 2);
  }
  REQUIRE(node.expired());
  REQUIRE(tape_size() == base);
  // And a backward without retain_graph releases its part of the tape.
  Tensor z = x * x;
  z.backward(Tensor::ones({4}, DType::f64));
  REQUIRE(tape_size() == base);
}

TEST_CASE("the leaf gradient lands in a preset buffer in place", "[autograd]") {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2}).set_requires_grad();
  Tensor buf = Tensor::zeros({2}, DType::f64);
  x.set_grad(buf);
  (x * x).backward(Tensor::ones({2}, DType::f64));
  REQUIRE(x.grad().impl() == buf.impl());
  REQUIRE(vals(buf) == std::vector<double>{2, 4});
}

TEST_CASE("gradients through views match finite differences", "[autograd][gradcheck]") {
  Tensor x = rand_input({3, 5, 7}, 1);
  auto check = [&](const char* what, const TestFn& f) {
    GradcheckReport r = gradcheck(f, {x});
    INFO(what << "\n" << r.detail);
    REQUIRE(r.max_rel_error < 1e-6);
  };
  Tensor w = rand_input({3, 5, 7}, 2, false);
  check("reshape", [&](const std::vector<Tensor>& in) {
    return in[0].reshape({7, 15}) * w.reshape({7, 15});
  });
  check("permute", [&](const std::vector<Tensor>& in) {
    return in[0].permute({2, 0, 1}) * w.permute({1, 2, 0}).reshape({7, 3, 5});
  });
  check("transpose+contiguous",
        [&](const std::vector<Tensor>& in) { return in[0].transpose(0, 2).contiguous(); });
  check("slice with step", [&](const std::vector<Tensor>& in) {
    return in[0].slice(2, 1, 7, 2) * in[0].slice(1, 0, 5, 1).slice(2, 0, 3);
  });
  check("select",
        [&](const std::vector<Tensor>& in) { return in[0].select(1, 3) * in[0].select(1, -1); });
  check("expand", [&](const std::vector<Tensor>& in) {
    return in[0].slice(1, 0, 1).expand({2, 3, 5, 7}) * w;
  });
  check("unbind, every part used", [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> parts = in[0].permute({1, 0, 2}).unbind(0);  // 5 x (3, 7)
    return parts[0] * parts[4] + parts[2] * w.select(1, 1) + parts[1] + parts[3];
  });
  check("unbind, some parts unused", [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> parts = in[0].unbind(2);  // 7 x (3, 5)
    return parts[6] * parts[1] * w.select(2, 0);
  });
  check("unsqueeze/squeeze/flatten",
        [&](const std::vector<Tensor>& in) { return in[0].unsqueeze(0).squeeze(0).flatten(1); });
  check("to(f32) and back",
        [&](const std::vector<Tensor>& in) { return in[0].to(DType::f64).clone() * w; });
}

TEST_CASE("the leaf hook reports each leaf once, when its gradient is complete", "[autograd]") {
  engine::Generator gen(3);
  Tensor w = Tensor::randn({4, 4}, gen), b = Tensor::randn({4}, gen),
         u = Tensor::randn({4, 4}, gen);
  for (Tensor* t : {&w, &b, &u}) t->set_requires_grad(true);
  Tensor x = Tensor::randn({3, 4}, gen);
  std::vector<const engine::TensorImpl*> order;
  std::vector<std::vector<float>> grad_at_report;
  {
    engine::LeafGradHookScope scope([&](const engine::TensorImpl* leaf) {
      order.push_back(leaf);
      const Tensor& g = leaf == w.impl() ? w.grad() : leaf == b.impl() ? b.grad() : u.grad();
      grad_at_report.push_back(g.to_vector<float>());
    });
    // w is used twice (first and last), u once in between: w is complete only at the end.
    Tensor h = engine::tanh(engine::linear(x, w, b));
    Tensor y = engine::linear(engine::linear(h, u), w);
    engine::sum(y * y).backward();
  }
  REQUIRE(order.size() == 3);
  // Backward meets u's only use before w's first use (w is complete only after both uses),
  // then w and b together in the first linear.
  CHECK(order[0] == u.impl());
  CHECK(((order[1] == w.impl() && order[2] == b.impl()) ||
         (order[1] == b.impl() && order[2] == w.impl())));
  for (size_t k = 0; k < order.size(); ++k) {
    const Tensor& g = order[k] == w.impl() ? w.grad() : order[k] == b.impl() ? b.grad() : u.grad();
    CHECK(grad_at_report[k] == g.to_vector<float>());  // nothing was added after the report
  }
  // Outside the scope nothing is reported.
  order.clear();
  engine::sum(engine::linear(x, w, b)).backward();
  CHECK(order.empty());
}

namespace {
// Records what run_backward offered it, and passes the gradient through (or adds it into the
// sink itself when told to).
struct SinkProbe : Node {
  bool offered = false, use_sink = false;
  DType ask = DType::f64;
  const char* name() const override { return "sink_probe"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor* sink = grad_sink(0, ask);
    offered = sink != nullptr;
    if (sink && use_sink) {
      sink->add_(grads[0]);
      return {Tensor()};
    }
    return {grads[0]};
  }
};
Tensor probe(const Tensor& x, const std::shared_ptr<SinkProbe>& node) {
  Tensor out = x.detach().clone();
  record(node, {x}, {out});
  return out;
}
}  // namespace

TEST_CASE("backward offers a leaf's held .grad as a sink only when it can take the gradient",
          "[autograd]") {
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2}).set_requires_grad();
  const Tensor g = Tensor::from_vector<double>({1, 10, 100, 1000}, {2, 2});
  auto run = [&](bool use_sink, DType ask = DType::f64) {
    auto n = std::make_shared<SinkProbe>();
    n->use_sink = use_sink;
    n->ask = ask;
    probe(x, n).backward(g);
    return n->offered;
  };
  REQUIRE_FALSE(run(true));  // no .grad yet: the engine keeps a copy of the returned gradient
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 10, 100, 1000});
  REQUIRE(run(true));  // now held and contiguous: added in place, nothing returned
  REQUIRE(vals(x.grad()) == std::vector<double>{2, 20, 200, 2000});
  REQUIRE(run(false));  // a node may ignore the offer and return its gradient as before
  REQUIRE(vals(x.grad()) == std::vector<double>{3, 30, 300, 3000});
  REQUIRE_FALSE(run(true, DType::f32));  // a gradient of another dtype gets no sink
  REQUIRE(vals(x.grad()) == std::vector<double>{4, 40, 400, 4000});
  // A held gradient that is a transposed view: not contiguous, no sink (the engine adds).
  x.set_grad(Tensor::zeros({2, 2}, DType::f64).transpose(0, 1));
  REQUIRE_FALSE(run(true));
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 10, 100, 1000});
}

TEST_CASE("linear, matmul and embedding add into a held .grad in place, exactly", "[autograd]") {
  // Integers in f64: every sum is exact, so in-place and out-of-place results are equal.
  auto ints = [](const Shape& s, int seed) {
    std::vector<double> v(static_cast<size_t>(shape_numel(s)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = double((int(i) * 7 + seed) % 11 - 5);
    return Tensor::from_vector(v, s);
  };
  const Tensor h = ints({4, 3}, 1), p = ints({2, 4, 3}, 2), dy_lin = ints({4, 5}, 3),
               dy_emb = ints({3, 3}, 4), dy_mm = ints({2, 4, 5}, 5);
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 4, 1}, {3});
  const Tensor held = ints({5, 3}, 6), held_q = ints({3, 5}, 7);
  // References: each use on a leaf of its own, nothing held (no sink anywhere).
  auto leaf = [](const Tensor& t) { return t.clone().set_requires_grad(); };
  Tensor e_lin = leaf(ints({5, 3}, 8)), e_emb = leaf(e_lin.detach());
  linear(h, e_lin).backward(dy_lin);
  embedding(e_emb, idx).backward(dy_emb);
  Tensor q_ref = leaf(ints({3, 5}, 9));
  matmul(p, q_ref).backward(dy_mm);
  // The tied table: both uses in one graph, with a gradient already held (a second micro-batch,
  // or the flat slab of FlatParameters).
  Tensor e = leaf(e_lin.detach());
  e.set_grad(held.clone());
  linear(h, e).backward(dy_lin);
  REQUIRE(vals(e.grad()) == vals(held + e_lin.grad()));
  embedding(e, idx).backward(dy_emb);
  REQUIRE(vals(e.grad()) == vals(held + e_lin.grad() + e_emb.grad()));
  Tensor q = leaf(q_ref.detach());
  q.set_grad(held_q.clone());
  matmul(p, q).backward(dy_mm);  // 2-D b: one GEMM over the folded rows, beta 1
  REQUIRE(vals(q.grad()) == vals(held_q + q_ref.grad()));
  // The same leaf on both inputs of one node: the weight's gradient in place, x's returned.
  Tensor w_ref_x = leaf(ints({3, 3}, 10)), w_ref_w = leaf(w_ref_x.detach());
  const Tensor dy_w = ints({3, 3}, 11);
  linear(w_ref_x, w_ref_w).backward(dy_w);
  Tensor w = leaf(w_ref_x.detach());
  w.set_grad(ints({3, 3}, 12));
  linear(w, w).backward(dy_w);
  REQUIRE(vals(w.grad()) == vals(ints({3, 3}, 12) + w_ref_x.grad() + w_ref_w.grad()));
}

TEST_CASE("a 16-bit cast of an f32 leaf adds its gradient into the held f32 .grad", "[autograd]") {
  // bf16 values that are exact sums of small integers / 8: every result is exact in both ways.
  auto eighths = [](int64_t n, int seed) {
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = float((int(i) * 5 + seed) % 13 - 6) / 8.0f;
    return Tensor::from_vector(v, {n});
  };
  for (DType half : {DType::bf16, DType::f16}) {
    INFO(dtype_name(half));
    // The CPU computes in f32: the 16-bit tensor goes back to f32 for the product, and that
    // cast's backward hands the first cast a 16-bit gradient, as a 16-bit kernel would.
    const Tensor x = eighths(7, 1), held = eighths(7, 2);
    auto use = [&](const Tensor& c) { return c.to(DType::f32) * x; };
    // The reference: no .grad held, so the cast converts and the engine keeps the result.
    Tensor r = eighths(7, 3).set_requires_grad();
    use(r.to(half)).backward(Tensor::ones({7}));
    REQUIRE(r.grad().dtype() == DType::f32);
    Tensor w = eighths(7, 3).set_requires_grad();
    Tensor buf = held.clone();
    w.set_grad(buf);
    use(w.to(half)).backward(Tensor::ones({7}));
    REQUIRE(w.grad().impl() == buf.impl());  // added in place, in f32
    REQUIRE(vals(buf) == vals(held + r.grad()));
    // Used twice (two consumers of one cast): both land once each.
    buf.copy_(held);
    const Tensor c = w.to(half);
    (use(c) + c.to(DType::f32)).backward(Tensor::ones({7}));
    REQUIRE(vals(buf) == vals(held + r.grad() + Tensor::ones({7})));
  }
}

// unbind's views are select(d, i); one node writes their gradients into one tensor, in the
// input's layout when the input is a permuted whole tensor (BERT's q, k, v split of a (B, T, 3,
// H, d_h) projection permuted to (3, B, H, T, d_h)), so the permute's backward hands a contiguous
// gradient to the view before it; parts that got no gradient are zeros.
TEST_CASE("unbind: views of select, one gradient in the input's layout", "[autograd]") {
  Tensor base = rand_input({2, 4, 3, 2, 5}, 7);  // (B, T, 3, H, d_h)
  Tensor x = base.permute({2, 0, 3, 1, 4});      // (3, B, H, T, d_h)
  std::vector<Tensor> parts = x.unbind(0);
  REQUIRE(parts.size() == 3);
  for (int64_t i = 0; i < 3; ++i) {
    REQUIRE(parts[i].shape() == Shape{2, 2, 4, 5});
    REQUIRE(parts[i].storage_offset() == x.select(0, i).storage_offset());
    REQUIRE(parts[i].strides() == x.select(0, i).strides());
    REQUIRE(vals(parts[i].contiguous()) == vals(x.select(0, i).contiguous()));
  }
  Tensor g0 = rand_input({2, 2, 4, 5}, 8, false), g2 = rand_input({2, 2, 4, 5}, 9, false);
  Tensor loss = sum(parts[0] * g0) + sum(parts[2] * g2);  // parts[1] unused
  bool saw_unbind = false;
  auto find = [&](auto&& self, const std::shared_ptr<Node>& n) -> void {
    if (!n) return;
    if (std::string(n->name()) == "unbind") {
      saw_unbind = true;
      return;
    }
    for (const Edge& e : n->next) self(self, e.node);
  };
  find(find, loss.grad_fn());
  REQUIRE(saw_unbind);
  loss.backward();
  Tensor gx = base.grad().permute({2, 0, 3, 1, 4});
  REQUIRE(vals(gx.select(0, 0).contiguous()) == vals(g0));
  REQUIRE(vals(gx.select(0, 1).contiguous()) == std::vector<double>(80, 0.0));
  REQUIRE(vals(gx.select(0, 2).contiguous()) == vals(g2));

  // The gradient that reaches the permute is in x's layout: the permute's backward is contiguous.
  Tensor y = base.detach().set_requires_grad().permute({2, 0, 3, 1, 4});
  std::vector<Tensor> q = y.unbind(0);
  std::shared_ptr<Node> unbind_node = q[0].grad_fn();
  REQUIRE(unbind_node);
  REQUIRE(std::string(unbind_node->name()) == "unbind");
  REQUIRE(q[1].grad_fn() == unbind_node);
  std::vector<Tensor> got =
      unbind_node->backward({rand_input({2, 2, 4, 5}, 10, false), Tensor(), Tensor()});
  REQUIRE(got.size() == 1);
  REQUIRE(got[0].strides() == y.strides());
  REQUIRE(got[0].permute({1, 3, 0, 2, 4}).is_contiguous());
  // A layout that is not a permuted whole tensor (a slice) gets a contiguous gradient.
  Tensor z = base.detach().set_requires_grad().slice(1, 1, 3);
  std::vector<Tensor> r = z.unbind(1);
  std::vector<Tensor> gz =
      r[0].grad_fn()->backward({rand_input({2, 3, 2, 5}, 11, false), Tensor()});
  REQUIRE(gz[0].is_contiguous());
  REQUIRE(x.unbind(-5).size() == 3);
  REQUIRE_THROWS_WITH(x.unbind(5), Contains("[unbind]"));
}
