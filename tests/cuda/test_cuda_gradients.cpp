// [cuda] The gradient-slab ops of the training step on the device against the CPU: the statistics
// (sum of squares within rounding of the CPU's double sum, the non-finite count exactly),
// unscaling and clipping element for element.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "engine/backend.h"
#include "ops/ops.h"

using namespace engine;

namespace {
const Device kGpu = Device::cuda(0);
}

// unscale_and_check_ launches min(1024, ceil(n / 256)) blocks of 256 threads: the largest size
// fills the whole grid and loops over it. Under ThreadSanitizer (build-emu-tsan) the emulator's
// fiber switches cost ~0.2 ms each, ~46 s for a full grid's call, so TSan (which looks for races
// between a block's threads, the same shared-memory reductions at every size) leaves that size
// out; every other build and fiber order runs all four.
#if defined(__SANITIZE_THREAD__)
constexpr int64_t kSizes[] = {1, 31, 1000};
#else
constexpr int64_t kSizes[] = {1, 31, 1000, 300001};
#endif

TEST_CASE("unscale_and_check_ and scale_ on the device agree with the CPU", "[cuda]") {
  Generator g(8);
  // Sizes below a block, not a multiple of the warp, and above the grid's reach (1024 x 256).
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    Tensor h = Tensor::randn({n}, g, 0, 0.1);
    Tensor d = h.to(kGpu);
    const std::vector<double> hs = unscale_and_check_(h, 0.25).to_vector<double>();
    const std::vector<double> ds = unscale_and_check_(d, 0.25).to_vector<double>();
    REQUIRE(ds[0] == Approx(hs[0]).epsilon(1e-12));  // double sums in another order
    REQUIRE(ds[1] == 0.0);
    REQUIRE(d.to_vector<float>() == h.to_vector<float>());  // the same f32 multiply
    scale_(h, 0.3);
    scale_(d, 0.3);
    REQUIRE(d.to_vector<float>() == h.to_vector<float>());
  }
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  Tensor bad = Tensor::from_vector<float>({1, inf, nan, 2, -inf}, {5}).to(kGpu);
  REQUIRE(unscale_and_check_(bad).to_vector<double>()[1] == 3.0);
}

TEST_CASE(
    "unscale_and_check_ with its factor in device memory agrees with the CPU and the host "
    "factor",
    "[cuda]") {
  // The trainer's step block: the factor read where the kernel runs, the statistics written into
  // a slice of the block. Factor 1 skips the unscaling, as the host factor does.
  Generator g(9);
  for (const double factor : {0.125, 1.0}) {
    INFO("factor " << factor);
    Tensor h = Tensor::randn({1000}, g, 0, 0.1);
    Tensor d = h.to(kGpu), d_host = h.to(kGpu);
    Tensor block_h = Tensor::from_vector<double>({factor, -1, -1, 7}, {4});
    Tensor block_d = block_h.to(kGpu);
    unscale_and_check_(h, block_h.slice(0, 0, 1), block_h.slice(0, 1, 3));
    unscale_and_check_(d, block_d.slice(0, 0, 1), block_d.slice(0, 1, 3));
    const std::vector<double> want = unscale_and_check_(d_host, factor).to_vector<double>();
    const std::vector<double> got = block_d.to_vector<double>(), cpu = block_h.to_vector<double>();
    REQUIRE(got[1] == want[0]);  // the same kernel as the host factor's: the same bits
    REQUIRE(got[1] == Approx(cpu[1]).epsilon(1e-12));
    REQUIRE(got[2] == 0.0);
    REQUIRE(cpu[2] == 0.0);
    REQUIRE(got[3] == 7.0);  // nothing written past the statistics
    REQUIRE(d.to_vector<float>() == h.to_vector<float>());
    REQUIRE(d.to_vector<float>() == d_host.to_vector<float>());
  }
}
