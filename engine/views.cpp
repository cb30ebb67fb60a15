// Views (reshape, permute, slice, expand, ...) and the differentiable copies (contiguous, clone,
// to). These are layout, not arithmetic, so they belong to the core; their backward passes use
// only backend primitives (copy, fill, sum_to).
#include <algorithm>
#include <numeric>
#include <optional>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/layout.h"
#include "engine/tensor.h"

namespace engine {

namespace {

// The dims from the outermost stride to the innermost (ties in dim order).
std::vector<int64_t> stride_order(const std::vector<int64_t>& strides) {
  std::vector<int64_t> order(strides.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  return order;
}

}  // namespace

Tensor empty_in_stride_order(const Shape& shape, const std::vector<int64_t>& strides, DType dtype,
                             Device device) {
  const size_t n = shape.size();
  const std::vector<int64_t> order = stride_order(strides);
  Shape ordered(n);
  std::vector<int64_t> inverse(n);
  for (size_t j = 0; j < n; ++j) {
    ordered[j] = shape[order[j]];
    inverse[order[j]] = static_cast<int64_t>(j);
  }
  return Tensor::empty(ordered, dtype, device).permute(inverse);
}

namespace {

// Strides that view (shape, strides) as new_shape without a copy, if any exist (the algorithm
// PyTorch uses: split the old dims into contiguous chunks and map new dims onto them).
std::optional<std::vector<int64_t>> view_strides(const Shape& old_shape,
                                                 const std::vector<int64_t>& old_strides,
                                                 const Shape& new_shape) {
  std::vector<int64_t> ns(new_shape.size());
  if (old_shape.empty()) {
    std::fill(ns.begin(), ns.end(), 1);
    return ns;
  }
  int64_t numel = shape_numel(old_shape);
  if (numel == 0) return contiguous_strides(new_shape);
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(old_shape.size()) - 1; td >= 0; --td) {
    tensor_numel *= old_shape[td];
    if (td == 0 || (old_shape[td - 1] != 1 && old_strides[td - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        ns[view_d] = view_numel * chunk_base;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base = old_strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return ns;
}

Shape infer_shape(Shape shape, int64_t numel, const Shape& from, const char* op) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      ENGINE_CHECK(infer < 0, "[", op, "] only one dimension can be -1, got ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      ENGINE_CHECK(shape[i] >= 0, "[", op, "] invalid size ", shape[i], " in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    ENGINE_CHECK(known != 0 && numel % known == 0, "[", op, "] cannot reshape ", shape_str(from),
                 " (", numel, " elements) into ", shape_str(shape));
    shape[infer] = numel / known;
  }
  ENGINE_CHECK(shape_numel(shape) == numel, "[", op, "] cannot reshape ", shape_str(from), " (",
               numel, " elements) into ", shape_str(shape), " (", shape_numel(shape), " elements)");
  return shape;
}

// ---- nodes -----------------------------------------------------------------------------------

struct ReshapeNode : Node {
  Shape in_shape;
  const char* name() const override { return "reshape"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {g[0].reshape(in_shape)};
  }
};

struct PermuteNode : Node {
  std::vector<int64_t> inverse;
  const char* name() const override { return "permute"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {g[0].permute(inverse)};
  }
};

struct SliceNode : Node {
  int64_t dim, start, step;
  const char* name() const override { return "slice"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const TensorMeta& m = inputs[0];
    const int64_t len = g[0].shape()[dim], stop = start + (len - 1) * step + 1;
    // On a device, into the gradient the input's other slices have already passed back (or its
    // .grad), when the engine offers it: one add over the slice, not a zero-filled tensor of the
    // whole input, a copy into it and an add of the whole.
    if (const Tensor* sink = m.device.is_cpu() ? nullptr : grad_sink(0, g[0].dtype())) {
      sink->slice(dim, start, stop, step).add_(g[0]);
      return {Tensor()};
    }
    Tensor gi = Tensor::zeros(m.shape, g[0].dtype(), m.device);
    gi.slice(dim, start, stop, step).copy_(g[0]);
    return {gi};
  }
};

// A tensor of `shape` laid out as `strides` when those are a permutation of a contiguous
// layout (a permuted view of a whole tensor), else a contiguous one: a gradient in its input's
// layout, so the permute that made the input hands back a contiguous tensor to the view before it.
Tensor empty_in_layout(const Shape& shape, const std::vector<int64_t>& strides, DType dtype,
                       Device device) {
  const size_t n = shape.size();
  const std::vector<int64_t> order = stride_order(strides);
  int64_t expect = 1;
  for (size_t j = n; j-- > 0;) {
    const int64_t d = order[j];
    if (shape[d] != 1 && strides[d] != expect) return Tensor::empty(shape, dtype, device);
    expect *= shape[d];
  }
  return empty_in_stride_order(shape, strides, dtype, device);
}

}  // namespace

Tensor stacked_view(const std::vector<Tensor>& g, int64_t dim) {
  if (g.size() < 2) return Tensor();
  const Tensor& g0 = g[0];
  const int64_t step = g[1].storage_offset() - g0.storage_offset();
  if (step <= 0) return Tensor();
  for (size_t i = 0; i < g.size(); ++i) {
    const Tensor& gi = g[i];
    if (!gi.shares_storage(g0) || gi.dtype() != g0.dtype() || gi.shape() != g0.shape() ||
        gi.strides() != g0.strides() ||
        gi.storage_offset() - g0.storage_offset() != static_cast<int64_t>(i) * step)
      return Tensor();
  }
  for (size_t d = 0; d < g0.shape().size(); ++d)
    if (g0.shape()[d] > 1 && g0.strides()[d] == 0) return Tensor();
  Shape shape = g0.shape();
  std::vector<int64_t> strides = g0.strides();
  shape.insert(shape.begin() + dim, static_cast<int64_t>(g.size()));
  strides.insert(strides.begin() + dim, step);
  return make_view(g0, shape, strides, g0.storage_offset());
}

namespace {

// unbind: every index along `dim` as one output of one node, so the backward writes the
// gradients into one tensor once (slices would each make a zero tensor of the input's size, copy
// their part in, and then be summed: BERT's q, k, v split moved ~7x the bytes).
struct UnbindNode : Node {
  int64_t dim = 0;
  std::vector<int64_t> in_strides;
  const char* name() const override { return "unbind"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const TensorMeta& m = inputs[0];
    const Tensor* any = nullptr;
    bool all = true;
    for (const Tensor& gi : g) {
      if (gi.defined() && !any) any = &gi;
      all = all && gi.defined();
    }
    if (!any) return {Tensor()};
    // Gradients that are already the slices of one tensor along a dimension of its own (the
    // fused attention's dq, dk, dv): that tensor is the input's gradient, no copy.
    if (all) {
      Tensor whole = stacked_view(g, dim);
      if (whole.defined() && whole.shape() == m.shape) return {whole};
    }
    Tensor out = empty_in_layout(m.shape, in_strides, any->dtype(), m.device);
    if (!all) out.fill_(0.0);
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i].defined()) out.select(dim, static_cast<int64_t>(i)).copy_(g[i]);
    return {out};
  }
};

struct ExpandNode : Node {
  const char* name() const override { return "expand"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {sum_to_shape(g[0], inputs[0].shape)};
  }
};

struct IdentityNode : Node {  // contiguous / clone: the gradient passes through
  const char* name() const override { return "copy"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override { return {g[0]}; }
};

struct CastNode : Node {  // to(dtype) / to(device): the gradient goes back the same way
  const char* name() const override { return "to"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    // Autocast's cast of an f32 leaf whose .grad is offered (Node::grad_sink): the 16-bit
    // gradient is added into it in one pass (backend.h's mixed add_), not converted into a new
    // f32 tensor that the engine then adds: a launch and two passes fewer per small parameter
    // (a bias, a LayerNorm weight) each step. Same bits.
    // Where the .grad's zero was deferred (Node::grad_sink's overwrite) the gradient is converted
    // into it instead: one pass, no zero fill first.
    if (g[0].defined() && g[0].device() == inputs[0].device && g[0].is_contiguous() &&
        inputs[0].dtype == DType::f32 &&
        (g[0].dtype() == DType::bf16 || g[0].dtype() == DType::f16)) {
      bool overwrite = false;
      if (const Tensor* sink = grad_sink(0, DType::f32, &overwrite)) {
        if (overwrite)
          sink->copy_(g[0]);
        else
          backend_for(*sink).add_(*sink, g[0], 1.0);
        return {Tensor()};
      }
    }
    return {g[0].to(inputs[0].dtype).to(inputs[0].device)};
  }
};

Tensor finish_view(const Tensor& in, Tensor out, std::shared_ptr<Node> node) {
  if (needs_grad(in)) record(node, {in}, {out});
  return out;
}

Tensor reshape_view(const Tensor& in, Shape shape, std::vector<int64_t> strides) {
  Tensor out = make_view(in, std::move(shape), std::move(strides), in.storage_offset());
  if (needs_grad(in)) {
    auto n = std::make_shared<ReshapeNode>();
    n->in_shape = in.shape();
    record(n, {in}, {out});
  }
  return out;
}

// A fresh contiguous copy of `in` with `dtype` on the same device (no graph).
Tensor raw_copy(const Tensor& in, DType dtype) {
  Tensor out = Tensor::empty(in.shape(), dtype, in.device());
  backend_for(in).copy(in, out);
  return out;
}

}  // namespace

Tensor Tensor::reshape(Shape shape) const {
  shape = infer_shape(std::move(shape), numel(), this->shape(), "reshape");
  if (auto st = view_strides(this->shape(), strides(), shape))
    return reshape_view(*this, std::move(shape), std::move(*st));
  return contiguous().view(std::move(shape));
}

Tensor Tensor::view(Shape shape) const {
  shape = infer_shape(std::move(shape), numel(), this->shape(), "view");
  auto st = view_strides(this->shape(), strides(), shape);
  ENGINE_CHECK(st.has_value(), "[view] ", describe(*this), " with strides ", shape_str(strides()),
               " cannot be viewed as ", shape_str(shape),
               " without a copy; use reshape() or contiguous() first");
  return reshape_view(*this, std::move(shape), std::move(*st));
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  int64_t n = dim();
  ENGINE_CHECK(static_cast<int64_t>(dims.size()) == n, "[permute] got ", dims.size(),
               " dims for a tensor with ", n, " dims ", describe(*this));
  Shape shape(n);
  std::vector<int64_t> st(n), inverse(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(dims[i], n, "permute");
    ENGINE_CHECK(inverse[d] < 0, "[permute] dim ", d, " repeated in ", shape_str(dims));
    inverse[d] = i;
    shape[i] = this->shape()[d];
    st[i] = strides()[d];
  }
  Tensor out = make_view(*this, std::move(shape), std::move(st), storage_offset());
  auto node = std::make_shared<PermuteNode>();
  node->inverse = std::move(inverse);
  return finish_view(*this, out, node);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t n = dim();
  std::vector<int64_t> dims(n);
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0, n, "transpose")], dims[wrap_dim(d1, n, "transpose")]);
  return permute(dims);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  ENGINE_CHECK(step >= 1, "[slice] step must be >= 1, got ", step);
  int64_t n = shape()[d];
  auto clamp = [n](int64_t i) { return std::clamp(i < 0 ? i + n : i, int64_t{0}, n); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  int64_t len = (end - start + step - 1) / step;
  Shape shape = this->shape();
  std::vector<int64_t> st = strides();
  shape[d] = len;
  int64_t offset = storage_offset() + start * st[d];
  st[d] *= step;
  Tensor out = make_view(*this, std::move(shape), std::move(st), offset);
  auto node = std::make_shared<SliceNode>();
  node->dim = d;
  node->start = start;
  node->step = step;
  return finish_view(*this, out, node);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  int64_t n = shape()[d];
  ENGINE_CHECK(index >= -n && index < n, "[select] index ", index, " is out of range for dim ", d,
               " of ", describe(*this));
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

std::vector<Tensor> Tensor::unbind(int64_t d) const {
  d = wrap_dim(d, dim(), "unbind");
  const int64_t n = shape()[d];
  Shape shape = this->shape();
  std::vector<int64_t> st = strides();
  const int64_t step = st[d];
  shape.erase(shape.begin() + d);
  st.erase(st.begin() + d);
  std::vector<Tensor> outs;
  outs.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    outs.push_back(make_view(*this, shape, st, storage_offset() + i * step));
  if (needs_grad(*this) && n > 0) {
    auto node = std::make_shared<UnbindNode>();
    node->dim = d;
    node->in_strides = strides();
    record(node, {*this}, outs);
  }
  return outs;
}

Tensor Tensor::expand(const Shape& target) const {
  ENGINE_CHECK(target.size() >= shape().size(), "[expand] cannot expand ", describe(*this),
               " to fewer dims ", shape_str(target));
  Shape shape = target;
  size_t lead = target.size() - this->shape().size();
  for (size_t i = 0; i < this->shape().size(); ++i)
    if (shape[lead + i] == -1) shape[lead + i] = this->shape()[i];
  ENGINE_CHECK(is_broadcastable_to(this->shape(), shape), "[expand] ", describe(*this),
               " cannot be expanded to ", shape_str(target));
  if (shape == this->shape()) return *this;
  Tensor out =
      make_view(*this, shape, broadcast_strides(this->shape(), strides(), shape), storage_offset());
  return finish_view(*this, out, std::make_shared<ExpandNode>());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape shape = this->shape();
  std::vector<int64_t> st = strides();
  int64_t s = d < dim() ? st[d] * shape[d] : 1;
  shape.insert(shape.begin() + d, 1);
  st.insert(st.begin() + d, s);
  return reshape_view(*this, std::move(shape), std::move(st));
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  ENGINE_CHECK(shape()[d] == 1, "[squeeze] dim ", d, " of ", describe(*this), " has size ",
               shape()[d], ", expected 1");
  Shape shape = this->shape();
  std::vector<int64_t> st = strides();
  shape.erase(shape.begin() + d);
  st.erase(st.begin() + d);
  return reshape_view(*this, std::move(shape), std::move(st));
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  ENGINE_CHECK(s <= e, "[flatten] start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape(this->shape().begin(), this->shape().begin() + s);
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m *= this->shape()[i];
  shape.push_back(m);
  shape.insert(shape.end(), this->shape().begin() + e + 1, this->shape().end());
  return reshape(shape);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = raw_copy(*this, dtype());
  return finish_view(*this, out, std::make_shared<IdentityNode>());
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = raw_copy(*this, dt);
  if (needs_grad(*this)) {
    ENGINE_CHECK(is_floating(dt), "[to] cannot convert ", describe(*this),
                 " which requires grad to the integer dtype ", dtype_name(dt),
                 " (detach() it first)");
    record(std::make_shared<CastNode>(), {*this}, {out});
  }
  return out;
}

Tensor cast_precomputed(const Tensor& t, const Tensor& converted) {
  ENGINE_CHECK(t.defined() && converted.defined() && converted.shape() == t.shape() &&
                   converted.device() == t.device() && is_floating(converted.dtype()) &&
                   is_floating(t.dtype()) && converted.dtype() != t.dtype(),
               "[cast_precomputed] ", converted.defined() ? describe(converted) : "undefined",
               " is not a conversion of ", t.defined() ? describe(t) : "undefined",
               " (same shape and device, another floating dtype)");
  Tensor out =
      make_view(converted, converted.shape(), converted.strides(), converted.storage_offset());
  if (needs_grad(t)) record(std::make_shared<CastNode>(), {t}, {out});
  return out;
}

Tensor Tensor::to(Device dev) const {
  if (dev == device()) return *this;
  Tensor src = contiguous();
  Tensor out = Tensor::empty(shape(), dtype(), dev);
  if (nbytes()) {
    if (device().is_cpu()) {
      backend(dev.type).copy_from_host(out.raw_data(), src.raw_data(), nbytes(), dev.index);
    } else if (dev.is_cpu()) {
      backend(device().type).copy_to_host(out.raw_data(), src.raw_data(), nbytes(), device().index);
    } else {  // device to device through the host: rare, simple, correct
      Tensor host = src.detach().to(Device::cpu());
      backend(dev.type).copy_from_host(out.raw_data(), host.raw_data(), nbytes(), dev.index);
    }
  }
  return finish_view(*this, out, std::make_shared<CastNode>());
}

Tensor Tensor::detach() const {
  ENGINE_CHECK(defined(), "[detach] called on an undefined tensor");
  Tensor out = make_view(*this, shape(), strides(), storage_offset());
  out.impl()->name = name();
  return out;
}

}  // namespace engine
