// Sum / mean: dim handling and autograd wiring over the backend's sum_to primitive; the CPU's
// column_sums_add kernel.
#include "ops/reduce.h"

#include <vector>

#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "ops/elementwise.h"

namespace engine {
namespace {

// `dims` wrapped and marked; empty means every dim.
std::vector<bool> reduced_dims(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  std::vector<bool> mask(x.shape().size(), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, x.dim(), op);
    ENGINE_CHECK(!mask[w], "[", op, "] dim ", d, " is repeated in dims ", shape_str(dims), " for ",
                 describe(x));
    mask[w] = true;
  }
  return mask;
}

struct ReduceNode : Node {
  const char* op = "sum";
  Shape keep_shape;  // the output with reduced dims kept as size 1
  double scale = 1;  // 1 for sum, 1 / count for mean
  const char* name() const override { return op; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor g = grads[0];
    if (scale != 1) {
      Tensor scaled = Tensor::empty(g.shape(), g.dtype(), g.device());
      affine_kernel(g.device(), g, scale, 0.0, scaled);
      g = scaled;
    }
    // Every input element got the same upstream gradient: a stride-0 broadcast view, no copy.
    return {g.reshape(keep_shape).expand(inputs[0].shape)};
  }
};

Tensor reduce(const Tensor& x, const std::vector<bool>& mask, bool keepdim, bool is_mean,
              const char* op) {
  Shape keep_shape = x.shape(), out_shape;
  int64_t count = 1;
  for (size_t d = 0; d < mask.size(); ++d) {
    if (mask[d]) {
      count *= keep_shape[d];
      keep_shape[d] = 1;
      if (keepdim) out_shape.push_back(1);
    } else {
      out_shape.push_back(x.shape()[d]);
    }
  }
  Tensor out = Tensor::empty(keep_shape, x.dtype(), x.device());
  backend_for(x).sum_to(x.detach(), out);
  // Mean over zero elements is 0/0 = NaN, as in PyTorch.
  const double scale = is_mean ? 1.0 / static_cast<double>(count) : 1.0;
  if (is_mean) affine_kernel(x.device(), out, scale, 0.0, out);  // elementwise: in place is safe
  out = out.view(out_shape);
  if (needs_grad(x)) {
    auto node = std::make_shared<ReduceNode>();
    node->op = op;
    node->keep_shape = std::move(keep_shape);
    node->scale = scale;
    record(node, {x}, {out});
  }
  return out;
}

void check_input(const Tensor& x, bool is_mean, const char* op) {
  ENGINE_CHECK(x.defined(), "[", op, "] got an undefined input");
  ENGINE_CHECK(!is_mean || is_floating(x.dtype()), "[", op, "] expects a floating tensor, got ",
               describe(x));
}

// The CPU's column_sums_add: f32 sources (the CPU kernels compute in f32), each column summed in
// row order in double, then added.
void column_sums_add_cpu(const Tensor& src, const Tensor& dst) {
  ENGINE_CHECK(src.dtype() == DType::f32 && dst.dtype() == DType::f32 && src.dim() == 2 &&
                   dst.dim() == 1 && src.size(1) == dst.size(0) && src.is_contiguous() &&
                   dst.is_contiguous(),
               "[column_sums_add] expects a contiguous (rows, n) f32 source and an (n) f32 "
               "destination on the CPU, got ",
               describe(src), " and ", describe(dst));
  const int64_t rows = src.size(0), n = src.size(1);
  const float* x = src.data<float>();
  float* d = dst.data<float>();
  std::vector<double> s(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) s[static_cast<size_t>(c)] += x[r * n + c];
  for (int64_t c = 0; c < n; ++c) d[c] += static_cast<float>(s[static_cast<size_t>(c)]);
}

ENGINE_REGISTER_KERNEL(column_sums_add_kernel, DeviceType::CPU, column_sums_add_cpu);

}  // namespace

Tensor sum(const Tensor& x) { return sum(x, {}, false); }
Tensor mean(const Tensor& x) { return mean(x, {}, false); }

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_input(x, false, "sum");
  return reduce(x, reduced_dims(x, dims, "sum"), keepdim, false, "sum");
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_input(x, true, "mean");
  return reduce(x, reduced_dims(x, dims, "mean"), keepdim, true, "mean");
}

}  // namespace engine
