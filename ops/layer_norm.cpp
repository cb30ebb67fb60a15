// Layer norm: argument checks, autograd wiring and the CPU kernels.
#include "ops/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/cpu/chunk_sums.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/scratch.h"
#include "engine/cpu/vmath.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "ops/dropout_add_layer_norm.h"

namespace engine {
namespace {

void check_param(const Tensor& x, const Tensor& p, const char* what) {
  if (!p.defined()) return;
  const int64_t c = x.shape().back();
  ENGINE_CHECK(p.dim() == 1 && p.size(0) == c, "[layer_norm] input ", describe(x),
               " does not match ", what, " ", describe(p), ": expected ", what, " of shape (", c,
               ")");
  ENGINE_CHECK(p.dtype() == x.dtype(), "[layer_norm] ", what, " ", describe(p),
               " does not match the dtype of input ", describe(x), " (convert one with .to())");
  ENGINE_CHECK(p.device() == x.device(), "[layer_norm] ", what, " ", describe(p),
               " is not on the device of input ", describe(x));
}

struct LayerNormNode : Node {
  Tensor x;           // (..., C) contiguous input
  Tensor weight;      // (C) or undefined
  Tensor mean, rstd;  // (R) per-row statistics from the forward
  const char* name() const override { return "layer_norm"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    // On a device: the join's backward kernel (layer_norm_backward_one_pass): x's gradient and
    // the parameter gradients in one pass over x and dy, the f32 sinks written where their zero
    // was deferred (no fill first).
    if (!x.device().is_cpu())
      return layer_norm_backward_one_pass(*this, x, weight, mean, rstd, grads[0], 0.0, {});
    Tensor dx, dw, db;
    if (needs_input_grad(0)) dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    // A parameter's gradient added in f32 into the f32 .grad behind autocast's cast of it when
    // the engine offers that (no 16-bit gradient, no separate add).
    const Tensor* w32 = grad_sink_f32(1);
    const Tensor* b32 = grad_sink_f32(2);
    if (w32)
      dw = *w32;
    else if (needs_input_grad(1))
      dw = Tensor::empty(inputs[1].shape, x.dtype(), x.device());
    if (b32)
      db = *b32;
    else if (needs_input_grad(2))
      db = Tensor::empty(inputs[2].shape, x.dtype(), x.device());
    layer_norm_backward_kernel(x.device(), x, weight, mean, rstd, grads[0].contiguous(), dx, dw,
                               db);
    return {dx, w32 ? Tensor() : dw, b32 ? Tensor() : db};
  }
  void release_saved() override { x = weight = mean = rstd = Tensor(); }
};

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {

constexpr int64_t kParallelElems = ::engine::cpu::kParallelMinElems;  // engine/cpu/parallel.h
// dweight/dbias are summed per chunk of rows, then the chunks in order: the chunk boundaries
// depend only on the row count, so the result is bitwise the same for any number of threads.
constexpr int64_t kMaxChunks = 64;

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  dispatch_floating(x.dtype(), "layer_norm", [&]<class T>() {
    // On the CPU the statistics dtype equals the compute type (f32 -> f32, f64 -> f64).
    const int64_t c = x.shape().back();
    const int64_t rows = x.numel() / c;
    const T* px = x.data<T>();
    const T* pw = weight.defined() ? weight.data<T>() : nullptr;
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;
    T* py = y.data<T>();
    T* pmean = mean.data<T>();
    T* prstd = rstd.data<T>();
#pragma omp parallel for if (rows * c > kParallelElems)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = px + r * c;
      T* yr = py + r * c;
      // Two passes (mean, then squared deviations): no cancellation as in E[x^2] - E[x]^2.
      const T mu = engine::cpu::row_sum(xr, c) / T(c);
      const T v = engine::cpu::row_sum_sq_dev(xr, mu, c);
      const T rs = T(1) / std::sqrt(v / T(c) + T(eps));
      pmean[r] = mu;
      prstd[r] = rs;
      if (pw && pb) {  // the usual affine case as one vectorisable loop
        for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - mu) * rs * pw[j] + pb[j];
      } else {
        for (int64_t j = 0; j < c; ++j) {
          T h = (xr[j] - mu) * rs;
          if (pw) h *= pw[j];
          if (pb) h += pb[j];
          yr[j] = h;
        }
      }
    }
  });
}

void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias) {
  dispatch_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
    const int64_t c = x.shape().back();
    const int64_t rows = x.numel() / c;
    const T* px = x.data<T>();
    const T* pw = weight.defined() ? weight.data<T>() : nullptr;
    const T* pmean = mean.data<T>();
    const T* prstd = rstd.data<T>();
    const T* pg = dy.data<T>();
    T* pdx = dx.defined() ? dx.data<T>() : nullptr;
    const bool want_w = dweight.defined(), want_b = dbias.defined();
    const int64_t chunks = std::min(rows, kMaxChunks);
    // Per-chunk partial sums in double: sums over many rows (B * T) lose little even for f32.
    const int64_t part_size = (want_w + want_b) * chunks * c;
    std::vector<double> fresh;
    double* part = ::engine::cpu::thread_scratch<double, 0>(part_size, fresh);
    std::fill(part, part + part_size, 0.0);
    double* part_w = want_w ? part : nullptr;
    double* part_b = want_b ? part + (want_w ? chunks * c : 0) : nullptr;
#pragma omp parallel for schedule(static) if (rows * c > kParallelElems)
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t r0 = rows * k / chunks, r1 = rows * (k + 1) / chunks;
      double* acc_w = want_w ? part_w + k * c : nullptr;
      double* acc_b = want_b ? part_b + k * c : nullptr;
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = px + r * c;
        const T* gr = pg + r * c;
        const T mu = pmean[r], rs = prstd[r];
        T* dr = pdx ? pdx + r * c : nullptr;
        if (!dr) {
          // Branch-free loops so they vectorise.
          if (acc_w)
            for (int64_t j = 0; j < c; ++j)
              acc_w[j] += static_cast<double>(gr[j] * ((xr[j] - mu) * rs));
          if (acc_b)
            for (int64_t j = 0; j < c; ++j) acc_b[j] += static_cast<double>(gr[j]);
          continue;
        }
        // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * weight.
        // One pass reads x and dy once for the weight and bias sums, dxhat (into dx's row: dx
        // never aliases dy or x) and both row means; a second turns dxhat into dx.
        // SIMD reductions: a fixed lane order for a given build, so still deterministic.
        T sum_g = 0, sum_gx = 0;
        if (acc_w && acc_b && pw) {
#pragma omp simd reduction(+ : sum_g, sum_gx)
          for (int64_t j = 0; j < c; ++j) {
            const T xh = (xr[j] - mu) * rs, g = gr[j], d = g * pw[j];
            acc_w[j] += static_cast<double>(g * xh);
            acc_b[j] += static_cast<double>(g);
            dr[j] = d;
            sum_g += d;
            sum_gx += d * xh;
          }
        } else {
          if (acc_w)
            for (int64_t j = 0; j < c; ++j)
              acc_w[j] += static_cast<double>(gr[j] * ((xr[j] - mu) * rs));
          if (acc_b)
            for (int64_t j = 0; j < c; ++j) acc_b[j] += static_cast<double>(gr[j]);
          if (pw)
            for (int64_t j = 0; j < c; ++j) dr[j] = gr[j] * pw[j];
          else
            std::copy(gr, gr + c, dr);
#pragma omp simd reduction(+ : sum_g, sum_gx)
          for (int64_t j = 0; j < c; ++j) {
            sum_g += dr[j];
            sum_gx += dr[j] * ((xr[j] - mu) * rs);
          }
        }
        const T mean_g = sum_g / T(c), mean_gx = sum_gx / T(c);
        for (int64_t j = 0; j < c; ++j)
          dr[j] = rs * (dr[j] - mean_g - ((xr[j] - mu) * rs) * mean_gx);
      }
    }
    if (want_w) ::engine::cpu::sum_chunks_in_order(part_w, chunks, c, dweight.data<T>());
    if (want_b) ::engine::cpu::sum_chunks_in_order(part_b, chunks, c, dbias.data<T>());
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(layer_norm_forward_kernel, DeviceType::CPU, cpu::layer_norm_forward);
ENGINE_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::CPU, cpu::layer_norm_backward);

}  // namespace

DType layer_norm_stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

Tensor layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, double eps) {
  ENGINE_CHECK(x_in.defined(), "[layer_norm] got an undefined input");
  // Autocast: the compute dtype throughout (the kernels keep the statistics in f32).
  const Tensor x = autocast_to_compute(x_in), weight = autocast_to_compute(weight_in),
               bias = autocast_to_compute(bias_in);
  ENGINE_CHECK(is_floating(x.dtype()), "[layer_norm] expects a floating input, got ", describe(x));
  ENGINE_CHECK(x.dim() >= 1 && x.shape().back() > 0,
               "[layer_norm] expects a non-empty last dim to normalise over, got ", describe(x));
  ENGINE_CHECK(eps >= 0, "[layer_norm] eps must be >= 0, got ", eps);
  check_param(x, weight, "weight");
  check_param(x, bias, "bias");

  const int64_t rows = x.numel() / x.shape().back();
  Tensor xc = x.detach().contiguous();
  Tensor wc = weight.defined() ? weight.detach().contiguous() : Tensor();
  Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const DType sd = layer_norm_stats_dtype(x.dtype());
  Tensor mean = Tensor::empty({rows}, sd, x.device());
  Tensor rstd = Tensor::empty({rows}, sd, x.device());
  layer_norm_forward_kernel(x.device(), xc, wc, bc, eps, y, mean, rstd);
  if (needs_grad(x, weight, bias)) {
    auto n = std::make_shared<LayerNormNode>();
    n->x = xc;
    n->weight = wc;  // read by dx (dxhat = dy * weight) even when the weight needs no gradient
    n->mean = mean;
    n->rstd = rstd;
    record(n, {x, weight, bias}, {y});
  }
  return y;
}

}  // namespace engine
