// [cuda] sample_categorical and replace_tokens on the device against the CPU backend, bit for bit
// (the same Philox words and the same first-argmax rule): rows shorter than a warp, longer than a
// block, a BERT-sized vocabulary, f32 / f64 / bf16 logits, ties, padding masks.
#include <catch2/catch.hpp>

#include <limits>
#include <vector>

#include "cuda_test_support.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_equal;

TEST_CASE("sample_categorical on the device draws the CPU's classes", "[cuda]") {
  Generator init(51);
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (auto [n, c] :
         {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {4, 300}, {2, 30522}, {130, 33}}) {
      INFO(dtype_name(dt) << " " << n << " x " << c);
      Tensor logits = Tensor::randn({n, c}, init, 0.0, 2.0).to(dt);
      Generator a(3), b(3);
      a.set_state({123, 9});
      b.set_state({123, 9});
      // The CPU computes in f32 / f64: bf16 logits reach it as the f32 values they hold.
      Tensor cpu = sample_categorical(dt == DType::bf16 ? logits.to(DType::f32) : logits, 1.0, a);
      Tensor gpu = sample_categorical(logits.to(kGpu), 1.0, b);
      REQUIRE(a.offset() == b.offset());
      require_equal(gpu, cpu);
    }
  }
  // No score above -inf: column 0 on both.
  Tensor flat = Tensor::full({2, 70}, -std::numeric_limits<float>::infinity());
  Generator a(1), b(1);
  require_equal(sample_categorical(flat.to(kGpu), 1.0, b), sample_categorical(flat, 1.0, a));
}

TEST_CASE("replace_tokens on the device equals the CPU", "[cuda]") {
  const int64_t b = 3, t = 37;
  std::vector<int64_t> ids(size_t(b * t)), mask(size_t(b * t), 1);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 7 % 50);
  for (int64_t j = 30; j < t; ++j) mask[size_t(2 * t + j)] = 0;
  std::vector<int64_t> pos, val, orig;
  for (int64_t p = 1; p < b * t; p += 6) {
    pos.push_back(p);
    val.push_back(p % 3 == 0 ? ids[size_t(p)] : (p * 11) % 50);
    orig.push_back(ids[size_t(p)]);
  }
  const int64_t m = int64_t(pos.size());
  Tensor ti = Tensor::from_vector(ids, {b, t}), tm = Tensor::from_vector(mask, {b, t});
  Tensor tp = Tensor::from_vector(pos, {m}), tv = Tensor::from_vector(val, {m}),
         to = Tensor::from_vector(orig, {m});
  for (bool with_mask : {true, false}) {
    INFO("mask " << with_mask);
    ReplacedTokens cpu = replace_tokens(ti, with_mask ? tm : Tensor(), tp, tv, to);
    ReplacedTokens gpu = replace_tokens(ti.to(kGpu), with_mask ? tm.to(kGpu) : Tensor(),
                                        tp.to(kGpu), tv.to(kGpu), to.to(kGpu));
    require_equal(gpu.ids, cpu.ids);
    require_equal(gpu.labels, cpu.labels);
  }
}
