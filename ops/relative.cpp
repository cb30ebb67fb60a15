// relative_gather / relative_scatter: argument checks, autograd wiring (each op's backward is the
// other's kernel) and the CPU kernels.
#include "ops/relative.h"

#include <algorithm>
#include <vector>

#include "engine/autograd.h"
#include "engine/cpu/parallel.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

// Product of all dims but the last two: the rows of (Tq, *) matrices the kernels loop over.
int64_t leading_numel(const Shape& shape) {
  return shape_numel(Shape(shape.begin(), shape.end() - 2));
}

void check_common(const Tensor& t, const Tensor& index, const char* op, const char* what) {
  ENGINE_CHECK(t.defined() && index.defined(), "[", op, "] got an undefined input");
  ENGINE_CHECK(is_floating(t.dtype()), "[", op, "] expects a floating ", what, ", got ",
               describe(t));
  ENGINE_CHECK(index.dtype() == DType::i64, "[", op, "] index must be an i64 tensor, got ",
               describe(index));
  ENGINE_CHECK(index.dim() == 2, "[", op, "] index must be 2-D (Tq, Tk), got ", describe(index));
  ENGINE_CHECK(t.device() == index.device(), "[", op, "] inputs are on different devices: ", what,
               " ", describe(t), " and index ", describe(index));
  ENGINE_CHECK(t.dim() >= 2, "[", op, "] ", what, " must have at least 2 dims (..., Tq, *), got ",
               describe(t));
}

// Raw forward/backward bodies (no graph). `index` is the op's detached contiguous copy.
Tensor gather_raw(const Tensor& x, const Tensor& index) {
  const int64_t tq = index.shape()[0], tk = index.shape()[1], r = x.shape().back();
  const int64_t l = leading_numel(x.shape());
  Shape out_shape = x.shape();
  out_shape.back() = tk;  // (..., Tq, Tk)
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  relative_gather_kernel(x.device(), x.detach().contiguous().view({l, tq, r}), index,
                         out.view({l, tq, tk}));
  return out;
}

Tensor scatter_raw(const Tensor& y, const Tensor& index, int64_t num_buckets,
                   const Tensor& inverse) {
  const int64_t tq = index.shape()[0], tk = index.shape()[1];
  const int64_t l = leading_numel(y.shape());
  Shape out_shape = y.shape();
  out_shape.back() = num_buckets;  // (..., Tq, R)
  Tensor out = Tensor::empty(out_shape, y.dtype(), y.device());
  relative_scatter_kernel(y.device(), y.detach().contiguous().view({l, tq, tk}), index, inverse,
                          out.view({l, tq, num_buckets}));
  return out;
}

struct RelativeGatherNode : Node {
  Tensor index;    // (Tq, Tk) contiguous, detached; R comes from inputs[0]
  Tensor inverse;  // relative_index_inverse(index, R) or undefined
  const char* name() const override { return "relative_gather"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {scatter_raw(grads[0], index, inputs[0].shape.back(), inverse)};
  }
  void release_saved() override { index = inverse = Tensor(); }
};

struct RelativeScatterNode : Node {
  Tensor index;  // (Tq, Tk) contiguous, detached
  const char* name() const override { return "relative_scatter"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {gather_raw(grads[0], index)};
  }
  void release_saved() override { index = Tensor(); }
};

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {

// Rows are (l, i) pairs; they are parallel work once the tensor is this large.
constexpr int64_t kParallelElems = ::engine::cpu::kParallelMinElems;  // engine/cpu/parallel.h

// Every index value in [0, buckets), checked once per launch before any thread starts (an
// exception must not escape an OpenMP region). Tq * Tk reads: small next to the L * Tq * Tk the
// kernel moves.
void check_index_range(const Tensor& index, int64_t buckets, const char* op, const char* what) {
  const int64_t* p = index.data<int64_t>();
  const int64_t tk = index.shape()[1];
  for (int64_t k = 0; k < index.numel(); ++k)
    ENGINE_CHECK(p[k] >= 0 && p[k] < buckets, "[", op, "] index value ", p[k], " at (", k / tk,
                 ", ", k % tk, ") is out of range for ", buckets, " buckets (", what,
                 "; expected 0 <= index < ", buckets, ")");
}

void relative_gather(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t tq = x.shape()[1], r = x.shape()[2], tk = out.shape()[2];
  check_index_range(index, r, "relative_gather", "x's last dim");
  const int64_t rows = x.shape()[0] * tq;
  if (rows == 0 || tk == 0) return;
  const int64_t* idx = index.data<int64_t>();
  // A copy is dtype-agnostic, so bf16/f16 gathers work too (the op admits floating dtypes only).
  dispatch_any(x.dtype(), [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
#pragma omp parallel for if (rows * tk > kParallelElems)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t* ir = idx + (row % tq) * tk;
      const T* xr = px + row * r;
      T* orow = po + row * tk;
      for (int64_t j = 0; j < tk; ++j) orow[j] = xr[ir[j]];
    }
  });
}

void relative_invert(const Tensor& index, int64_t r, const Tensor& inverse) {
  check_index_range(index, r, "relative_index_inverse", "num_buckets");
  const int64_t tq = index.shape()[0], tk = index.shape()[1];
  const int64_t* idx = index.data<int64_t>();
  int32_t* off = inverse.data<int32_t>();
  int32_t* keys = off + tq * (r + 1);
  for (int64_t i = 0; i < tq; ++i) {
    int32_t* o = off + i * (r + 1);
    std::fill(o, o + r + 1, 0);
    for (int64_t j = 0; j < tk; ++j) ++o[idx[i * tk + j] + 1];
    for (int64_t b = 0; b < r; ++b) o[b + 1] += o[b];
    std::vector<int32_t> cur(o, o + r);
    for (int64_t j = 0; j < tk; ++j)
      keys[i * tk + cur[size_t(idx[i * tk + j])]++] = static_cast<int32_t>(j);
  }
}

void relative_scatter(const Tensor& y, const Tensor& index, const Tensor& /*inverse*/,
                      const Tensor& out) {
  const int64_t tq = y.shape()[1], tk = y.shape()[2], r = out.shape()[2];
  check_index_range(index, r, "relative_scatter", "num_buckets");
  const int64_t rows = y.shape()[0] * tq;
  if (rows == 0 || r == 0) return;
  const int64_t* idx = index.data<int64_t>();
  // CPU kernels compute in f32 or f64, so summing in out's own row is summing in float/double.
  dispatch_floating(y.dtype(), "relative_scatter", [&]<class T>() {
    const T* py = y.data<T>();
    T* po = out.data<T>();
    // One thread owns each output row and adds in j order: no atomics, and the same sums
    // whatever the thread count.
#pragma omp parallel for if (rows * tk > kParallelElems)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t* ir = idx + (row % tq) * tk;
      const T* yr = py + row * tk;
      T* orow = po + row * r;
      std::fill(orow, orow + r, T(0));
      for (int64_t j = 0; j < tk; ++j) orow[ir[j]] += yr[j];
    }
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(relative_gather_kernel, DeviceType::CPU, cpu::relative_gather);
ENGINE_REGISTER_KERNEL(relative_scatter_kernel, DeviceType::CPU, cpu::relative_scatter);
ENGINE_REGISTER_KERNEL(relative_invert_kernel, DeviceType::CPU, cpu::relative_invert);

}  // namespace

Tensor relative_clip_index(int64_t tq, int64_t tk, int64_t clip, Device device) {
  std::vector<int64_t> idx(static_cast<size_t>(tq * tk));
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j)
      idx[static_cast<size_t>(i * tk + j)] = std::clamp(j - i, -clip, clip) + clip;
  return Tensor::from_vector<int64_t>(idx, {tq, tk}).to(device);
}

Tensor relative_index_inverse(const Tensor& index, int64_t num_buckets) {
  ENGINE_CHECK(index.defined() && index.dtype() == DType::i64 && index.dim() == 2,
               "[relative_index_inverse] index must be a 2-D (Tq, Tk) i64 tensor, got ",
               index.defined() ? describe(index) : std::string("undefined"));
  ENGINE_CHECK(num_buckets >= 0, "[relative_index_inverse] num_buckets must be >= 0, got ",
               num_buckets);
  const int64_t tq = index.shape()[0], tk = index.shape()[1];
  ENGINE_CHECK(tk < (int64_t(1) << 31) && (num_buckets + 1) * tq + tq * tk < (int64_t(1) << 31),
               "[relative_index_inverse] index ", describe(index), " with ", num_buckets,
               " buckets is too large for the 32-bit inverted index");
  Tensor inverse = Tensor::empty({tq * (num_buckets + 1) + tq * tk}, DType::i32, index.device());
  relative_invert_kernel(index.device(), index.detach().contiguous(), num_buckets, inverse);
  return inverse;
}

namespace {

// An inverse given to the ops: relative_index_inverse's shape for (index, R) on index's device.
void check_inverse(const Tensor& inverse, const Tensor& index, int64_t r, const char* op) {
  if (!inverse.defined()) return;
  const int64_t tq = index.shape()[0], tk = index.shape()[1];
  ENGINE_CHECK(inverse.dtype() == DType::i32 && inverse.dim() == 1 &&
                   inverse.numel() == tq * (r + 1) + tq * tk && inverse.is_contiguous() &&
                   inverse.device() == index.device(),
               "[", op, "] inverse must be relative_index_inverse(index, ", r, "): a contiguous (",
               tq * (r + 1) + tq * tk, ") i32 tensor on index's device, got ", describe(inverse));
}

}  // namespace

Tensor relative_gather(const Tensor& x, const Tensor& index, const Tensor& inverse) {
  check_common(x, index, "relative_gather", "x");
  ENGINE_CHECK(x.shape()[x.dim() - 2] == index.shape()[0],
               "[relative_gather] x must be (..., Tq, R) with Tq = index's ", index.shape()[0],
               " rows, got x ", describe(x), " and index ", describe(index));
  check_inverse(inverse, index, x.shape().back(), "relative_gather");
  Tensor idx = index.detach().contiguous();
  Tensor out = gather_raw(x, idx);
  if (needs_grad(x)) {
    auto node = std::make_shared<RelativeGatherNode>();
    node->index = idx;
    node->inverse = inverse.defined() ? inverse.detach() : Tensor();
    record(node, {x}, {out});
  }
  return out;
}

Tensor relative_scatter(const Tensor& y, const Tensor& index, int64_t num_buckets,
                        const Tensor& inverse) {
  check_common(y, index, "relative_scatter", "y");
  ENGINE_CHECK(num_buckets >= 0, "[relative_scatter] num_buckets must be >= 0, got ", num_buckets);
  const Shape& s = y.shape();
  ENGINE_CHECK(s[s.size() - 2] == index.shape()[0] && s.back() == index.shape()[1],
               "[relative_scatter] y must be (..., Tq, Tk) with (Tq, Tk) = index's shape ",
               shape_str(index.shape()), ", got y ", describe(y), " and index ", describe(index));
  check_inverse(inverse, index, num_buckets, "relative_scatter");
  Tensor idx = index.detach().contiguous();
  Tensor out = scatter_raw(y, idx, num_buckets, inverse.defined() ? inverse.detach() : Tensor());
  if (needs_grad(y)) {
    auto node = std::make_shared<RelativeScatterNode>();
    node->index = idx;
    record(node, {y}, {out});
  }
  return out;
}

}  // namespace engine
