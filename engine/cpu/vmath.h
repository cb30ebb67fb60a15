// Vectorised row math for CPU kernels. f32 goes through Eigen's SIMD exp; f64 keeps the std::
// functions (the f64 gradient checks compare against finite differences at 1e-6 and need them
// exact). Compiled in one translation unit so kernels do not pay for Eigen's headers.
#pragma once

#include <cstdint>

namespace engine::cpu {

// max over x[0..n) (-inf for n == 0).
template <class T>
T row_max(const T* x, int64_t n);

// y[j] = exp(x[j] - shift), with exp(-inf) exactly 0; returns sum_j y[j]. y may alias x.
template <class T>
T exp_shifted(const T* x, T shift, T* y, int64_t n);

// y[j] = exp_shifted's y[j] * scale, in two passes instead of exp_shifted's three and a fourth to
// scale (the rows are a softmax's backward: no sum needed). Same bits as exp_shifted, then *=.
template <class T>
void exp_shifted_scaled(const T* x, T shift, T scale, T* y, int64_t n);

// sum_j exp(x[j] - shift) without storing it, accumulated in double.
template <class T>
double sum_exp_shifted(const T* x, T shift, int64_t n);

// sum_j x[j], and sum_j (x[j] - mu)^2, in SIMD lanes (a fixed order: deterministic).
template <class T>
T row_sum(const T* x, int64_t n);
template <class T>
T row_sum_sq_dev(const T* x, T mu, int64_t n);

}  // namespace engine::cpu
