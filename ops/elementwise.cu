// CUDA kernels of the elementwise ops (see elementwise.h): add/sub/mul/div over broadcast views
// (a broadcast that collapses to rows x cols — a row repeated, a value a row — in 16-byte vectors
// without a strided indexer; other views through a StridedIndexer<3>),
// affine, GELU / tanh / sin / cos forward and backward, and GELU of x + bias (bias_gelu, 16-byte
// vectors) with its bias gradient summed in the backward's pass (column_sums: dx written where dy
// is read), in f32, f64, bf16 and f16.
//
// The math is the CPU kernels' (elementwise.cpp), written as the same expressions in the same
// order: f32 and f64 compute in their own type, bf16 and f16 in f32 (to_acc) and are rounded once
// at the store (from_acc). Where an expression has a product followed by a sum (affine, the
// backward formulas) both compilers may fuse them into an FMA: nvcc does by default, and so does
// g++ for the CPU build (C++ mode contracts by default; -march=native has FMA); the emulation
// build compiles device code to contract as nvcc does (-ffp-contract=fast -mfma
// -fexpensive-optimizations, emu/CMakeLists.txt; checked by a test in test_cuda_kernel_helpers).
// add / sub / mul / div are bit-identical to the CPU, and affine is when both fuse (the default
// ENGINE_NATIVE build on FMA hardware; a CPU built without FMA differs by an ulp). The
// transcendental functions (erf, tanh, sin, cos, exp) are the CUDA math library's; the CPU's f32
// kernels use Eigen's vectorised approximations, so those agree to a few ulp, not bit for bit.
#include <cuda_runtime.h>

#include <initializer_list>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/launch.h"
#include "engine/cuda/reduce.cuh"
#include "engine/cuda/strided.cuh"
#include "engine/error.h"
#include "ops/elementwise.h"

namespace engine::cuda {
namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// ---- functors (V is the compute type: Acc<T>) -------------------------------------------------

template <class V>
struct AddOp {
  __device__ V operator()(V a, V b) const { return a + b; }
};
template <class V>
struct SubOp {
  __device__ V operator()(V a, V b) const { return a - b; }
};
template <class V>
struct MulOp {
  __device__ V operator()(V a, V b) const { return a * b; }
};
template <class V>
struct DivOp {
  __device__ V operator()(V a, V b) const { return a / b; }
};

// alpha and beta are rounded to the compute type first, as the CPU kernel does; alpha * x + beta
// is one FMA on the GPU and on the CPU built with -march=native.
template <class V>
struct AffineOp {
  V alpha, beta;
  __device__ V operator()(V x) const { return alpha * x + beta; }
};

// 0.5 x (1 + erf(x / sqrt 2)), evaluated as (0.5 x) (1 + erf(x k)) like the CPU.
template <class V>
struct GeluOp {
  __device__ V operator()(V x) const { return V(0.5) * x * (V(1) + dmath::erf(x * V(kInvSqrt2))); }
};
template <class V>
struct TanhOp {
  __device__ V operator()(V x) const { return dmath::tanh(x); }
};
template <class V>
struct SinOp {
  __device__ V operator()(V x) const { return dmath::sin(x); }
};
template <class V>
struct CosOp {
  __device__ V operator()(V x) const { return dmath::cos(x); }
};

// Backward functors: (saved, grad_y) -> grad_y * f'(saved).
// d/dx [x Phi(x)] = Phi(x) + x phi(x). The CPU's f32 (Eigen) and f64 (scalar) kernels group the
// factors differently; each dtype here follows its CPU counterpart (bf16 / f16 follow f32).
template <class V>
struct GeluBackwardOp {
  __device__ V operator()(V x, V g) const {
    const V cdf = V(0.5) * (V(1) + dmath::erf(x * V(kInvSqrt2)));
    if constexpr (std::is_same_v<V, double>) {
      // T(kInvSqrt2Pi) * exp(T(-0.5) * x * x); cdf + x * pdf
      const V pdf = V(kInvSqrt2Pi) * dmath::exp(V(-0.5) * x * x);
      return g * (cdf + x * pdf);
    } else {
      // 0.5 (1 + erf(x k)) + (x k') exp(-0.5 x^2)
      return g * (cdf + x * V(kInvSqrt2Pi) * dmath::exp(V(-0.5) * (x * x)));
    }
  }
};
// `y` is tanh's output: 1 - y^2 needs nothing else.
template <class V>
struct TanhBackwardOp {
  __device__ V operator()(V y, V g) const { return g * (V(1) - y * y); }
};
template <class V>
struct SinBackwardOp {
  __device__ V operator()(V x, V g) const { return g * dmath::cos(x); }
};
template <class V>
struct CosBackwardOp {
  __device__ V operator()(V x, V g) const { return -g * dmath::sin(x); }
};

// ---- strided kernels (broadcast / non-contiguous operands) ------------------------------------

// out[o0] = op(a[o1], b[o2]) with the offsets from an indexer over out's shape.
template <class Op, class T>
__global__ void binary_strided(int64_t n, Op op, T* out, const T* a, const T* b,
                               StridedIndexer<3> ix) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = from_acc<T>(op(to_acc(a[off[1]]), to_acc(b[off[2]])));
  }
}

// Broadcast operands without a strided indexer: the layout collapsed to (rows, cols) with out
// contiguous, each operand read whole (offset i), as one row repeated (i % cols: a bias, a
// position table over a batch), one value a row (i / cols: a per-row scale) or one value.
enum class Bcast : uint8_t { full, row, col, scalar };

template <class T>
__device__ inline const T* bcast_at(const T* p, Bcast m, int64_t i, int64_t r, int64_t c) {
  switch (m) {
    case Bcast::full:
      return p + i;
    case Bcast::row:
      return p + c;
    case Bcast::col:
      return p + r;
    default:
      return p;
  }
}

// V consecutive elements a thread (V divides cols: a vector stays in one row; the row and column
// from one 32-bit FastDiv when the tensor is under 2^31 elements).
template <class Op, class T, int V>
__global__ void binary_bcast(int64_t n, Op op, T* out, const T* a, const T* b, Bcast ma, Bcast mb,
                             int64_t cols, FastDiv row_of, bool fast) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n / V; k += stride) {
    const int64_t i = k * V;
    const int64_t r = fast ? int64_t(row_of.div(static_cast<uint32_t>(i))) : i / cols;
    const int64_t c = i - r * cols;
    Vec<T, V> va, vb, o;
    if (ma == Bcast::full || ma == Bcast::row) {
      va = *reinterpret_cast<const Vec<T, V>*>(bcast_at(a, ma, i, r, c));
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q) va.v[q] = *bcast_at(a, ma, i, r, c);
    }
    if (mb == Bcast::full || mb == Bcast::row) {
      vb = *reinterpret_cast<const Vec<T, V>*>(bcast_at(b, mb, i, r, c));
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q) vb.v[q] = *bcast_at(b, mb, i, r, c);
    }
#pragma unroll
    for (int q = 0; q < V; ++q) o.v[q] = from_acc<T>(op(to_acc(va.v[q]), to_acc(vb.v[q])));
    *reinterpret_cast<Vec<T, V>*>(out + i) = o;
  }
}

// The (rows, cols) broadcast form of out = op(a, b), if the layout has one: out contiguous, and
// each operand full, a row repeated, a value a row or one value.
struct BcastPlan {
  bool ok = false;
  int64_t cols = 1;
  Bcast ma = Bcast::full, mb = Bcast::full;
};

BcastPlan bcast_plan(const Tensor& out, const Tensor& a, const Tensor& b) {
  BcastPlan p;
  if (!out.is_contiguous()) return p;
  const std::vector<int64_t>* sts[3] = {&out.strides(), &a.strides(), &b.strides()};
  const Collapsed c =
      collapse_layout(out.shape(), std::vector<const std::vector<int64_t>*>(sts, sts + 3));
  const size_t nd = c.sizes.size();
  if (nd == 0 || nd > 2) return p;
  const int64_t cols = c.sizes.back();
  auto mode = [&](size_t k, Bcast& m) {
    const int64_t sc = c.strides[k].back();
    if (nd == 1) {  // one run of cols: the operand whole or one value
      if (sc != 0 && sc != 1) return false;
      m = sc == 1 ? Bcast::full : Bcast::scalar;
      return true;
    }
    const int64_t sr = c.strides[k][0];
    if (sc == 1 && sr == cols) return m = Bcast::full, true;
    if (sc == 1 && sr == 0) return m = Bcast::row, true;
    if (sc == 0 && sr == 1) return m = Bcast::col, true;
    if (sc == 0 && sr == 0) return m = Bcast::scalar, true;
    return false;
  };
  Bcast mo = Bcast::scalar;
  if (!mode(0, mo) || mo != Bcast::full || !mode(1, p.ma) || !mode(2, p.mb)) return p;
  p.cols = cols;
  p.ok = true;
  return p;
}

template <class Op, class T>
__global__ void unary_strided(int64_t n, Op op, T* out, const T* x, StridedIndexer<2> ix) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[0]] = from_acc<T>(op(to_acc(x[off[1]])));
  }
}

LaunchConfig grid_for(int64_t n, cudaStream_t stream) {
  return LaunchConfig{dim3(grid_blocks(n, kElementwiseThreads)), dim3(kElementwiseThreads), 0,
                      stream};
}

void check_operands(const char* op, std::initializer_list<const Tensor*> ts, const Tensor& out) {
  for (const Tensor* t : ts) {
    ENGINE_CHECK(
        t->dtype() == out.dtype() && t->shape() == out.shape() && t->device() == out.device(), "[",
        op,
        "] the CUDA kernel expects operands of the output's shape, dtype and "
        "device, got ",
        describe(*t), " for ", describe(out));
  }
}

// ---- bias_gelu --------------------------------------------------------------------------------

// y[r][j] = gelu(x[r][j] + bias[j]) over the flat (rows, n) elements in vectors of V (n % V == 0,
// every pointer aligned when V > 1): a grid-stride loop, the column from a 32-bit FastDiv below
// 2^31 elements. x + bias is rounded to the compute type first, as the CPU stores it.
template <class T, int V>
__global__ void bias_gelu_vec(const T* x, const T* bias, T* y, int64_t n_vec, int64_t n,
                              FastDiv cols_vec) {
  using A = Acc<T>;
  const int64_t vecs_per_row = n / V;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_vec;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r =
        n_vec < (int64_t{1} << 31) ? cols_vec.div(static_cast<uint32_t>(i)) : i / vecs_per_row;
    const int64_t c = (i - r * vecs_per_row) * V;
    const Vec<T, V> xv = reinterpret_cast<const Vec<T, V>*>(x)[i];
    const Vec<T, V> bv = *reinterpret_cast<const Vec<T, V>*>(bias + c);
    Vec<T, V> out;
#pragma unroll
    for (int q = 0; q < V; ++q)
      out.v[q] = from_acc<T>(GeluOp<A>{}(to_acc(xv.v[q]) + to_acc(bv.v[q])));
    reinterpret_cast<Vec<T, V>*>(y)[i] = out;
  }
}

// The backward as column sums (reduce.cuh): each element's dx = dy * gelu'(x + bias) written
// where it is read, and summed per column for the bias gradient (when gbias is set).
template <class T, int V>
struct BiasGeluBackward {
  using Acc = std::conditional_t<std::is_same_v<::engine::cuda::Acc<T>, double>, double, float>;
  const T* x;
  const T* bias;
  const T* dy;
  T* dx;
  ParamGrad<T> gbias;  // may be empty
  int64_t n;
  __device__ void load(int64_t r, int64_t c, Acc (&v)[1][V]) const {
    using A = ::engine::cuda::Acc<T>;
    const Vec<T, V> xv = *reinterpret_cast<const Vec<T, V>*>(x + r * n + c);
    const Vec<T, V> gv = *reinterpret_cast<const Vec<T, V>*>(dy + r * n + c);
    const Vec<T, V> bv = *reinterpret_cast<const Vec<T, V>*>(bias + c);
    Vec<T, V> out;
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const A d = GeluBackwardOp<A>{}(to_acc(xv.v[q]) + to_acc(bv.v[q]), to_acc(gv.v[q]));
      out.v[q] = from_acc<T>(d);
      v[0][q] = static_cast<Acc>(d);
    }
    *reinterpret_cast<Vec<T, V>*>(dx + r * n + c) = out;
  }
  __device__ void store(int, int64_t c, const Acc (&s)[V]) const {
#pragma unroll
    for (int q = 0; q < V; ++q) gbias.put(c + q, s[q]);
  }
  __device__ void store_one(int, int64_t c, Acc s) const { gbias.put(c, s); }
};

// ---- kernels registered with the op's tables --------------------------------------------------

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_name(op);
  check_operands(name, {&a, &b}, out);
  const int64_t n = out.numel();
  DeviceGuard guard(out.device().index);
  cudaStream_t stream = compute_stream(out.device().index);
  dispatch_device_floating(out.dtype(), name, [&]<class T>() {
    using V = Acc<T>;
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    auto run = [&](auto f) {
      if (n == 0) return;
      if (a.is_contiguous() && b.is_contiguous() && out.is_contiguous()) {
        launch_elementwise(name, n, stream, f, po, pa, pb);
        return;
      }
      if (const BcastPlan bp = bcast_plan(out, a, b); bp.ok) {
        // 16-byte vectors where a vector stays in one row and every vector load is aligned
        constexpr int kV = sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T));
        auto vec_ok = [&](const T* p, Bcast m) {
          return m == Bcast::col || m == Bcast::scalar || detail::aligned(p, 16);
        };
        const bool vec =
            bp.cols % kV == 0 && detail::aligned(po, 16) && vec_ok(pa, bp.ma) && vec_ok(pb, bp.mb);
        const bool fast = n < (int64_t(1) << 31);
        const FastDiv row_of(static_cast<uint32_t>(fast ? bp.cols : 1));
        const int w = vec ? kV : 1;
        const LaunchConfig cfg{dim3(grid_blocks(n / w, kElementwiseThreads)),
                               dim3(kElementwiseThreads), 0, stream};
        auto launch = [&](auto kernel) {
          launch_kernel("binary_bcast", kernel, cfg, n, f, po, pa, pb, bp.ma, bp.mb, bp.cols,
                        row_of, fast);
        };
        if (vec)
          launch(binary_bcast<decltype(f), T, kV>);
        else
          launch(binary_bcast<decltype(f), T, 1>);
        return;
      }
      const std::vector<int64_t>* sts[3] = {&out.strides(), &a.strides(), &b.strides()};
      auto ix = make_indexer<3>(out.shape(), sts);
      ENGINE_LAUNCH((binary_strided<decltype(f), T>), grid_for(n, stream), n, f, po, pa, pb, ix);
    };
    switch (op) {
      case BinaryOp::add:
        return run(AddOp<V>{});
      case BinaryOp::sub:
        return run(SubOp<V>{});
      case BinaryOp::mul:
        return run(MulOp<V>{});
      case BinaryOp::div:
        return run(DivOp<V>{});
    }
  });
}

void affine(const Tensor& x, double alpha, double beta, const Tensor& out) {
  check_operands("affine", {&x}, out);
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device().index);
  cudaStream_t stream = compute_stream(out.device().index);
  dispatch_device_floating(out.dtype(), "affine", [&]<class T>() {
    using V = Acc<T>;
    const AffineOp<V> f{static_cast<V>(alpha), static_cast<V>(beta)};
    const T* px = static_cast<const T*>(x.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    if (x.is_contiguous() && out.is_contiguous()) {
      launch_elementwise("affine", n, stream, f, po, px);
      return;
    }
    const std::vector<int64_t>* sts[2] = {&out.strides(), &x.strides()};
    auto ix = make_indexer<2>(out.shape(), sts);
    ENGINE_LAUNCH((unary_strided<AffineOp<V>, T>), grid_for(n, stream), n, f, po, px, ix);
  });
}

// x and y contiguous (the op passes x.contiguous()).
void unary(UnaryOp op, const Tensor& x, const Tensor& y) {
  const char* name = unary_name(op);
  check_operands(name, {&x}, y);
  ENGINE_CHECK(x.is_contiguous() && y.is_contiguous(), "[", name,
               "] the CUDA kernel expects contiguous tensors, got ", describe(x), " -> ",
               describe(y));
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = compute_stream(x.device().index);
  dispatch_device_floating(x.dtype(), name, [&]<class T>() {
    using V = Acc<T>;
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(y.raw_data());
    switch (op) {
      case UnaryOp::gelu:
        return launch_elementwise(name, n, stream, GeluOp<V>{}, py, px);
      case UnaryOp::tanh:
        return launch_elementwise(name, n, stream, TanhOp<V>{}, py, px);
      case UnaryOp::sin:
        return launch_elementwise(name, n, stream, SinOp<V>{}, py, px);
      case UnaryOp::cos:
        return launch_elementwise(name, n, stream, CosOp<V>{}, py, px);
    }
  });
}

// grad_x = grad_y * f'(saved); all three contiguous.
void unary_backward(UnaryOp op, const Tensor& saved, const Tensor& gy, const Tensor& gx) {
  const char* name = unary_name(op);
  check_operands(name, {&saved, &gy}, gx);
  ENGINE_CHECK(saved.is_contiguous() && gy.is_contiguous() && gx.is_contiguous(), "[", name,
               "] the CUDA backward kernel expects contiguous tensors, got ", describe(saved), ", ",
               describe(gy), " -> ", describe(gx));
  const int64_t n = gx.numel();
  if (n == 0) return;
  DeviceGuard guard(gx.device().index);
  cudaStream_t stream = compute_stream(gx.device().index);
  dispatch_device_floating(gx.dtype(), name, [&]<class T>() {
    using V = Acc<T>;
    const T* ps = static_cast<const T*>(saved.raw_data());
    const T* pg = static_cast<const T*>(gy.raw_data());
    T* po = static_cast<T*>(gx.raw_data());
    switch (op) {
      case UnaryOp::gelu:
        return launch_elementwise(name, n, stream, GeluBackwardOp<V>{}, po, ps, pg);
      case UnaryOp::tanh:
        return launch_elementwise(name, n, stream, TanhBackwardOp<V>{}, po, ps, pg);
      case UnaryOp::sin:
        return launch_elementwise(name, n, stream, SinBackwardOp<V>{}, po, ps, pg);
      case UnaryOp::cos:
        return launch_elementwise(name, n, stream, CosBackwardOp<V>{}, po, ps, pg);
    }
  });
}

// Whether every pointer is 16-byte aligned and rows of n split into whole vectors of V.
bool vec_ok(int64_t n, int v, std::initializer_list<const Tensor*> ts) {
  if (v <= 1 || n % v) return false;
  for (const Tensor* t : ts)
    if (t->defined() && reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) return false;
  return true;
}

// x, y (rows, n) and bias (n), contiguous, one dtype.
void bias_gelu(const Tensor& x, const Tensor& bias, const Tensor& y) {
  check_operands("bias_gelu", {&x}, y);
  const int64_t n = bias.numel();
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  if (rows == 0) return;
  DeviceGuard guard(x.device().index);
  const cudaStream_t stream = compute_stream(x.device().index);
  dispatch_device_floating(x.dtype(), "bias_gelu", [&]<class T>() {
    constexpr int kV = 16 / sizeof(T);
    auto run = [&]<int V>() {
      const int64_t n_vec = rows * n / V;
      const FastDiv cols(static_cast<uint32_t>(n / V < (int64_t{1} << 31) ? n / V : 1));
      ENGINE_LAUNCH((bias_gelu_vec<T, V>), grid_for(n_vec, stream), dptr<const T>(x),
                    dptr<const T>(bias), dptr<T>(y), n_vec, n, cols);
    };
    if (vec_ok(n, kV, {&x, &bias, &y}))
      run.template operator()<kV>();
    else
      run.template operator()<1>();
  });
}

void bias_gelu_backward(const Tensor& x, const Tensor& bias, const Tensor& gy, const Tensor& gx,
                        const Tensor& gbias) {
  check_operands("bias_gelu_backward", {&x, &gy}, gx);
  const int64_t n = bias.numel();
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const bool want_b = gbias.defined();
  if (rows == 0) {  // a sum over no rows (added: nothing)
    if (want_b && gbias.dtype() == x.dtype()) gbias.fill_(0.0);
    return;
  }
  const int index = x.device().index;
  DeviceGuard guard(index);
  dispatch_device_floating(x.dtype(), "bias_gelu_backward", [&]<class T>() {
    constexpr int kV = reduce_vec<T>();
    auto run = [&]<int V>() {
      const BiasGeluBackward<T, V> f{dptr<const T>(x),
                                     dptr<const T>(bias),
                                     dptr<const T>(gy),
                                     dptr<T>(gx),
                                     param_grad<T>(gbias, x.dtype(), "bias_gelu_backward"),
                                     n};
      column_sums<V, 1>("bias_gelu_backward", rows, n, f, index);
    };
    if (vec_ok(n, kV, {&x, &bias, &gy, &gx}))
      run.template operator()<kV>();
    else
      run.template operator()<1>();
  });
}

}  // namespace

ENGINE_REGISTER_KERNEL(binary_kernel, DeviceType::CUDA, binary);
ENGINE_REGISTER_KERNEL(affine_kernel, DeviceType::CUDA, affine);
ENGINE_REGISTER_KERNEL(unary_kernel, DeviceType::CUDA, unary);
ENGINE_REGISTER_KERNEL(unary_backward_kernel, DeviceType::CUDA, unary_backward);
ENGINE_REGISTER_KERNEL(bias_gelu_kernel, DeviceType::CUDA, bias_gelu);
ENGINE_REGISTER_KERNEL(bias_gelu_backward_kernel, DeviceType::CUDA, bias_gelu_backward);

}  // namespace engine::cuda
