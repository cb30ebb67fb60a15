// [cuda] FlatParameters::zero_grad on a device defers its zeros (AutogradMeta::grad_fresh): the
// backward's writers overwrite the stale values instead of adding to zeros — weight gradients by
// GEMMs with beta 0, linear's bias gradient straight from cuBLASLt's epilogue, the residual join's
// parameter sums stored — and whatever no writer overwrote is zeroed before anyone reads it
// (a parameter no node reached, one whose writer only adds, the same leaf on two inputs of one
// node). Checked with the slab's parameter ranges poisoned with NaN before zero_grad: the
// gradients must equal, bit for bit, those of the same backward into zeros made up front.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "engine/autocast.h"
#include "engine/graph.h"
#include "engine/module.h"
#include "engine/work_log.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;
using engine::testing::require_equal;

namespace {

struct Params {
  NamedTensors all;
  Tensor w1, b1, w2, ln_w, ln_b, join_bias, unused, square, shared;
};

Params make_params(Generator& g, int64_t k, int64_t n) {
  Params p;
  auto add = [&](const std::string& name, const Shape& s) {
    Tensor t = (Tensor::randn(s, g) * 0.5).set_requires_grad();
    p.all.emplace_back(name, t);
    return t;
  };
  p.w1 = add("w1", {n, k});
  p.b1 = add("b1", {n});
  p.w2 = add("w2", {k, n});
  p.ln_w = add("ln_w", {k});
  p.ln_b = add("ln_b", {k});
  p.join_bias = add("join_bias", {k});
  p.unused = add("unused", {5});     // no node reaches it
  p.square = add("square", {k, k});  // the same leaf on both inputs of one matmul
  p.shared = add("shared", {k, k});  // two nodes: the first writes, the second adds
  return p;
}

// A linear with its bias (the BGRADB epilogue under autocast), a second linear, the residual join
// (dropout + add + LayerNorm with its three parameters), matmul(square, square) and a weight two
// linears share.
Tensor loss_of(const Params& p, const Tensor& x, Generator& gen) {
  Autocast ac(DType::bf16);
  const Tensor h = linear(x, p.w1, p.b1);
  const Tensor y = linear(gelu(h), p.w2);
  const DropoutAddNorm d =
      dropout_add_layer_norm(y, p.join_bias, x, 0.1, true, gen, p.ln_w, p.ln_b, 1e-5);
  const Tensor z = matmul(d.normed, matmul(p.square, p.square)) + linear(d.normed, p.shared) +
                   linear(x, p.shared);
  return engine::sum(z.to(DType::f32) * z.to(DType::f32));
}

// The slab's gradient after zero_grad and `backwards` backwards, the parameter ranges stale
// (NaN) before zero_grad; `upfront`: the zeros made before the backward (flat.grad() reads them).
Tensor run(FlatParameters& flat, const Params& p, const Tensor& x, bool upfront, int backwards,
           std::vector<WorkRecord>* work = nullptr) {
  for (const FlatParameters::Entry& e : flat.entries())
    flat.grad_slice(e.offset, e.offset + e.numel).fill_(NAN);
  flat.zero_grad();
  if (upfront) (void)flat.grad();
  if (work) start_work_recording();
  for (int b = 0; b < backwards; ++b) {
    Generator gen(17);
    loss_of(p, x, gen).backward();
  }
  if (work) *work = stop_work_recording();
  return flat.grad().clone();
}

}  // namespace

TEST_CASE("a deferred zero_grad: first writers overwrite, the rest is zeroed before it is read",
          "[cuda]") {
  Generator g(71);
  const int64_t k = 32, n = 48;
  Params p = make_params(g, k, n);
  FlatParameters flat(p.all, kGpu);
  const Tensor x = Tensor::randn({3, 7, k}, g).to(kGpu);
  // Two identical backwards after zero_grad sum to twice one (to the rounding of a GEMM that adds
  // C before rounding, as the emulator's does): a second writer that overwrote instead of adding
  // would halve it, in both runs below alike.
  require_close(run(flat, p, x, false, 2), run(flat, p, x, false, 1) * 2.0, 1e-5, 1e-6, 1e-6);
  for (int backwards : {1, 2}) {
    INFO(backwards << " backward(s) after zero_grad");
    const Tensor want = run(flat, p, x, true, backwards);
    std::vector<WorkRecord> work;
    const Tensor got = run(flat, p, x, false, backwards, &work);
    require_equal(got, want);
    // Nothing NaN: every stale value was overwritten or zeroed; the unused one is 0.
    for (double v : got.to_vector<double>()) REQUIRE(std::isfinite(v));
    for (double v : p.unused.grad().to(Device::cpu()).to_vector<double>()) REQUIRE(v == 0.0);
    // No fill of the slab; the first backward's weight GEMMs into f32 .grads with beta 0 (w1,
    // w2, shared's first use), beta 1 for shared's second use and for square (zeroed up front:
    // its casts feed both inputs of one matmul), every one of the second backward's with beta 1;
    // linear's bias from the epilogue without an add.
    int slab_fills = 0, written = 0, added = 0, adds = 0;
    for (const WorkRecord& r : work) {
      if (r.op == "fill" && r.shape.rfind("(" + std::to_string(flat.numel()) + ")", 0) == 0)
        ++slab_fills;
      if (r.op == "gemm" && r.shape.find(" c_f32") != std::string::npos)
        (r.shape.find(" beta") == std::string::npos ? written : added) += 1;
      if (r.op == "add_" && r.shape.rfind("(" + std::to_string(n) + ") f32", 0) == 0) ++adds;
    }
    CHECK(slab_fills == 0);
    CHECK(written == 3);
    CHECK(added == (backwards == 1 ? 2 : 7));
    CHECK(adds == (backwards == 1 ? 0 : 1));
  }
}

TEST_CASE("a deferred zero_grad: readers see zeros, a captured step owns its zeros", "[cuda]") {
  Generator g(72);
  Params p = make_params(g, 16, 24);
  FlatParameters flat(p.all, kGpu);
  // A reader of a parameter's .grad, or of the slab, after zero_grad alone: zeros.
  for (const FlatParameters::Entry& e : flat.entries())
    flat.grad_slice(e.offset, e.offset + e.numel).fill_(3.0);
  flat.zero_grad();
  for (double v : p.w1.grad().to(Device::cpu()).to_vector<double>()) REQUIRE(v == 0.0);
  for (double v : flat.grad().to(Device::cpu()).to_vector<double>()) REQUIRE(v == 0.0);
  // Tensor::zero_grad / set_grad end a deferral too.
  flat.zero_grad();
  p.b1.zero_grad();
  p.b1.grad().fill_(2.0);  // a write through grad(): not stale
  for (double v : p.b1.grad().to(Device::cpu()).to_vector<double>()) REQUIRE(v == 2.0);

  // A captured zero_grad + backward (no reader inside): the parameters nothing wrote are zeroed
  // by the graph itself (at the capture's end), so a replay over stale values gives the eager
  // step's gradients.
  const Tensor x = Tensor::randn({2, 5, 16}, g).to(kGpu);
  const auto step = [&] {
    flat.zero_grad();
    Generator gen(3);
    loss_of(p, x, gen).backward();
  };
  step();
  const Tensor want = flat.grad().clone();
  const DeviceGraph graph = DeviceGraph::capture(kGpu, step);
  for (const FlatParameters::Entry& e : flat.entries())
    flat.grad_slice(e.offset, e.offset + e.numel).fill_(NAN);
  graph.replay();
  require_equal(flat.grad(), want);
}
