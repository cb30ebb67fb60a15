// dropout_add_layer_norm: the fused op against the unfused ops it replaces (bias add, dropout,
// residual add, layer_norm) from the same generator, forward and every gradient; finite-difference
// gradients with dropout on; the generator's use; thread-count determinism; errors.
#include <omp.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "ops/ops.h"
#include "test_support.h"

using namespace engine;
using engine::testing::error_of;
using engine::testing::gradcheck;
using engine::testing::rand_input;

namespace {

void require_close(const Tensor& got, const Tensor& want, double tol) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = got.to(DType::f64).to_vector<double>();
  const std::vector<double> w = want.to(DType::f64).to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i]))) continue;
    INFO("element " << i << ": got " << g[i] << ", want " << w[i]);
    REQUIRE(std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])));
  }
}

struct Inputs {
  Tensor x, bias, residual, weight, ln_bias;
  std::vector<Tensor> all() const { return {x, bias, residual, weight, ln_bias}; }
};

Inputs make_inputs(const Shape& s, DType dt, uint64_t seed, bool with_bias = true,
                   bool with_affine = true) {
  Generator g(seed);
  const int64_t c = s.back();
  Inputs in;
  in.x = Tensor::randn(s, g, 0.0, 1.0, dt).set_requires_grad();
  in.residual = Tensor::randn(s, g, 0.5, 2.0, dt).set_requires_grad();
  if (with_bias) in.bias = Tensor::randn({c}, g, 0.0, 0.5, dt).set_requires_grad();
  if (with_affine) {
    in.weight = Tensor::randn({c}, g, 1.0, 0.3, dt).set_requires_grad();
    in.ln_bias = Tensor::randn({c}, g, 0.0, 0.3, dt).set_requires_grad();
  }
  return in;
}

// The unfused path the op replaces.
DropoutAddNorm unfused(const Inputs& in, double p, bool training, Generator& gen, double eps) {
  Tensor h = in.bias.defined() ? in.x + in.bias : in.x;
  Tensor sum = in.residual + dropout(h, p, training, gen);
  return {sum, layer_norm(sum, in.weight, in.ln_bias, eps)};
}

// Both outputs with gradients: <w1, normed> + <w2, sum>.
void backward_both(const DropoutAddNorm& out, uint64_t seed) {
  Generator g(seed);
  const Tensor w1 = Tensor::randn(out.normed.shape(), g, 0.0, 1.0, out.normed.dtype());
  const Tensor w2 = Tensor::randn(out.sum.shape(), g, 0.0, 1.0, out.sum.dtype());
  (sum(out.normed * w1) + sum(out.sum * w2)).backward();
}

Inputs fresh_leaves(const Inputs& in) {
  auto leaf = [](const Tensor& t) {
    if (!t.defined()) return t;
    return t.requires_grad() ? t.detach().set_requires_grad() : t.detach();
  };
  return {leaf(in.x), leaf(in.bias), leaf(in.residual), leaf(in.weight), leaf(in.ln_bias)};
}

}  // namespace

TEST_CASE("dropout_add_layer_norm equals bias + dropout + add + layer_norm, forward and backward",
          "[dropout_add_layer_norm]") {
  // c = 7: rows that start mid-Philox-block; c = 64: whole blocks. Training with dropout, p = 0
  // and eval (no draw), p = 1 (everything dropped); with and without the biases and the affine.
  for (Shape s : {Shape{3, 5, 7}, Shape{4, 64}, Shape{1, 1}}) {
    for (double p : {0.0, 0.25, 1.0}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool training = variant != 3, with_bias = variant != 1, with_affine = variant != 2;
        INFO("shape " << shape_str(s) << " p " << p << " variant " << variant);
        const Inputs a = make_inputs(s, DType::f64, 11 + variant, with_bias, with_affine);
        const Inputs b = fresh_leaves(a);
        Generator g1(99), g2(99);
        DropoutAddNorm fused = dropout_add_layer_norm(a.x, a.bias, a.residual, p, training, g1,
                                                      a.weight, a.ln_bias, 1e-5);
        DropoutAddNorm ref = unfused(b, p, training, g2, 1e-5);
        REQUIRE(g1.offset() == g2.offset());  // the same random numbers taken
        require_close(fused.sum, ref.sum, 1e-14);
        require_close(fused.normed, ref.normed, 1e-12);
        backward_both(fused, 5);
        backward_both(ref, 5);
        const std::vector<Tensor> got = a.all(), want = b.all();
        const char* names[] = {"x", "bias", "residual", "weight", "ln_bias"};
        for (size_t i = 0; i < got.size(); ++i) {
          if (!got[i].defined()) continue;
          INFO("gradient of " << names[i]);
          require_close(got[i].grad(), want[i].grad(), 1e-11);
        }
      }
    }
  }
}

TEST_CASE("dropout_add_layer_norm with some inputs needing no gradient",
          "[dropout_add_layer_norm]") {
  // x without a gradient (its bias and the residual with): the bias gradient is computed from
  // dx without writing it, next to the residual's.
  for (int frozen = 0; frozen < 3; ++frozen) {
    INFO("frozen input " << frozen);
    Inputs a = make_inputs({6, 20}, DType::f64, 31);
    Tensor& f = frozen == 0 ? a.x : frozen == 1 ? a.residual : a.weight;
    f = f.detach();
    const Inputs b = fresh_leaves(a);
    Generator g1(5), g2(5);
    backward_both(
        dropout_add_layer_norm(a.x, a.bias, a.residual, 0.3, true, g1, a.weight, a.ln_bias, 1e-5),
        6);
    backward_both(unfused(b, 0.3, true, g2, 1e-5), 6);
    const std::vector<Tensor> got = a.all(), want = b.all();
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("input " << i);
      REQUIRE(got[i].requires_grad() == want[i].requires_grad());
      if (got[i].requires_grad()) require_close(got[i].grad(), want[i].grad(), 1e-11);
    }
  }
}

TEST_CASE("dropout_add_layer_norm's graph is freed when dropped without a backward",
          "[dropout_add_layer_norm]") {
  // The node saves its own output (the sum): as the output itself, not a detached alias, it
  // would hold the node that holds it (LeakSanitizer found it in the model tests).
  const Inputs in = make_inputs({4, 16}, DType::f32, 41);
  std::weak_ptr<Node> node;
  {
    Generator g(1);
    DropoutAddNorm o =
        dropout_add_layer_norm(in.x, in.bias, in.residual, 0.1, true, g, in.weight, in.ln_bias);
    node = o.normed.grad_fn();
    REQUIRE_FALSE(node.expired());
  }
  REQUIRE(node.expired());
}

TEST_CASE("dropout_add_layer_norm drops the elements dropout drops", "[dropout_add_layer_norm]") {
  // residual 0, x + bias = 1, no affine: sum is the keep mask times 1 / (1 - p).
  const double p = 0.4;
  Generator g(3);
  const PhiloxState s{g.seed(), g.offset()};
  Tensor ones = Tensor::ones({6, 37}, DType::f64);
  DropoutAddNorm out = dropout_add_layer_norm(ones, Tensor(), Tensor::zeros({6, 37}, DType::f64), p,
                                              true, g, Tensor(), Tensor());
  const std::vector<double> got = out.sum.to_vector<double>();
  const std::vector<double> mask = dropout_mask({6, 37}, p, s, DType::f64).to_vector<double>();
  size_t kept = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == mask[i] / (1 - p));
    kept += mask[i] != 0;
  }
  REQUIRE(kept > 0);
  REQUIRE(kept < got.size());
}

TEST_CASE("dropout_add_layer_norm gradcheck with dropout on, both outputs",
          "[dropout_add_layer_norm]") {
  for (Shape s : {Shape{3, 4, 6}, Shape{5, 8}}) {
    INFO("shape " << shape_str(s));
    const int64_t c = s.back();
    std::vector<Tensor> in = {rand_input(s, 301), rand_input({c}, 302), rand_input(s, 303),
                              rand_input({c}, 304), rand_input({c}, 305)};
    auto rep = gradcheck(
        [](const std::vector<Tensor>& t) {
          Generator g(17);  // the same mask at every evaluation
          DropoutAddNorm o =
              dropout_add_layer_norm(t[0], t[1], t[2], 0.3, true, g, t[3], t[4], 1e-5);
          return o.normed + o.sum * 0.5;
        },
        in);
    INFO(rep.detail);
    REQUIRE(rep.max_rel_error < 1e-6);
  }
}

TEST_CASE("dropout_add_layer_norm parameter gradients are the same bits at any thread count",
          "[dropout_add_layer_norm]") {
  const int max_threads = omp_get_max_threads();
  std::vector<std::vector<float>> first;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    const Inputs in = make_inputs({300, 256}, DType::f32, 21);
    Generator g(8);
    DropoutAddNorm out = dropout_add_layer_norm(in.x, in.bias, in.residual, 0.1, true, g, in.weight,
                                                in.ln_bias, 1e-12);
    backward_both(out, 9);
    std::vector<std::vector<float>> grads;
    for (const Tensor& p : in.all()) grads.push_back(p.grad().to_vector<float>());
    if (first.empty()) first = grads;
    for (size_t i = 0; i < grads.size(); ++i) REQUIRE(grads[i] == first[i]);
  }
  omp_set_num_threads(max_threads);
}

TEST_CASE("dropout_add_layer_norm reads non-contiguous inputs", "[dropout_add_layer_norm]") {
  Generator g(4);
  Tensor xt = Tensor::randn({9, 5}, g).transpose(0, 1);  // (5, 9), not contiguous
  Tensor rt = Tensor::randn({9, 5}, g).transpose(0, 1);
  REQUIRE_FALSE(xt.is_contiguous());
  Generator g1(1), g2(1);
  DropoutAddNorm a = dropout_add_layer_norm(xt, Tensor(), rt, 0.2, true, g1, Tensor(), Tensor());
  DropoutAddNorm b = dropout_add_layer_norm(xt.contiguous(), Tensor(), rt.contiguous(), 0.2, true,
                                            g2, Tensor(), Tensor());
  require_close(a.normed, b.normed, 0.0);
  require_close(a.sum, b.sum, 0.0);
}

TEST_CASE("dropout_add_layer_norm refuses mismatched inputs with one clear error",
          "[dropout_add_layer_norm]") {
  Generator g(1);
  Tensor x = Tensor::zeros({2, 4}), r = Tensor::zeros({2, 4}), c4 = Tensor::zeros({4});
  auto err = [&](const Tensor& xx, const Tensor& b, const Tensor& rr, double p, const Tensor& w) {
    return error_of([&] { dropout_add_layer_norm(xx, b, rr, p, true, g, w, Tensor()); });
  };
  CHECK_THAT(err(x, c4, Tensor::zeros({2, 5}), 0.1, c4),
             Catch::Contains("residual") && Catch::Contains("does not match the shape of x"));
  CHECK_THAT(err(x, Tensor::zeros({3}), r, 0.1, c4),
             Catch::Contains("bias") && Catch::Contains("expected shape (4)"));
  CHECK_THAT(err(x, c4, r, 0.1, Tensor::zeros({4}, DType::f64)),
             Catch::Contains("weight") && Catch::Contains("dtype"));
  CHECK_THAT(err(x, c4, r, 1.5, c4), Catch::Contains("p must be in [0, 1]"));
  CHECK_THAT(err(Tensor(), c4, r, 0.1, c4), Catch::Contains("must be defined"));
  CHECK_THAT(err(Tensor::zeros({2, 0}), Tensor(), Tensor::zeros({2, 0}), 0.1, Tensor()),
             Catch::Contains("non-empty last dim"));
}

// ---- layer_norm_dropout: dropout(layer_norm(x)), the embeddings' order --------------------------

TEST_CASE("layer_norm_dropout equals layer_norm then dropout, forward and backward",
          "[dropout_add_layer_norm]") {
  // The same kernels' other mode: c = 7 (rows mid-Philox-block), 64, 1; p = 0, 0.25, 1; eval;
  // with and without the affine.
  for (DType dt : {DType::f32, DType::f64}) {
    for (Shape s : {Shape{3, 5, 7}, Shape{4, 64}, Shape{1, 1}}) {
      for (double p : {0.0, 0.25, 1.0}) {
        for (int variant = 0; variant < 3; ++variant) {
          const bool training = variant != 2, with_affine = variant != 1;
          INFO(dtype_name(dt) << " shape " << shape_str(s) << " p " << p << " variant " << variant);
          const Inputs a = make_inputs(s, dt, 21 + variant, false, with_affine);
          const Inputs b = fresh_leaves(a);
          Generator g1(7), g2(7);
          const Tensor fused = layer_norm_dropout(a.x, a.weight, a.ln_bias, p, training, g1, 1e-5);
          const Tensor ref = dropout(layer_norm(b.x, b.weight, b.ln_bias, 1e-5), p, training, g2);
          REQUIRE(g1.offset() == g2.offset());  // the same random numbers taken
          require_close(fused, ref, dt == DType::f32 ? 1e-6 : 1e-14);
          Generator gw(3);
          const Tensor w = Tensor::randn(s, gw, 0.0, 1.0, dt);
          sum(fused * w).backward();
          sum(ref * w).backward();
          const char* names[] = {"x", "weight", "ln_bias"};
          const Tensor got[] = {a.x, a.weight, a.ln_bias}, want[] = {b.x, b.weight, b.ln_bias};
          for (int i = 0; i < 3; ++i) {
            if (!got[i].defined()) continue;
            INFO("gradient of " << names[i]);
            require_close(got[i].grad(), want[i].grad(), dt == DType::f32 ? 1e-6 : 1e-12);
          }
        }
      }
    }
  }
}

TEST_CASE("layer_norm_dropout gradcheck with dropout on", "[dropout_add_layer_norm]") {
  for (Shape s : {Shape{3, 4, 6}, Shape{5, 8}}) {
    INFO("shape " << shape_str(s));
    const int64_t c = s.back();
    std::vector<Tensor> in = {rand_input(s, 311), rand_input({c}, 312), rand_input({c}, 313)};
    auto rep = gradcheck(
        [](const std::vector<Tensor>& t) {
          Generator g(19);  // the same mask at every evaluation
          return layer_norm_dropout(t[0], t[1], t[2], 0.3, true, g, 1e-5);
        },
        in);
    INFO(rep.detail);
    REQUIRE(rep.max_rel_error < 1e-6);
  }
}

TEST_CASE("layer_norm_dropout refuses bad arguments with one clear error",
          "[dropout_add_layer_norm]") {
  Generator g(1);
  const Tensor x = Tensor::ones({2, 4});
  REQUIRE_THAT(error_of([&] { layer_norm_dropout(x, Tensor::ones({3}), Tensor(), 0.1, true, g); }),
               Catch::Contains("[layer_norm_dropout] weight") && Catch::Contains("(4)"));
  REQUIRE_THAT(error_of([&] { layer_norm_dropout(x, Tensor(), Tensor(), 1.5, true, g); }),
               Catch::Contains("[layer_norm_dropout] p must be in [0, 1], got 1.5"));
  REQUIRE_THAT(error_of([&] {
                 layer_norm_dropout(Tensor::ones({2, 0}), Tensor(), Tensor(), 0.1, true, g);
               }),
               Catch::Contains("[layer_norm_dropout] expects a non-empty last dim"));
}
