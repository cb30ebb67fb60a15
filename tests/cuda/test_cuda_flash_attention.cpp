// [cuda] The fused attention kernels (ops/flash_attention.h) on tensor cores against the CPU's
// plain formulas of the same contract in double, and the attention op's fused path against its
// unfused path on the same device: outputs, log-sum-exp, every gradient, the dropout mask (equal
// to the unfused path's: a different mask moves the output by O(1), far past the tolerances),
// the bias gradient summed over the batch (in groups) the same bits on every run. Awkward shapes:
// lengths not a multiple of the 16-row fragments or the 64-row tiles, Tq != Tk, one query, a
// batch entry with every key masked (its rows output zeros), a bias broadcast over heads. Layouts:
// q, k, v, out, dout and the gradients as the model hands them over (the heads' split and merge
// as views: q from a (B, T, H, D) tensor, k and v the slices of one (B, T, 2, H, D) tensor), and
// the attention op's gradients of an unbound projection output without a copy.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "engine/autocast.h"
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
  bool strided = false;     // the device's operands and results in the model's layouts (views)
  bool f32_bias = false;    // the bias in f32 (TUPE's positional term as the model builds it)
  bool accumulate = false;  // dbias added to what it holds (accumulate_dbias)
  int64_t groups = 0;       // the batch's groups for dbias (0: the backend's choice)
  int64_t clip = 0;         // relative positions (Shaw): 0 none, else the clip of R = 2 clip + 1
  int rel = 3;              // with clip: 1 the key term, 2 the value term, 3 both
};

// (B, H, T, D) views in the layouts of the model's heads: `n` tensors of (B, T, H, D) (n = 1) or
// the n slices of one (B, T, n, H, D) tensor, permuted to (B, H, T, D), on `dev`; filled from
// `src` (contiguous (B, H, T, D) each) when given.
std::vector<Tensor> head_views(int64_t b, int64_t h, int64_t t, int64_t d, int64_t n, DType dt,
                               Device dev, const std::vector<Tensor>& src = {}) {
  const Tensor whole = Tensor::empty({b, t, n, h, d}, dt, dev).permute({2, 0, 3, 1, 4});
  std::vector<Tensor> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(whole.select(0, i));
    if (!src.empty()) out.back().copy_(src[static_cast<size_t>(i)].to(dev));
  }
  return out;
}

// The probabilities are rounded to the 16-bit type before their products with V and K (as every
// flash kernel does): outputs and dQ, dK, dV within that rounding of the double formulas.
double tolerance(DType dt) { return dt == DType::bf16 ? 2e-2 : 4e-3; }

// Each defined tensor of an argument struct replaced by its copy on the device.
void to_gpu(std::initializer_list<Tensor*> tensors) {
  for (Tensor* t : tensors)
    if (t->defined()) *t = t->to(kGpu);
}

// The device's backward of `a`, and the kernels it launched, in order.
std::vector<std::string> backward_kernels(const FlashAttentionBackward& a) {
  start_work_recording();
  flash_attention_backward_kernel(kGpu, a);
  std::vector<std::string> kernels;
  for (const WorkRecord& r : stop_work_recording())
    for (const LaunchRecord& l : r.kernels) kernels.push_back(l.kernel);
  return kernels;
}

bool launched(const std::vector<std::string>& kernels, const std::string& name) {
  return std::any_of(kernels.begin(), kernels.end(),
                     [&](const std::string& k) { return k.find(name) != std::string::npos; });
}

void check_kernels(const Case& c, DType dt) {
  INFO("B " << c.b << " groups " << c.groups << " H " << c.h << " Tq " << c.tq << " Tk " << c.tk
            << " D " << c.d << " p " << c.p << " bias " << c.bias << " mask " << c.mask << " "
            << dtype_name(dt) << " f32 bias " << c.f32_bias << " accumulate " << c.accumulate
            << " clip " << c.clip << " rel " << c.rel);
  const int64_t nrel = 2 * c.clip + 1;
  const bool rel_keys = c.clip > 0 && (c.rel & 1) != 0, rel_values = c.clip > 0 && (c.rel & 2) != 0;
  Generator g(71);
  const double scale = 1.0 / std::sqrt(2.0 * c.d);
  FlashAttentionForward f;
  f.q = Tensor::randn({c.b, c.h, c.tq, c.d}, g).to(dt);
  f.k = Tensor::randn({c.b, c.h, c.tk, c.d}, g).to(dt);
  f.v = Tensor::randn({c.b, c.h, c.tk, c.d}, g).to(dt);
  if (c.bias)  // broadcast over heads: stride 0 on the first dim
    f.bias = Tensor::randn({1, c.tq, c.tk}, g)
                 .to(c.f32_bias ? DType::f32 : dt)
                 .expand({c.h, c.tq, c.tk});
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
  if (c.clip > 0) {
    f.rel_table = Tensor::randn({nrel, c.d}, g).to(dt);
    f.rel_clip = c.clip;
    f.rel_keys = rel_keys;
    f.rel_values = rel_values;
  }
  flash_attention_forward_kernel(Device::cpu(), f);

  FlashAttentionForward fg = f;
  to_gpu({&fg.q, &fg.k, &fg.v, &fg.key_mask, &fg.rel_table});
  if (c.bias) fg.bias = f.bias.contiguous().to(kGpu).slice(0, 0, 1).expand({c.h, c.tq, c.tk});
  fg.out = Tensor::empty(f.out.shape(), dt, kGpu);
  if (c.strided) {
    fg.q = head_views(c.b, c.h, c.tq, c.d, 1, dt, kGpu, {f.q})[0];
    const std::vector<Tensor> kv = head_views(c.b, c.h, c.tk, c.d, 2, dt, kGpu, {f.k, f.v});
    fg.k = kv[0];
    fg.v = kv[1];
    fg.out = head_views(c.b, c.h, c.tq, c.d, 1, dt, kGpu)[0];
    REQUIRE_FALSE(fg.q.is_contiguous());
    REQUIRE(fg.k.stride(2) == 2 * c.h * c.d);
  }
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
  // With accumulate_dbias, dbias starts from this (a gradient other layers passed back).
  const Tensor dbias0 = Tensor::randn({c.h, c.tq, c.tk}, g);
  if (c.bias) bw.dbias = c.accumulate ? dbias0.clone() : Tensor::empty({c.h, c.tq, c.tk});
  bw.accumulate_dbias = c.accumulate;
  bw.rel_table = f.rel_table;
  bw.rel_clip = f.rel_clip;
  bw.rel_keys = f.rel_keys;
  bw.rel_values = f.rel_values;
  if (rel_keys) bw.drel = Tensor::empty({c.b, c.h, c.tq, nrel}, dt);
  if (rel_values) bw.rel_weights = Tensor::empty({c.b, c.h, c.tq, nrel}, dt);
  flash_attention_backward_kernel(Device::cpu(), bw);
  if (c.bias && c.accumulate) {  // the contract itself: the batch's sum added to dbias0
    FlashAttentionBackward fresh = bw;
    fresh.dbias = Tensor::empty({c.h, c.tq, c.tk});
    fresh.accumulate_dbias = false;
    fresh.dq = Tensor::empty(f.q.shape(), dt);
    fresh.dk = Tensor::empty(f.k.shape(), dt);
    fresh.dv = Tensor::empty(f.v.shape(), dt);
    flash_attention_backward_kernel(Device::cpu(), fresh);
    require_close(bw.dbias, dbias0 + fresh.dbias, 1e-6, 1e-6);
  }
  // The device's backward from the same saved tensors (the CPU's out and lse), twice: the same
  // bits each time.
  FlashAttentionBackward bg = bw;
  bg.batch_groups = c.groups;
  to_gpu({&bg.q, &bg.k, &bg.v, &bg.key_mask, &bg.out, &bg.lse, &bg.mask_bits, &bg.dout,
          &bg.rel_table});
  // The relative tables out: (B, H, Tq, R), or views of (B, Tq, H, R) in the model's layouts.
  auto rel_table_out = [&]() {
    return c.strided ? Tensor::empty({c.b, c.tq, c.h, nrel}, dt, kGpu).permute({0, 2, 1, 3})
                     : Tensor::empty({c.b, c.h, c.tq, nrel}, dt, kGpu);
  };
  bg.bias = fg.bias;  // the head-broadcast view
  if (c.strided) {
    bg.q = fg.q;
    bg.k = fg.k;
    bg.v = fg.v;
    bg.out = head_views(c.b, c.h, c.tq, c.d, 1, dt, kGpu, {bw.out})[0];
    bg.dout = head_views(c.b, c.h, c.tq, c.d, 1, dt, kGpu, {bw.dout})[0];
  }
  std::vector<Tensor> first;
  for (int run = 0; run < 2; ++run) {
    bg.dq = Tensor::empty(f.q.shape(), dt, kGpu);
    bg.dk = Tensor::empty(f.k.shape(), dt, kGpu);
    bg.dv = Tensor::empty(f.v.shape(), dt, kGpu);
    if (c.strided) {
      bg.dq = head_views(c.b, c.h, c.tq, c.d, 1, dt, kGpu)[0];
      const std::vector<Tensor> dkv = head_views(c.b, c.h, c.tk, c.d, 2, dt, kGpu);
      bg.dk = dkv[0];
      bg.dv = dkv[1];
    }
    if (c.bias)
      bg.dbias =
          c.accumulate ? dbias0.to(kGpu) : Tensor::empty({c.h, c.tq, c.tk}, DType::f32, kGpu);
    if (rel_keys) bg.drel = rel_table_out();
    if (rel_values) bg.rel_weights = rel_table_out();
    const std::vector<std::string> kernels = backward_kernels(bg);
    // dQ and dbias in one kernel (clusters of the key tiles) where dbias is wanted, D <= 64, no
    // relative positions and at most 8 key tiles; otherwise the q kernel, and the bias kernel.
    const bool fused = c.bias && c.d <= 64 && c.clip == 0 && (c.tk + 63) / 64 <= 8;
    CHECK(launched(kernels, "flash_backward_q_bias<") == fused);
    CHECK(launched(kernels, "flash_backward_q<") == !fused);
    CHECK(launched(kernels, "flash_backward_bias<") == (c.bias && !fused));
    CHECK(launched(kernels, "flash_backward_kv<"));
    if (run == 0) {
      first = {bg.dq, bg.dk, bg.dv, bg.dbias, bg.drel, bg.rel_weights};
      continue;
    }
    if (rel_keys) require_equal(bg.drel, first[4]);
    if (rel_values) require_equal(bg.rel_weights, first[5]);
    require_equal(bg.dq, first[0]);
    require_equal(bg.dk, first[1]);
    require_equal(bg.dv, first[2]);
    if (c.bias) require_equal(bg.dbias, first[3]);
  }
  require_close(bg.dq, bw.dq, tol, tol, tol);
  require_close(bg.dk, bw.dk, tol, tol, tol);
  require_close(bg.dv, bw.dv, tol, tol, tol);
  if (c.bias && !c.strided && c.clip == 0) {
    // Without clusters (clusters = false, as on a device that has none, or
    // ENGINE_ATTENTION_CLUSTERS=off): flash_backward_q and _bias, within rounding of the CPU.
    FlashAttentionBackward two = bg;
    two.clusters = false;
    two.dq = Tensor::empty(f.q.shape(), dt, kGpu);
    two.dk = Tensor::empty(f.k.shape(), dt, kGpu);
    two.dv = Tensor::empty(f.v.shape(), dt, kGpu);
    two.dbias = c.accumulate ? dbias0.to(kGpu) : Tensor::empty({c.h, c.tq, c.tk}, DType::f32, kGpu);
    const std::vector<std::string> kernels = backward_kernels(two);
    CHECK_FALSE(launched(kernels, "flash_backward_q_bias<"));
    CHECK(launched(kernels, "flash_backward_q<"));
    CHECK(launched(kernels, "flash_backward_bias<"));
    require_close(two.dq, bw.dq, tol, tol, tol);
    require_close(two.dk, bw.dk, tol, tol, tol);
    require_close(two.dv, bw.dv, tol, tol, tol);
    require_close(two.dbias, bw.dbias, 1e-3, 1e-4, 1e-4);
    require_equal(two.dk, bg.dk);  // the kv kernel is the same either way
    require_equal(two.dv, bg.dv);
  }
  if (rel_keys) require_close(bg.drel, bw.drel, tol, tol, tol);
  if (rel_values) require_close(bg.rel_weights, bw.rel_weights, tol, tol);
  // dS in f32 from 16-bit inputs, summed over the batch in f32.
  if (c.bias) require_close(bg.dbias, bw.dbias, 1e-3, 1e-4, 1e-4);
}

}  // namespace

TEST_CASE("flash attention kernels match the CPU's formulas: outputs, log-sum-exp, gradients",
          "[cuda]") {
  for (const Case& c :
       {Case{2, 2, 37, 70, 64, 0.0, true, true},    // ragged tiles, masks
        Case{3, 2, 16, 16, 32, 0.3, true, false},   // dropout, one fragment
        Case{2, 1, 1, 130, 64, 0.25, false, true},  // one query, three key tiles
        Case{1, 2, 70, 20, 128, 0.1, true, false},
        Case{5, 2, 20, 33, 32, 0.1, true, true},   // dbias over 5 entries
        Case{4, 2, 130, 70, 32, 0.1, true, true},  // dbias: 3 x 2 tiles
        // dbias with 8 key tiles (the largest cluster) and with 9 (none)
        Case{2, 1, 20, 512, 64, 0.1, true, true}, Case{2, 1, 20, 530, 32, 0.1, true, true},
        // the model's layouts: rows H D (q, out, dout, dq) and 2 H D (k, v, dk,
        // dv) apart, heads D apart
        Case{2, 3, 37, 70, 64, 0.2, true, true, true},
        Case{3, 2, 16, 20, 32, 0.0, false, true, true},
        Case{1, 2, 70, 20, 128, 0.1, true, false, true},
        // an f32 bias read as it is; dbias added to what it holds
        Case{2, 3, 37, 70, 64, 0.2, true, true, true, true},
        Case{5, 2, 20, 33, 32, 0.1, true, true, false, true, true},
        Case{3, 2, 16, 16, 32, 0.0, true, false, false, false, true},
        // dbias in groups of 3 and 2 (the backend's choice at these sizes: a
        // group an entry), and in one group written straight into dbias
        Case{5, 2, 20, 33, 32, 0.1, true, true, false, false, false, 2},
        Case{5, 2, 20, 33, 32, 0.1, true, true, true, true, true, 2},
        Case{3, 2, 16, 16, 32, 0.0, true, false, false, false, true, 1},
        Case{4, 2, 130, 70, 32, 0.1, true, true, false, true, false, 1},
        // Shaw's relative positions: tails on both sides (clip 5 < T), one query
        // against three key tiles, the largest R (129, three tiles of vectors),
        // the model's layouts, the key or the value term alone, with a bias and
        // its gradient in groups
        Case{2, 2, 37, 70, 64, 0.2, false, true, false, false, false, 0, 5},
        Case{3, 2, 16, 16, 32, 0.0, false, false, false, false, false, 0, 2},
        Case{2, 1, 1, 130, 64, 0.25, false, true, false, false, false, 0, 64},
        Case{1, 2, 70, 20, 128, 0.1, false, false, false, false, false, 0, 64},
        Case{2, 2, 150, 140, 32, 0.1, false, true, false, false, false, 0, 40},
        Case{2, 3, 37, 70, 64, 0.2, false, true, true, false, false, 0, 7},
        Case{2, 2, 37, 70, 64, 0.0, false, true, false, false, false, 0, 9, 1},
        Case{2, 2, 37, 70, 64, 0.2, false, true, false, false, false, 0, 9, 2},
        Case{5, 2, 20, 33, 32, 0.1, true, true, false, true, true, 2, 3}}) {
    check_kernels(c, DType::bf16);
  }
  check_kernels(Case{2, 2, 37, 70, 64, 0.2, false, true, false, false, false, 0, 5}, DType::f16);
  check_kernels(Case{2, 2, 37, 70, 64, 0.2, true, true}, DType::f16);
  check_kernels(Case{2, 2, 37, 70, 64, 0.2, true, true, true}, DType::f16);
  check_kernels(Case{2, 2, 37, 70, 64, 0.2, true, true, false, true, true}, DType::f16);
}

TEST_CASE("flash attention's bias gradient over an empty batch is zero, or what it held",
          "[cuda]") {
  const DType dt = DType::bf16;
  FlashAttentionBackward bw;
  bw.q = Tensor::zeros({0, 2, 16, 32}, dt, kGpu);
  bw.k = bw.q;
  bw.v = bw.q;
  bw.out = bw.q;
  bw.dout = bw.q;
  bw.lse = Tensor::zeros({0, 2, 16}, DType::f32, kGpu);
  bw.bias = Tensor::zeros({2, 16, 16}, DType::f32, kGpu);
  bw.dq = Tensor::zeros({0, 2, 16, 32}, dt, kGpu);
  bw.dk = bw.dq;
  bw.dv = bw.dq;
  bw.dbias = Tensor::full({2, 16, 16}, 5.0, DType::f32, kGpu);
  flash_attention_backward_kernel(kGpu, bw);
  require_equal(bw.dbias, Tensor::zeros({2, 16, 16}, DType::f32, kGpu));
  bw.dbias = Tensor::full({2, 16, 16}, 5.0, DType::f32, kGpu);
  bw.accumulate_dbias = true;  // nothing added
  flash_attention_backward_kernel(kGpu, bw);
  require_equal(bw.dbias, Tensor::full({2, 16, 16}, 5.0, DType::f32, kGpu));
}

TEST_CASE("flash attention kernels refuse layouts their vector loads cannot take", "[cuda]") {
  Generator g(74);
  const DType dt = DType::bf16;
  FlashAttentionForward f;
  f.q = Tensor::randn({1, 2, 16, 32}, g).to(dt).to(kGpu);
  f.k = f.q;
  f.v = f.q;
  f.out = Tensor::empty({1, 2, 16, 32}, dt, kGpu);
  f.lse = Tensor::empty({1, 2, 16}, DType::f32, kGpu);
  REQUIRE(flash_attention_layout_fits(f.q));
  flash_attention_forward_kernel(kGpu, f);
  // the head width not contiguous; a row stride off a 16-byte boundary; a first element off one
  const Tensor wide = Tensor::randn({1, 2, 16, 64}, g).to(dt).to(kGpu);
  const Tensor rows = Tensor::randn({1, 2, 16 * 33}, g).to(dt).to(kGpu);
  for (const Tensor& bad :
       {wide.slice(3, 0, 64, 2), rows.view({1, 2, 16, 33}).slice(3, 0, 32), wide.slice(3, 1, 33)}) {
    INFO(describe(bad));
    REQUIRE_FALSE(flash_attention_layout_fits(bad));
    FlashAttentionForward fb = f;
    fb.q = bad;
    REQUIRE_THROWS_WITH(
        flash_attention_forward_kernel(kGpu, fb),
        Catch::Contains("[flash_attention] q") && Catch::Contains("head width contiguous"));
  }
  // A bias in neither q's dtype nor f32.
  FlashAttentionForward fb = f;
  fb.bias = Tensor::zeros({2, 16, 16}, DType::f16, kGpu);
  REQUIRE_THROWS_WITH(flash_attention_forward_kernel(kGpu, fb),
                      Catch::Contains("[flash_attention] bias") &&
                          Catch::Contains("must be in q's dtype (bf16) or f32"));
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

TEST_CASE("relative attention's fused path equals its composed path on the device", "[cuda]") {
  // Shaw's terms through the fused kernels (q A^T and the probabilities' sums per bucket made
  // inside them) against q A^T through relative_gather, softmax, attention_dropout and
  // relative_scatter times A on the same device: the output and the gradients of q, k, v and the
  // vectors, the dropout mask (the same Philox words), tails on both sides (clip 6 < T), a padded
  // batch entry; q, k, v contiguous, or the model's views of one projection output (the table's
  // gradient then by products over the heads on views, else on copies); each term alone.
  for (double p : {0.0, 0.25}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      for (int layout = 0; layout < 2; ++layout) {
        for (int terms : {3, 1, 2}) {
          if (terms != 3 && (dt == DType::f16 || layout == 1)) continue;
          INFO("p " << p << " " << dtype_name(dt) << " model layout " << layout << " terms "
                    << terms);
          const int64_t b = 2, h = 2, t = 45, d = 32, clip = 6, nrel = 2 * clip + 1;
          Generator g(73);
          const Tensor q0 = Tensor::randn({b, h, t, d}, g).to(dt),
                       k0 = Tensor::randn({b, h, t, d}, g).to(dt),
                       v0 = Tensor::randn({b, h, t, d}, g).to(dt), a0 = Tensor::randn({nrel, d}, g);
          std::vector<float> m(static_cast<size_t>(b * t), 1.0f);
          for (int64_t j = 30; j < t; ++j) m[static_cast<size_t>(t + j)] = 0.0f;
          const Tensor mask = Tensor::from_vector(m, {b, t}).to(kGpu);
          const Tensor dout = Tensor::randn({b, h, t, d}, g).to(dt).to(kGpu);
          std::vector<Tensor> res[2];
          uint64_t offsets[2];
          for (int fused = 0; fused < 2; ++fused) {
            Tensor q, k, v, qkv;
            if (layout == 0) {
              q = q0.to(kGpu).set_requires_grad();
              k = k0.to(kGpu).set_requires_grad();
              v = v0.to(kGpu).set_requires_grad();
            } else {  // the projection's (B, T, 3, H, D) output, unbound
              Tensor whole = Tensor::empty({b, t, 3, h, d}, dt, kGpu);
              const Tensor src[3] = {q0, k0, v0};
              for (int i = 0; i < 3; ++i)
                whole.select(2, i).copy_(src[i].permute({0, 2, 1, 3}).to(kGpu));
              qkv = whole.set_requires_grad();
              const std::vector<Tensor> parts = qkv.permute({2, 0, 3, 1, 4}).unbind(0);
              q = parts[0];
              k = parts[1];
              v = parts[2];
            }
            Tensor a = a0.to(kGpu).set_requires_grad();
            Generator gen(5);
            AttentionOptions o;
            o.key_mask = mask;
            o.dropout_p = p;
            o.training = true;
            o.generator = &gen;
            o.fused = fused == 1 ? FusedAttention::always : FusedAttention::never;
            RelativeTerms rt;
            rt.clip = clip;
            rt.table = a.to(dt);
            rt.keys = (terms & 1) != 0;
            rt.values = (terms & 2) != 0;
            const Tensor out = attention(q, k, v, o, rt);
            out.backward(dout);
            if (layout == 0)
              res[fused] = {out, q.grad(), k.grad(), v.grad(), a.grad()};
            else
              res[fused] = {out, qkv.grad(), a.grad()};
            offsets[fused] = gen.offset();
          }
          REQUIRE(offsets[0] == offsets[1]);
          const double tol = tolerance(dt);
          for (size_t i = 0; i < res[0].size(); ++i) {
            INFO("result " << i << " (out, dq, dk, dv, dA; or out, dqkv, dA)");
            require_close(res[1][i], res[0][i], tol, tol, tol);
          }
        }
      }
    }
  }
}

TEST_CASE("relative attention takes the fused kernels, and refuses bad tables", "[cuda]") {
  const DType dt = DType::bf16;
  Generator g(74);
  const int64_t b = 2, h = 2, t = 20, d = 32;
  const Tensor q = Tensor::randn({b, h, t, d}, g).to(dt).to(kGpu);
  RelativeTerms rt;
  rt.clip = 4;
  rt.table = Tensor::randn({9, d}, g).to(dt).to(kGpu);
  start_work_recording();
  attention(q, q, q, AttentionOptions{}, rt);
  bool fused = false, composed = false;
  for (const WorkRecord& r : stop_work_recording()) {
    fused = fused || r.op == "flash_attention";
    composed = composed || r.op == "relative_gather" || r.op == "softmax";
  }
  REQUIRE(fused);
  REQUIRE_FALSE(composed);
  // A clip past the kernels' (R > kFlashMaxRelBuckets): the composed ops.
  RelativeTerms wide = rt;
  wide.clip = 70;
  wide.table = Tensor::randn({141, d}, g).to(dt).to(kGpu);
  start_work_recording();
  attention(q, q, q, AttentionOptions{}, wide);
  fused = composed = false;
  for (const WorkRecord& r : stop_work_recording()) {
    fused = fused || r.op == "flash_attention";
    composed = composed || r.op == "relative_gather";
  }
  REQUIRE_FALSE(fused);
  REQUIRE(composed);
  RelativeTerms bad = rt;
  bad.table = Tensor::randn({7, d}, g).to(dt).to(kGpu);
  REQUIRE_THROWS_WITH(attention(q, q, q, AttentionOptions{}, bad),
                      Catch::Contains("relative vectors") && Catch::Contains("(9, 32)"));
  bad = rt;
  bad.clip = 0;
  REQUIRE_THROWS_WITH(attention(q, q, q, AttentionOptions{}, bad), Catch::Contains("clip >= 1"));
  FlashAttentionForward f;
  f.q = f.k = f.v = q;
  f.out = Tensor::empty(q.shape(), dt, kGpu);
  f.lse = Tensor::empty({b, h, t}, DType::f32, kGpu);
  f.rel_clip = 70;  // R = 141 > kFlashMaxRelBuckets
  f.rel_table = wide.table;
  REQUIRE_THROWS_WITH(flash_attention_forward_kernel(kGpu, f), Catch::Contains("rel_clip 70"));
  f.rel_clip = 4;
  f.rel_table = Tensor::randn({9, d}, g).to(kGpu);  // f32 beside bf16 q
  REQUIRE_THROWS_WITH(flash_attention_forward_kernel(kGpu, f), Catch::Contains("rel_table"));
}

TEST_CASE("attention's fused path takes the heads' split and merge as views: no copies", "[cuda]") {
  // The model's attention: q, k, v unbound from the projection's (B, T, 3, H, D) output, the
  // context merged back to (B, T, H D); fused against unfused, and no copy either way through the
  // fused path (the unbind's backward receives dq, dk, dv as the slices of one tensor).
  for (double p : {0.0, 0.2}) {
    INFO("p " << p);
    const int64_t b = 2, h = 3, t = 37, d = 32;
    const DType dt = DType::bf16;
    Generator g(75);
    const Tensor x0 = Tensor::randn({b, t, 3 * h * d}, g).to(dt),
                 bias0 = Tensor::randn({1, h, t, t}, g).to(dt),
                 dy = Tensor::randn({b, t, h * d}, g).to(dt).to(kGpu);
    std::vector<Tensor> res[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = x0.to(kGpu).set_requires_grad(), bias = bias0.to(kGpu).set_requires_grad();
      Generator gen(6);
      AttentionOptions o;
      o.scale = 1.0 / std::sqrt(double(d));
      o.bias = bias;
      o.dropout_p = p;
      o.training = true;
      o.generator = &gen;
      o.fused = fused == 1 ? FusedAttention::always : FusedAttention::never;
      start_work_recording();
      const std::vector<Tensor> qkv = x.view({b, t, 3, h, d}).permute({2, 0, 3, 1, 4}).unbind(0);
      const Tensor ctx = attention(qkv[0], qkv[1], qkv[2], o);
      const Tensor y = ctx.permute({0, 2, 1, 3}).reshape({b, t, h * d});
      y.backward(dy);
      std::vector<std::string> copies;  // of the heads' tensors: q, k, v, out and their gradients
      for (const WorkRecord& r : stop_work_recording())
        if (r.op == "copy" && r.shape.find(", 32)") != std::string::npos) copies.push_back(r.shape);
      if (fused == 1) {
        INFO("copies: " << copies.size() << (copies.empty() ? "" : ", the first " + copies[0]));
        REQUIRE(copies.empty());
        REQUIRE(y.shares_storage(ctx));
      } else {
        REQUIRE_FALSE(copies.empty());  // the unfused path's batched GEMMs want contiguous heads
      }
      res[fused] = {y, x.grad(), bias.grad()};
    }
    for (int i = 0; i < 3; ++i) {
      INFO("result " << i << " (y, dx, dbias)");
      require_close(res[1][i], res[0][i], tolerance(dt), tolerance(dt), tolerance(dt));
    }
  }
}

TEST_CASE("an f32 positional term every layer reads: no cast, its gradient summed in place",
          "[cuda]") {
  // TUPE's term as the model builds it: one (1, H, T, T) f32 tensor a step (here a view of an f32
  // leaf), read by every layer under bf16 autocast. The fused path reads it in f32 and sums its
  // gradient layer by layer into one f32 tensor (the first layer's, offered back as the others'
  // sink): no 16-bit cast of it forward, no conversion or add of its gradient backward. The
  // unfused path casts it each layer; both give the same gradients.
  const int64_t b = 2, h = 2, t = 37, d = 32, layers = 3;
  const DType dt = DType::bf16;
  Generator g(76);
  const Tensor theta0 = Tensor::randn({h, t, t}, g), dy = Tensor::randn({b, h, t, d}, g).to(kGpu);
  std::vector<Tensor> qkv0;
  for (int64_t i = 0; i < 3 * layers; ++i) qkv0.push_back(Tensor::randn({b, h, t, d}, g).to(dt));
  std::vector<Tensor> res[2];
  for (int fused = 0; fused < 2; ++fused) {
    INFO((fused == 1 ? "fused" : "unfused"));
    Tensor theta = theta0.to(kGpu).set_requires_grad();
    std::vector<Tensor> qkv;
    for (const Tensor& x : qkv0) qkv.push_back(x.to(kGpu).set_requires_grad());
    Generator gen(7);
    start_work_recording();
    {
      Autocast ac(dt);
      const Tensor bias = theta.unsqueeze(0);  // (1, H, T, T) f32
      Tensor y;
      for (int64_t l = 0; l < layers; ++l) {
        AttentionOptions o;
        o.scale = 1.0 / std::sqrt(2.0 * d);
        o.bias = bias;
        o.dropout_p = 0.1;
        o.training = true;
        o.generator = &gen;
        o.fused = fused == 1 ? FusedAttention::always : FusedAttention::never;
        const Tensor a = attention(qkv[3 * l], qkv[3 * l + 1], qkv[3 * l + 2], o).to(DType::f32);
        y = y.defined() ? y + a : a;
      }
      y.backward(dy);
    }
    // The term's casts and conversions (a 16-bit (H, T, T) tensor) and the adds of its gradient,
    // outside attention's own kernels (the leaf's .grad taking its first gradient is not one).
    std::vector<std::string> bias_work;
    for (const WorkRecord& r : stop_work_recording())
      if (r.shape.find(", 37, 37)") != std::string::npos && r.op.rfind("flash_attention", 0) != 0 &&
          (r.shape.find("bf16") != std::string::npos || r.op == "add_" || r.op == "binary"))
        bias_work.push_back(r.op + " " + r.shape);
    if (fused == 1) {
      for (const std::string& w : bias_work) UNSCOPED_INFO(w);
      REQUIRE(bias_work.empty());
    } else {
      REQUIRE(bias_work.size() >= size_t(layers));  // a cast a layer at least
    }
    res[fused] = {theta.grad(), qkv[0].grad(), qkv[3 * layers - 1].grad()};
  }
  for (int i = 0; i < 3; ++i) {
    INFO("result " << i << " (dtheta, dq of the first layer, dv of the last)");
    require_close(res[1][i], res[0][i], tolerance(dt), tolerance(dt), tolerance(dt));
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
