// [cuda] bucket_lookup, cls_reset and untied_bias on the device against the CPU backend. The lookup
// and the reset are copies: bit for bit. The sums (the table's gradient in pieces of position
// order, the reset's row and column through block_sum) within f32 rounding of the CPU's, and the
// same bits on every run. Awkward shapes: N not a multiple of 4 (the scalar path), rows not a
// multiple of the vector width, more than 32 buckets (two groups), buckets no position names, N
// past the 512-piece cap (several positions a thread), one row, one column; and a bad index on the
// device. untied_bias's 16-byte vector path (T a multiple of the width) and its scalar path (T not,
// or operands off a 16-byte boundary) give the same bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "cuda_test_support.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;
using engine::testing::require_equal;

namespace {

Tensor random_index(const Shape& shape, int64_t r, uint64_t seed) {
  std::vector<int64_t> v(size_t(shape_numel(shape)));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = int64_t((s >> 33) % uint64_t(r > 2 ? r - 2 : r));  // the last two buckets never named
  }
  return Tensor::from_vector<int64_t>(v, shape);
}

}  // namespace

TEST_CASE("bucket_lookup on the device: the lookup bit for bit, the table's gradient within f32",
          "[cuda]") {
  Generator g(61);
  struct Case {
    Shape index;
    int64_t r, c;
  };
  for (const Case& k : {Case{{7, 7}, 5, 3},            // N % 4 != 0: one position a thread
                        Case{{16, 16}, 34, 4},         // two groups of buckets, TUPE-R code's 34
                        Case{{1}, 1, 1},               // one position
                        Case{{64, 40}, 8, 2},          // 2560: two pieces
                        Case{{1100, 1001}, 40, 1}}) {  // 1.1M: 512 pieces, 17 positions a thread
    for (DType dt : {DType::f32, DType::f64}) {
      INFO(dtype_name(dt) << " index " << shape_str(k.index) << " R " << k.r << " C " << k.c);
      Tensor index = random_index(k.index, k.r, 7 + uint64_t(k.r));
      Tensor table = Tensor::randn({k.r, k.c}, g, 0, 1, dt).set_requires_grad();
      Tensor tg = table.detach().to(kGpu).set_requires_grad();
      Tensor out = bucket_lookup(table, index), og = bucket_lookup(tg, index.to(kGpu));
      require_equal(og, out);
      Tensor dy = Tensor::randn(out.shape(), g, 0, 1, dt);
      out.backward(dy);
      og.backward(dy.to(kGpu));
      // (sums of ~30,000 values that cancel: within a few ulp of the largest, as other sums are)
      require_close(tg.grad(), table.grad(), dt == DType::f64 ? 1e-12 : 1e-5, 1e-4,
                    dt == DType::f64 ? 1e-13 : 2e-6);
      // The same bits on a second run; the never-named buckets exactly 0.
      Tensor again = table.detach().to(kGpu).set_requires_grad();
      bucket_lookup(again, index.to(kGpu)).backward(dy.to(kGpu));
      require_equal(again.grad(), tg.grad());
      if (k.r > 2) {
        std::vector<double> gr = tg.grad().to(Device::cpu()).to_vector<double>();
        for (int64_t b = k.r - 2; b < k.r; ++b)
          for (int64_t ch = 0; ch < k.c; ++ch) REQUIRE(gr[size_t(b * k.c + ch)] == 0.0);
      }
    }
  }
  // bf16: the lookup a copy, the sums in f32 rounded once (N = 81: a position a step; 64: 4).
  for (int64_t m : {9, 8}) {
    INFO("bf16 index " << m << " x " << m);
    Tensor index = random_index({m, m}, 6, 3);
    Tensor tb = Tensor::randn({6, 2}, g).to(DType::bf16);
    require_equal(bucket_lookup(tb.to(kGpu), index.to(kGpu)).to(Device::cpu()),
                  bucket_lookup(tb, index));
    Tensor tbg = tb.to(kGpu).set_requires_grad();
    Tensor dy = Tensor::randn({2, m, m}, g).to(DType::bf16);
    bucket_lookup(tbg, index.to(kGpu)).backward(dy.to(kGpu));
    Tensor t32 = tb.to(DType::f32).set_requires_grad();
    bucket_lookup(t32, index).backward(dy.to(DType::f32));
    require_close(tbg.grad().to(Device::cpu()).to(DType::f32),
                  t32.grad().to(DType::bf16).to(DType::f32), 1e-2, 1e-2);
  }
}

TEST_CASE("bucket_lookup on the device reports an index out of range", "[cuda]") {
  Tensor table = Tensor::ones({4, 2}).to(kGpu);
  Tensor bad = Tensor::from_vector<int64_t>({0, 1, 9, 2}, {4}).to(kGpu);
  REQUIRE_THROWS_WITH(bucket_lookup(table, bad).to(Device::cpu()),
                      Catch::Contains("[bucket_lookup] index value 9 at flat position 2") &&
                          Catch::Contains("4 buckets"));
}

TEST_CASE("cls_reset on the device: values bit for bit, the row and column sums within f32",
          "[cuda]") {
  Generator g(62);
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (Shape s :
         {Shape{3, 5, 8}, Shape{2, 7, 9}, Shape{1, 1, 4}, Shape{4, 6, 1}, Shape{16, 130, 130}}) {
      INFO(dtype_name(dt) << " " << shape_str(s));
      const bool half = dt == DType::bf16;
      const DType ref = half ? DType::f32 : dt;  // the CPU computes 16-bit sums in f32
      Tensor v = Tensor::randn(s, g, 0, 1, dt), row = Tensor::randn({s[0]}, g, 0, 1, dt),
             col = Tensor::randn({s[0]}, g, 0, 1, dt);
      Tensor vg = v.to(kGpu).set_requires_grad(), rg = row.to(kGpu).set_requires_grad(),
             cg = col.to(kGpu).set_requires_grad();
      Tensor out = cls_reset(vg, rg, cg);
      require_equal(out.to(Device::cpu()), cls_reset(v, row, col));
      Tensor dy = Tensor::randn(s, g, 0, 1, dt);
      out.backward(dy.to(kGpu));
      Tensor vc = v.to(ref).set_requires_grad(), rc = row.to(ref).set_requires_grad(),
             cc = col.to(ref).set_requires_grad();
      cls_reset(vc, rc, cc).backward(dy.to(ref));
      require_equal(vg.grad().to(Device::cpu()).to(ref), vc.grad());
      const double tol = dt == DType::f64 ? 1e-12 : half ? 1e-2 : 1e-5;
      require_close(rg.grad().to(Device::cpu()).to(ref), rc.grad().to(dt).to(ref), tol, tol);
      require_close(cg.grad().to(Device::cpu()).to(ref), cc.grad().to(dt).to(ref), tol, tol);
    }
  }
  // A non-contiguous v (read through one contiguous copy), only v needing a gradient.
  Tensor v = Tensor::randn({2, 6, 5}, g).transpose(1, 2);
  Tensor r = Tensor::randn({2}, g), c = Tensor::randn({2}, g);
  require_equal(cls_reset(v.to(kGpu), r.to(kGpu), c.to(kGpu)).to(Device::cpu()),
                cls_reset(v, r, c));
}

TEST_CASE("untied_bias on the device against the CPU: every mode, 16-bit products into f32",
          "[cuda]") {
  Generator g(63);
  struct Dt {
    DType p, add;  // add's dtype (none when p's is 16-bit and add f16: no add)
    bool with_add;
  };
  for (const Dt& d : {Dt{DType::f32, DType::f32, true}, Dt{DType::f64, DType::f64, true},
                      Dt{DType::bf16, DType::f32, true}, Dt{DType::bf16, DType::bf16, false},
                      Dt{DType::f16, DType::f16, true}})
    for (int mode = 0; mode < 3; ++mode)  // 0: no reset, 1: paper, 2: code
      for (int64_t c_t : {0, 1, 2}) {
        const int64_t c = c_t == 0 ? 3 : c_t == 1 ? 16 : 2, t = c_t == 0 ? 5 : c_t == 1 ? 128 : 1;
        UntiedBiasOptions o;
        o.scale = 0.125;
        o.reset = mode > 0;
        o.add_at_reset = mode == 2;
        const int64_t n = t + (o.reset ? 2 : 0);
        INFO(dtype_name(d.p) << " add " << (d.with_add ? dtype_name(d.add) : "none") << " mode "
                             << mode << " C " << c << " T " << t);
        const DType out_dt = d.with_add ? promote_floating(d.p, d.add) : d.p;
        const DType ref = out_dt == DType::f64 ? DType::f64 : DType::f32;
        Tensor p = Tensor::randn({c, n, n}, g, 0, 1, d.p);
        Tensor add = d.with_add ? Tensor::randn({c, t, t}, g, 0, 1, d.add) : Tensor();
        Tensor pg = p.to(kGpu).set_requires_grad(),
               ag = d.with_add ? add.to(kGpu).set_requires_grad() : Tensor();
        Tensor out = untied_bias(pg, ag, o);
        REQUIRE(out.dtype() == out_dt);
        Tensor pc = p.to(ref).set_requires_grad(),
               ac = d.with_add ? add.to(ref).set_requires_grad() : Tensor();
        Tensor want = untied_bias(pc, ac, o);
        const double tol = ref == DType::f64 ? 1e-12 : out_dt == DType::f32 ? 1e-6 : 1e-2;
        require_close(out.to(Device::cpu()).to(ref), want.to(out_dt).to(ref), tol, tol);
        Tensor dy = Tensor::randn({c, t, t}, g, 0, 1, out_dt);
        out.backward(dy.to(kGpu));
        want.backward(dy.to(ref));
        // dP in P's dtype (16-bit from an f32 gradient: rounded once); the diagonal's sums
        // within the dtype's rounding of the CPU's.
        REQUIRE(pg.grad().dtype() == d.p);
        const double gt = d.p == DType::f64 ? 1e-12 : d.p == DType::f32 ? 1e-5 : 1e-2;
        require_close(pg.grad().to(Device::cpu()).to(ref), pc.grad().to(d.p).to(ref), gt, gt, gt);
        if (d.with_add) {
          REQUIRE(ag.grad().dtype() == d.add);
          require_equal(ag.grad().to(Device::cpu()).to(ref), ac.grad().to(d.add).to(ref));
        }
      }
  // at_least_f32: a bf16 product into an f32 term (the model's TUPE-A), its gradient bf16.
  {
    UntiedBiasOptions o;
    o.scale = 0.25;
    o.reset = true;
    o.at_least_f32 = true;
    Tensor p = Tensor::randn({3, 9, 9}, g, 0, 1, DType::bf16);
    Tensor pg = p.to(kGpu).set_requires_grad(), pc = p.to(DType::f32).set_requires_grad();
    Tensor out = untied_bias(pg, Tensor(), o);
    REQUIRE(out.dtype() == DType::f32);
    require_close(out.to(Device::cpu()), untied_bias(pc, Tensor(), o), 1e-6, 1e-6);
    Tensor dy = Tensor::randn({3, 7, 7}, g);
    out.backward(dy.to(kGpu));
    untied_bias(pc, Tensor(), o).backward(dy);
    REQUIRE(pg.grad().dtype() == DType::bf16);
    require_close(pg.grad().to(Device::cpu()).to(DType::f32),
                  pc.grad().to(DType::bf16).to(DType::f32), 1e-2, 1e-2, 1e-2);
  }
  // The same bits on a second run (the sums' fixed order).
  UntiedBiasOptions o;
  o.scale = 0.5;
  o.reset = true;
  Tensor base = Tensor::randn({4, 66, 66}, g).to(kGpu);
  Tensor dy = Tensor::randn({4, 64, 64}, g).to(kGpu);
  auto run = [&]() {
    Tensor p = base.clone();
    p.set_requires_grad();
    untied_bias(p, Tensor(), o).backward(dy);
    return p.grad().to(Device::cpu());
  };
  require_equal(run(), run());
}

TEST_CASE("untied_bias on the device: 16-byte vectors and the scalar path give the same bits",
          "[cuda]") {
  // T = 8: the vector path for f32 (4 a vector), f64 (2) and 16-bit (8) outputs; T = 6: f64's
  // only. Each run again with add and dout one element off a 16-byte boundary (the scalar path
  // for every dtype). The forward bit for bit against its rounding spelled out: s P + add one FMA,
  // at the reset s theta rounded and then add added (in f32 for 16-bit, rounded once).
  Generator g(64);
  struct Dt {
    DType p, add;
  };
  // A copy of x one element into a device buffer: contiguous, not 16-byte aligned.
  auto shifted = [](const Tensor& x) {
    std::vector<double> v = x.to(Device::cpu()).to(DType::f64).to_vector<double>();
    v.insert(v.begin(), 0.0);
    const int64_t m = x.numel();
    return Tensor::from_vector<double>(v, {m + 1}).to(x.dtype()).to(kGpu);
  };
  for (const Dt& d : {Dt{DType::f32, DType::f32}, Dt{DType::bf16, DType::f32},
                      Dt{DType::bf16, DType::bf16}, Dt{DType::f64, DType::f64}})
    for (int mode = 0; mode < 3; ++mode)  // 0: no reset, 1: paper, 2: code
      for (int64_t t : {8, 6}) {
        const int64_t c = 3;
        UntiedBiasOptions o;
        o.scale = 0.3;
        o.reset = mode > 0;
        o.add_at_reset = mode == 2;
        const int64_t n = t + (o.reset ? 2 : 0);
        INFO(dtype_name(d.p) << " add " << dtype_name(d.add) << " mode " << mode << " T " << t);
        const DType acc = d.add == DType::f64 ? DType::f64 : DType::f32;
        Tensor p = Tensor::randn({c, n, n}, g, 0, 1, d.p);
        Tensor add = Tensor::randn({c, t, t}, g, 0, 1, d.add);
        Tensor dy = Tensor::randn({c, t, t}, g, 0, 1, d.add);
        // The forward's rounding, in the accumulation type T.
        auto reference = [&]<class T>() {
          const std::vector<double> pv = p.to(DType::f64).to_vector<double>();
          const std::vector<double> av = add.to(DType::f64).to_vector<double>();
          std::vector<double> out(size_t(c * t * t));
          const T s = T(o.scale);
          for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t i = 0; i < t; ++i)
              for (int64_t j = 0; j < t; ++j) {
                const int64_t e = (ch * t + i) * t + j;
                const T a = T(av[size_t(e)]);
                T v;
                if (o.reset && (i == 0 || j == 0)) {
                  const int64_t k = i == 0 ? t : t + 1;
                  volatile T prod = s * T(pv[size_t((ch * n + k) * n + k)]);  // not fused
                  v = o.add_at_reset ? T(prod + a) : T(prod);
                } else {
                  v = std::fma(s, T(pv[size_t((ch * n + i) * n + j)]), a);
                }
                out[size_t(e)] = double(v);
              }
          return Tensor::from_vector<double>(out, {c, t, t}).to(acc).to(d.add);
        };
        const Tensor want =
            acc == DType::f64 ? reference.operator()<double>() : reference.operator()<float>();
        // Aligned: the vector path where T allows it.
        Tensor pg = p.to(kGpu).set_requires_grad(), ag = add.to(kGpu).set_requires_grad();
        Tensor out = untied_bias(pg, ag, o);
        require_equal(out, want);
        out.backward(dy.to(kGpu));
        // One element off: the scalar path.
        Tensor p2 = p.to(kGpu).set_requires_grad(), buf = shifted(add).set_requires_grad();
        Tensor out2 = untied_bias(p2, buf.slice(0, 1, c * t * t + 1).view({c, t, t}), o);
        require_equal(out2, out);
        out2.backward(shifted(dy).slice(0, 1, c * t * t + 1).view({c, t, t}));
        require_equal(p2.grad(), pg.grad());
        require_equal(buf.grad().slice(0, 1, c * t * t + 1).view({c, t, t}), ag.grad());
        // And the CPU's gradients (dP's two diagonal sums within rounding).
        Tensor pc = p.to(acc).set_requires_grad(), ac = add.to(acc).set_requires_grad();
        untied_bias(pc, ac, o).backward(dy.to(acc));
        const double gt = d.p == DType::f64 ? 1e-12 : d.p == DType::f32 ? 1e-5 : 1e-2;
        require_close(pg.grad().to(acc), pc.grad().to(d.p).to(acc), gt, gt, gt);
        require_equal(ag.grad().to(acc), ac.grad().to(d.add).to(acc));
      }
}
