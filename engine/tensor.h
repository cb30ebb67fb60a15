// Tensor: a handle (shared_ptr) to a TensorImpl that views a reference-counted Storage through a
// shape, strides and an element offset. Views (reshape, transpose/permute, slice, expand) share
// the storage without copying where the layout allows and are differentiable.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/shape.h"
#include "engine/storage.h"

namespace engine {

class Node;
class TensorImpl;
class Generator;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories -------------------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor arange(int64_t n, DType dtype = DType::f32, Device device = Device::cpu());
  // Copies `numel(shape)` elements of type `dtype` from host memory.
  static Tensor from_host(const void* data, DType dtype, const Shape& shape,
                          Device device = Device::cpu());
  template <class T>
  static Tensor from_vector(const std::vector<T>& data, const Shape& shape,
                            Device device = Device::cpu()) {
    check_vector_size(static_cast<int64_t>(data.size()), shape);
    return from_host(data.data(), dtype_v<T>, shape, device);
  }
  // Random tensors from the counter-based generator (computed on the CPU, then moved: the same
  // (seed, offset) gives the same values on every device).
  static Tensor randn(const Shape& shape, Generator& gen, double mean = 0.0, double std = 1.0,
                      DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::f32,
                     Device device = Device::cpu());  // uniform in [0, 1)

  // ---- metadata --------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  const std::vector<int64_t>& strides() const;
  int64_t stride(int64_t d) const;
  int64_t storage_offset() const;
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  // Address of the first element (device memory for CUDA tensors).
  void* raw_data() const;
  template <class T>
  T* data() const {
    check_dtype(dtype_v<T>, "data");
    return static_cast<T*>(raw_data());
  }
  const std::shared_ptr<Storage>& storage() const;
  bool shares_storage(const Tensor& other) const;
  const std::string& name() const;
  const Tensor& set_name(std::string name) const;

  // ---- views and copies (differentiable) -------------------------------------------------
  Tensor reshape(Shape shape) const;  // a view when the strides allow it, else a copy
  Tensor view(Shape shape) const;     // a view or an error
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  // Python-style slice [start:end:step] along dim (negative indices count from the end,
  // out-of-range bounds are clamped, step >= 1).
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes dim
  // Every select(dim, i) at once, as views; one backward node writes their gradients into one
  // tensor (in this tensor's layout when it is a permuted whole tensor).
  std::vector<Tensor> unbind(int64_t dim) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a dim; stride-0 broadcast view
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;  // *this when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor detach() const;  // same storage, outside the graph

  // ---- in place, through the handle (never recorded; refused on a tensor that requires grad while
  // grad mode is on, e.g. parameters outside NoGrad)
  // ---------------------------------------------------
  const Tensor& fill_(double value) const;
  const Tensor& zero_() const { return fill_(0.0); }
  const Tensor& copy_(const Tensor& src) const;  // broadcasts src, converts dtype, crosses devices
  const Tensor& add_(const Tensor& other,
                     double alpha = 1.0) const;  // this += alpha * other (broadcast)
  const Tensor& mul_(double factor) const;

  // ---- values ----------------------------------------------------------------------------
  double item() const;  // one-element tensors
  template <class T>
  std::vector<T> to_vector() const {
    std::vector<T> out(static_cast<size_t>(numel()));
    copy_to_host(out.data(), dtype_v<T>);
    return out;
  }
  void copy_to_host(void* dst, DType as) const;  // numel elements, converted to `as`
  std::string str() const;                       // for debugging: values, shape, dtype, device

  // ---- autograd --------------------------------------------------------------------------
  bool requires_grad() const;
  const Tensor& set_requires_grad(bool on = true) const;  // leaves only
  bool is_leaf() const;
  Tensor grad() const;  // undefined until a backward reaches this leaf (zeroes a deferred zero)
  void set_grad(const Tensor& g) const;
  void zero_grad() const;  // zeroes the gradient buffer in place (keeps flat-slab views)
  const std::shared_ptr<Node>& grad_fn() const;
  int output_slot() const;
  // Runs backward from this tensor; `grad` defaults to 1 for one-element tensors.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  void check_dtype(DType expected, const char* op) const;

 private:
  static void check_vector_size(int64_t n, const Shape& shape);
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Autograd state of a tensor: leaves hold their accumulated gradient; outputs of recorded ops
// point to the node that made them.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  int output_slot = 0;
  // A deferred zero (FlatParameters::zero_grad on a device): grad's storage holds stale values
  // and means 0. The first gradient written into it overwrites it (a GEMM with beta 0, a copy
  // instead of an add: no zero-fill pass over the slab); any reader first zeroes it
  // (materialize_grad).
  bool grad_fresh = false;
};

// Zeroes a leaf's gradient whose zero was deferred (AutogradMeta::grad_fresh) and clears the flag;
// nothing otherwise. Every reader of a .grad buffer outside the autograd engine goes through it
// (Tensor::grad, FlatParameters::grad).
void materialize_grad(TensorImpl* leaf);

class TensorImpl {
 public:
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  std::vector<int64_t> strides;  // in elements
  DType dtype = DType::f32;
  AutogradMeta autograd;
  std::string name;
};

// A new TensorImpl over `base`'s storage with the given layout, outside the graph.
Tensor make_view(const Tensor& base, Shape shape, std::vector<int64_t> strides, int64_t offset);

// "(4, 7) f32 cpu" — for error messages.
std::string describe(const Tensor& t);

}  // namespace engine
