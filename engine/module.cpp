// Named parameter registration and the flat parameter/gradient slabs.
#include "engine/module.h"

#include <cctype>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/graph.h"

namespace engine {

void Module::check_name(const std::string& name, const char* what) const {
  ENGINE_CHECK(!name.empty(), "[module] empty ", what, " name");
  for (char c : name)
    ENGINE_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '_', "[module] ", what,
                 " name '", name, "' may hold only letters, digits and '_'");
  for (auto& p : params_)
    ENGINE_CHECK(p.first != name, "[module] name '", name, "' is already a parameter");
  for (auto& c : children_)
    ENGINE_CHECK(c.first != name, "[module] name '", name, "' is already a submodule");
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_name(name, "parameter");
  ENGINE_CHECK(value.defined(), "[module] parameter '", name, "' is undefined");
  ENGINE_CHECK(value.is_leaf(), "[module] parameter '", name,
               "' is the output of an op; register a leaf (detach() it)");
  value.set_requires_grad(true);
  if (value.name().empty()) value.set_name(name);
  params_.emplace_back(name, std::move(value));
  return params_.back().second;
}

void Module::register_module(const std::string& name, Module& child) {
  check_name(name, "submodule");
  ENGINE_CHECK(&child != this, "[module] a module cannot contain itself");
  children_.emplace_back(name, &child);
}

void Module::collect(const std::string& prefix, NamedTensors& out) const {
  for (auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  for (auto& [n, c] : children_) c->collect(prefix + n + ".", out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.zero_grad();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

namespace {
Device first_device(const NamedTensors& params) {
  ENGINE_CHECK(!params.empty(), "[flat_parameters] no parameters given");
  return params[0].second.device();
}
}  // namespace

FlatParameters::FlatParameters(const NamedTensors& params)
    : FlatParameters(params, first_device(params)) {}

FlatParameters::FlatParameters(const NamedTensors& params, Device dev) {
  ENGINE_CHECK(!params.empty(), "[flat_parameters] no parameters given");
  constexpr int64_t kAlign = 16;  // elements: 64 bytes for f32
  const DType dt = params[0].second.dtype();
  const Device from = params[0].second.device();
  int64_t total = 0;
  for (auto& [name, t] : params) {
    ENGINE_CHECK(t.dtype() == dt && t.device() == from, "[flat_parameters] parameter '", name,
                 "' is ", describe(t), " but the first one is ", dtype_name(dt), " on ", from.str(),
                 "; a slab holds one dtype on one device");
    ENGINE_CHECK(is_floating(dt) && t.is_leaf(), "[flat_parameters] parameter '", name,
                 "' must be a floating leaf, got ", describe(t));
    Entry e;
    e.name = name;
    e.param = t;
    e.offset = total;
    e.numel = t.numel();
    total += (e.numel + kAlign - 1) / kAlign * kAlign;
    entries_.push_back(std::move(e));
  }
  data_ = Tensor::zeros({total}, dt, dev);
  grad_ = Tensor::zeros({total}, dt, dev);
  NoGrad ng;
  for (Entry& e : entries_) {
    Tensor& p = e.param;
    Tensor dst = make_view(data_, p.shape(), contiguous_strides(p.shape()), e.offset);
    dst.copy_(p.detach().to(dev));
    TensorImpl* impl = p.impl();
    impl->storage = data_.storage();
    impl->offset = e.offset;
    impl->strides = contiguous_strides(p.shape());
    Tensor g = make_view(grad_, p.shape(), contiguous_strides(p.shape()), e.offset);
    if (impl->autograd.grad.defined()) g.copy_(impl->autograd.grad.to(dev));
    impl->autograd.grad = g;
  }
}

void FlatParameters::zero_grad() {
  NoGrad ng;
  if (grad_.device().is_cpu()) {  // the CPU keeps its bits: c + (a b) with c = +0, as always
    grad_.fill_(0.0);
    for (Entry& e : entries_) e.param.impl()->autograd.grad_fresh = false;
    return;
  }
  for (Entry& e : entries_) e.param.impl()->autograd.grad_fresh = true;
  // Inside a graph capture the zeros nothing writes belong to the graph: made at its end (its
  // replays run no host code to make them later).
  at_capture_end([this] {
    for (const Entry& e : entries_) materialize_grad(e.param.impl());
  });
}

const Tensor& FlatParameters::grad() const {
  size_t fresh = 0;
  for (const Entry& e : entries_) fresh += e.param.impl()->autograd.grad_fresh ? 1 : 0;
  if (fresh == entries_.size() && fresh > 1) {  // nothing written: one fill
    NoGrad ng;
    grad_.fill_(0.0);
    for (const Entry& e : entries_) e.param.impl()->autograd.grad_fresh = false;
  } else if (fresh > 0) {
    for (const Entry& e : entries_) materialize_grad(e.param.impl());
  }
  return grad_;
}

Tensor FlatParameters::grad_slice(int64_t begin, int64_t end) const {
  for (const Entry& e : entries_)
    if (e.offset < end && e.offset + e.numel > begin) materialize_grad(e.param.impl());
  return grad_.slice(0, begin, end);
}

}  // namespace engine
