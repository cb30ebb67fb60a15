// [cuda] The fused attention kernels (ops/flash_attention.h) on tensor cores against the CPU's
// plain formulas of the same contract in double, and the attention op's fused path against its
// unfused path on the same device: outputs, log-sum-exp, every gradient, the dropout mask (equal
// to the unfused path's: a different mask moves the output by O(1), far past the tolerances),
// the bias gradient summed over the batch in groups the same bits on every run. Awkward shapes:
// lengths not a multiple of the 16-row fragments or the 64-row tiles, Tq != Tk, one query, a
// batch entry with every key masked (its rows output zeros), a bias broadcast over heads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "engine/work_log.h"
#include "ops/flash_attention.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;
using engine::testing::require_equal;

namespace {

struct Case {
  int64_t b, h, tq, tk, d;
  double p;
  bool bias, mask;
  int64_t groups = 0;  // the batch's groups for dbias (0: the backend's choice)
};

// The probabilities are rounded to the 16-bit type before their products with V and K (as every
// flash kernel does): outputs and dQ, dK, dV within that rounding of the double formulas.
double tolerance(DType dt) { return dt == DType::bf16 ? 2e-2 : 4e-3; }

// Each defined tensor of an argument struct replaced by its copy on the device.
void to_gpu(std::initializer_list<Tensor*> tensors) {
  for (Tensor* t : tensors)
    if (t->defined()) *t = t->to(kGpu);
}

void check_kernels(const Case& c, DType dt) {
  INFO("B " << c.b << " groups " << c.groups << " H " << c.h << " Tq " << c.tq << " Tk " << c.tk
            << " D " << c.d << " p " << c.p << " bias " << c.bias << " mask " << c.mask << " "
            << dtype_name(dt));
  Generator g(71);
  const double scale = 1.0 / std::sqrt(2.0 * c.d);
  FlashAttentionForward f;
  f.q = Tensor::randn({c.b, c.h, c.tq, c.d}, g).to(dt);
  f.k = Tensor::randn({c.b, c.h, c.tk, c.d}, g).to(dt);
  f.v = Tensor::randn({c.b, c.h, c.tk, c.d}, g).to(dt);
  if (c.bias)  // broadcast over heads: stride 0 on the first dim
    f.bias = Tensor::randn({1, c.tq, c.tk}, g).to(dt).expand({c.h, c.tq, c.tk});
  if (c.mask) {
    std::vector<float> m(static_cast<size_t>(c.b * c.tk), 1.0f);
    for (int64_t j = c.tk - c.tk / 3; j < c.tk; ++j) m[j] = 0.0f;  // entry 0: padding at the end
    if (c.b > 1)
      for (int64_t j = 0; j < c.tk; ++j) m[c.tk + j] = 0.0f;  // entry 1: every key masked
    f.key_mask = Tensor::from_vector(m, {c.b, c.tk});
  }
  f.scale = scale;
  f.p = c.p;
  f.state = {1234, 17};
  f.out = Tensor::empty({c.b, c.h, c.tq, c.d}, dt);
  f.lse = Tensor::empty({c.b, c.h, c.tq}, DType::f32);
  if (c.p > 0) f.mask_bits = Tensor::empty({c.b, c.h, c.tq, (c.tk + 3) / 4}, DType::u8);
  flash_attention_forward_kernel(Device::cpu(), f);

  FlashAttentionForward fg = f;
  to_gpu({&fg.q, &fg.k, &fg.v, &fg.key_mask});
  if (c.bias) fg.bias = f.bias.contiguous().to(kGpu).slice(0, 0, 1).expand({c.h, c.tq, c.tk});
  fg.out = Tensor::empty(f.out.shape(), dt, kGpu);
  fg.lse = Tensor::empty(f.lse.shape(), DType::f32, kGpu);
  if (c.p > 0) fg.mask_bits = Tensor::empty(f.mask_bits.shape(), DType::u8, kGpu);
  flash_attention_forward_kernel(kGpu, fg);
  // The keep bits: the CPU's (the unfused path's stream elements) bit for bit.
  if (c.p > 0) require_equal(fg.mask_bits, f.mask_bits);
  const double tol = tolerance(dt);
  require_close(fg.out, f.out, tol, tol);
  {
    // The log-sum-exp: +inf for the rows with no kept key, close elsewhere.
    const std::vector<float> got = fg.lse.to(Device::cpu()).to_vector<float>(),
                             want = f.lse.to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("lse row " << i);
      if (std::isinf(want[i])) {
        REQUIRE(got[i] == want[i]);
      } else {
        REQUIRE(got[i] == Approx(want[i]).margin(1e-3));
      }
    }
  }

  FlashAttentionBackward bw;
  bw.q = f.q;
  bw.k = f.k;
  bw.v = f.v;
  bw.bias = f.bias;
  bw.key_mask = f.key_mask;
  bw.out = f.out;
  bw.lse = f.lse;
  bw.mask_bits = f.mask_bits;
  bw.dout = Tensor::randn(f.out.shape(), g).to(dt);
  bw.scale = scale;
  bw.p = c.p;
  bw.state = f.state;
  bw.dq = Tensor::empty(f.q.shape(), dt);
  bw.dk = Tensor::empty(f.k.shape(), dt);
  bw.dv = Tensor::empty(f.v.shape(), dt);
  if (c.bias) bw.dbias = Tensor::empty({c.h, c.tq, c.tk}, DType::f32);
  flash_attention_backward_kernel(Device::cpu(), bw);
  // The device's backward from the same saved tensors (the CPU's out and lse), twice: the same
  // bits each time.
  FlashAttentionBackward bg = bw;
  bg.batch_groups = c.groups;
  to_gpu({&bg.q, &bg.k, &bg.v, &bg.key_mask, &bg.out, &bg.lse, &bg.mask_bits, &bg.dout});
  bg.bias = fg.bias;  // the head-broadcast view
  std::vector<Tensor> first;
  for (int run = 0; run < 2; ++run) {
    bg.dq = Tensor::empty(f.q.shape(), dt, kGpu);
    bg.dk = Tensor::empty(f.k.shape(), dt, kGpu);
    bg.dv = Tensor::empty(f.v.shape(), dt, kGpu);
    if (c.bias) bg.dbias = Tensor::empty({c.h, c.tq, c.tk}, DType::f32, kGpu);
    flash_attention_backward_kernel(kGpu, bg);
    if (run == 0) {
      first = {bg.dq, bg.dk, bg.dv, bg.dbias};
      continue;
    }
    require_equal(bg.dq, first[0]);
    require_equal(bg.dk, first[1]);
    require_equal(bg.dv, first[2]);
    if (c.bias) require_equal(bg.dbias, first[3]);
  }
  require_close(bg.dq, bw.dq, tol, tol, tol);
  require_close(bg.dk, bw.dk, tol, tol, tol);
  require_close(bg.dv, bw.dv, tol, tol, tol);
  // dS in f32 from 16-bit inputs, summed over the batch in f32.
  if (c.bias) require_close(bg.dbias, bw.dbias, 1e-3, 1e-4, 1e-4);
}

}  // namespace

TEST_CASE("flash attention kernels match the CPU's formulas: outputs, log-sum-exp, gradients",
          "[cuda]") {
  for (const Case& c : {Case{2, 2, 37, 70, 64, 0.0, true, true},    // ragged tiles, masks
                        Case{3, 2, 16, 16, 32, 0.3, true, false},   // dropout, one fragment
                        Case{2, 1, 1, 130, 64, 0.25, false, true},  // one query, three key tiles
                        Case{1, 2, 70, 20, 128, 0.1, true, false},
                        Case{5, 2, 20, 33, 32, 0.1, true, true, 2}}) {  // groups of 3 and 2
    check_kernels(c, DType::bf16);
  }
  check_kernels(Case{2, 2, 37, 70, 64, 0.2, true, true}, DType::f16);
}

TEST_CASE("attention's fused path equals its unfused path on the device, dropout mask included",
          "[cuda]") {
  for (double p : {0.0, 0.25}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      INFO("p " << p << " " << dtype_name(dt));
      const int64_t b = 3, h = 2, t = 45, d = 32;
      Generator g(72);
      const Tensor q0 = Tensor::randn({b, h, t, d}, g).to(dt),
                   k0 = Tensor::randn({b, h, t, d}, g).to(dt),
                   v0 = Tensor::randn({b, h, t, d}, g).to(dt),
                   bias0 = Tensor::randn({1, h, t, t}, g).to(dt);
      std::vector<float> m(static_cast<size_t>(b * t), 1.0f);
      for (int64_t j = 30; j < t; ++j) m[j] = 0.0f;
      const Tensor mask = Tensor::from_vector(m, {b, t}).to(kGpu);
      const Tensor dout = Tensor::randn({b, h, t, d}, g).to(dt).to(kGpu);
      std::vector<Tensor> res[2];
      uint64_t offsets[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor q = q0.to(kGpu).set_requires_grad(), k = k0.to(kGpu).set_requires_grad(),
               v = v0.to(kGpu).set_requires_grad(), bias = bias0.to(kGpu).set_requires_grad();
        Generator gen(5);
        AttentionOptions o;
        o.scale = 1.0 / std::sqrt(2.0 * d);
        o.bias = bias;
        o.key_mask = mask;
        o.dropout_p = p;
        o.training = true;
        o.generator = &gen;
        o.fused = fused == 1 ? FusedAttention::always : FusedAttention::never;
        Tensor out = attention(q, k, v, o);
        out.backward(dout);
        res[fused] = {out, q.grad(), k.grad(), v.grad(), bias.grad()};
        offsets[fused] = gen.offset();
      }
      REQUIRE(offsets[0] == offsets[1]);  // the same Philox words taken
      const double tol = tolerance(dt);
      for (int i = 0; i < 5; ++i) {
        INFO("result " << i << " (out, dq, dk, dv, dbias)");
        require_close(res[1][i], res[0][i], tol, tol, tol);
      }
    }
  }
}

TEST_CASE("attention takes the fused kernels by default, with or without dropout", "[cuda]") {
  Generator g(73);
  const Tensor q = Tensor::randn({2, 2, 20, 64}, g).to(DType::bf16).to(kGpu);
  auto ops_of = [&](double p, std::optional<FusedAttention> mode) {
    AttentionOptions o;
    o.dropout_p = p;
    o.training = true;
    o.fused = mode;
    Generator gen(3);
    o.generator = &gen;
    start_work_recording();
    attention(q, q, q, o);
    std::vector<std::string> names;
    for (const WorkRecord& r : stop_work_recording()) names.push_back(r.op);
    return names;
  };
  auto fused = [](const std::vector<std::string>& v) {
    const bool flash = std::find(v.begin(), v.end(), "flash_attention") != v.end();
    const bool unfused = std::find(v.begin(), v.end(), "attention_softmax") != v.end();
    REQUIRE(flash != unfused);
    return flash;
  };
  REQUIRE(default_fused_attention() == FusedAttention::always);
  REQUIRE(fused(ops_of(0.0, std::nullopt)));
  REQUIRE(fused(ops_of(0.1, std::nullopt)));
  REQUIRE(fused(ops_of(0.0, FusedAttention::without_dropout)));
  REQUIRE_FALSE(fused(ops_of(0.1, FusedAttention::without_dropout)));
  REQUIRE_FALSE(fused(ops_of(0.0, FusedAttention::never)));
  REQUIRE(fused(ops_of(0.1, FusedAttention::always)));
  // f32, a head width the kernels do not take, a bias per batch entry: the unfused path.
  auto unfused_for = [&](const Tensor& x, const Tensor& bias) {
    AttentionOptions o;
    o.bias = bias;
    start_work_recording();
    attention(x, x, x, o);
    std::vector<std::string> names;
    for (const WorkRecord& r : stop_work_recording()) names.push_back(r.op);
    return !fused(names);
  };
  REQUIRE(unfused_for(q.to(DType::f32), Tensor()));
  REQUIRE(unfused_for(Tensor::randn({2, 2, 20, 48}, g).to(DType::bf16).to(kGpu), Tensor()));
  REQUIRE(unfused_for(q, Tensor::randn({2, 2, 20, 20}, g).to(DType::bf16).to(kGpu)));
  REQUIRE_FALSE(unfused_for(q, Tensor::randn({1, 2, 20, 20}, g).to(DType::bf16).to(kGpu)));
  // Empty problems: no batch entry (the unfused path), no query row (the fused one), forward and
  // backward.
  for (Shape s : {Shape{0, 2, 5, 32}, Shape{2, 2, 0, 32}}) {
    INFO(shape_str(s));
    Tensor x = Tensor::zeros(s, DType::bf16, kGpu).set_requires_grad();
    AttentionOptions o;
    o.bias = Tensor::zeros({1, 2, s[2], s[2]}, DType::bf16, kGpu);
    o.dropout_p = 0.1;
    o.training = true;
    Tensor y = attention(x, x, x, o);
    REQUIRE(y.shape() == s);
    y.backward(Tensor::zeros(s, DType::bf16, kGpu));
    REQUIRE(x.grad().shape() == s);
  }
}
