// Eigen-backed implementations of engine/cpu/vmath.h.
#include "engine/cpu/vmath.h"

#include <Eigen/Core>
#include <cmath>
#include <limits>

namespace engine::cpu {
namespace {
using ArrayF = Eigen::Array<float, Eigen::Dynamic, 1>;
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

// y = exp(x - shift) by Eigen's SIMD exp (Eigen's select() is not SIMD, so no select around it).
// Eigen clamps exp's argument near -88, so exp(-inf) (a masked logit) comes out ~4e-39 instead of
// 0: callers flush every result below FLT_MIN with flushed() in their own pass over y, which gives
// exact zeros for masked entries and changes a true exp(x < -87) by less than 1e-38 next to a row
// sum >= 1.
void eigen_exp_shifted(const float* x, float shift, float* y, int64_t n) {
  Eigen::Map<ArrayF>(y, n) = (Eigen::Map<const ArrayF>(x, n) - shift).exp();
}
inline float flushed(float v) { return v < std::numeric_limits<float>::min() ? 0.0f : v; }
}  // namespace

template <>
float row_max<float>(const float* x, int64_t n) {
  if (n == 0) return kNegInfF;
  return Eigen::Map<const ArrayF>(x, n).maxCoeff();
}
template <>
double row_max<double>(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

template <>
float exp_shifted<float>(const float* x, float shift, float* y, int64_t n) {
  eigen_exp_shifted(x, shift, y, n);
  for (int64_t j = 0; j < n; ++j) y[j] = flushed(y[j]);
  return Eigen::Map<const ArrayF>(y, n).sum();
}
template <>
double exp_shifted<double>(const double* x, double shift, double* y, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) {
    y[j] = std::exp(x[j] - shift);
    s += y[j];
  }
  return s;
}

template <>
void exp_shifted_scaled<float>(const float* x, float shift, float scale, float* y, int64_t n) {
  eigen_exp_shifted(x, shift, y, n);
  for (int64_t j = 0; j < n; ++j) y[j] = flushed(y[j]) * scale;
}
template <>
void exp_shifted_scaled<double>(const double* x, double shift, double scale, double* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = std::exp(x[j] - shift) * scale;
}

template <>
double sum_exp_shifted<float>(const float* x, float shift, int64_t n) {
  // Blocks of 1024 summed in f32 by SIMD lanes, the blocks in double.
  double s = 0;
  for (int64_t j = 0; j < n; j += 1024) {
    int64_t m = n - j < 1024 ? n - j : 1024;
    s += static_cast<double>((Eigen::Map<const ArrayF>(x + j, m) - shift).exp().sum());
  }
  return s;
}
template <>
double sum_exp_shifted<double>(const double* x, double shift, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - shift);
  return s;
}

template <class T>
T row_sum(const T* x, int64_t n) {
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  return n ? Eigen::Map<const A>(x, n).sum() : T(0);
}
template <class T>
T row_sum_sq_dev(const T* x, T mu, int64_t n) {
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  return n ? (Eigen::Map<const A>(x, n) - mu).square().sum() : T(0);
}
template float row_sum<float>(const float*, int64_t);
template double row_sum<double>(const double*, int64_t);
template float row_sum_sq_dev<float>(const float*, float, int64_t);
template double row_sum_sq_dev<double>(const double*, double, int64_t);

}  // namespace engine::cpu
