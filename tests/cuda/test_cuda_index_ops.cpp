// [cuda] dropout, index_select / embedding, relative_gather / relative_scatter, cross_entropy and
// the AdamW step on the device against the CPU backend, forward and backward. Where the kernels
// are specified to compute the same operations in the same order the check is bit for bit
// (dropout masks, row gathers, the inverted index, the AdamW step); the embedding scatter within
// f32 rounding (long runs of one row are summed in pieces) and the same bits on every run;
// cross_entropy within 1e-5 relative. Awkward shapes: sizes not a multiple of 4 (a partial Philox
// block), of the warp or of the vector width, rows longer than a block, one row, empty batches.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "engine/autocast.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "engine/work_log.h"
#include "ops/ops.h"
#include "relative_index.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_close;
using engine::testing::require_equal;
using engine::testing::shaw_index;

TEST_CASE("dropout masks and values on the device equal the CPU's bit for bit", "[cuda]") {
  Generator g(41);
  for (DType dt : {DType::f32, DType::f64}) {
    for (Shape s : {Shape{1}, Shape{3}, Shape{7, 5}, Shape{2, 3, 1031}, Shape{0, 4}}) {
      for (double p : {0.1, 0.5, 0.9}) {
        INFO(dtype_name(dt) << " " << shape_str(s) << " p " << p);
        Tensor x = Tensor::randn(s, g, 0, 1, dt).set_requires_grad();
        Tensor xg = x.detach().to(kGpu).set_requires_grad();
        Generator a(7), b(7);
        a.set_state({99, 13});
        b.set_state({99, 13});
        Tensor y = dropout(x, p, true, a), yg = dropout(xg, p, true, b);
        REQUIRE(a.offset() == b.offset());
        require_equal(yg, y);
        Tensor dy = Tensor::randn(s, g, 0, 1, dt);
        y.backward(dy);
        yg.backward(dy.to(kGpu));
        require_equal(xg.grad(), x.grad());
      }
    }
  }
  for (DType mt : {DType::u8, DType::f32, DType::f64}) {
    const PhiloxState st{1234, 5};
    require_equal(dropout_mask({3, 37}, 0.3, st, mt, kGpu), dropout_mask({3, 37}, 0.3, st, mt));
  }
}

TEST_CASE("attention's dropout rule on the device equals the CPU's bit for bit", "[cuda]") {
  // One thread per Philox block of 8 elements, two 4-element writes (vectors where aligned): sizes
  // that end mid-block, an offset across the 2^32 counter carry; f32, f64, and bf16 / f16 scaled
  // in f32 and rounded once.
  Generator g(21);
  const PhiloxState st{0x0123456789ABCDEFull, (uint64_t(1) << 32) - 3};
  for (const int64_t n : {int64_t(1), int64_t(13), int64_t(4099)})
    for (const DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      INFO("n " << n << " " << dtype_name(dt));
      const bool half = dt == DType::bf16 || dt == DType::f16;
      const Tensor x = Tensor::randn({n}, g).to(dt).to(half ? DType::f32 : dt);
      const Tensor want = Tensor::empty({n}, x.dtype()), got = Tensor::empty({n}, dt, kGpu);
      attention_dropout_kernel(Device::cpu(), x, want, 0.3, st);
      attention_dropout_kernel(kGpu, x.to(dt).to(kGpu), got, 0.3, st);
      require_equal(got.to(Device::cpu()), want.to(dt));
    }
}

TEST_CASE("dropout in bf16 and f16 keeps the CPU's mask and scales in f32", "[cuda]") {
  Generator g(42);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    Tensor x = Tensor::randn({5, 77}, g).to(dt).to(DType::f32);  // representable inputs
    const PhiloxState st{3, 8};
    Tensor want = Tensor::empty(x.shape());
    dropout_kernel(Device::cpu(), x, want, 0.25, st);
    Tensor got = Tensor::empty(x.shape(), dt, kGpu);
    dropout_kernel(kGpu, x.to(dt).to(kGpu), got, 0.25, st);
    // Same zeros; kept values are x / 0.75 rounded once to the half type.
    require_equal(got.to(Device::cpu()).to(DType::f32), want.to(dt).to(DType::f32));
  }
}

TEST_CASE("index_select and embedding on the device equal the CPU, with a deterministic backward",
          "[cuda]") {
  Generator g(43);
  for (DType it : {DType::i32, DType::i64}) {
    // One row; rows wider than a block; none; a 7-row table read 1000 times (runs of ~140 keys:
    // summed in pieces over two levels); 9000 ids (four sort tiles and two merge passes) over
    // 2 rows (runs of 4500: three levels) and over 3000 rows; widths not a multiple of the vector.
    for (auto [n, d, m] : {std::array<int64_t, 3>{1, 1, 1},
                           {5, 33, 17},
                           {3, 700, 300},
                           {50, 8, 0},
                           {7, 1, 1000},
                           {2, 16, 9000},
                           {3000, 12, 9000},
                           {40, 5, 70}}) {
      // The index dtype changes only how the ids are read: the long sorts (the costliest cases
      // under the emulator's ThreadSanitizer build) run once, with i64 ids.
      if (it == DType::i32 && m > 1000) continue;
#if defined(__SANITIZE_THREAD__)
      // Under ThreadSanitizer one long sort (its blocks sync alike for any table): the 2-row
      // table's three-level run sums are checked in the plain and AddressSanitizer builds.
      if (n == 2) continue;
#endif
      INFO(dtype_name(it) << " table (" << n << ", " << d << "), " << m << " ids");
      std::vector<int64_t> ids(static_cast<size_t>(m));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + i / 3) % n);
      Tensor idx = Tensor::from_vector(ids, {m}).to(it);
      Tensor w = Tensor::randn({n, d}, g).set_requires_grad();
      Tensor y = embedding(w, idx);
      Tensor dy = Tensor::randn(y.shape(), g);
      y.backward(dy);
      // The inverted index: the CPU's sorted keys exactly.
      const Tensor keys = sorted_index_keys(idx.to(kGpu), n);
      require_equal(keys, sorted_index_keys(idx, n));
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        // Run 0 sorts in the backward; run 1 hands it the inverted index (a constant index's
        // cached keys) and must give the same bits.
        Tensor wg = w.detach().to(kGpu).set_requires_grad();
        Tensor inv = run == 1 ? keys : Tensor();
        Tensor yg = embedding(wg, idx.to(kGpu), inv);
        require_equal(yg, y);
        yg.backward(dy.to(kGpu));
        // Runs of up to 64 keys in index order as on the CPU; longer ones in pieces: within f32
        // rounding of the CPU's sums, and the same bits on every run.
        require_close(wg.grad(), w.grad(), 1e-5, 1e-6, 1e-6);
        const std::vector<float> got = wg.grad().to(Device::cpu()).to_vector<float>();
        if (run == 0) first = got;
        REQUIRE(got == first);
      }
    }
  }
  // bf16 / f16 / f64 gradients: sums in f32 (f64), rounded once into the table.
  for (DType dt : {DType::bf16, DType::f16, DType::f64}) {
    INFO(dtype_name(dt));
    std::vector<int64_t> ids(3000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 11 == 0 ? 3 : i % 5);
    Tensor idx = Tensor::from_vector(ids, {3000});
    Tensor w = Tensor::randn({6, 24}, g).to(dt);
    Tensor dy = Tensor::randn({3000, 24}, g).to(dt);
    Tensor want = Tensor::zeros({6, 24}, dt == DType::f64 ? DType::f64 : DType::f32);
    scatter_add_rows_kernel(Device::cpu(), dy.to(want.dtype()), idx, Tensor(), want);
    Tensor got = Tensor::zeros({6, 24}, dt, kGpu);
    scatter_add_rows_kernel(kGpu, dy.to(kGpu), idx.to(kGpu), Tensor(), got);
    const double rel = dt == DType::f64 ? 1e-12 : (dt == DType::bf16 ? 1e-2 : 2e-3);
    require_close(got, want, rel, rel, rel);
  }
  // A unique index (the MLM head's positions): one row add each (add_rows), the general
  // scatter's bits on the device, and the CPU's; 16-byte rows and rows that are not.
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (int64_t d : {24, 5}) {
      INFO("unique " << dtype_name(dt) << " d " << d);
      std::vector<int64_t> ids(300);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37) % 401);
      Tensor idx = Tensor::from_vector(ids, {300}).to(kGpu);
      Tensor x = Tensor::randn({401, d}, g).to(dt);
      Tensor dy = Tensor::randn({300, d}, g).to(dt).to(kGpu);
      Tensor a = x.to(kGpu).set_requires_grad(), b = x.to(kGpu).set_requires_grad();
      index_select(a, idx, true).backward(dy);
      index_select(b, idx).backward(dy);
      require_equal(a.grad(), b.grad());
      index_select(a, idx, true).backward(dy);  // into the gradient it holds
      index_select(b, idx).backward(dy);
      require_equal(a.grad(), b.grad());
      // The CPU computes in f32 (f64): g, then g + g, are exact in the 16-bit types too.
      const DType ref = dt == DType::f64 ? DType::f64 : DType::f32;
      Tensor c = x.to(ref).set_requires_grad();
      const Tensor dyc = dy.to(Device::cpu()).to(ref);
      index_select(c, idx.to(Device::cpu()), true).backward(dyc);
      index_select(c, idx.to(Device::cpu()), true).backward(dyc);
      require_equal(a.grad().to(Device::cpu()), c.grad().to(dt));
    }
  // A mismatched inverted index is refused naming the op.
  Tensor w = Tensor::randn({4, 3}, g).to(kGpu).set_requires_grad();
  Tensor ix = Tensor::from_vector(std::vector<int64_t>{1, 2}, {2}).to(kGpu);
  REQUIRE_THROWS_WITH(embedding(w, ix, Tensor::zeros({3}, DType::i64, kGpu)),
                      Catch::Contains("[embedding] the inverted index"));
  // index_select over a 3-D tensor, and a bf16 table (a row copy in any dtype).
  Tensor x = Tensor::randn({6, 3, 5}, g);
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{5, 0, 0, 2}, {4});
  require_equal(index_select(x.to(kGpu), idx.to(kGpu)), index_select(x, idx));
  Tensor xb = x.to(DType::bf16);
  require_equal(index_select(xb.to(kGpu), idx.to(kGpu)).to(Device::cpu()).to(DType::f32),
                index_select(xb.to(DType::f32), idx));
}

TEST_CASE("an embedding read from the autocast slab's bf16 copy: the f32 path's bits both ways",
          "[cuda]") {
  // The token table a view of a FlatParameters slab; under Autocast + AutocastSlab,
  // autocast_from_slab gives the copy's view (no kernel) and embedding gathers bf16 rows from it;
  // the backward scatters the bf16 gradient rows into the f32 .grad (no bf16 table, no
  // conversion). Against gathering the f32 rows and converting them: the same output bits, and
  // the same gradient bits (the 16-bit rows widen exactly; the sums run in the same order).
  // Runs summed in one piece and over two levels (7 rows, 1000 ids); rows not a multiple of the
  // vector width (5); an empty index.
  Generator g(47);
  for (auto [n, d, m] : {std::array<int64_t, 3>{7, 24, 1000}, {40, 5, 70}, {9, 16, 0}}) {
    INFO("table (" << n << ", " << d << "), " << m << " ids");
    std::vector<int64_t> ids(static_cast<size_t>(m));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + i / 3) % n);
    const Tensor idx = Tensor::from_vector(ids, {m}).to(kGpu);
    const Tensor table = Tensor::randn({n, d}, g), w = Tensor::randn({m, d}, g).to(kGpu);
    auto run = [&](bool from_slab, std::vector<WorkRecord>* backward_work) {
      NamedTensors ps = {{"emb", table.clone().set_requires_grad()}};
      FlatParameters flat(ps, kGpu);
      AutocastSlab slab(flat.data());
      Tensor y, loss;
      {
        Autocast ac(DType::bf16);
        const Tensor half = autocast_from_slab(ps[0].second);
        REQUIRE(half.defined() == true);
        REQUIRE(half.dtype() == DType::bf16);
        y = from_slab ? embedding(half, idx) : embedding(ps[0].second, idx).to(DType::bf16);
        loss = engine::sum(y.to(DType::f32) * w);
      }
      if (backward_work) start_work_recording();
      loss.backward();
      if (backward_work) *backward_work = stop_work_recording();
      return std::vector<Tensor>{y.detach(), flat.grad().clone()};
    };
    std::vector<WorkRecord> work;
    const std::vector<Tensor> a = run(true, &work), b = run(false, nullptr);
    require_equal(a[0], b[0]);
    require_equal(a[1], b[1]);
    // The CPU backend's scatter of the same rows (the loss's gradient, rounded to bf16 by the
    // cast's backward, widened): within f32 rounding (long runs are summed in pieces).
    if (m > 0) {
      Tensor want = Tensor::zeros({n, d});
      scatter_add_rows_kernel(Device::cpu(), w.to(Device::cpu()).to(DType::bf16).to(DType::f32),
                              idx.to(Device::cpu()), Tensor(), want);
      require_close(a[1].slice(0, 0, n * d).view({n, d}), want, 1e-5, 1e-6, 1e-6);
    }
    // No 16-bit table (zeroed, scattered into, converted and added): no launch names its shape.
    const std::string table_shape = "(" + std::to_string(n) + ", " + std::to_string(d) + ") bf16";
    for (const WorkRecord& r : work) {
      INFO(r.op << " " << r.shape);
      CHECK(r.shape.find(table_shape) == std::string::npos);
    }
  }
  // Outside a slab, or for a tensor not in it, there is nothing to read.
  const Tensor t = Tensor::randn({3, 4}, g).to(kGpu);
  {
    Autocast ac(DType::bf16);
    CHECK_FALSE(autocast_from_slab(t).defined());
    NamedTensors ps = {{"p", Tensor::randn({4}, g)}};
    FlatParameters flat(ps, kGpu);
    AutocastSlab slab(flat.data());
    CHECK_FALSE(autocast_from_slab(t).defined());
  }
  CHECK_FALSE(autocast_from_slab(t).defined());  // no Autocast scope
  // A 16-bit gradient into a table of another dtype than f32 is refused naming the op.
  REQUIRE_THROWS_WITH(
      scatter_add_rows_kernel(kGpu, Tensor::zeros({2, 4}, DType::bf16, kGpu),
                              Tensor::zeros({2}, DType::i64, kGpu), Tensor(),
                              Tensor::zeros({3, 4}, DType::f16, kGpu)),
      Catch::Contains("[scatter_add_rows]") && Catch::Contains("16-bit rows into an f32 table"));
}

TEST_CASE("relative_gather and relative_scatter on the device equal the CPU bit for bit",
          "[cuda]") {
  Generator g(44);
  for (DType dt : {DType::f32, DType::f64}) {
    for (auto [l, tq, tk, k] : {std::array<int64_t, 4>{1, 1, 1, 0},
                                {3, 5, 7, 2},
                                {2, 33, 40, 8},
                                {0, 4, 4, 1},
                                {2, 9, 300, 130}}) {
      INFO(dtype_name(dt) << " L " << l << " Tq " << tq << " Tk " << tk << " k " << k);
      Tensor index = shaw_index(tq, tk, k);
      const int64_t r = 2 * k + 1;
      Tensor x = Tensor::randn({l, tq, r}, g, 0, 1, dt).set_requires_grad();
      Tensor xg = x.detach().to(kGpu).set_requires_grad();
      Tensor y = relative_gather(x, index), yg = relative_gather(xg, index.to(kGpu));
      require_equal(yg, y);
      Tensor dy = Tensor::randn(y.shape(), g, 0, 1, dt);
      y.backward(dy);
      yg.backward(dy.to(kGpu));
      require_equal(xg.grad(), x.grad());  // the scatter: bucket sums in j order

      // Scatter into more buckets than any index names (the unnamed ones are 0), a
      // non-contiguous input (a transposed view).
      Tensor ys = Tensor::randn({l, tk, tq}, g, 0, 1, dt).transpose(1, 2);
      require_equal(relative_scatter(ys.to(kGpu), index.to(kGpu), r + 3),
                    relative_scatter(ys, index, r + 3));
      // The inverse made once on the device: the CPU's CSR, and the same values through both
      // ops (the gather's backward included) as without it.
      const Tensor inv = relative_index_inverse(index.to(kGpu), r + 3);
      require_equal(inv, relative_index_inverse(index, r + 3));
      require_equal(relative_scatter(ys.to(kGpu), index.to(kGpu), r + 3, inv),
                    relative_scatter(ys, index, r + 3));
      Tensor xi = x.detach().to(kGpu).set_requires_grad();
      const Tensor inv_r = relative_index_inverse(index.to(kGpu), r);
      relative_gather(xi, index.to(kGpu), inv_r).backward(dy.to(kGpu));
      require_equal(xi.grad(), x.grad());
    }
  }
  // bf16: the gather is a copy; the scatter sums in f32 and rounds once.
  Tensor index = shaw_index(6, 6, 2);
  Tensor y = Tensor::randn({2, 6, 6}, g).to(DType::bf16);
  Tensor want = relative_scatter(y.to(DType::f32), index, 5).to(DType::bf16);
  require_equal(relative_scatter(y.to(kGpu), index.to(kGpu), 5).to(Device::cpu()), want);
}

TEST_CASE("rotary on the device matches the CPU, forward and backward", "[cuda]") {
  Generator g(46);
  for (auto [l, t, d] : {std::array<int64_t, 3>{1, 1, 2}, {3, 7, 10}, {2, 33, 64}, {0, 4, 8}}) {
    INFO("L " << l << " T " << t << " D " << d);
    Tensor theta = Tensor::randn({t, d / 2}, g) * 3.0;
    Tensor c = cos(theta), s = sin(theta);
    Tensor cg = c.to(kGpu), sg = s.to(kGpu);
    for (DType dt : {DType::f32, DType::f64}) {
      // A non-contiguous x, as the layers' q and k views of the fused projection are.
      Tensor x = Tensor::randn({t, l, d}, g, 0, 1, dt).set_requires_grad();
      Tensor xg = x.detach().to(kGpu).set_requires_grad();
      Tensor y = rotary(x.transpose(0, 1), c, s), yg = rotary(xg.transpose(0, 1), cg, sg);
      require_close(yg, y, 1e-6, 1e-6);
      Tensor dy = Tensor::randn(y.shape(), g, 0, 1, dt);
      y.backward(dy);
      yg.backward(dy.to(kGpu));
      require_close(xg.grad(), x.grad(), 1e-6, 1e-6);
    }
    // bf16: rotated in f32, rounded once.
    Tensor xb = Tensor::randn({l, t, d}, g).to(DType::bf16);
    Tensor want = rotary(xb.to(DType::f32), c, s).to(DType::bf16).to(DType::f32);
    require_close(rotary(xb.to(kGpu), cg, sg).to(Device::cpu()).to(DType::f32), want, 8e-3, 1e-6);
  }
  // The layers' q: a (B, H, T, d_h) view of the fused (B, T, 3, H, d_h) projection, read in place:
  // 16-byte groups (d_h 64: f32 2 pairs, bf16 4) and one pair at a time (d_h 6, 3 pairs a row),
  // for q and for k (a start inside the fused rows).
  for (int64_t dh : {64, 6}) {
    const int64_t b = 2, t = 5, h = 3;
    Tensor theta = Tensor::randn({t, dh / 2}, g) * 3.0;
    Tensor c = cos(theta), s = sin(theta);
    for (DType dt : {DType::f32, DType::bf16}) {
      for (int64_t which : {0, 1}) {
        INFO("d_h " << dh << " " << dtype_name(dt) << " part " << which);
        Tensor fused = Tensor::randn({b, t, 3, h, dh}, g).to(dt);
        Tensor q = fused.permute({2, 0, 3, 1, 4}).select(0, which);
        Tensor qg = fused.to(kGpu).permute({2, 0, 3, 1, 4}).select(0, which);
        Tensor want = rotary(q.to(DType::f32), c, s);
        if (dt == DType::bf16) want = want.to(DType::bf16).to(DType::f32);
        require_close(rotary(qg, c.to(kGpu), s.to(kGpu)).to(Device::cpu()).to(DType::f32), want,
                      dt == DType::bf16 ? 8e-3 : 1e-6, 1e-6);
      }
    }
  }
}

TEST_CASE("cross_entropy on the device matches the CPU with ignored rows and every reduction",
          "[cuda]") {
  Generator g(45);
  for (DType dt : {DType::f32, DType::f64}) {
    for (auto [n, c] : {std::array<int64_t, 2>{1, 1}, {5, 3}, {7, 33}, {4, 3000}, {0, 5}}) {
      for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
        INFO(dtype_name(dt) << " (" << n << ", " << c << ") reduction " << static_cast<int>(red));
        const double rel = dt == DType::f64 ? 1e-12 : 1e-5, abs = dt == DType::f64 ? 1e-14 : 1e-7;
        std::vector<int64_t> t(static_cast<size_t>(n));
        for (size_t i = 0; i < t.size(); ++i) t[i] = i % 3 == 1 ? -100 : (i * 5) % c;
        Tensor targets = Tensor::from_vector(t, {n});
        Tensor x = Tensor::randn({n, c}, g, 0, 3, dt).set_requires_grad();
        Tensor xg = x.detach().to(kGpu).set_requires_grad();
        Tensor loss = cross_entropy(x, targets, -100, red);
        Tensor lossg = cross_entropy(xg, targets.to(kGpu).to(DType::i32), -100, red);
        require_close(lossg, loss, rel, abs);
        Tensor dl = Tensor::randn(loss.shape(), g, 0, 1, dt);
        loss.backward(dl);
        lossg.backward(dl.to(kGpu));
        require_close(xg.grad(), x.grad(), rel, abs);
      }
    }
  }
  // Every row ignored: mean is 0 and the gradient is 0, as on the CPU.
  Tensor x = Tensor::randn({3, 4}, g).to(kGpu).set_requires_grad();
  Tensor t = Tensor::full({3}, -100, DType::i64, kGpu);
  Tensor loss = cross_entropy(x, t);
  REQUIRE(loss.item() == 0.0);
  loss.backward();
  require_equal(x.grad(), Tensor::zeros({3, 4}, DType::f32, kGpu));
}

TEST_CASE("cross_entropy on the device: rows with -inf, +inf and NaN logits as on the CPU",
          "[cuda]") {
  // The one-pass kernel's running maximum and rescaled sum, in 8-element vectors (64 classes) and
  // one at a time (37): a row of -inf logits is NaN, -inf logits elsewhere add nothing, +inf and
  // NaN make the row NaN — each thread's part as the CPU's two passes make it.
  Generator g(49);
  for (int64_t c : {64, 37}) {
    INFO(c << " classes");
    const int64_t n = 6;
    std::vector<float> v = Tensor::randn({n, c}, g, 0, 3).to_vector<float>();
    auto at = [&](int64_t i, int64_t j) -> float& { return v[size_t(i * c + j)]; };
    for (int64_t j = 0; j < c; ++j) at(0, j) = -INFINITY;      // every logit -inf
    for (int64_t j = 0; j < c; j += 2) at(1, j) = -INFINITY;   // half of them, the target not
    for (int64_t j = 0; j < c - 9; ++j) at(2, j) = -INFINITY;  // all but the last 9
    at(3, c / 2) = INFINITY;
    at(4, c - 1) = NAN;
    const Tensor x = Tensor::from_vector(v, {n, c});
    const Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 1, c - 1, 0, 0, 3}, {n});
    const Tensor want = cross_entropy(x, t, -100, Reduction::none);
    const Tensor got = cross_entropy(x.to(kGpu), t.to(kGpu), -100, Reduction::none);
    const std::vector<double> w = want.to_vector<double>(),
                              o = got.to(Device::cpu()).to_vector<double>();
    for (size_t i = 0; i < w.size(); ++i) {
      INFO("row " << i << ": got " << o[i] << ", want " << w[i]);
      REQUIRE(std::isnan(o[i]) == std::isnan(w[i]));
      REQUIRE(std::isinf(o[i]) == std::isinf(w[i]));
      if (std::isfinite(w[i])) REQUIRE(o[i] == Approx(w[i]).epsilon(1e-5));
    }
    REQUIRE(std::isnan(o[0]));
    REQUIRE(std::isfinite(o[1]));
    REQUIRE(std::isfinite(o[2]));
  }
}

TEST_CASE("cross_entropy on bf16 and f16 logits keeps f32 statistics", "[cuda]") {
  Generator g(46);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    Tensor x = Tensor::randn({6, 50}, g, 0, 2).to(dt);
    Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 49, -100, 7, 7, 3}, {6});
    Tensor xc = x.to(DType::f32).set_requires_grad();  // the same rounded logits in f32
    Tensor xg = x.to(kGpu).set_requires_grad();
    Tensor loss = cross_entropy(xc, targets), lossg = cross_entropy(xg, targets.to(kGpu));
    REQUIRE(lossg.dtype() == dt);
    // f32 statistics: only the final rounding to the half type differs.
    const double tol = dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
    require_close(lossg, loss, tol);
    loss.backward();
    lossg.backward();
    require_close(xg.grad(), xc.grad(), tol, 1e-3 * tol);
  }
}

TEST_CASE("under autocast 16-bit logits give the f32 loss with the bits of casting them first",
          "[cuda]") {
  // Autocast's loss in f32: the kernels read bf16 / f16 logits as they are and give the loss and
  // the logits' gradient the bits of the cast path (the logits converted to f32, exactly, the f32
  // kernels, the gradient rounded back), without the (N, C) conversion either way.
  Generator g(48);
  for (DType dt : {DType::bf16, DType::f16}) {
    // rows in 16-byte vectors (C % 8 == 0) and not; a row longer than a block; no row
    for (auto [n, c] : {std::array<int64_t, 2>{6, 64}, {5, 37}, {3, 1030}, {4, 2048}, {0, 8}}) {
      for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
        INFO(dtype_name(dt) << " (" << n << ", " << c << ") reduction " << static_cast<int>(red));
        std::vector<int64_t> tv(static_cast<size_t>(n));
        for (size_t i = 0; i < tv.size(); ++i) tv[i] = i % 3 == 1 ? -100 : (i * 7 + 3) % c;
        const Tensor t = Tensor::from_vector(tv, {n}).to(kGpu);
        const Tensor x0 = Tensor::randn({n, c}, g, 0, 3).to(dt).to(kGpu);
        Tensor xa = x0.clone().set_requires_grad(), xb = x0.clone().set_requires_grad();
        Tensor la = cross_entropy(xa.to(DType::f32), t, -100, red);  // the cast path by hand
        start_work_recording();
        Tensor lb;
        {
          Autocast ac(dt);
          lb = cross_entropy(xb, t, -100, red);
        }
        const Tensor dl = Tensor::randn(la.shape(), g).to(kGpu);
        lb.backward(dl);
        int conversions = 0;  // of the (N, C) logits or their gradient to or from f32
        for (const WorkRecord& r : stop_work_recording())
          conversions += r.op == "copy" && r.shape.rfind(shape_str({n, c}), 0) == 0 &&
                         r.shape.find("f32") != std::string::npos;
        REQUIRE(conversions == 0);
        la.backward(dl);
        REQUIRE(lb.dtype() == DType::f32);
        require_equal(lb, la);
        REQUIRE(xb.grad().dtype() == dt);
        require_equal(xb.grad(), xa.grad());
      }
    }
  }
}

TEST_CASE("the AdamW step on the device equals the CPU step bit for bit", "[cuda]") {
  Generator g(47);
  for (int64_t n : {1, 5, 1027, 70001}) {
    INFO("slab of " << n);
    Tensor p = Tensor::randn({n}, g), grad = Tensor::randn({n}, g, 0, 0.1);
    Tensor m = Tensor::randn({n}, g, 0, 0.01), v = scale(Tensor::rand({n}, g), 1e-4);
    // Decay on every element but each third (bit i % 8 of byte i / 8: decay_bit).
    std::vector<uint8_t> bits(static_cast<size_t>(decay_bits_bytes(n)), 0);
    for (int64_t i = 0; i < n; ++i)
      if (i % 3 != 0) bits[static_cast<size_t>(i / 8)] |= static_cast<uint8_t>(1u << (i % 8));
    Tensor mk = Tensor::from_vector(bits, {decay_bits_bytes(n)});
    Tensor pg = p.to(kGpu), mg = m.to(kGpu), vg = v.to(kGpu);
    AdamWStepScalars s;
    s.beta1 = 0.9;
    s.beta2 = 0.999;
    s.eps = 1e-6;
    for (int step = 1; step <= 3; ++step) {
      const double lr = 1e-3 * step;
      s.decay_factor = 1.0 - lr * 0.01;
      s.step_size = lr / (1.0 - std::pow(0.9, step));
      s.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(0.999, step));
      s.grad_scale = step == 2 ? 0.37 : 1.0;  // clipping's coefficient on one step
      adamw_kernel(Device::cpu(), p, grad, m, v, mk, s);
      adamw_kernel(kGpu, pg, grad.to(kGpu), mg, vg, mk.to(kGpu), s);
    }
    // The device controls of a graph's step (AdamW::step_on_device): clipped, then skipped.
    for (const double nonfinite : {0.0, 1.0}) {
      AdamWStepScalars d = s;
      d.clip_norm = 0.5;
      const std::vector<double> c = {0.99, 2e-3, 0.05, 4.0, nonfinite};  // norm 2: clipped
      d.controls = Tensor::from_vector(c, {5});
      adamw_kernel(Device::cpu(), p, grad, m, v, mk, d);
      d.controls = d.controls.to(kGpu);
      adamw_kernel(kGpu, pg, grad.to(kGpu), mg, vg, mk.to(kGpu), d);
    }
    require_equal(pg, p);
    require_equal(mg, m);
    require_equal(vg, v);
    // Only the elements whose bit is set decay: with no gradient and no moments, p = 1 becomes
    // the decay factor there and stays 1 elsewhere.
    AdamWStepScalars z;
    z.beta1 = 0.9;
    z.beta2 = 0.999;
    z.eps = 1e-6;
    z.decay_factor = 0.5;
    z.step_size = 1e-3;
    z.bias_correction2_sqrt = 1.0;
    for (Device dev : {Device::cpu(), kGpu}) {
      Tensor ones = Tensor::ones({n}).to(dev), zero = Tensor::zeros({n}).to(dev);
      adamw_kernel(dev, ones, zero, zero.clone(), zero.clone(), mk.to(dev), z);
      const std::vector<float> got = ones.to(Device::cpu()).to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        INFO(dev.str() << " element " << i);
        REQUIRE(got[static_cast<size_t>(i)] == (i % 3 != 0 ? 0.5f : 1.0f));
      }
    }
  }
}
