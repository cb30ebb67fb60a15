// [cuda] GEMM through cuBLASLt against the CPU backend: every transpose combination, strided
// batches with a shared (stride 0) operand, alpha / beta with beta != 0, sizes that are not
// multiples of anything (1, 3, 17, 33, 65), f32 / f64 / bf16 / f16 inputs (f32 accumulation),
// the bias and GELU epilogues, and matmul / linear forward and backward with autograd.
// In the emulation build the product runs in the cuBLASLt shim (emu/cublaslt.cpp), which reads
// back the real descriptors the engine built.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "engine/autocast.h"
#include "engine/module.h"
#include "engine/work_log.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::bf16_rounded;
using engine::testing::kGpu;
using engine::testing::leaf_holding_grad;
using engine::testing::require_close;
using engine::testing::require_equal;
using engine::testing::slab_adds;

namespace {

// The same values in dtype `dt` on the CPU (f32 / f64 compute there) and on the device.
struct Pair {
  Tensor cpu, gpu;
};
Pair pair(const Shape& s, Generator& g, DType dt) {
  Tensor h = Tensor::randn(s, g, 0, 1, DType::f32).to(dt);
  return {h, h.to(kGpu)};
}

}  // namespace

TEST_CASE("gemm: transposes, batches, shared operands, alpha and beta (f32, f64)", "[cuda]") {
  Generator g(21);
  for (DType dt : {DType::f32, DType::f64}) {
    for (int64_t m : {1, 3, 17, 65}) {
      for (int64_t n : {1, 33}) {
        for (int64_t k : {1, 17, 65}) {
          for (bool ta : {false, true}) {
            for (bool tb : {false, true}) {
              for (int64_t batch : {1, 3}) {
                INFO(dtype_name(dt) << " m " << m << " n " << n << " k " << k << " ta " << ta
                                    << " tb " << tb << " batch " << batch);
                // a is batched; b is shared by the batch (2-D) when batch > 1.
                Pair a = pair(ta ? Shape{batch, k, m} : Shape{batch, m, k}, g, dt);
                Pair b = pair(tb ? Shape{n, k} : Shape{k, n}, g, dt);
                Pair c = pair({batch, m, n}, g, dt);
                const double alpha = 0.75, beta = batch == 3 ? 0.5 : 0.0;
                gemm(a.cpu, ta, b.cpu, tb, c.cpu, alpha, beta);
                gemm(a.gpu, ta, b.gpu, tb, c.gpu, alpha, beta);
                require_close(c.gpu, c.cpu, 0, 0, dt == DType::f64 ? 1e-12 : 1e-6);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("gemm on transposed views and column-major outputs", "[cuda]") {
  Generator g(22);
  Pair a = pair({5, 7}, g, DType::f32), b = pair({9, 7}, g, DType::f32);
  // c as the transpose of a contiguous (9, 5): the kernel is handed C^T = B A^T.
  Tensor cc = Tensor::zeros({9, 5}), cg = Tensor::zeros({9, 5}, DType::f32, kGpu);
  gemm(a.cpu, false, b.cpu.transpose(0, 1), false, cc.transpose(0, 1));
  gemm(a.gpu, false, b.gpu.transpose(0, 1), false, cg.transpose(0, 1));
  require_close(cg, cc, 0, 0, 1e-6);
}

TEST_CASE("gemm epilogues: bias, GELU (tanh form), both", "[cuda]") {
  Generator g(23);
  for (GemmEpilogue e :
       {GemmEpilogue::bias, GemmEpilogue::gelu_tanh, GemmEpilogue::bias_gelu_tanh}) {
    for (int64_t batch : {1, 2}) {
      INFO("epilogue " << static_cast<int>(e) << " batch " << batch);
      Pair a = pair({batch, 17, 33}, g, DType::f32), b = pair({65, 33}, g, DType::f32);
      Pair bias = pair({65}, g, DType::f32);
      const bool with_bias = e != GemmEpilogue::gelu_tanh;
      Tensor cc = Tensor::zeros({batch, 17, 65}),
             cg = Tensor::zeros({batch, 17, 65}, DType::f32, kGpu);
      gemm(a.cpu, false, b.cpu, true, cc, 1.0, 0.0, e, with_bias ? bias.cpu : Tensor());
      gemm(a.gpu, false, b.gpu, true, cg, 1.0, 0.0, e, with_bias ? bias.gpu : Tensor());
      require_close(cg, cc, 0, 0, 1e-6);
      // The epilogue did something: against the plain product plus the bias by hand.
      Tensor plain = Tensor::zeros({batch, 17, 65});
      gemm(a.cpu, false, b.cpu, true, plain);
      if (with_bias) plain = plain + bias.cpu;  // on the CPU
      if (e == GemmEpilogue::bias) {
        require_close(cc, plain, 0, 0, 1e-6);
      } else {
        std::vector<float> x = plain.to_vector<float>(), y = cc.to_vector<float>();
        for (size_t i = 0; i < x.size(); ++i) {
          const double v = x[i];
          const double want =
              0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
          REQUIRE(y[i] == Approx(want).margin(1e-5));
        }
      }
    }
  }
  Pair a = pair({3, 4}, g, DType::f32), b = pair({4, 5}, g, DType::f32);
  Tensor c = Tensor::zeros({3, 5}, DType::f32, kGpu);
  REQUIRE_THROWS_WITH(gemm(a.gpu, false, b.gpu, false, c, 1.0, 0.0, GemmEpilogue::bias,
                           Tensor::zeros({4}, DType::f32, kGpu)),
                      Catch::Contains("bias epilogue needs a contiguous (5) bias"));
}

TEST_CASE("gemm with bf16 and f16 inputs accumulates in f32", "[cuda]") {
  Generator g(24);
  for (DType dt : {DType::bf16, DType::f16}) {
    for (bool tb : {false, true}) {
      INFO(dtype_name(dt) << " tb " << tb);
      const int64_t m = 17, n = 33, k = 65, batch = 2;
      Pair a = pair({batch, m, k}, g, dt),
           b = pair(tb ? Shape{batch, n, k} : Shape{batch, k, n}, g, dt);
      Tensor cg = Tensor::zeros({batch, m, n}, dt, kGpu);
      gemm(a.gpu, false, b.gpu, tb, cg);
      // The reference: the same rounded inputs multiplied in f32 on the CPU, rounded once.
      Tensor cf = Tensor::zeros({batch, m, n});
      gemm(a.cpu.to(DType::f32), false, b.cpu.to(DType::f32), tb, cf);
      // One rounding of the result: 2^-8 relative for bf16, 2^-11 for f16 (of the largest
      // element, since the f32 sums differ in order too).
      require_close(cg, cf.to(dt), 0, 0, dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024);
      REQUIRE(cg.dtype() == dt);
    }
  }
}

TEST_CASE("gemm: bf16 and f16 operands added in f32 into an f32 c (beta 1)", "[cuda]") {
  Generator g(27);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    // dW = dY^T X, the weight-gradient shape, added onto what c holds.
    Pair dy = pair({40, 33}, g, dt), x = pair({40, 17}, g, dt);
    const Tensor held = Tensor::randn({33, 17}, g);
    Tensor c = held.to(kGpu);
    gemm(dy.gpu, true, x.gpu, false, c, 1.0, 1.0);
    REQUIRE(c.dtype() == DType::f32);
    Tensor want = held.clone();
    gemm(dy.cpu.to(DType::f32), true, x.cpu.to(DType::f32), false, want, 1.0, 1.0);
    require_close(c, want, 1e-6, 1e-6, 1e-6);  // f32 accumulation, no 16-bit rounding of dW
  }
  // The CPU GEMM takes one dtype; an epilogue with an f32 c is refused.
  Tensor a16 = Tensor::ones({2, 3}).to(DType::bf16), b16 = Tensor::ones({3, 4}).to(DType::bf16);
  Tensor c32 = Tensor::zeros({2, 4});
  REQUIRE_THROWS_WITH(gemm(a16, false, b16, false, c32), Catch::Contains("[gemm] CPU kernels"));
  REQUIRE_THROWS_WITH(gemm(a16.to(kGpu), false, b16.to(kGpu), false, c32.to(kGpu), 1.0, 0.0,
                           GemmEpilogue::bias, Tensor::zeros({4}, DType::f32, kGpu)),
                      Catch::Contains("an epilogue with 16-bit a and b into an f32 c"));
}

TEST_CASE("under bf16 autocast a weight's gradient goes into its f32 .grad by the GEMM itself",
          "[cuda]") {
  // A held f32 .grad (FlatParameters' slab) behind autocast's bf16 cast of the weight: linear's
  // and matmul's backward add dW in f32 straight into it (GemmArgs::c_f32) -- no bf16 dW, no
  // conversion, no add_ -- and the result matches the CPU's f32 gradient within bf16 inputs'
  // rounding. A cast used twice (two consumers) goes the usual way (bf16 sum, conversion, add).
  Generator g(28);
  const Tensor x = Tensor::randn({6, 17}, g), w = Tensor::randn({9, 17}, g);
  const Tensor p = Tensor::randn({2, 3, 17}, g), q = Tensor::randn({17, 5}, g);
  const Tensor dy = Tensor::randn({6, 9}, g), dm = Tensor::randn({2, 3, 5}, g);
  for (int uses : {1, 2}) {
    INFO(uses << " use(s) of the weight");
    Tensor wd = w.to(kGpu).set_requires_grad(), qd = q.to(kGpu).set_requires_grad();
    wd.set_grad(Tensor::zeros({9, 17}, DType::f32, kGpu));
    qd.set_grad(Tensor::zeros({17, 5}, DType::f32, kGpu));
    const Tensor held = wd.grad();
    Tensor loss;
    {
      Autocast ac(DType::bf16);
      // Two uses of one cast (the cast has two consumers) vs one use per cast.
      const Tensor wb = uses == 2 ? wd.to(DType::bf16) : wd;
      Tensor y = linear(x.to(kGpu), wb);
      if (uses == 2) y = y + linear(x.to(kGpu), wb);
      loss = engine::sum(y.to(DType::f32) * dy.to(kGpu)) +
             engine::sum(matmul(p.to(kGpu), qd).to(DType::f32) * dm.to(kGpu));
    }
    start_work_recording();
    loss.backward();
    const std::vector<WorkRecord> work = stop_work_recording();
    REQUIRE(wd.grad().shares_storage(held));
    // The GEMMs that stored f32 (k 6 for dW, k 6 for dQ: the folded rows), and the adds into a
    // weight's slab: none with one use; the second use's cast adds its bf16 sum the usual way.
    int c_f32 = 0, slab_adds = 0;
    for (const WorkRecord& r : work) {
      if (r.op == "gemm" && r.shape.find(" c_f32") != std::string::npos) ++c_f32;
      if (r.op == "add_" && r.shape.rfind("(9, 17) f32", 0) == 0) ++slab_adds;
    }
    CHECK(c_f32 == (uses == 1 ? 2 : 1));
    CHECK(slab_adds == (uses == 1 ? 0 : 1));
    // Against the CPU in f32 on the bf16-rounded operands.
    Tensor wc = w.to(DType::bf16).to(DType::f32).set_requires_grad();
    Tensor qc = q.to(DType::bf16).to(DType::f32).set_requires_grad();
    Tensor xc = x.to(DType::bf16).to(DType::f32), pc = p.to(DType::bf16).to(DType::f32);
    Tensor yc = linear(xc, wc);
    if (uses == 2) yc = yc + linear(xc, wc);
    (engine::sum(yc * dy) + engine::sum(matmul(pc, qc) * dm)).backward();
    require_close(wd.grad(), wc.grad(), 0, 0, 1e-2);
    require_close(qd.grad(), qc.grad(), 0, 0, 1e-2);
  }
}

TEST_CASE("gemm's bias_grad epilogue adds op(a)'s row sums into an f32 tensor, fused or not",
          "[cuda]") {
  // dW += dY^T X and db += the column sums of dY in one GEMM (cuBLASLt's BGRADB epilogue, then
  // one add into db), or, where the library has no algorithm for it or its call refuses it (the
  // shim, with EMU_CUBLASLT_NO_BGRAD=1 or =matmul), the product alone and column_sums_add: the
  // same values every way, the CPU's in f32 on the bf16-rounded operands.
  Generator g(31);
  const Tensor dy = Tensor::randn({37, 24}, g), x = Tensor::randn({37, 20}, g);
  const Tensor c0 = Tensor::randn({24, 20}, g), b0 = Tensor::randn({24}, g);
  Tensor cw = c0.clone(), cb = b0.clone();
  gemm(bf16_rounded(dy), true, bf16_rounded(x), false, cw, 1.0, 1.0, GemmEpilogue::bias_grad, cb);
  // the CPU: column_sums_add
  require_close(cb, b0 + engine::sum(bf16_rounded(dy), {0}), 1e-5, 1e-5);
  for (const std::string mode : {"", "1", "matmul"}) {
    // "1": no algorithm with the epilogue; "matmul": the heuristic offers one, the call refuses
    const bool refuse = !mode.empty();
    INFO((refuse ? "the library refuses the epilogue: " + mode : "fused"));
    if (refuse) setenv("EMU_CUBLASLT_NO_BGRAD", mode.c_str(), 1);
    const Tensor c = c0.to(kGpu), b = b0.to(kGpu);
    start_work_recording();
    gemm(dy.to(DType::bf16).to(kGpu), true, x.to(DType::bf16).to(kGpu), false, c, 1.0, 1.0,
         GemmEpilogue::bias_grad, b);
    const std::vector<WorkRecord> work = stop_work_recording();
    unsetenv("EMU_CUBLASLT_NO_BGRAD");
    int sums = 0, adds = 0;
    for (const WorkRecord& r : work) {
      sums += r.op == "column_sums_add";
      adds += r.op == "add_";
      if (r.op == "gemm") CHECK(r.shape.find(" bgrad") != std::string::npos);  // asked for
    }
    CHECK(sums == (refuse ? 1 : 0));
    CHECK(adds == (refuse ? 0 : 1));
    require_close(c, cw, 1e-4, 1e-4);
    require_close(b, cb, 1e-4, 1e-4);
  }
  // What it refuses: a not read transposed; a bias of another length or dtype.
  const Tensor a16 = dy.to(DType::bf16).to(kGpu), x16 = x.to(DType::bf16).to(kGpu);
  REQUIRE_THROWS_WITH(gemm(a16.transpose(0, 1).contiguous(), false, x16, false,
                           Tensor::zeros({24, 20}, DType::f32, kGpu), 1.0, 1.0,
                           GemmEpilogue::bias_grad, Tensor::zeros({24}, DType::f32, kGpu)),
                      Catch::Contains("[gemm] the bias_grad epilogue takes"));
  REQUIRE_THROWS_WITH(gemm(a16, true, x16, false, Tensor::zeros({24, 20}, DType::f32, kGpu), 1.0,
                           1.0, GemmEpilogue::bias_grad, Tensor::zeros({20}, DType::f32, kGpu)),
                      Catch::Contains("(24) f32 tensor"));
}

TEST_CASE("under bf16 autocast parameters' gradients are added in f32 into their .grad by sums",
          "[cuda]") {
  // Held f32 .grads behind autocast's bf16 casts of linear's bias, bias_gelu's bias and
  // layer_norm's weight and bias: the backward's column sums add into them in f32
  // (column_sums_add, bias_gelu's and layer_norm's f32 destinations) -- no bf16 gradient, no
  // add_ -- matching the CPU in f32 on the rounded operands. Rows in 16-byte vectors and
  // LayerNorm rows a warp each (768), and neither, LayerNorm rows a block each and the column
  // sums in several chunks (1500). Casts used twice go the usual way (bf16 sums, an add each).
  Generator g(29);
  for (auto [rows, n] : {std::array<int64_t, 2>{6, 768}, {300, 1500}}) {
    for (int uses : {1, 2}) {
      INFO("(" << rows << ", " << n << "), " << uses << " use(s) of the parameters");
      const Tensor x = Tensor::randn({rows, 17}, g), w = Tensor::randn({n, 17}, g);
      const Tensor dz = Tensor::randn({rows, n}, g), held = Tensor::randn({4, n}, g);
      std::vector<Tensor> values, params, slabs;  // linear's bias, bias_gelu's, LN weight, bias
      for (int i = 0; i < 4; ++i) {
        values.push_back(Tensor::randn({n}, g));
        params.push_back(leaf_holding_grad(values.back(), held.select(0, i)));
        slabs.push_back(params.back().grad());
      }
      Tensor loss;
      {
        Autocast ac(DType::bf16);
        std::vector<Tensor> c;
        for (const Tensor& p : params) c.push_back(uses == 2 ? p.to(DType::bf16) : p);
        const Tensor z =
            layer_norm(bias_gelu(linear(x.to(kGpu), w.to(kGpu), c[0]), c[1]), c[2], c[3], 1e-5);
        loss = engine::sum(z.to(DType::f32) * dz.to(kGpu));
        if (uses == 2)
          for (const Tensor& ci : c) loss = loss + engine::sum(ci.to(DType::f32));
      }
      start_work_recording();
      loss.backward();
      CHECK(slab_adds(stop_work_recording(), n) == (uses == 1 ? 0 : 4));
      // The CPU in f32 on the bf16-rounded operands.
      std::vector<Tensor> pc;
      for (const Tensor& v : values) pc.push_back(bf16_rounded(v).set_requires_grad());
      Tensor lc =
          engine::sum(layer_norm(bias_gelu(linear(bf16_rounded(x), bf16_rounded(w), pc[0]), pc[1]),
                                 pc[2], pc[3], 1e-5) *
                      dz);
      if (uses == 2)
        for (const Tensor& p : pc) lc = lc + engine::sum(p);
      lc.backward();
      for (int i = 0; i < 4; ++i) {
        INFO("parameter " << i << " (linear's bias, bias_gelu's, LayerNorm's weight, bias)");
        REQUIRE(params[i].grad().shares_storage(slabs[i]));
        require_close(params[i].grad(), held.select(0, i) + pc[i].grad(), 0, 0, 2e-2);
      }
    }
  }
}

TEST_CASE("column_sums_add on the device adds the CPU's column sums, the same bits each run",
          "[cuda]") {
  Generator g(30);
  for (auto [rows, n] : {std::array<int64_t, 2>{6, 9}, {3000, 64}, {1, 8}, {0, 5}, {70, 1031}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      INFO("(" << rows << ", " << n << ") " << dtype_name(dt));
      const Tensor src = Tensor::randn({rows, n}, g).to(dt), held = Tensor::randn({n}, g);
      Tensor want = held.clone();
      column_sums_add_kernel(Device::cpu(), src.to(DType::f32), want);  // bf16 -> f32: exact
      std::vector<Tensor> got;
      for (int run = 0; run < 2; ++run) {
        got.push_back(held.to(kGpu));
        column_sums_add_kernel(kGpu, src.to(kGpu), got.back());
      }
      require_equal(got[1], got[0]);
      require_close(got[0], want, 1e-5, 1e-5);
    }
  }
  REQUIRE_THROWS_WITH(column_sums_add_kernel(kGpu, Tensor::zeros({2, 3}, DType::bf16, kGpu),
                                             Tensor::zeros({3}, DType::bf16, kGpu)),
                      Catch::Contains("[column_sums_add]") && Catch::Contains("(n) f32"));
}

TEST_CASE("AutocastSlab: one conversion of the parameter slab, the per-tensor casts' bits",
          "[cuda]") {
  // Two linear layers' parameters in one FlatParameters slab on the device; a bf16 forward and
  // backward with and without the scope: the same loss and gradients bit for bit, one
  // conversion (the slab's) instead of one per parameter; a tensor outside the slab is cast alone.
  Generator g(29);
  const Tensor x = Tensor::randn({6, 17}, g), other = Tensor::randn({9, 9}, g);
  auto run = [&](bool scope, int& conversions) {
    Generator gp(30);
    NamedTensors ps = {{"w1", Tensor::randn({9, 17}, gp).set_requires_grad()},
                       {"b1", Tensor::randn({9}, gp).set_requires_grad()},
                       {"w2", Tensor::randn({4, 9}, gp).set_requires_grad()}};
    FlatParameters flat(ps, kGpu);
    const Tensor od = other.to(kGpu);
    std::unique_ptr<AutocastSlab> s;
    if (scope) s = std::make_unique<AutocastSlab>(flat.data());
    Tensor loss;
    start_work_recording();
    {
      Autocast ac(DType::bf16);
      const Tensor h = linear(x.to(kGpu), ps[0].second, ps[1].second);
      loss = engine::sum(linear(matmul(h, od), ps[2].second).to(DType::f32));
    }
    conversions = 0;
    for (const WorkRecord& r : stop_work_recording())
      if (r.op == "copy" && r.shape.find(" f32 (") != std::string::npos &&
          r.shape.find(") bf16") != std::string::npos)
        ++conversions;
    loss.backward();
    s.reset();
    return std::vector<Tensor>{loss.detach(), flat.grad().clone()};
  };
  int per_tensor = 0, once = 0;
  const std::vector<Tensor> a = run(false, per_tensor), b = run(true, once);
  CHECK(per_tensor == 5);  // x, w1, b1, other, w2
  CHECK(once == 3);        // x, the slab, other
  require_equal(b[0], a[0]);
  require_equal(b[1], a[1]);
}

TEST_CASE("matmul and linear forward and backward on the device match the CPU", "[cuda]") {
  Generator g(25);
  // linear: x (2, 5, 17) @ W (33, 17)^T + b (33)
  Tensor x = Tensor::randn({2, 5, 17}, g), w = Tensor::randn({33, 17}, g),
         b = Tensor::randn({33}, g);
  Tensor xg = x.to(kGpu), wg = w.to(kGpu), bg = b.to(kGpu);
  for (Tensor* t : {&x, &w, &b, &xg, &wg, &bg}) t->set_requires_grad();
  Tensor y = linear(x, w, b), yg = linear(xg, wg, bg);
  require_close(yg, y, 0, 0, 1e-6);
  Tensor dy = Tensor::randn(y.shape(), g);
  y.backward(dy);
  yg.backward(dy.to(kGpu));
  require_close(xg.grad(), x.grad(), 0, 0, 1e-6);
  require_close(wg.grad(), w.grad(), 0, 0, 1e-6);
  require_close(bg.grad(), b.grad(), 0, 0, 1e-6);
  // matmul with broadcast batch dims: (2, 1, 7, 3) @ (4, 3, 5)
  Tensor p = Tensor::randn({2, 1, 7, 3}, g), q = Tensor::randn({4, 3, 5}, g);
  Tensor pg = p.to(kGpu), qg = q.to(kGpu);
  for (Tensor* t : {&p, &q, &pg, &qg}) t->set_requires_grad();
  Tensor r = matmul(p, q), rg = matmul(pg, qg);
  require_close(rg, r, 0, 0, 1e-6);
  Tensor dr = Tensor::randn(r.shape(), g);
  r.backward(dr);
  rg.backward(dr.to(kGpu));
  require_close(pg.grad(), p.grad(), 0, 0, 1e-5);
  require_close(qg.grad(), q.grad(), 0, 0, 1e-5);
}

TEST_CASE("a held .grad takes linear's, matmul's and embedding's gradients in place on the device",
          "[cuda]") {
  // A tied table used by an embedding and a linear layer, and a 2-D matmul operand, each with a
  // gradient already held (as in FlatParameters' slab): backward adds into it in place (the GEMM
  // with beta 1, the scatter-add into the held rows) on both devices.
  Generator g(26);
  Tensor e = Tensor::randn({9, 17}, g), held_e = Tensor::randn({9, 17}, g);
  Tensor q = Tensor::randn({17, 5}, g), held_q = Tensor::randn({17, 5}, g);
  Tensor h = Tensor::randn({6, 17}, g), p = Tensor::randn({2, 3, 17}, g);
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{3, 0, 3, 8, 1}, {5});
  Tensor dy_lin = Tensor::randn({6, 9}, g), dy_emb = Tensor::randn({5, 17}, g),
         dy_mm = Tensor::randn({2, 3, 5}, g);
  auto run = [&](Device dev) {
    Tensor ed = e.clone().to(dev).set_requires_grad(), qd = q.clone().to(dev).set_requires_grad();
    ed.set_grad(held_e.clone().to(dev));  // a copy: backward adds into it
    qd.set_grad(held_q.clone().to(dev));
    const Tensor grad_before = ed.grad();
    linear(h.to(dev), ed).backward(dy_lin.to(dev));
    embedding(ed, idx.to(dev)).backward(dy_emb.to(dev));
    matmul(p.to(dev), qd).backward(dy_mm.to(dev));
    REQUIRE(ed.grad().shares_storage(grad_before));  // the held buffer, not a new one
    return std::pair{ed.grad(), qd.grad()};
  };
  auto [e_cpu, q_cpu] = run(Device::cpu());
  auto [e_gpu, q_gpu] = run(kGpu);
  require_close(e_gpu, e_cpu, 0, 0, 1e-5);
  require_close(q_gpu, q_cpu, 0, 0, 1e-5);
  // Against the sums formed out of place: fresh leaves, one use each.
  Tensor e1 = e.clone().set_requires_grad(), e2 = e.clone().set_requires_grad(),
         q1 = q.clone().set_requires_grad();
  linear(h, e1).backward(dy_lin);
  embedding(e2, idx).backward(dy_emb);
  matmul(p, q1).backward(dy_mm);
  require_close(e_cpu, held_e + e1.grad() + e2.grad(), 0, 0, 1e-5);
  require_close(q_cpu, held_q + q1.grad(), 0, 0, 1e-5);
}

TEST_CASE("on the device linear adds dX into the residual stream's gradient already summed",
          "[cuda]") {
  // x = 2 x0; y = 3 x + linear(x, W): backward reaches x first through 3 x (a gradient nothing
  // else holds), then through linear, whose dX GEMM adds into that gradient (beta 1) instead of
  // a new tensor and an add_. The CPU keeps the separate add (its bits). Within rounding of the
  // CPU's gradient; the same bits on two device runs.
  Generator g(29);
  const Tensor x0 = Tensor::randn({2, 5, 17}, g), w = Tensor::randn({17, 17}, g),
               dy = Tensor::randn({2, 5, 17}, g);
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    // The device work of the backward: adds of x's shape, and GEMMs adding into their c.
    auto run = [&](Device dev, int64_t& adds, int64_t& beta_gemms) {
      const DType t = dev.is_cpu() ? DType::f32 : dt;  // the CPU's reference in f32
      Tensor xl = x0.clone().to(t).to(dev).set_requires_grad();
      const Tensor x = xl * 2.0;
      const Tensor y = x * 3.0 + linear(x, w.to(t).to(dev));
      start_work_recording();
      y.backward(dy.to(t).to(dev));
      adds = beta_gemms = 0;
      for (const WorkRecord& r : stop_work_recording()) {
        if (r.op == "add_" || r.op == "binary") adds += r.shape.rfind("(2, 5, 17)", 0) == 0;
        if (r.op == "gemm") beta_gemms += r.shape.find("beta") != std::string::npos;
      }
      return xl.grad();
    };
    int64_t adds = 0, beta_gemms = 0;
    const Tensor want = run(Device::cpu(), adds, beta_gemms);
    const Tensor got = run(kGpu, adds, beta_gemms);
    REQUIRE(adds == 0);  // x's two gradients summed by the GEMM, not by an add
    REQUIRE(beta_gemms == 1);
    const Tensor again = run(kGpu, adds, beta_gemms);
    require_equal(got, again);
    const double tol = dt == DType::f32 ? 1e-5 : 2e-2;
    require_close(got.to(DType::f32), want, tol, tol, tol);
  }
}
