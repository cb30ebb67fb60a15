// [cuda] the attention op on the device against the CPU backend: strided-batched GEMMs through
// cuBLASLt around the fused softmax kernel (scale + shared positional bias + key mask + softmax
// + dropout, and its backward). Same Philox stream, so with dropout the device and the CPU drop
// the same probabilities; f32 within 1e-5 relative (GEMM sums in another order), forward and
// every gradient, the bias's summed over the batch. T = 1, T not a multiple of the warp, rows
// longer than a block, a sequence with no kept key.
#include <catch2/catch.hpp>

#include <vector>

#include "cuda_test_support.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;
using engine::testing::require_equal;

TEST_CASE("attention on the device matches the CPU with bias, key mask and dropout", "[cuda]") {
  Generator g(51);
  struct Case {
    int64_t b, h, t, d;
    double p;
  };
  for (Case c : {Case{1, 1, 1, 4, 0.0}, Case{2, 3, 7, 5, 0.1}, Case{2, 2, 33, 8, 0.0},
                 Case{1, 2, 300, 4, 0.2}, Case{0, 2, 5, 4, 0.1}}) {
    INFO("B " << c.b << " H " << c.h << " T " << c.t << " D " << c.d << " p " << c.p);
    Tensor q = Tensor::randn({c.b, c.h, c.t, c.d}, g).set_requires_grad();
    Tensor k = Tensor::randn({c.b, c.h, c.t, c.d}, g).set_requires_grad();
    Tensor v = Tensor::randn({c.b, c.h, c.t, c.d}, g).set_requires_grad();
    Tensor bias = Tensor::randn({1, c.h, c.t, c.t}, g).set_requires_grad();  // TUPE's shape
    std::vector<float> keep(static_cast<size_t>(c.b * c.t), 1.f);
    if (c.b > 1) {
      for (int64_t j = 0; j < c.t; ++j) keep[static_cast<size_t>(c.t + j)] = 0.f;  // none kept
      keep[0] = 0.f;
    }
    Tensor mask = Tensor::from_vector(keep, {c.b, c.t});
    auto run = [&](Device dev, std::vector<Tensor>& leaves) {
      leaves.clear();
      for (const Tensor* t : {&q, &k, &v, &bias})
        leaves.push_back(t->detach().to(dev).set_requires_grad());
      AttentionOptions opt;
      opt.scale = 0.3;
      opt.bias = leaves[3];
      opt.key_mask = mask.to(dev);
      opt.dropout_p = c.p;
      opt.training = true;
      Generator gen(9);
      opt.generator = &gen;
      return attention(leaves[0], leaves[1], leaves[2], opt);
    };
    std::vector<Tensor> lc, lg;
    Tensor y = run(Device::cpu(), lc), yg = run(kGpu, lg);
    require_close(yg, y, 1e-5, 1e-6, 1e-5);
    Tensor dy = Tensor::randn(y.shape(), g);
    y.backward(dy);
    yg.backward(dy.to(kGpu));
    for (size_t i = 0; i < 4; ++i) {
      INFO("gradient " << i);
      require_close(lg[i].grad(), lc[i].grad(), 1e-5, 1e-6, 1e-5);
    }
  }
}

TEST_CASE("the fused attention softmax equals the CPU's scale, softmax and dropout passes",
          "[cuda]") {
  Generator g(52);
  // Rows of 37 (a warp per row, element by element, a Philox block split across rows), 64 (4-
  // element vectors, one Philox block per four), 4 and 1100 (a block per row).
  for (const int64_t n : {int64_t{37}, int64_t{64}, int64_t{4}, int64_t{1100}})
    for (DType dt : {DType::f32, DType::f64}) {
      INFO(dtype_name(dt) << " rows of " << n);
      Tensor x = Tensor::randn({2, 3, 5, n}, g, 0, 2, dt);
      Tensor bias = Tensor::randn({1, 3, 5, n}, g, 0, 1, dt);
      std::vector<int64_t> keep(size_t(2 * n), 1);
      keep[1] = 0;  // one masked key in the first sequence
      Tensor mask = Tensor::from_vector(keep, {2, 1, 1, n});
      const PhiloxState st{77, 3};
      Tensor probs = Tensor::empty(x.shape(), dt), dropped = Tensor::empty(x.shape(), dt);
      attention_softmax_raw(x, 0.125, bias, mask, 0.3, st, probs, dropped);
      Tensor pg = Tensor::empty(x.shape(), dt, kGpu), dg = Tensor::empty(x.shape(), dt, kGpu);
      attention_softmax_raw(x.to(kGpu), 0.125, bias.to(kGpu), mask.to(kGpu), 0.3, st, pg, dg);
      const double rel = dt == DType::f64 ? 1e-12 : 1e-5;
      require_close(pg, probs, rel, 1e-7);
      require_close(dg, dropped, rel, 1e-7);
      // The same elements dropped.
      const std::vector<double> a = dg.to(Device::cpu()).to(DType::f64).to_vector<double>();
      const std::vector<double> b = dropped.to(DType::f64).to_vector<double>();
      for (size_t i = 0; i < a.size(); ++i) REQUIRE((a[i] == 0) == (b[i] == 0));
      // Backward, in place on the device.
      Tensor dpd = Tensor::randn(x.shape(), g, 0, 1, dt);
      Tensor ds = Tensor::empty(x.shape(), dt);
      attention_softmax_backward_raw(probs, dpd, 0.3, st, ds);
      Tensor dsg = dpd.to(kGpu);
      attention_softmax_backward_raw(pg, dsg, 0.3, st, dsg);
      require_close(dsg, ds, rel, 1e-7, rel);
      // The mask read from the forward's dropped probabilities (what the attention op keeps on a
      // device) instead of drawn again: the same bits.
      Tensor dsk = dpd.to(kGpu);
      attention_softmax_backward_raw(pg, dsk, 0.3, st, dsk, dg);
      require_equal(dsk, dsg);
    }
  // p = 0 and scale 1: exactly the plain softmax kernel.
  Tensor x = Tensor::randn({4, 9}, g);
  Tensor pg = Tensor::empty({4, 9}, DType::f32, kGpu);
  attention_softmax_raw(x.to(kGpu), 1.0, Tensor(), Tensor(), 0.0, {}, pg, Tensor());
  require_equal(pg, softmax(x.to(kGpu)));
}
