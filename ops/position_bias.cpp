// bucket_lookup / cls_reset / untied_bias: argument checks, autograd wiring and the CPU kernels.
#include "ops/position_bias.h"

#include <vector>

#include "engine/autograd.h"
#include "engine/cpu/parallel.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {

void add_work_cost(WorkCost& cost, const UntiedBiasForward& a) {
  for (const Tensor* t : {&a.product, &a.add, &a.out})
    if (t->defined()) add_work_cost(cost, *t);
}

void add_work_cost(WorkCost& cost, const UntiedBiasBackward& a) {
  for (const Tensor* t : {&a.grad, &a.dproduct, &a.dadd, &a.row_sums, &a.col_sums})
    if (t->defined()) add_work_cost(cost, *t);
}

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

// dtable (R, C), overwritten, = grad (C, ...)'s sums per bucket of index.
void lookup_backward_into(const Tensor& grad, const Tensor& index, const Tensor& dtable) {
  const int64_t c = grad.shape()[0];
  bucket_lookup_backward_kernel(grad.device(), grad.detach().contiguous().view({c, index.numel()}),
                                index, dtable);
}

Tensor lookup_backward_raw(const Tensor& grad, const Tensor& index, int64_t r) {
  Tensor dtable = Tensor::empty({r, grad.shape()[0]}, grad.dtype(), grad.device());
  lookup_backward_into(grad, index, dtable);
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
    // Into the table's .grad when the engine offers it: written where its zero was deferred (the
    // kernel overwrites every element), added otherwise; no table-sized copy after.
    bool overwrite = false;
    if (const Tensor* sink = grad_sink(0, grads[0].dtype(), &overwrite)) {
      if (overwrite) {
        lookup_backward_into(grads[0], index, *sink);
      } else {
        sink->add_(lookup_backward_raw(grads[0], index, inputs[0].shape[0]));
      }
      return {Tensor()};
    }
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

// The dtype the kernels take P (or write dP) in next to a term (or its gradient) of dtype dt:
// P's own where it is dt's, or 16-bit with an f32 term on a device; else dt (P converted).
DType kernel_product_dtype(DType pt, DType dt, Device dev) {
  const bool half_into_f32 =
      !dev.is_cpu() && dt == DType::f32 && (pt == DType::bf16 || pt == DType::f16);
  return pt == dt || half_into_f32 ? pt : dt;
}

// untied_bias's launch: P as the kernels take it, add in out's dtype.
Tensor untied_raw(const Tensor& product, const Tensor& add, DType dt, const UntiedBiasOptions& o) {
  const int64_t k = o.reset ? 2 : 0, c = product.shape()[0], t = product.shape()[1] - k;
  UntiedBiasForward a;
  a.product = product.detach().contiguous();
  a.product = a.product.to(kernel_product_dtype(a.product.dtype(), dt, product.device()));
  if (add.defined()) a.add = add.detach().to(dt).contiguous();
  a.out = Tensor::empty({c, t, t}, dt, product.device());
  a.options = o;
  untied_bias_kernel(product.device(), a);
  return a.out;
}

struct UntiedBiasNode : Node {
  UntiedBiasOptions options;
  const char* name() const override { return "untied_bias"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor g = grads[0].contiguous();
    const int64_t c = g.shape()[0];
    std::vector<Tensor> out(2);
    UntiedBiasBackward a;
    a.grad = g;
    a.options = options;
    // dP in P's dtype where the kernels take it, else in dout's and converted.
    const DType pt = inputs[0].dtype;
    if (needs_input_grad(0)) {
      a.dproduct = Tensor::empty(inputs[0].shape, kernel_product_dtype(pt, g.dtype(), g.device()),
                                 g.device());
      if (options.reset) {
        a.row_sums = Tensor::empty({c}, g.dtype(), g.device());
        a.col_sums = Tensor::empty({c}, g.dtype(), g.device());
        cls_reset_sums_kernel(g.device(), g, a.row_sums, a.col_sums);
      }
    }
    // dadd is dout itself where nothing is masked and the dtypes agree: no copy.
    if (needs_input_grad(1)) {
      if ((!options.reset || options.add_at_reset) && inputs[1].dtype == g.dtype())
        out[1] = g;
      else
        a.dadd = Tensor::empty(g.shape(), g.dtype(), g.device());
    }
    if (a.dproduct.defined() || a.dadd.defined()) untied_bias_backward_kernel(g.device(), a);
    if (a.dproduct.defined()) out[0] = a.dproduct.to(pt);
    if (a.dadd.defined()) out[1] = a.dadd.to(inputs[1].dtype);
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

// Whether (i, j) of a (T, T) term is the [CLS] reset's: row 0, or column 0.
inline bool at_reset(const UntiedBiasOptions& o, int64_t i, int64_t j) {
  return o.reset && (i == 0 || j == 0);
}

void untied_bias(const UntiedBiasForward& a) {
  const UntiedBiasOptions& o = a.options;
  const int64_t c = a.out.shape()[0], t = a.out.shape()[1], n = a.product.shape()[1];
  dispatch_floating(a.out.dtype(), "untied_bias", [&]<class T>() {
    const T* p = a.product.data<T>();
    const T* add = a.add.defined() ? a.add.data<T>() : nullptr;
    T* out = a.out.data<T>();
    const T s = static_cast<T>(o.scale);
#pragma omp parallel for if (c * t * t > kParallelElems)
    for (int64_t ch = 0; ch < c; ++ch) {
      const T* pc = p + ch * n * n;
      const T theta1 = o.reset ? s * pc[t * n + t] : T(0),
              theta2 = o.reset ? s * pc[(t + 1) * n + t + 1] : T(0);
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j) {
          const int64_t e = (ch * t + i) * t + j;
          T v;
          if (at_reset(o, i, j)) {
            v = i == 0 ? theta1 : theta2;
            if (add && o.add_at_reset) v += add[e];
          } else {
            v = s * pc[i * n + j];
            if (add) v += add[e];
          }
          out[e] = v;
        }
    }
  });
}

void untied_bias_backward(const UntiedBiasBackward& a) {
  const UntiedBiasOptions& o = a.options;
  const int64_t c = a.grad.shape()[0], t = a.grad.shape()[1], k = o.reset ? 2 : 0, n = t + k;
  dispatch_floating(a.grad.dtype(), "untied_bias", [&]<class T>() {
    const T* g = a.grad.data<T>();
    T* dp = a.dproduct.defined() ? a.dproduct.data<T>() : nullptr;
    T* da = a.dadd.defined() ? a.dadd.data<T>() : nullptr;
    const T s = static_cast<T>(o.scale);
#pragma omp parallel for if (c * n * n > kParallelElems)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          if (i >= t || j >= t) {
            if (!dp) continue;
            T v = T(0);
            if (i == j && i == t) v = s * a.row_sums.data<T>()[ch];
            if (i == j && i == t + 1) v = s * a.col_sums.data<T>()[ch];
            dp[(ch * n + i) * n + j] = v;
            continue;
          }
          const T gv = g[(ch * t + i) * t + j];
          const bool r = at_reset(o, i, j);
          if (dp) dp[(ch * n + i) * n + j] = r ? T(0) : s * gv;
          if (da) da[(ch * t + i) * t + j] = r && !o.add_at_reset ? T(0) : gv;
        }
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(untied_bias_kernel, DeviceType::CPU, cpu::untied_bias);
ENGINE_REGISTER_KERNEL(untied_bias_backward_kernel, DeviceType::CPU, cpu::untied_bias_backward);
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

Tensor untied_bias(const Tensor& product, const Tensor& add, const UntiedBiasOptions& options) {
  ENGINE_CHECK(product.defined(), "[untied_bias] got an undefined product");
  const int64_t k = options.reset ? 2 : 0;
  const Shape& ps = product.shape();
  ENGINE_CHECK(is_floating(product.dtype()) && product.dim() == 3 && ps[1] == ps[2] && ps[1] > k,
               "[untied_bias] product must be a floating (C, T + ", k, ", T + ", k,
               ") tensor with T >= 1 (", options.reset ? "with" : "without",
               " the [CLS] reset), got ", describe(product));
  const int64_t t = ps[1] - k;
  DType dt = product.dtype();
  if (add.defined()) {
    ENGINE_CHECK(is_floating(add.dtype()) && add.shape() == Shape({ps[0], t, t}) &&
                     add.device() == product.device(),
                 "[untied_bias] add must be a floating (C, T, T) = (", ps[0], ", ", t, ", ", t,
                 ") tensor on the product's device (product ", describe(product), "), got ",
                 describe(add));
    dt = promote_floating(dt, add.dtype());
  }
  if (options.at_least_f32 && (dt == DType::bf16 || dt == DType::f16)) dt = DType::f32;
  Tensor out = untied_raw(product, add, dt, options);
  if (needs_grad(product, add)) {
    auto node = std::make_shared<UntiedBiasNode>();
    node->options = options;
    record(node, {product, add}, {out});
  }
  return out;
}

}  // namespace engine
