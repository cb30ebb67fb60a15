// bucket_lookup / cls_reset: argument checks, autograd wiring and the CPU kernels.
#include "ops/position_bias.h"

#include <vector>

#include "engine/autograd.h"
#include "engine/cpu/parallel.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

// ---- raw bodies (no graph) ---------------------------------------------------------------------

// index: the op's detached contiguous copy, flattened.
Tensor lookup_raw(const Tensor& table, const Tensor& index, const Shape& index_shape) {
  const int64_t c = table.shape()[1], n = index.numel();
  Shape out_shape{c};
  out_shape.insert(out_shape.end(), index_shape.begin(), index_shape.end());
  Tensor out = Tensor::empty(out_shape, table.dtype(), table.device());
  bucket_lookup_kernel(table.device(), table.detach().contiguous(), index, out.view({c, n}));
  return out;
}

Tensor lookup_backward_raw(const Tensor& grad, const Tensor& index, int64_t r) {
  const int64_t c = grad.shape()[0], n = index.numel();
  Tensor dtable = Tensor::empty({r, c}, grad.dtype(), grad.device());
  bucket_lookup_backward_kernel(grad.device(), grad.detach().contiguous().view({c, n}), index,
                                dtable);
  return dtable;
}

Tensor reset_raw(const Tensor& v, const Tensor& row, const Tensor& col) {
  Tensor out = Tensor::empty(v.shape(), v.dtype(), v.device());
  cls_reset_kernel(v.device(), v.detach().contiguous(), row, col, out);
  return out;
}

struct BucketLookupNode : Node {
  Tensor index;  // flat (N), contiguous, detached
  const char* name() const override { return "bucket_lookup"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {lookup_backward_raw(grads[0], index, inputs[0].shape[0])};
  }
  void release_saved() override { index = Tensor(); }
};

struct ClsResetNode : Node {
  const char* name() const override { return "cls_reset"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor g = grads[0].contiguous();
    std::vector<Tensor> out(3);
    if (needs_input_grad(0)) out[0] = reset_raw(g, Tensor(), Tensor());
    if (needs_input_grad(1) || needs_input_grad(2)) {
      const int64_t c = g.shape()[0];
      Tensor drow = needs_input_grad(1) ? Tensor::empty({c}, g.dtype(), g.device()) : Tensor();
      Tensor dcol = needs_input_grad(2) ? Tensor::empty({c}, g.dtype(), g.device()) : Tensor();
      cls_reset_sums_kernel(g.device(), g, drow, dcol);
      out[1] = drow;
      out[2] = dcol;
    }
    return out;
  }
};

// ---- CPU kernels -------------------------------------------------------------------------------

namespace cpu {

constexpr int64_t kParallelElems = ::engine::cpu::kParallelMinElems;

// Every index value in [0, r), checked before any thread starts (an exception must not escape an
// OpenMP region).
void check_buckets(const Tensor& index, int64_t r) {
  const int64_t* p = index.data<int64_t>();
  for (int64_t k = 0; k < index.numel(); ++k)
    ENGINE_CHECK(p[k] >= 0 && p[k] < r, "[bucket_lookup] index value ", p[k], " at flat position ",
                 k, " is out of range for a table of ", r, " buckets (expected 0 <= index < ", r,
                 ")");
}

void bucket_lookup(const Tensor& table, const Tensor& index, const Tensor& out) {
  const int64_t r = table.shape()[0], c = table.shape()[1], n = index.numel();
  check_buckets(index, r);
  const int64_t* idx = index.data<int64_t>();
  dispatch_any(table.dtype(), [&]<class T>() {  // a copy: any dtype
    const T* pt = table.data<T>();
    T* po = out.data<T>();
#pragma omp parallel for if (c * n > kParallelElems)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < n; ++p) po[ch * n + p] = pt[idx[p] * c + ch];
  });
}

void bucket_lookup_backward(const Tensor& grad, const Tensor& index, const Tensor& dtable) {
  const int64_t r = dtable.shape()[0], c = dtable.shape()[1], n = index.numel();
  check_buckets(index, r);
  const int64_t* idx = index.data<int64_t>();
  dispatch_floating(grad.dtype(), "bucket_lookup_backward", [&]<class T>() {
    const T* pg = grad.data<T>();
    T* pd = dtable.data<T>();
    // A channel a thread, its buckets summed in p order: the same sums whatever the threads.
#pragma omp parallel for if (c * n > kParallelElems)
    for (int64_t ch = 0; ch < c; ++ch) {
      std::vector<T> sums(size_t(r), T(0));
      for (int64_t p = 0; p < n; ++p) sums[size_t(idx[p])] += pg[ch * n + p];
      for (int64_t b = 0; b < r; ++b) pd[b * c + ch] = sums[size_t(b)];
    }
  });
}

void cls_reset(const Tensor& v, const Tensor& row, const Tensor& col, const Tensor& out) {
  const int64_t c = v.shape()[0], t = v.shape()[1], u = v.shape()[2];
  dispatch_any(v.dtype(), [&]<class T>() {
    const T* pv = v.data<T>();
    const T* pr = row.defined() ? row.data<T>() : nullptr;
    const T* pc = col.defined() ? col.data<T>() : nullptr;
    T* po = out.data<T>();
#pragma omp parallel for if (c * t * u > kParallelElems)
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < t; ++i) {
        const T* vr = pv + (ch * t + i) * u;
        T* orow = po + (ch * t + i) * u;
        if (i == 0) {
          for (int64_t j = 0; j < u; ++j) orow[j] = pr ? pr[ch] : T();
          continue;
        }
        orow[0] = pc ? pc[ch] : T();
        for (int64_t j = 1; j < u; ++j) orow[j] = vr[j];
      }
    }
  });
}

void cls_reset_sums(const Tensor& grad, const Tensor& drow, const Tensor& dcol) {
  const int64_t c = grad.shape()[0], t = grad.shape()[1], u = grad.shape()[2];
  dispatch_floating(grad.dtype(), "cls_reset", [&]<class T>() {
    const T* pg = grad.data<T>();
    for (int64_t ch = 0; ch < c; ++ch) {
      const T* g = pg + ch * t * u;
      if (drow.defined()) {
        T s = 0;
        for (int64_t j = 0; j < u; ++j) s += g[j];
        drow.data<T>()[ch] = s;
      }
      if (dcol.defined()) {
        T s = 0;
        for (int64_t i = 1; i < t; ++i) s += g[i * u];
        dcol.data<T>()[ch] = s;
      }
    }
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(bucket_lookup_kernel, DeviceType::CPU, cpu::bucket_lookup);
ENGINE_REGISTER_KERNEL(bucket_lookup_backward_kernel, DeviceType::CPU, cpu::bucket_lookup_backward);
ENGINE_REGISTER_KERNEL(cls_reset_kernel, DeviceType::CPU, cpu::cls_reset);
ENGINE_REGISTER_KERNEL(cls_reset_sums_kernel, DeviceType::CPU, cpu::cls_reset_sums);

}  // namespace

Tensor bucket_lookup(const Tensor& table, const Tensor& index) {
  ENGINE_CHECK(table.defined() && index.defined(), "[bucket_lookup] got an undefined input");
  ENGINE_CHECK(is_floating(table.dtype()) && table.dim() == 2,
               "[bucket_lookup] table must be a floating (R, C) tensor, got ", describe(table));
  ENGINE_CHECK(index.dtype() == DType::i64, "[bucket_lookup] index must be an i64 tensor, got ",
               describe(index));
  ENGINE_CHECK(table.device() == index.device(), "[bucket_lookup] table ", describe(table),
               " and index ", describe(index), " are on different devices");
  ENGINE_CHECK(!needs_grad(index), "[bucket_lookup] index is a constant and takes no gradient");
  Tensor idx = index.detach().contiguous().view({index.numel()});
  Tensor out = lookup_raw(table, idx, index.shape());
  if (needs_grad(table)) {
    auto node = std::make_shared<BucketLookupNode>();
    node->index = idx;
    record(node, {table}, {out});
  }
  return out;
}

Tensor cls_reset(const Tensor& v, const Tensor& row, const Tensor& col) {
  ENGINE_CHECK(v.defined() && row.defined() && col.defined(), "[cls_reset] got an undefined input");
  ENGINE_CHECK(is_floating(v.dtype()) && v.dim() == 3 && v.shape()[1] >= 1 && v.shape()[2] >= 1,
               "[cls_reset] v must be a floating (C, T, U) tensor with T, U >= 1, got ",
               describe(v));
  for (const Tensor* t : {&row, &col})
    ENGINE_CHECK(
        t->dtype() == v.dtype() && t->shape() == Shape{v.shape()[0]} && t->device() == v.device(),
        "[cls_reset] row and col must be (C) = (", v.shape()[0], ") of v's dtype on v's ",
        "device (v ", describe(v), "), got ", describe(*t));
  Tensor r = row.detach().contiguous(), c = col.detach().contiguous();
  Tensor out = reset_raw(v, r, c);
  if (needs_grad(v, row, col)) record(std::make_shared<ClsResetNode>(), {v, row, col}, {out});
  return out;
}

}  // namespace engine
