// [cuda] layer_norm on the device against the CPU backend, forward and backward: rows of 1 and
// rows longer than a block, with and without weight and bias, f32 / f64 and bf16 / f16 (against
// the CPU's f32 on the same rounded inputs), and the parameter gradients reduced in a fixed order
// (a rerun gives the same bits; under autocast added in f32 into the parameters' f32 .grad:
// test_cuda_matmul.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_test_support.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;

TEST_CASE("layer_norm forward and backward match the CPU", "[cuda]") {
  Generator g(41);
  for (DType dt : {DType::f32, DType::f64}) {
    // Rows a warp each (1 .. 1024, vectors when a multiple of 4) or a block each (1031); many
    // rows: the parameter gradients in several chunks and a second pass.
    for (Shape s : {Shape{1, 1}, Shape{3, 1}, Shape{2, 33}, Shape{4, 1031}, Shape{2, 3, 768},
                    Shape{3, 1024}, Shape{2, 130}, Shape{600, 40}}) {
      for (int affine = 0; affine < 4; ++affine) {
        const bool with_w = affine & 1, with_b = affine & 2;
        INFO(dtype_name(dt) << " shape " << shape_str(s) << " weight " << with_w << " bias "
                            << with_b);
        const double rel = dt == DType::f64 ? 1e-11 : 1e-5, abs = dt == DType::f64 ? 1e-13 : 1e-5;
        const int64_t c = s.back();
        Tensor x = Tensor::randn(s, g, 1.0, 2.0, dt).set_requires_grad();
        Tensor w = with_w ? Tensor::randn({c}, g, 1, 0.5, dt).set_requires_grad() : Tensor();
        Tensor b = with_b ? Tensor::randn({c}, g, 0, 0.5, dt).set_requires_grad() : Tensor();
        Tensor xg = x.detach().to(kGpu).set_requires_grad();
        Tensor wg = with_w ? w.detach().to(kGpu).set_requires_grad() : Tensor();
        Tensor bg = with_b ? b.detach().to(kGpu).set_requires_grad() : Tensor();
        Tensor y = layer_norm(x, w, b, 1e-5), yg = layer_norm(xg, wg, bg, 1e-5);
        require_close(yg, y, rel, abs);
        Tensor dy = Tensor::randn(s, g, 0, 1, dt);
        y.backward(dy);
        yg.backward(dy.to(kGpu));
        require_close(xg.grad(), x.grad(), rel, abs, rel);
        if (with_w) require_close(wg.grad(), w.grad(), rel, abs, rel);
        if (with_b) require_close(bg.grad(), b.grad(), rel, abs, rel);
      }
    }
  }
}

TEST_CASE("layer_norm parameter gradients are the same bits on every rerun", "[cuda]") {
  Generator g(42);
  Tensor x = Tensor::randn({70, 96}, g).to(kGpu);
  Tensor w = Tensor::randn({96}, g).to(kGpu), b = Tensor::randn({96}, g).to(kGpu);
  Tensor dy = Tensor::randn({70, 96}, g).to(kGpu);
  std::vector<float> first_w, first_b;
  for (int run = 0; run < 3; ++run) {
    Tensor xr = x.detach().set_requires_grad(), wr = w.detach().set_requires_grad(),
           br = b.detach().set_requires_grad();
    layer_norm(xr, wr, br).backward(dy);
    const std::vector<float> gw = wr.grad().to(Device::cpu()).to_vector<float>();
    const std::vector<float> gb = br.grad().to(Device::cpu()).to_vector<float>();
    if (run == 0) {
      first_w = gw, first_b = gb;
    } else {
      REQUIRE(gw == first_w);
      REQUIRE(gb == first_b);
    }
  }
}

TEST_CASE("layer_norm in bf16 and f16 keeps f32 statistics", "[cuda]") {
  Generator g(43);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const double rel = dt == DType::bf16 ? 1.0 / 64 : 1.0 / 512;
    Tensor x = Tensor::randn({5, 768}, g, 0.5, 2).to(dt);
    Tensor w = Tensor::randn({768}, g, 1, 0.2).to(dt), b = Tensor::randn({768}, g, 0, 0.2).to(dt);
    Tensor want = layer_norm(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32));
    Tensor got = layer_norm(x.to(kGpu), w.to(kGpu), b.to(kGpu));
    REQUIRE(got.dtype() == dt);
    require_close(got, want, rel, rel);
  }
}

TEST_CASE("the device's layer_norm_backward kernel (the join's, one pass) matches the CPU's",
          "[cuda]") {
  // The kernel table called directly (the op's device backward goes to the join's kernel with its
  // overwrite flags): dx and the parameter sums written for f32; for a bf16 problem the f32
  // dweight / dbias are added into; rows a warp each, several rows a warp, a block a row.
  Generator g(44);
  for (Shape s : {Shape{3, 40}, Shape{600, 40}, Shape{2, 1031}}) {
    INFO("shape " << shape_str(s));
    const int64_t c = s.back(), rows = shape_numel(s) / c;
    const Tensor x = Tensor::randn(s, g, 0.5, 2.0), w = Tensor::randn({c}, g, 1.0, 0.2),
                 dy = Tensor::randn(s, g);
    const Tensor mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
    const Tensor y = Tensor::empty(s);
    layer_norm_forward_kernel(Device::cpu(), x, w, Tensor(), 1e-5, y, mean, rstd);
    Tensor dx = Tensor::empty(s), dw = Tensor::empty({c}), db = Tensor::empty({c});
    layer_norm_backward_kernel(Device::cpu(), x, w, mean, rstd, dy, dx, dw, db);
    Tensor gdx = Tensor::empty(s, DType::f32, kGpu), gdw = Tensor::empty({c}, DType::f32, kGpu),
           gdb = Tensor::empty({c}, DType::f32, kGpu);
    layer_norm_backward_kernel(kGpu, x.to(kGpu), w.to(kGpu), mean.to(kGpu), rstd.to(kGpu),
                               dy.to(kGpu), gdx, gdw, gdb);
    require_close(gdx, dx, 1e-5, 1e-5, 1e-5);
    require_close(gdw, dw, 1e-5, 1e-5, 1e-5);
    require_close(gdb, db, 1e-5, 1e-5, 1e-5);
    // bf16 operands, f32 parameter gradients added into what they hold.
    const Tensor held = Tensor::randn({2, c}, g);
    Tensor adw = held.select(0, 0).contiguous().to(kGpu),
           adb = held.select(0, 1).contiguous().to(kGpu);
    Tensor bdx = Tensor::empty(s, DType::bf16, kGpu);
    layer_norm_backward_kernel(kGpu, x.to(DType::bf16).to(kGpu), w.to(DType::bf16).to(kGpu),
                               mean.to(kGpu), rstd.to(kGpu), dy.to(DType::bf16).to(kGpu), bdx, adw,
                               adb);
    require_close(bdx, dx, 1.0 / 32, 1.0 / 32, 1.0 / 32);
    require_close(adw, held.select(0, 0) + dw, 0, 0, 2e-2);
    require_close(adb, held.select(0, 1) + db, 0, 0, 2e-2);
  }
}
