// Shared by the [cuda] parity tests: the device they run on and the closeness checks.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/module.h"
#include "engine/tensor.h"
#include "engine/work_log.h"

namespace engine::testing {

inline const Device kGpu = Device::cuda(0);

// The adds into an (n) f32 gradient among recorded work: autocast's f32 += 16-bit of a parameter
// gradient that did not go into its f32 .grad itself.
inline int slab_adds(const std::vector<WorkRecord>& work, int64_t n) {
  int adds = 0;
  for (const WorkRecord& r : work)
    adds += r.op == "add_" && r.shape.rfind("(" + std::to_string(n) + ") f32", 0) == 0;
  return adds;
}

// t rounded to bf16 and back to f32: the operands a bf16 run saw, for the CPU's f32 reference.
inline Tensor bf16_rounded(const Tensor& t) { return t.to(DType::bf16).to(DType::f32); }

// value as an f32 leaf on the device whose .grad is already held (a view of FlatParameters'
// slab): what autocast's casts of a model's parameters sit in front of.
inline Tensor leaf_holding_grad(const Tensor& value, const Tensor& held) {
  Tensor t = value.to(kGpu).set_requires_grad();
  t.set_grad(held.contiguous().to(kGpu));
  return t;
}

// Requires |got - want| <= rel |want| + abs + scaled * max |want| for every element (both moved
// to the CPU in f64). The `scaled` term is for results whose elements cancel (GEMM sums, the
// gradients of softmax and layer_norm): a sum taken in another order moves a small element by
// more than its own relative tolerance, but not by more than a fraction of the largest one.
inline void require_close(const Tensor& got, const Tensor& want, double rel, double abs = 0.0,
                          double scaled = 0.0) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = got.to(Device::cpu()).to(DType::f64).to_vector<double>();
  const std::vector<double> w = want.to(Device::cpu()).to(DType::f64).to_vector<double>();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  // The message is built for the first element that fails only (formatting one per element was
  // most of the time of the large cases).
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - w[i]) <= rel * std::abs(w[i]) + abs + scaled * scale) continue;
    INFO("element " << i << ": got " << g[i] << ", want " << w[i] << " (max " << scale << ")");
    REQUIRE(std::abs(g[i] - w[i]) <= rel * std::abs(w[i]) + abs + scaled * scale);
  }
  SUCCEED();
}

// The same values bit for bit (compared as f64 on the CPU; NaNs must match as NaNs).
inline void require_equal(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const std::vector<double> g = got.to(Device::cpu()).to(DType::f64).to_vector<double>();
  const std::vector<double> w = want.to(Device::cpu()).to(DType::f64).to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) continue;
    INFO("element " << i << ": got " << g[i] << ", want " << w[i]);
    REQUIRE((g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))));
  }
  SUCCEED();
}

// Every parameter gradient of the model on the device against the CPU model's (the same names
// in the same order), within 1e-5 relative plus 1e-5 of the tensor's largest magnitude (sums that
// cancel) and 1e-10 absolute (gradients that are zero in exact arithmetic).
inline void require_same_gradients(const Module& gpu, const Module& cpu) {
  const NamedTensors pa = cpu.named_parameters(), pb = gpu.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO("gradient of " << pa[i].first);
    REQUIRE(pb[i].first == pa[i].first);
    require_close(pb[i].second.grad(), pa[i].second.grad(), 1e-5, 1e-10, 1e-5);
  }
}

}  // namespace engine::testing
