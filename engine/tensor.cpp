// Tensor factories, metadata, in-place updates, host transfers and printing. Views and the
// differentiable copies (contiguous, clone, to) live in views.cpp.
#include "engine/tensor.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/rng.h"

namespace engine {
namespace {

const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl, const char* what) {
  ENGINE_CHECK(impl != nullptr, "[tensor] ", what, " called on an undefined tensor");
  return *impl;
}

void check_in_place(const Tensor& t, const char* op) {
  ENGINE_CHECK(!(GradMode::is_enabled() && t.requires_grad()), "[", op,
               "] in-place update of a tensor that requires grad ", describe(t),
               " while grad mode is on; wrap it in NoGrad (optimizer steps) or detach() it");
}

}  // namespace

// ---- factories -------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  int64_t nbytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    ENGINE_CHECK(d >= 0, "[empty] negative dimension in shape ", shape_str(shape));
    ENGINE_CHECK(!__builtin_mul_overflow(nbytes, d, &nbytes), "[empty] shape ", shape_str(shape),
                 " of ", dtype_name(dtype), " is too large to address (over 2^63 bytes)");
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(nbytes), allocator_for(device));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend(device.type).fill(t, value);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(i);
  return from_vector(v, {n}).to(dtype).to(device);
}

Tensor Tensor::from_host(const void* data, DType dtype, const Shape& shape, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (t.nbytes()) backend(device.type).copy_from_host(t.raw_data(), data, t.nbytes(), device.index);
  return t;
}

void Tensor::check_vector_size(int64_t n, const Shape& shape) {
  ENGINE_CHECK(n == shape_numel(shape), "[from_vector] ", n, " values do not fill shape ",
               shape_str(shape), " (", shape_numel(shape), " elements)");
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, double mean, double std, DType dtype,
                     Device device) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  fill_normal(gen, mean, std, v.data(), static_cast<int64_t>(v.size()));
  return from_vector(v, shape).to(dtype).to(device);
}

Tensor Tensor::rand(const Shape& shape, Generator& gen, DType dtype, Device device) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  fill_uniform(gen, v.data(), static_cast<int64_t>(v.size()));
  return from_vector(v, shape).to(dtype).to(device);
}

// ---- metadata --------------------------------------------------------------------------------

const Shape& Tensor::shape() const { return checked(impl_, "shape").shape; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }
const std::vector<int64_t>& Tensor::strides() const { return checked(impl_, "strides").strides; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::storage_offset() const { return checked(impl_, "storage_offset").offset; }
DType Tensor::dtype() const { return checked(impl_, "dtype").dtype; }
Device Tensor::device() const { return checked(impl_, "device").storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const {
  return checked(impl_, "storage").storage;
}
bool Tensor::shares_storage(const Tensor& o) const {
  return defined() && o.defined() && impl_->storage == o.impl_->storage;
}
const std::string& Tensor::name() const { return checked(impl_, "name").name; }
const Tensor& Tensor::set_name(std::string n) const {
  checked(impl_, "set_name");
  impl_->name = std::move(n);
  return *this;
}

bool Tensor::is_contiguous() const {
  const TensorImpl& t = checked(impl_, "is_contiguous");
  int64_t expected = 1;
  for (int64_t i = static_cast<int64_t>(t.shape.size()) - 1; i >= 0; --i) {
    if (t.shape[i] == 1) continue;
    if (t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  const TensorImpl& t = checked(impl_, "raw_data");
  t.storage->note_access();
  char* base = static_cast<char*>(t.storage->data());
  if (!base) return nullptr;
  return base + t.offset * static_cast<int64_t>(dtype_size(t.dtype));
}

void Tensor::check_dtype(DType expected, const char* op) const {
  ENGINE_CHECK(dtype() == expected, "[", op, "] expected dtype ", dtype_name(expected), ", got ",
               describe(*this));
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "(undefined tensor)";
  std::string s = shape_str(t.shape());
  s += " ";
  s += dtype_name(t.dtype());
  s += " ";
  s += t.device().str();
  return s;
}

Tensor make_view(const Tensor& base, Shape shape, std::vector<int64_t> strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

// ---- in place --------------------------------------------------------------------------------

const Tensor& Tensor::fill_(double value) const {
  check_in_place(*this, "fill_");
  backend_for(*this).fill(*this, value);
  return *this;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  check_in_place(*this, "copy_");
  ENGINE_CHECK(src.defined(), "[copy_] source is undefined");
  ENGINE_CHECK(is_broadcastable_to(src.shape(), shape()), "[copy_] source ", describe(src),
               " cannot be broadcast to destination ", describe(*this));
  Tensor s = src.detach();
  if (s.device() != device()) s = s.to(device());
  s = s.expand(shape());
  backend_for(*this).copy(s, *this);
  return *this;
}

const Tensor& Tensor::add_(const Tensor& other, double alpha) const {
  check_in_place(*this, "add_");
  ENGINE_CHECK(other.defined(), "[add_] other is undefined");
  ENGINE_CHECK(other.device() == device(), "[add_] ", describe(*this), " and ", describe(other),
               " are on different devices");
  ENGINE_CHECK(other.dtype() == dtype(), "[add_] dtype mismatch: ", describe(*this),
               " += ", describe(other));
  ENGINE_CHECK(is_broadcastable_to(other.shape(), shape()), "[add_] ", describe(other),
               " cannot be broadcast to ", describe(*this));
  backend_for(*this).add_(*this, other.detach().expand(shape()), alpha);
  return *this;
}

const Tensor& Tensor::mul_(double factor) const {
  check_in_place(*this, "mul_");
  // x *= f as x += (f - 1) * x keeps the backend primitive set small. Each element reads and
  // writes only itself, so dst may be src; f == 0 fills, so inf/NaN become 0 as expected.
  if (factor == 0.0) return fill_(0.0);
  backend_for(*this).add_(*this, detach(), factor - 1.0);
  return *this;
}

// ---- values ----------------------------------------------------------------------------------

void Tensor::copy_to_host(void* dst, DType as) const {
  NoGrad ng;
  Tensor t = detach();
  // One counted transfer either way (backend.h, transfer_counts): the device's copy to the host,
  // or, for a CPU tensor, the host reading its values.
  const bool on_host = t.device().is_cpu();
  if (!on_host) t = t.to(Device::cpu());
  if (t.dtype() != as || !t.is_contiguous()) {
    Tensor c = Tensor::empty(t.shape(), as);
    backend(DeviceType::CPU).copy(t, c);
    t = c;
  }
  if (!t.nbytes()) return;
  if (on_host)
    backend(DeviceType::CPU).copy_to_host(dst, t.raw_data(), t.nbytes(), 0);
  else
    std::memcpy(dst, t.raw_data(), t.nbytes());
}

double Tensor::item() const {
  ENGINE_CHECK(defined() && numel() == 1, "[item] expected a one-element tensor, got ",
               describe(*this));
  double v = 0;
  copy_to_host(&v, DType::f64);
  return v;
}

namespace {

void print_rec(std::ostringstream& os, const std::vector<double>& v, const Shape& shape, size_t dim,
               int64_t base, const std::vector<int64_t>& st, bool summarize, int width,
               bool integral, bool sci, int indent) {
  constexpr int64_t kEdge = 3;
  if (shape.empty()) {
    char buf[64];
    if (integral)
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v[0]));
    else
      std::snprintf(buf, sizeof buf, sci ? "%.4e" : "%.4f", v[0]);
    os << buf;
    return;
  }
  os << "[";
  int64_t n = shape[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdge && i == kEdge) {
      os << (dim + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + dim + 1, ' '));
      i = n - kEdge - 1;
      continue;
    }
    int64_t off = base + i * st[dim];
    if (dim + 1 == shape.size()) {
      char buf[64];
      if (integral)
        std::snprintf(buf, sizeof buf, "%*lld", width, static_cast<long long>(v[off]));
      else
        std::snprintf(buf, sizeof buf, sci ? "%*.4e" : "%*.4f", width, v[off]);
      os << buf;
    } else {
      print_rec(os, v, shape, dim + 1, off, st, summarize, width, integral, sci, indent);
    }
    if (i + 1 < n) {
      os << ",";
      if (dim + 1 == shape.size())
        os << " ";
      else
        os << std::string(shape.size() - dim - 1, '\n') << std::string(indent + dim + 1, ' ');
    }
  }
  os << "]";
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::vector<double> v(static_cast<size_t>(numel()));
  copy_to_host(v.data(), DType::f64);
  bool integral = is_integral(dtype());
  double maxabs = 0, minabs = INFINITY;
  bool finite = true;
  for (double x : v) {
    if (!std::isfinite(x)) {
      finite = false;
      continue;
    }
    maxabs = std::max(maxabs, std::fabs(x));
    if (x != 0) minabs = std::min(minabs, std::fabs(x));
  }
  bool sci = !integral && finite && (maxabs >= 1e5 || (minabs < 1e-4 && minabs != INFINITY));
  int width = 1;
  for (double x : v) {
    char buf[64];
    int w = integral ? std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(x))
                     : std::snprintf(buf, sizeof buf, sci ? "%.4e" : "%.4f", x);
    width = std::max(width, w);
  }
  std::ostringstream os;
  os << "tensor(";
  print_rec(os, v, shape(), 0, 0, contiguous_strides(shape()), numel() > 1000, width, integral, sci,
            7);
  os << ", shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype())
     << ", device=" << device().str();
  if (requires_grad()) os << ", requires_grad";
  if (!name().empty()) os << ", name=" << name();
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---- autograd accessors ----------------------------------------------------------------------

bool Tensor::requires_grad() const {
  return checked(impl_, "requires_grad").autograd.requires_grad;
}

const Tensor& Tensor::set_requires_grad(bool on) const {
  checked(impl_, "set_requires_grad");
  ENGINE_CHECK(!impl_->autograd.grad_fn, "[set_requires_grad] ", describe(*this),
               " is the output of an op; only leaves can change requires_grad (use detach())");
  ENGINE_CHECK(!on || is_floating(dtype()),
               "[set_requires_grad] only floating tensors can "
               "require grad, got ",
               describe(*this));
  impl_->autograd.requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return !checked(impl_, "is_leaf").autograd.grad_fn; }
Tensor Tensor::grad() const {
  checked(impl_, "grad");
  materialize_grad(impl_.get());
  return impl_->autograd.grad;
}

void materialize_grad(TensorImpl* leaf) {
  AutogradMeta& am = leaf->autograd;
  if (!am.grad_fresh) return;
  am.grad_fresh = false;
  if (am.grad.defined()) {
    NoGrad ng;
    am.grad.fill_(0.0);
  }
}

void Tensor::set_grad(const Tensor& g) const {
  checked(impl_, "set_grad");
  ENGINE_CHECK(
      !g.defined() || (g.shape() == shape() && g.dtype() == dtype() && g.device() == device()),
      "[set_grad] gradient ", describe(g), " does not match tensor ", describe(*this));
  impl_->autograd.grad = g;
  impl_->autograd.grad_fresh = false;
}

void Tensor::zero_grad() const {
  checked(impl_, "zero_grad");
  impl_->autograd.grad_fresh = false;  // zeroed now
  Tensor g = impl_->autograd.grad;
  if (g.defined()) {
    NoGrad ng;
    g.fill_(0.0);
  }
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  return checked(impl_, "grad_fn").autograd.grad_fn;
}
int Tensor::output_slot() const { return checked(impl_, "output_slot").autograd.output_slot; }

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  run_backward(*this, grad, retain_graph);
}

}  // namespace engine
