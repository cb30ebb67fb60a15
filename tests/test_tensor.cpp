// Tensor core: factories, dtypes, views without copies, contiguous(), printing, errors.
#include <catch2/catch.hpp>

#include "engine/engine.h"

using namespace engine;
using Catch::Contains;

TEST_CASE("factories, metadata and round trips", "[tensor]") {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(t.shape() == Shape{2, 3});
  REQUIRE(t.strides() == std::vector<int64_t>{3, 1});
  REQUIRE(t.numel() == 6);
  REQUIRE(t.dtype() == DType::f32);
  REQUIRE(t.device() == Device::cpu());
  REQUIRE(t.is_contiguous());
  REQUIRE(t.size(-1) == 3);
  REQUIRE(t.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  REQUIRE(Tensor::zeros({4}).to_vector<float>() == std::vector<float>(4, 0.f));
  REQUIRE(Tensor::full({2}, 2.5, DType::f64).to_vector<double>() == std::vector<double>{2.5, 2.5});
  REQUIRE(Tensor::arange(4, DType::i64).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  REQUIRE(Tensor::scalar(3.0).item() == 3.0);
  REQUIRE(Tensor::scalar(3.0).dim() == 0);
  REQUIRE(Tensor::empty({0, 3}).numel() == 0);
}

TEST_CASE("every dtype converts and round-trips", "[tensor]") {
  Tensor t = Tensor::from_vector<double>({-2.0, 0.5, 1.0, 3.0}, {4});
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    REQUIRE(t.to(dt).dtype() == dt);
    REQUIRE(t.to(dt).to_vector<double>() == t.to_vector<double>());  // all exactly representable
  }
  REQUIRE(t.to(DType::i32).to_vector<int32_t>() == std::vector<int32_t>{-2, 0, 1, 3});
  REQUIRE(t.to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{-2, 0, 1, 3});
  REQUIRE(Tensor::from_vector<double>({0.0, 1.0, 7.0}, {3}).to(DType::u8).to_vector<uint8_t>() ==
          std::vector<uint8_t>{0, 1, 7});
  REQUIRE(dtype_size(DType::bf16) == 2);
  REQUIRE(dtype_size(DType::i64) == 8);
}

TEST_CASE("bf16 and f16 round to nearest even", "[tensor]") {
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1).
  // 1 + 3 * 2^-9 is above the halfway point and rounds up.
  Tensor x =
      Tensor::from_vector<float>({1.0f + 1.0f / 256, 1.0f + 3.0f / 512, 65504.f, 1e-8f}, {4});
  std::vector<double> b = x.to(DType::bf16).to_vector<double>();
  REQUIRE(b[0] == 1.0);
  REQUIRE(b[1] == 1.0 + 1.0 / 128);
  std::vector<double> h = x.to(DType::f16).to_vector<double>();
  REQUIRE(h[2] == 65504.0);  // the largest finite half
  REQUIRE(h[3] == 0.0);      // below half's smallest subnormal (6e-8)
}

TEST_CASE("views share storage and do not copy", "[tensor]") {
  Tensor t = Tensor::arange(24, DType::f32).reshape({2, 3, 4});
  Tensor col = Tensor::arange(3, DType::f32).reshape({3, 1});
  auto& alloc = cpu_allocator();
  int64_t allocs = alloc.stats().num_allocs;

  Tensor tr = t.transpose(0, 2);  // (4, 3, 2)
  REQUIRE(tr.shape() == Shape{4, 3, 2});
  REQUIRE(tr.strides() == std::vector<int64_t>{1, 4, 12});
  REQUIRE(tr.shares_storage(t));
  REQUIRE_FALSE(tr.is_contiguous());

  Tensor p = t.permute({1, 2, 0});
  REQUIRE(p.shape() == Shape{3, 4, 2});
  Tensor s = t.slice(2, 1, 4, 2);  // columns 1 and 3
  REQUIRE(s.shape() == Shape{2, 3, 2});
  REQUIRE(s.storage_offset() == 1);
  REQUIRE(s.strides() == std::vector<int64_t>{12, 4, 2});
  Tensor e = col.expand({2, 3, 4});
  REQUIRE(e.strides() == std::vector<int64_t>{0, 1, 0});
  Tensor r = t.reshape({6, 4});
  REQUIRE(r.shares_storage(t));
  Tensor u = t.unsqueeze(1);
  REQUIRE(u.shape() == Shape{2, 1, 3, 4});
  REQUIRE(u.squeeze(1).shape() == t.shape());
  REQUIRE(t.select(1, -1).shape() == Shape{2, 4});
  REQUIRE(alloc.stats().num_allocs == allocs);  // none of the above allocated

  // Values seen through the views.
  REQUIRE(s.contiguous().to_vector<float>() ==
          std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23});
  REQUIRE(tr.contiguous().slice(0, 1, 2).reshape({6}).to_vector<float>() ==
          std::vector<float>{1, 13, 5, 17, 9, 21});
  REQUIRE(e.contiguous().slice(0, 1, 2).reshape({12}).to_vector<float>() ==
          std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2});
  REQUIRE(t.select(1, -1).contiguous().to_vector<float>() ==
          std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23});
}

TEST_CASE("reshape copies only when the strides forbid a view", "[tensor]") {
  Tensor t = Tensor::arange(12, DType::f32).reshape({3, 4});
  Tensor tt = t.transpose(0, 1);  // (4, 3), not contiguous
  Tensor flat = tt.reshape({12});
  REQUIRE_FALSE(flat.shares_storage(t));
  REQUIRE(flat.to_vector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  REQUIRE_THROWS_WITH(tt.view({12}), Contains("[view]") && Contains("without a copy"));
  // A split of a contiguous dim stays a view even on a transposed tensor.
  REQUIRE(tt.reshape({2, 2, 3}).shares_storage(t));
  REQUIRE(t.reshape({-1, 6}).shape() == Shape{2, 6});
  REQUIRE(t.flatten().shape() == Shape{12});
  REQUIRE_THROWS_WITH(t.reshape({5, -1}), Contains("[reshape]") && Contains("(3, 4)"));
  REQUIRE_THROWS_WITH(t.reshape({-1, -1}), Contains("only one dimension can be -1"));
}

TEST_CASE("contiguous, clone and in-place updates", "[tensor]") {
  Tensor t = Tensor::arange(6, DType::f32).reshape({2, 3});
  REQUIRE(t.contiguous().impl() == t.impl());
  Tensor c = t.clone();
  REQUIRE_FALSE(c.shares_storage(t));
  c.fill_(1.0);
  REQUIRE(t.to_vector<float>()[0] == 0.0f);
  t.slice(1, 0, 1).fill_(-1.0);  // writes through a view
  REQUIRE(t.to_vector<float>() == std::vector<float>{-1, 1, 2, -1, 4, 5});
  t.add_(Tensor::from_vector<float>({10, 20, 30}, {3}), 2.0);  // broadcast row
  REQUIRE(t.to_vector<float>() == std::vector<float>{19, 41, 62, 19, 44, 65});
  t.mul_(0.5);
  REQUIRE(t.to_vector<float>() == std::vector<float>{9.5, 20.5, 31, 9.5, 22, 32.5});
  Tensor d = Tensor::empty({2, 3}, DType::f64);
  d.copy_(Tensor::from_vector<float>({1, 2, 3}, {3}));
  REQUIRE(d.to_vector<double>() == std::vector<double>{1, 2, 3, 1, 2, 3});
}

TEST_CASE("printing", "[tensor]") {
  Tensor t = Tensor::from_vector<float>({1, -2.5, 3, 4}, {2, 2});
  std::string s = t.str();
  REQUIRE_THAT(s, Contains("[[ 1.0000, -2.5000]") && Contains("[ 3.0000,  4.0000]]"));
  REQUIRE_THAT(s, Contains("shape=(2, 2)") && Contains("dtype=f32") && Contains("device=cpu"));
  REQUIRE_THAT(Tensor::arange(3, DType::i64).str(), Contains("[0, 1, 2]"));
  REQUIRE_THAT(Tensor::zeros({100, 100}).str(), Contains("..."));
  REQUIRE_THAT(Tensor::scalar(1e-7, DType::f64).str(), Contains("e-07"));
  REQUIRE(Tensor().str() == "tensor(undefined)");
}

TEST_CASE("tensor errors name the op and what was expected", "[tensor][errors]") {
  Tensor t = Tensor::zeros({2, 3});
  REQUIRE_THROWS_WITH(t.transpose(0, 2), Contains("[transpose] dim 2 is out of range"));
  REQUIRE_THROWS_WITH(t.permute({0, 0}), Contains("[permute] dim 0 repeated"));
  REQUIRE_THROWS_WITH(t.expand({4, 3}), Contains("[expand]") && Contains("(2, 3)"));
  REQUIRE_THROWS_WITH(t.squeeze(0), Contains("[squeeze]") && Contains("expected 1"));
  REQUIRE_THROWS_WITH(t.slice(1, 0, 2, 0), Contains("[slice] step must be >= 1"));
  REQUIRE_THROWS_WITH(t.select(0, 5), Contains("[select] index 5 is out of range"));
  REQUIRE_THROWS_WITH(t.item(), Contains("[item] expected a one-element tensor"));
  REQUIRE_THROWS_WITH(t.data<double>(), Contains("expected dtype f64") && Contains("f32"));
  REQUIRE_THROWS_WITH(Tensor().shape(), Contains("undefined tensor"));
  REQUIRE_THROWS_WITH((Tensor::from_vector<float>({1, 2}, {3})),
                      Contains("[from_vector] 2 values"));
  REQUIRE_THROWS_WITH(Tensor::empty({2, -1}), Contains("[empty] negative dimension"));
  REQUIRE_THROWS_WITH(Tensor::empty({int64_t{1} << 40, int64_t{1} << 40}), Contains("too large"));
  REQUIRE_THROWS_WITH(Tensor::empty({int64_t{1} << 45}, DType::f64),
                      Contains("[alloc] out of CPU memory"));
  REQUIRE_THROWS_WITH(t.copy_(Tensor::zeros({4})), Contains("[copy_]") && Contains("broadcast"));
  REQUIRE_THROWS_WITH(t.add_(Tensor::zeros({3}, DType::f64)), Contains("[add_] dtype mismatch"));
  Tensor ints = Tensor::zeros({2}, DType::i32);
  REQUIRE_THROWS_WITH(ints.set_requires_grad(), Contains("only floating tensors can require grad"));
}

TEST_CASE("the CPU allocator reuses large blocks of the same size", "[tensor][allocator]") {
  Allocator& a = cpu_allocator();
  const void* first = nullptr;
  {
    // 3 MiB + 5 x 64 KiB: above the cache's minimum, a size no other test uses.
    Tensor big = Tensor::empty({(3 << 20) + 5 * 65536}, DType::u8);
    first = big.raw_data();
    REQUIRE(reinterpret_cast<uintptr_t>(first) % kCpuAlignment == 0);
  }
  const AllocatorStats warm = a.stats();
  REQUIRE(warm.reserved_bytes >= warm.live_bytes + (3 << 20));  // the block stays cached
  {
    Tensor again = Tensor::empty({(3 << 20) + 5 * 65536}, DType::u8);
    REQUIRE(again.raw_data() == first);
    REQUIRE(a.stats().driver_allocs == warm.driver_allocs);
    REQUIRE(a.stats().live_bytes == warm.live_bytes + (3 << 20) + 5 * 65536);
    // Another size (one no other test uses): a new block.
    Tensor other = Tensor::empty({(5 << 20) + 3 * 65536 + 7}, DType::u8);
    REQUIRE(a.stats().driver_allocs == warm.driver_allocs + 1);
  }
  REQUIRE(a.stats().live_bytes == warm.live_bytes);
}

TEST_CASE("a CUDA device in a build or machine without one is a clear error", "[tensor][errors]") {
  if (cuda_available()) return;  // covered by the [cuda] tests on a GPU machine
  REQUIRE_THROWS_WITH(
      Tensor::zeros({2}).to(Device::cuda()),
      Contains("[device]") && (Contains("without cuda") || Contains("does not exist")));
}

TEST_CASE("the CPU allocator is aligned and counts live and peak bytes", "[tensor][allocator]") {
  Allocator& a = cpu_allocator();
  a.reset_peak();
  int64_t live0 = a.stats().live_bytes;
  {
    Tensor big = Tensor::empty({1000}, DType::f64);
    REQUIRE(reinterpret_cast<uintptr_t>(big.raw_data()) % kCpuAlignment == 0);
    REQUIRE(a.stats().live_bytes == live0 + 8000);
    Tensor view = big.slice(0, 10, 20);  // no new bytes
    REQUIRE(a.stats().live_bytes == live0 + 8000);
  }
  REQUIRE(a.stats().live_bytes == live0);
  REQUIRE(a.stats().peak_bytes >= live0 + 8000);
  a.reset_peak();
  REQUIRE(a.stats().peak_bytes == live0);
}
