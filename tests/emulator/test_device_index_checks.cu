// Device-side index checks: the ops never read device ids back on the host to check them, so a
// kernel that meets an index outside its table must trap (the launch faults with a sticky
// error) instead of reading or writing out of bounds. Each case launches the op on the emulated
// device with one bad index and expects the fault, then clears it.
#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "emu/runtime.h"
#include "ops/ops.h"

using namespace engine;

namespace {

const Device kGpu = Device::cuda(0);

void expect_trap(const char* kernel_piece) {
  const cudaError_t e = cudaDeviceSynchronize();
  REQUIRE(e == cudaErrorLaunchFailure);
  const std::string text = cudaGetErrorString(e);
  INFO(text);
  CHECK(text.find("__trap()") != std::string::npos);
  CHECK(text.find(kernel_piece) != std::string::npos);
  emu::clear_sticky_error();
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

}  // namespace

TEST_CASE("an out-of-range id traps in the device gather and scatter-add", "[emulator]") {
  Tensor table = Tensor::zeros({5, 3}, DType::f32, kGpu).set_requires_grad();
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 9, 2}, {3}).to(kGpu);
  Tensor y = embedding(table, ids);
  expect_trap("gather_rows_elems");
  y.backward(Tensor::ones({3, 3}, DType::f32, kGpu));
  expect_trap("scatter_add_rows_cols");
}

TEST_CASE("an out-of-range bucket traps in relative_gather and relative_scatter", "[emulator]") {
  Tensor index = Tensor::from_vector(std::vector<int64_t>{0, 1, 7, 2}, {2, 2}).to(kGpu);
  Tensor x = Tensor::zeros({1, 2, 5}, DType::f32, kGpu);
  Tensor y = relative_gather(x, index);
  expect_trap("relative_gather_elems");
  Tensor s = relative_scatter(Tensor::zeros({1, 2, 2}, DType::f32, kGpu), index, 5);
  expect_trap("relative_invert_index");
}

TEST_CASE("a target outside the classes traps in cross_entropy", "[emulator]") {
  Tensor logits = Tensor::zeros({2, 5}, DType::f32, kGpu);
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 50}, {2}).to(kGpu);
  Tensor loss = cross_entropy(logits, targets);
  expect_trap("cross_entropy_rows");
}
