// [cuda] softmax (with a broadcast bias and a key mask of any dtype) and log_softmax on the
// device against the CPU backend, forward and backward: rows of 1, rows not a multiple of the
// warp, rows longer than a block, a fully masked row, an empty batch; f32 / f64, and bf16 / f16
// against the CPU's f32 on the same rounded inputs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_test_support.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;

TEST_CASE("softmax and log_softmax forward and backward match the CPU", "[cuda]") {
  Generator g(31);
  for (DType dt : {DType::f32, DType::f64}) {
    for (Shape s : {Shape{1, 1}, Shape{3, 1}, Shape{2, 33}, Shape{4, 1031}, Shape{2, 3000},
                    Shape{0, 8}, Shape{5}}) {
      INFO(dtype_name(dt) << " shape " << shape_str(s));
      const double rel = dt == DType::f64 ? 1e-12 : 1e-5, abs = dt == DType::f64 ? 1e-15 : 1e-7;
      Tensor x = Tensor::randn(s, g, 0, 3, dt).set_requires_grad();
      Tensor xg = x.detach().to(kGpu).set_requires_grad();
      Tensor y = softmax(x), yg = softmax(xg);
      require_close(yg, y, rel, abs);
      Tensor dy = Tensor::randn(s, g, 0, 1, dt);
      y.backward(dy);
      yg.backward(dy.to(kGpu));
      require_close(xg.grad(), x.grad(), rel, abs, rel);

      Tensor x2 = x.detach().set_requires_grad(), x2g = xg.detach().set_requires_grad();
      Tensor l = log_softmax(x2), lg = log_softmax(x2g);
      require_close(lg, l, rel, abs);
      l.backward(dy);
      lg.backward(dy.to(kGpu));
      require_close(x2g.grad(), x2.grad(), rel, abs, rel);
    }
  }
}

TEST_CASE("softmax with a shared bias and a key mask of every dtype matches the CPU", "[cuda]") {
  Generator g(32);
  // Attention-shaped: scores (2, 3, 7, 7), a positional bias (1, 3, 7, 7) shared by the batch,
  // a key mask (2, 1, 1, 7) whose second sequence has no kept key (all its rows are zeros).
  Tensor x = Tensor::randn({2, 3, 7, 7}, g, 0, 2).set_requires_grad();
  Tensor bias = Tensor::randn({1, 3, 7, 7}, g).set_requires_grad();
  std::vector<float> keep(14, 1.f);
  keep[3] = keep[5] = 0.f;                                        // sequence 0: keys 3, 5 masked
  for (int j = 7; j < 14; ++j) keep[static_cast<size_t>(j)] = 0;  // sequence 1: none kept
  for (DType mt :
       {DType::u8, DType::i32, DType::i64, DType::f32, DType::f64, DType::bf16, DType::f16}) {
    INFO("mask " << dtype_name(mt));
    Tensor mask = Tensor::from_vector(keep, {2, 1, 1, 7}).to(mt);
    Tensor xc = x.detach().set_requires_grad(), bc = bias.detach().set_requires_grad();
    Tensor xg = x.detach().to(kGpu).set_requires_grad();
    Tensor bg = bias.detach().to(kGpu).set_requires_grad();
    Tensor y = softmax(xc, bc, mask), yg = softmax(xg, bg, mask.to(kGpu));
    require_close(yg, y, 1e-5, 1e-7);
    const std::vector<float> yv = yg.to(Device::cpu()).to_vector<float>();
    for (size_t i = 0; i < yv.size(); ++i) {
      const size_t key = i % 7, seq = i / (3 * 7 * 7);
      if (seq == 1 || key == 3 || key == 5) REQUIRE(yv[i] == 0.f);
    }
    Tensor dy = Tensor::randn(y.shape(), g);
    y.backward(dy);
    yg.backward(dy.to(kGpu));
    require_close(xg.grad(), xc.grad(), 1e-5, 1e-7, 1e-5);
    require_close(bg.grad(), bc.grad(), 1e-5, 1e-7, 1e-5);
  }
  // In place (y aliases x) through the raw helper.
  Tensor s = Tensor::randn({4, 33}, g), sg = s.to(kGpu);
  Tensor want = softmax(s);
  softmax_forward_raw(sg, Tensor(), Tensor(), sg);
  require_close(sg, want, 1e-5, 1e-7);
}

TEST_CASE("softmax in bf16 and f16 computes in f32 and rounds once", "[cuda]") {
  Generator g(33);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    // One rounding of values in (0, 1]: 2^-8 (bf16) / 2^-11 (f16) relative, plus the f32
    // transcendental differences.
    const double rel = dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
    Tensor x = Tensor::randn({3, 1031}, g, 0, 2).to(dt);
    Tensor bias = Tensor::randn({1, 1031}, g).to(dt);
    Tensor want = softmax(x.to(DType::f32), bias.to(DType::f32));
    Tensor got = softmax(x.to(kGpu), bias.to(kGpu));
    REQUIRE(got.dtype() == dt);
    require_close(got, want, rel, 1e-6);
    Tensor lwant = log_softmax(x.to(DType::f32));
    Tensor lgot = log_softmax(x.to(kGpu));
    require_close(lgot, lwant, rel, 1e-3);
  }
}
