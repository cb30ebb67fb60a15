// Elementwise ops: shape/dtype checks, autograd wiring and the CPU kernels.
#include "ops/elementwise.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <unsupported/Eigen/SpecialFunctions>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/cpu/chunk_sums.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/scratch.h"
#include "engine/cpu/strided.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
    case BinaryOp::div:
      return "div";
  }
  return "binary";
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::gelu:
      return "gelu";
    case UnaryOp::tanh:
      return "tanh";
    case UnaryOp::sin:
      return "sin";
    case UnaryOp::cos:
      return "cos";
  }
  return "unary";
}

namespace {

void check_same(const Tensor& a, const Tensor& b, const char* op) {
  ENGINE_CHECK(a.defined() && b.defined(), "[", op, "] got an undefined input");
  ENGINE_CHECK(a.device() == b.device(), "[", op,
               "] inputs are on different devices: ", describe(a), " and ", describe(b));
  ENGINE_CHECK(a.dtype() == b.dtype(), "[", op, "] dtype mismatch: ", describe(a), " and ",
               describe(b), " (convert one with .to())");
  ENGINE_CHECK(is_floating(a.dtype()), "[", op, "] expects floating tensors, got ", describe(a));
}

// Raw forward (no graph): used by the op and by backward formulas.
Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b) {
  Shape shape = broadcast_shapes(a.shape(), b.shape(), binary_name(op));
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  binary_kernel(a.device(), op, a.detach().expand(shape), b.detach().expand(shape), out);
  return out;
}

Tensor affine_raw(const Tensor& x, double alpha, double beta) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  affine_kernel(x.device(), x, alpha, beta, out);
  return out;
}

struct BinaryNode : Node {
  BinaryOp op;
  Tensor a, b;  // saved only where the backward reads them (mul: both, div: b and the output)
  Tensor out;
  const char* name() const override { return binary_name(op); }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor ga, gb;
    bool na = needs_input_grad(0), nb = needs_input_grad(1);
    switch (op) {
      case BinaryOp::add:
        if (na) ga = g;
        if (nb) gb = g;
        break;
      case BinaryOp::sub:
        if (na) ga = g;
        if (nb) gb = affine_raw(g, -1.0, 0.0);
        break;
      case BinaryOp::mul:
        if (na) ga = binary_raw(BinaryOp::mul, g, b);
        if (nb) gb = binary_raw(BinaryOp::mul, g, a);
        break;
      case BinaryOp::div:
        // d(a/b)/da = 1/b, d(a/b)/db = -(a/b)/b
        if (na) ga = binary_raw(BinaryOp::div, g, b);
        if (nb)
          gb = affine_raw(binary_raw(BinaryOp::div, binary_raw(BinaryOp::mul, g, out), b), -1.0,
                          0.0);
        break;
    }
    if (ga.defined()) ga = sum_to_shape(ga, inputs[0].shape);
    if (gb.defined()) gb = sum_to_shape(gb, inputs[1].shape);
    return {ga, gb};
  }
  void release_saved() override { a = b = out = Tensor(); }
};

Tensor binary(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  Tensor a = a_in, b = b_in;
  if (autocast_active() && a.defined() && b.defined() && a.dtype() != b.dtype() &&
      is_floating(a.dtype()) && is_floating(b.dtype())) {
    const DType t = promote_floating(a.dtype(), b.dtype());
    a = a.to(t);
    b = b.to(t);
  }
  check_same(a, b, binary_name(op));
  Tensor out = binary_raw(op, a, b);
  if (needs_grad(a, b)) {
    auto n = std::make_shared<BinaryNode>();
    n->op = op;
    if (op == BinaryOp::mul) {
      n->a = a.detach();
      n->b = b.detach();
    } else if (op == BinaryOp::div) {
      n->b = b.detach();
      n->out = out.detach();
    }
    record(n, {a, b}, {out});
  }
  return out;
}

struct AffineNode : Node {
  double alpha;
  const char* name() const override { return "affine"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {affine_raw(g[0], alpha, 0.0)};
  }
};

struct UnaryNode : Node {
  UnaryOp op;
  Tensor saved;  // y for tanh, x otherwise (see unary_backward_kernel)
  const char* name() const override { return unary_name(op); }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    Tensor gx = Tensor::empty(saved.shape(), saved.dtype(), saved.device());
    unary_backward_kernel(saved.device(), op, saved, g[0].contiguous(), gx);
    return {gx};
  }
  void release_saved() override { saved = Tensor(); }
};

Tensor unary(UnaryOp op, const Tensor& x) {
  const char* name = unary_name(op);
  ENGINE_CHECK(x.defined(), "[", name, "] got an undefined input");
  ENGINE_CHECK(is_floating(x.dtype()), "[", name, "] expects a floating tensor, got ", describe(x));
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  unary_kernel(x.device(), op, xc, y);
  if (needs_grad(x)) {
    auto n = std::make_shared<UnaryNode>();
    n->op = op;
    n->saved = (op == UnaryOp::tanh ? y : xc).detach();
    record(n, {x}, {y});
  }
  return y;
}

struct BiasGeluNode : Node {
  Tensor x, bias;  // contiguous; x + bias is recomputed (no pre-activation kept)
  const char* name() const override { return "bias_gelu"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());  // needed for the bias's sum too
    // The bias's gradient added in f32 into the f32 .grad behind autocast's cast of it, when the
    // engine offers that (no 16-bit gradient, no separate add).
    const Tensor* f32 = grad_sink_f32(1);
    Tensor gb = f32                   ? *f32
                : needs_input_grad(1) ? Tensor::empty(bias.shape(), bias.dtype(), bias.device())
                                      : Tensor();
    bias_gelu_backward_kernel(x.device(), x, bias, g[0].contiguous(), gx, gb);
    return {needs_input_grad(0) ? gx : Tensor(), f32 ? Tensor() : gb};
  }
  void release_saved() override { x = bias = Tensor(); }
};

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_floating(out.dtype(), binary_name(op), [&]<class T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    auto run = [&](auto f) {
      engine::cpu::strided_for_parallel<3>(
          out.shape(), {&out.strides(), &a.strides(), &b.strides()},
          ::engine::cpu::kParallelMinElems, [&](const int64_t* off, int64_t n, const int64_t* st) {
            T* o = po + off[0];
            const T* x = pa + off[1];
            const T* y = pb + off[2];
            if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
              for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
            } else {
              for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]]);
            }
          });
    };
    switch (op) {
      case BinaryOp::add:
        run([](T x, T y) { return x + y; });
        break;
      case BinaryOp::sub:
        run([](T x, T y) { return x - y; });
        break;
      case BinaryOp::mul:
        run([](T x, T y) { return x * y; });
        break;
      case BinaryOp::div:
        run([](T x, T y) { return x / y; });
        break;
    }
  });
}

void affine(const Tensor& x, double alpha, double beta, const Tensor& out) {
  dispatch_floating(out.dtype(), "affine", [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    const T a = static_cast<T>(alpha), b = static_cast<T>(beta);
    engine::cpu::strided_for_parallel<2>(
        out.shape(), {&out.strides(), &x.strides()}, ::engine::cpu::kParallelMinElems,
        [&](const int64_t* off, int64_t n, const int64_t* st) {
          for (int64_t i = 0; i < n; ++i) po[off[0] + i * st[0]] = a * px[off[1] + i * st[1]] + b;
        });
  });
}

using ArrayF = Eigen::Array<float, Eigen::Dynamic, 1>;
constexpr int64_t kChunk = 4096;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// GELU and its derivative d/dx [x Phi(x)] = Phi(x) + x phi(x), written once for gelu and
// bias_gelu: f32 over Eigen arrays (its vectorised erf and exp; coefficient-wise, so the result
// may be assigned to the argument), other types through the exact std:: functions (the f64
// gradient checks need them exact).
template <class A>
auto gelu_f32(const A& a) {
  return 0.5f * a * (1.0f + (a * float(kInvSqrt2)).erf());
}
template <class A>
auto gelu_grad_f32(const A& x) {
  return 0.5f * (1.0f + (x * float(kInvSqrt2)).erf()) +
         x * float(kInvSqrt2Pi) * (-0.5f * x.square()).exp();
}
template <class T>
T gelu_exact(T v) {
  return T(0.5) * v * (T(1) + std::erf(v * T(kInvSqrt2)));
}
template <class T>
T gelu_grad_exact(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2)));
  const T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

// x and y contiguous.
void unary(UnaryOp op, const Tensor& x, const Tensor& y) {
  dispatch_floating(x.dtype(), "unary", [&]<class T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
    if constexpr (std::is_same_v<T, float>) {  // Eigen SIMD erf/tanh/sin/cos, chunks per thread
#pragma omp parallel for if (n > ::engine::cpu::kParallelMinElems)
      for (int64_t c = 0; c < n; c += kChunk) {
        Eigen::Map<const ArrayF> a(px + c, std::min(kChunk, n - c));
        Eigen::Map<ArrayF> b(py + c, a.size());
        switch (op) {
          case UnaryOp::gelu:
            b = gelu_f32(a);
            break;
          case UnaryOp::tanh:
            b = a.tanh();
            break;
          case UnaryOp::sin:
            b = a.sin();
            break;
          case UnaryOp::cos:
            b = a.cos();
            break;
        }
      }
    } else {
      // f64 goes through the exact std:: functions (the gradient checks need them exact).
      auto run = [&](auto f) {
#pragma omp parallel for if (n > ::engine::cpu::kParallelMinElems)
        for (int64_t i = 0; i < n; ++i) py[i] = f(px[i]);
      };
      switch (op) {
        case UnaryOp::gelu:
          run([](T v) { return gelu_exact(v); });
          break;
        case UnaryOp::tanh:
          run([](T v) { return std::tanh(v); });
          break;
        case UnaryOp::sin:
          run([](T v) { return std::sin(v); });
          break;
        case UnaryOp::cos:
          run([](T v) { return std::cos(v); });
          break;
      }
    }
  });
}

void unary_backward(UnaryOp op, const Tensor& saved, const Tensor& gy, const Tensor& gx) {
  dispatch_floating(saved.dtype(), "unary_backward", [&]<class T>() {
    const T* s = saved.data<T>();
    const T* g = gy.data<T>();
    T* o = gx.data<T>();
    const int64_t n = saved.numel();
    if constexpr (std::is_same_v<T, float>) {
#pragma omp parallel for if (n > ::engine::cpu::kParallelMinElems)
      for (int64_t c = 0; c < n; c += kChunk) {
        const int64_t m = std::min(kChunk, n - c);
        Eigen::Map<const ArrayF> x(s + c, m), gy(g + c, m);
        Eigen::Map<ArrayF> gx(o + c, m);
        switch (op) {
          case UnaryOp::gelu:
            gx = gy * gelu_grad_f32(x);
            break;
          case UnaryOp::tanh:
            gx = gy * (1.0f - x.square());
            break;  // x holds y = tanh here
          case UnaryOp::sin:
            gx = gy * x.cos();
            break;
          case UnaryOp::cos:
            gx = -gy * x.sin();
            break;
        }
      }
    } else {
      // o[i] = g[i] * f'(s[i])
      auto run = [&](auto df) {
#pragma omp parallel for if (n > ::engine::cpu::kParallelMinElems)
        for (int64_t i = 0; i < n; ++i) o[i] = g[i] * df(s[i]);
      };
      switch (op) {
        case UnaryOp::gelu:
          run([](T x) { return gelu_grad_exact(x); });
          break;
        case UnaryOp::tanh:
          run([](T y) { return T(1) - y * y; });
          break;
        case UnaryOp::sin:
          run([](T x) { return std::cos(x); });
          break;
        case UnaryOp::cos:
          run([](T x) { return -std::sin(x); });
          break;
      }
    }
  });
}

// Rows of x (rows, n) in parallel. f32: x + bias inside GELU's expression (Eigen evaluates it per
// vector, in registers): storing x + bias first and running GELU over it cost 1.5x the time.
void bias_gelu(const Tensor& x, const Tensor& bias, const Tensor& y) {
  dispatch_floating(x.dtype(), "bias_gelu", [&]<class T>() {
    const int64_t n = bias.numel();
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    const T* px = x.data<T>();
    const T* pb = bias.data<T>();
    T* py = y.data<T>();
#pragma omp parallel for schedule(static) if (rows * n > ::engine::cpu::kParallelMinElems)
    for (int64_t r = 0; r < rows; ++r) {
      if constexpr (std::is_same_v<T, float>) {
        Eigen::Map<const ArrayF> xr(px + r * n, n), b(pb, n);
        Eigen::Map<ArrayF> yr(py + r * n, n);
        yr = gelu_f32(xr + b);
      } else {
        for (int64_t j = 0; j < n; ++j) py[r * n + j] = gelu_exact(px[r * n + j] + pb[j]);
      }
    }
  });
}

// Each chunk's rows sum into a per-thread row of T (f32: 16 lanes an instruction, read back from
// L1; summing into double was measurably slower per (1024, 3072) call; docs/benchmarks.md, "Figures
// behind the code"), stored as double; then the chunks in order.
void bias_gelu_backward(const Tensor& x, const Tensor& bias, const Tensor& gy, const Tensor& gx,
                        const Tensor& gbias) {
  dispatch_floating(x.dtype(), "bias_gelu_backward", [&]<class T>() {
    const int64_t n = bias.numel();
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    const T* px = x.data<T>();
    const T* pb = bias.data<T>();
    const T* pg = gy.data<T>();
    T* pdx = gx.data<T>();
    const bool want_b = gbias.defined();
    const int64_t chunks = std::min(rows, kBiasGeluChunks);
    std::vector<double> fresh;  // every chunk's row is written: no zeroing needed
    double* part = want_b ? ::engine::cpu::thread_scratch<double, 0>(chunks * n, fresh) : nullptr;
#pragma omp parallel if (rows * n > ::engine::cpu::kParallelMinElems)
    {
      std::vector<T> acc(want_b ? static_cast<size_t>(n) : 0);
#pragma omp for schedule(static)
      for (int64_t k = 0; k < chunks; ++k) {
        const int64_t r0 = rows * k / chunks, r1 = rows * (k + 1) / chunks;
        std::fill(acc.begin(), acc.end(), T(0));
        T* pa = acc.data();
        for (int64_t r = r0; r < r1; ++r) {
          T* dr = pdx + r * n;
          if constexpr (std::is_same_v<T, float>) {
            Eigen::Map<const ArrayF> xr(px + r * n, n), b(pb, n), g(pg + r * n, n);
            Eigen::Map<ArrayF> d(dr, n);
            d = g * gelu_grad_f32(xr + b);
          } else {
            for (int64_t j = 0; j < n; ++j)
              dr[j] = pg[r * n + j] * gelu_grad_exact(px[r * n + j] + pb[j]);
          }
          if (want_b)
            for (int64_t j = 0; j < n; ++j) pa[j] += dr[j];
        }
        if (want_b)
          for (int64_t j = 0; j < n; ++j) part[k * n + j] = static_cast<double>(pa[j]);
      }
    }
    if (want_b) ::engine::cpu::sum_chunks_in_order(part, chunks, n, gbias.data<T>());
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(binary_kernel, DeviceType::CPU, cpu::binary);
ENGINE_REGISTER_KERNEL(affine_kernel, DeviceType::CPU, cpu::affine);
ENGINE_REGISTER_KERNEL(unary_kernel, DeviceType::CPU, cpu::unary);
ENGINE_REGISTER_KERNEL(unary_backward_kernel, DeviceType::CPU, cpu::unary_backward);
ENGINE_REGISTER_KERNEL(bias_gelu_kernel, DeviceType::CPU, cpu::bias_gelu);
ENGINE_REGISTER_KERNEL(bias_gelu_backward_kernel, DeviceType::CPU, cpu::bias_gelu_backward);

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }

Tensor affine(const Tensor& x, double alpha, double beta) {
  ENGINE_CHECK(x.defined() && is_floating(x.dtype()), "[affine] expects a floating tensor, got ",
               describe(x));
  Tensor out = affine_raw(x, alpha, beta);
  if (needs_grad(x)) {
    auto n = std::make_shared<AffineNode>();
    n->alpha = alpha;
    record(n, {x}, {out});
  }
  return out;
}
Tensor scale(const Tensor& x, double alpha) { return affine(x, alpha, 0.0); }
Tensor gelu(const Tensor& x) { return unary(UnaryOp::gelu, x); }

Tensor bias_gelu(const Tensor& x_in, const Tensor& bias_in) {
  const Tensor x = autocast_to_compute(x_in), bias = autocast_to_compute(bias_in);
  ENGINE_CHECK(x.defined() && bias.defined(), "[bias_gelu] got an undefined input: x ", describe(x),
               ", bias ", describe(bias));
  check_same(x, bias, "bias_gelu");
  ENGINE_CHECK(x.dim() >= 1 && bias.dim() == 1 && bias.size(0) == x.size(-1), "[bias_gelu] bias ",
               describe(bias), " does not match x ", describe(x), ": expected bias (",
               x.dim() >= 1 ? x.size(-1) : 0, ") for x's last dim");
  Tensor xc = x.contiguous(), bc = bias.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  bias_gelu_kernel(x.device(), xc, bc, y);
  if (needs_grad(x, bias)) {
    auto n = std::make_shared<BiasGeluNode>();
    n->x = xc.detach();
    n->bias = bc.detach();
    record(n, {x, bias}, {y});
  }
  return y;
}
Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }
Tensor sin(const Tensor& x) { return unary(UnaryOp::sin, x); }
Tensor cos(const Tensor& x) { return unary(UnaryOp::cos, x); }

}  // namespace engine
