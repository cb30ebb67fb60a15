// Finite-difference gradient checking for tests, in f64 on the CPU.
//
// For f: inputs -> output, draws a fixed random cotangent w of the output's shape and compares
// the analytic gradients of <w, f(inputs)> (one backward) with central differences
// (<w, f(x + eps e_j)> - <w, f(x - eps e_j)>) / 2 eps for every element of every input that
// requires grad. The error reported is the relative error ||analytic - numeric|| / ||numeric||
// per input (absolute where the numeric gradient is ~0).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace engine::testing {

struct GradcheckReport {
  double max_rel_error = 0;
  std::string detail;  // per-input errors, for the failure message
};

using TestFn = std::function<Tensor(const std::vector<Tensor>&)>;

GradcheckReport gradcheck(const TestFn& f, const std::vector<Tensor>& inputs, double eps = 1e-6);

// A random f64 tensor with requires_grad set (values in N(0, 1), fixed seed per call site).
Tensor rand_input(const Shape& shape, uint64_t seed, bool requires_grad = true);

}  // namespace engine::testing
