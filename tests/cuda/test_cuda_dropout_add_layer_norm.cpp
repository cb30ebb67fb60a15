// [cuda] dropout_add_layer_norm on the device against the CPU backend from the same generator
// (the same mask), forward and every gradient: rows a warp each (lengths 1 .. 1024, vectors or
// not, rows starting mid-Philox-block), several rows a warp and several blocks of partial sums,
// rows longer than 1024 (a block each); f32 / f64, bf16 / f16 against the CPU's f32; the
// parameter gradients the same bits on every rerun.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::leaf_holding_grad;
using engine::testing::require_close;
using engine::testing::slab_adds;

namespace {

struct Case {
  Tensor x, bias, residual, weight, ln_bias;
  std::vector<Tensor> all() const { return {x, bias, residual, weight, ln_bias}; }
  Case to(Device d, DType dt) const {
    auto leaf = [&](const Tensor& t) {
      return t.defined() ? t.detach().to(dt).to(d).set_requires_grad() : Tensor();
    };
    return {leaf(x), leaf(bias), leaf(residual), leaf(weight), leaf(ln_bias)};
  }
};

Case make_case(const Shape& s, DType dt, Generator& g, bool with_bias, bool with_affine) {
  const int64_t c = s.back();
  Case k;
  k.x = Tensor::randn(s, g, 0.0, 1.0, dt);
  k.residual = Tensor::randn(s, g, 0.5, 2.0, dt);
  if (with_bias) k.bias = Tensor::randn({c}, g, 0.0, 0.5, dt);
  if (with_affine) {
    k.weight = Tensor::randn({c}, g, 1.0, 0.3, dt);
    k.ln_bias = Tensor::randn({c}, g, 0.0, 0.3, dt);
  }
  return k;
}

// Runs the op with generator seed 77 and a backward through both outputs (w_sum undefined: the
// sum output gets no gradient, as in a post-LN block).
DropoutAddNorm run(const Case& k, double p, const Tensor& w_normed, const Tensor& w_sum) {
  Generator g(77);
  DropoutAddNorm o =
      dropout_add_layer_norm(k.x, k.bias, k.residual, p, true, g, k.weight, k.ln_bias, 1e-5);
  Tensor loss = sum(o.normed * w_normed);
  if (w_sum.defined()) loss = loss + sum(o.sum * w_sum);
  loss.backward();
  return o;
}

}  // namespace

TEST_CASE("dropout_add_layer_norm forward and backward match the CPU", "[cuda]") {
  Generator g(51);
  const char* names[] = {"x", "bias", "residual", "weight", "ln_bias"};
  // Variants: 0 bias + affine, no dsum; 1 no bias, dsum; 2 no affine, dsum, p = 0; 3 everything
  // (bias, affine, dsum, dropout). (2100, 4): two rows a warp and several blocks of partial sums
  // (f32, variant 3 only: the emulated sanitizers' time); (3, 1031): a block per row.
  struct Run {
    DType dt;
    Shape s;
    int variant;
  };
  std::vector<Run> runs;
  for (DType dt : {DType::f32, DType::f64})
    for (Shape s : {Shape{1, 1}, Shape{2, 3, 7}, Shape{3, 33}, Shape{2, 3, 768}, Shape{2, 1024},
                    Shape{3, 1031}})
      for (int variant = 0; variant < 4; ++variant) runs.push_back({dt, s, variant});
  runs.push_back({DType::f32, Shape{2100, 4}, 3});
  for (const Run& run_case : runs) {
    const DType dt = run_case.dt;
    const Shape& s = run_case.s;
    const int variant = run_case.variant;
    const bool with_bias = variant != 1, with_affine = variant != 2, with_dsum = variant != 0;
    const double p = variant == 2 ? 0.0 : 0.2;
    INFO(dtype_name(dt) << " shape " << shape_str(s) << " variant " << variant);
    const double tol = dt == DType::f64 ? 1e-11 : 1e-5;
    const Case host = make_case(s, dt, g, with_bias, with_affine);
    const Case cpu = host.to(Device::cpu(), dt), gpu = host.to(kGpu, dt);
    const Tensor wn = Tensor::randn(s, g, 0.0, 1.0, dt);
    const Tensor ws = with_dsum ? Tensor::randn(s, g, 0.0, 1.0, dt) : Tensor();
    DropoutAddNorm want = run(cpu, p, wn, ws);
    DropoutAddNorm got = run(gpu, p, wn.to(kGpu), with_dsum ? ws.to(kGpu) : Tensor());
    require_close(got.sum, want.sum, tol, tol);
    require_close(got.normed, want.normed, tol, tol);
    const std::vector<Tensor> a = gpu.all(), b = cpu.all();
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].defined()) continue;
      INFO("gradient of " << names[i]);
      require_close(a[i].grad(), b[i].grad(), tol, tol, tol);
    }
  }
}

TEST_CASE("dropout_add_layer_norm with x needing no gradient matches the CPU", "[cuda]") {
  // The bias gradient summed from dx without dx written; rows a warp each and a block each.
  Generator g(54);
  for (Shape s : {Shape{5, 64}, Shape{2, 1031}}) {
    INFO("shape " << shape_str(s));
    const Case host = make_case(s, DType::f32, g, true, true);
    Case cpu = host.to(Device::cpu(), DType::f32), gpu = host.to(kGpu, DType::f32);
    cpu.x = cpu.x.detach();
    gpu.x = gpu.x.detach();
    const Tensor wn = Tensor::randn(s, g);
    run(cpu, 0.2, wn, Tensor());
    run(gpu, 0.2, wn.to(kGpu), Tensor());
    require_close(gpu.bias.grad(), cpu.bias.grad(), 1e-5, 1e-5, 1e-5);
    require_close(gpu.residual.grad(), cpu.residual.grad(), 1e-5, 1e-5, 1e-5);
    require_close(gpu.weight.grad(), cpu.weight.grad(), 1e-5, 1e-5, 1e-5);
  }
}

TEST_CASE("dropout_add_layer_norm in bf16 and f16 against the CPU in f32", "[cuda]") {
  Generator g(52);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const double rel = dt == DType::bf16 ? 1.0 / 32 : 1.0 / 256;
    const Case host = make_case({6, 768}, DType::f32, g, true, true);
    const Case cpu = host.to(Device::cpu(), dt).to(Device::cpu(), DType::f32);  // rounded inputs
    const Case gpu = host.to(kGpu, dt);
    const Tensor wn = Tensor::randn({6, 768}, g).to(dt);
    DropoutAddNorm want = run(cpu, 0.1, wn.to(DType::f32), Tensor());
    DropoutAddNorm got = run(gpu, 0.1, wn.to(kGpu), Tensor());
    REQUIRE(got.normed.dtype() == dt);
    require_close(got.normed, want.normed, rel, rel);
    require_close(got.sum, want.sum, rel, rel);
    require_close(gpu.x.grad(), cpu.x.grad(), rel, rel, rel);
    require_close(gpu.residual.grad(), cpu.residual.grad(), rel, rel, rel);
    require_close(gpu.weight.grad(), cpu.weight.grad(), rel, rel, rel);
    require_close(gpu.bias.grad(), cpu.bias.grad(), rel, rel, rel);
  }
}

TEST_CASE("dropout_add_layer_norm parameter gradients are the same bits on every rerun", "[cuda]") {
  Generator g(53);
  const Case host = make_case({300, 40}, DType::f32, g, true, true);
  const Tensor wn = Tensor::randn({300, 40}, g).to(kGpu);
  std::vector<std::vector<float>> first;
  for (int rerun = 0; rerun < 2; ++rerun) {
    const Case gpu = host.to(kGpu, DType::f32);
    run(gpu, 0.1, wn, Tensor());
    std::vector<std::vector<float>> grads;
    for (const Tensor& t : {gpu.bias, gpu.weight, gpu.ln_bias})
      grads.push_back(t.grad().to(Device::cpu()).to_vector<float>());
    if (rerun == 0) first = grads;
    for (size_t i = 0; i < grads.size(); ++i) REQUIRE(grads[i] == first[i]);
  }
}

TEST_CASE("under bf16 autocast the parameters' gradients are added in f32 into their .grad",
          "[cuda]") {
  // f32 leaves (bias, weight, ln_bias) holding a .grad (FlatParameters' slab), cast to bf16 by
  // autocast: the column sums add into the held f32 .grad themselves (no bf16 gradient, no add_),
  // for rows a warp each (768) and rows a block each (1500); against the CPU in f32 on the
  // bf16-rounded operands. A parameter cast used twice goes the usual way (bf16 sum, one add).
  Generator g(54);
  for (int64_t c : {768, 1500}) {
    for (int uses : {1, 2}) {
      INFO("C " << c << ", " << uses << " use(s) of the parameters");
      const Case host = make_case({6, c}, DType::f32, g, true, true);
      const Tensor held = Tensor::randn({3, c}, g), wn = Tensor::randn({6, c}, g);
      Tensor x = host.x.to(DType::bf16).to(kGpu), r = host.residual.to(DType::bf16).to(kGpu);
      std::vector<Tensor> params;
      for (const Tensor& t : {host.bias, host.weight, host.ln_bias})
        params.push_back(leaf_holding_grad(t, held.select(0, int64_t(params.size()))));
      const std::vector<Tensor> slabs = {params[0].grad(), params[1].grad(), params[2].grad()};
      Tensor loss;
      {
        Autocast ac(DType::bf16);
        Generator gen(77);
        const Tensor b = uses == 2 ? params[0].to(DType::bf16) : params[0];
        DropoutAddNorm o =
            dropout_add_layer_norm(x, b, r, 0.1, true, gen, params[1], params[2], 1e-5);
        loss = sum(o.normed.to(DType::f32) * wn.to(kGpu));
        if (uses == 2) loss = loss + sum(b.to(DType::f32));  // a second consumer of the cast
      }
      start_work_recording();
      loss.backward();
      CHECK(slab_adds(stop_work_recording(), c) == (uses == 1 ? 0 : 1));
      for (int i = 0; i < 3; ++i) REQUIRE(params[i].grad().shares_storage(slabs[i]));
      // The CPU in f32 on the rounded operands, from the same generator (the same mask).
      std::vector<Tensor> pc;
      for (const Tensor& t : {host.bias, host.weight, host.ln_bias})
        pc.push_back(t.to(DType::bf16).to(DType::f32).set_requires_grad());
      Generator gen(77);
      DropoutAddNorm oc = dropout_add_layer_norm(host.x.to(DType::bf16).to(DType::f32), pc[0],
                                                 host.residual.to(DType::bf16).to(DType::f32), 0.1,
                                                 true, gen, pc[1], pc[2], 1e-5);
      Tensor lc = sum(oc.normed * wn);
      if (uses == 2) lc = lc + sum(pc[0]);
      lc.backward();
      for (int i = 0; i < 3; ++i) {
        INFO("parameter " << i << " (bias, weight, ln_bias)");
        require_close(params[i].grad(), held.select(0, i) + pc[i].grad(), 0, 0, 2e-2);
      }
    }
  }
}

// ---- layer_norm_dropout: dropout(layer_norm(x)), the embeddings' order --------------------------

TEST_CASE("layer_norm_dropout matches the CPU and the device's layer_norm then dropout", "[cuda]") {
  // Rows a warp each (1 .. 1024, vectors or not, mid-Philox-block starts), several rows a warp
  // and blocks of partial sums (2100 x 4), a block a row (1031); p 0.2, 0 (no draw) and 1 (no
  // draw, all dropped); with and without the affine. Against the device's unfused pair
  // (layer_norm's kernels, then dropout's): the same elements dropped, the values close.
  Generator g(61);
  struct Run {
    DType dt;
    Shape s;
    double p;
    bool affine;
  };
  std::vector<Run> runs;
  for (DType dt : {DType::f32, DType::f64, DType::bf16})
    for (Shape s : {Shape{1, 1}, Shape{2, 3, 7}, Shape{3, 33}, Shape{2, 3, 768}, Shape{2, 1024},
                    Shape{3, 1031}})
      for (double p : {0.2, 0.0, 1.0}) runs.push_back({dt, s, p, p != 0.0});
  runs.push_back({DType::f32, Shape{2100, 4}, 0.2, true});
  for (const Run& rc : runs) {
    INFO(dtype_name(rc.dt) << " shape " << shape_str(rc.s) << " p " << rc.p);
    const int64_t c = rc.s.back();
    const DType host_dt = rc.dt == DType::bf16 ? DType::f32 : rc.dt;
    Tensor x = Tensor::randn(rc.s, g, 0.5, 2.0, host_dt), w, b;
    if (rc.affine) {
      w = Tensor::randn({c}, g, 1.0, 0.3, host_dt);
      b = Tensor::randn({c}, g, 0.0, 0.3, host_dt);
    }
    const Tensor wn = Tensor::randn(rc.s, g, 0.0, 1.0, host_dt);
    auto leaf = [](const Tensor& t, Device d, DType dt) {
      return t.defined() ? t.to(dt).to(d).set_requires_grad() : Tensor();
    };
    struct Out {
      Tensor y, dx, dw, db;
    };
    auto go = [&](Device d, DType dt, bool fused) {
      Tensor xl = leaf(x, d, dt), wl = leaf(w, d, dt), bl = leaf(b, d, dt);
      Generator gen(78);
      const Tensor y = fused ? layer_norm_dropout(xl, wl, bl, rc.p, true, gen, 1e-5)
                             : dropout(layer_norm(xl, wl, bl, 1e-5), rc.p, true, gen);
      sum(y * wn.to(dt).to(d)).backward();
      return Out{y, xl.grad(), wl.defined() ? wl.grad() : Tensor(),
                 bl.defined() ? bl.grad() : Tensor()};
    };
    const Out fused = go(kGpu, rc.dt, true), pair = go(kGpu, rc.dt, false);
    const double tol = rc.dt == DType::f64 ? 1e-11 : rc.dt == DType::f32 ? 1e-5 : 1.0 / 64;
    // The same elements dropped (the LayerNorm's values agree to its rounding: the kernels are
    // others, compiled apart; a last-bit difference moves a bf16 value by one unit).
    const std::vector<double> yf = fused.y.to(Device::cpu()).to(DType::f64).to_vector<double>();
    const std::vector<double> yp = pair.y.to(Device::cpu()).to(DType::f64).to_vector<double>();
    for (size_t i = 0; i < yf.size(); ++i) REQUIRE((yf[i] == 0) == (yp[i] == 0));
    require_close(fused.y, pair.y, tol, tol);
    require_close(fused.dx, pair.dx, tol, tol, tol);
    if (rc.affine) {  // summed in another order than layer_norm's column sums
      require_close(fused.dw, pair.dw, tol, tol, tol);
      require_close(fused.db, pair.db, tol, tol, tol);
    }
    if (rc.dt == DType::bf16) continue;  // the CPU computes in f32 / f64 only
    const Out cpu = go(Device::cpu(), rc.dt, true);
    require_close(fused.y, cpu.y, tol, tol);
    require_close(fused.dx, cpu.dx, tol, tol, tol);
    if (rc.affine) {
      require_close(fused.dw, cpu.dw, tol, tol, tol);
      require_close(fused.db, cpu.db, tol, tol, tol);
    }
  }
}

TEST_CASE(
    "layer_norm_dropout under bf16 autocast adds its parameters' gradients into their f32 "
    ".grad",
    "[cuda]") {
  // f32 leaves holding a .grad (FlatParameters' slab), cast by autocast: the in-pass column sums
  // add into the held f32 .grad (no bf16 gradient, no add_), rows a warp each (768) and a block
  // each (1500); against the CPU in f32 on the bf16-rounded operands, the same mask.
  Generator g(62);
  for (int64_t c : {768, 1500}) {
    INFO("C " << c);
    const Tensor x = Tensor::randn({6, c}, g, 0.5, 2.0), wn = Tensor::randn({6, c}, g);
    const Tensor w = Tensor::randn({c}, g, 1.0, 0.3), b = Tensor::randn({c}, g, 0.0, 0.3);
    const Tensor held = Tensor::randn({2, c}, g);
    const std::vector<Tensor> params = {leaf_holding_grad(w, held.select(0, 0)),
                                        leaf_holding_grad(b, held.select(0, 1))};
    const std::vector<Tensor> slabs = {params[0].grad(), params[1].grad()};
    Tensor loss;
    {
      Autocast ac(DType::bf16);
      Generator gen(79);
      const Tensor y = layer_norm_dropout(x.to(DType::bf16).to(kGpu), params[0], params[1], 0.1,
                                          true, gen, 1e-5);
      REQUIRE(y.dtype() == DType::bf16);
      loss = sum(y.to(DType::f32) * wn.to(kGpu));
    }
    start_work_recording();
    loss.backward();
    CHECK(slab_adds(stop_work_recording(), c) == 0);
    for (int i = 0; i < 2; ++i) REQUIRE(params[i].grad().shares_storage(slabs[i]));
    std::vector<Tensor> pc;
    for (const Tensor& t : {w, b})
      pc.push_back(t.to(DType::bf16).to(DType::f32).set_requires_grad());
    Generator gen(79);
    sum(layer_norm_dropout(x.to(DType::bf16).to(DType::f32), pc[0], pc[1], 0.1, true, gen, 1e-5) *
        wn)
        .backward();
    for (int i = 0; i < 2; ++i) {
      INFO("parameter " << i << " (weight, bias)");
      require_close(params[i].grad(), held.select(0, i) + pc[i].grad(), 0, 0, 2e-2);
    }
  }
}
