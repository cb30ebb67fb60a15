// Gradient-slab ops (see gradients.h): argument checks and the CPU kernels, one OpenMP pass each.
#include "ops/gradients.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/autograd.h"
#include "engine/cpu/parallel.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

void check_slab(const Tensor& x, const char* op) {
  ENGINE_CHECK(x.defined(), "[", op, "] got an undefined tensor");
  ENGINE_CHECK(is_floating(x.dtype()), "[", op, "] expects a floating tensor, got ", describe(x));
  ENGINE_CHECK(x.is_contiguous(), "[", op,
               "] expects a contiguous tensor (a gradient slab), got a strided ", describe(x));
}

}  // namespace

Tensor unscale_and_check_(const Tensor& grad, double inv_scale) {
  check_slab(grad, "unscale_and_check_");
  ENGINE_CHECK(std::isfinite(inv_scale) && inv_scale > 0,
               "[unscale_and_check_] inv_scale must be finite and > 0, got ", inv_scale);
  NoGrad ng;
  Tensor stats = Tensor::empty({2}, DType::f64, grad.device());
  unscale_check_kernel(grad.device(), grad, inv_scale, Tensor(), stats);
  return stats;
}

void unscale_and_check_(const Tensor& grad, const Tensor& inv_scale, const Tensor& stats) {
  check_slab(grad, "unscale_and_check_");
  const auto check_scalars = [&](const Tensor& t, int64_t n, const char* what) {
    ENGINE_CHECK(t.defined() && t.dtype() == DType::f64 && t.numel() == n && t.is_contiguous() &&
                     t.device() == grad.device(),
                 "[unscale_and_check_] ", what, " must be a contiguous (", n, ") f64 tensor on ",
                 grad.device().str(), ", got ",
                 t.defined() ? describe(t) : std::string("an undefined tensor"));
  };
  check_scalars(inv_scale, 1, "inv_scale");
  check_scalars(stats, 2, "stats");
  NoGrad ng;
  unscale_check_kernel(grad.device(), grad, 1.0, inv_scale, stats);
}

void scale_(const Tensor& grad, double factor) {
  check_slab(grad, "scale_");
  ENGINE_CHECK(std::isfinite(factor), "[scale_] factor must be finite, got ", factor);
  NoGrad ng;
  scale_kernel(grad.device(), grad, factor);
}

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {
namespace {

constexpr int64_t kParallelMin = ::engine::cpu::kParallelMinElems;  // engine/cpu/parallel.h
constexpr int64_t kChunk = 1 << 15;  // the fixed summation chunks (gradients.h)

void unscale_check(const Tensor& x, double inv_scale, const Tensor& inv_scale_device,
                   const Tensor& stats) {
  if (inv_scale_device.defined()) inv_scale = inv_scale_device.data<double>()[0];
  dispatch_floating(x.dtype(), "unscale_and_check_", [&]<class T>() {
    T* px = x.data<T>();
    const int64_t n = x.numel();
    const bool unscale = inv_scale != 1.0;
    const T f = static_cast<T>(inv_scale);
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
    std::vector<int64_t> bad(static_cast<size_t>(chunks), 0);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
      if (unscale)
        for (int64_t i = begin; i < end; ++i) px[i] *= f;
      double acc[4] = {0, 0, 0, 0};  // four chains hide the add latency
      int64_t nonfinite = 0;
      int64_t i = begin;
      for (; i + 4 <= end; i += 4)
        for (int k = 0; k < 4; ++k) {
          const double xv = static_cast<double>(px[i + k]);
          acc[k] += xv * xv;
          nonfinite += !std::isfinite(xv);
        }
      for (; i < end; ++i) {
        const double xv = static_cast<double>(px[i]);
        acc[0] += xv * xv;
        nonfinite += !std::isfinite(xv);
      }
      partial[static_cast<size_t>(c)] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      bad[static_cast<size_t>(c)] = nonfinite;
    }
    double total = 0;
    int64_t nonfinite = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      total += partial[static_cast<size_t>(c)];
      nonfinite += bad[static_cast<size_t>(c)];
    }
    double* out = stats.data<double>();
    out[0] = total;
    out[1] = static_cast<double>(nonfinite);
  });
}

void scale(const Tensor& x, double factor) {
  dispatch_floating(x.dtype(), "scale_", [&]<class T>() {
    T* px = x.data<T>();
    const int64_t n = x.numel();
    const T f = static_cast<T>(factor);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) px[i] *= f;
  });
}

}  // namespace
}  // namespace cpu

ENGINE_REGISTER_KERNEL(unscale_check_kernel, DeviceType::CPU, cpu::unscale_check);
ENGINE_REGISTER_KERNEL(scale_kernel, DeviceType::CPU, cpu::scale);

}  // namespace engine
