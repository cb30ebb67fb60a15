// concat / split: shape checks and autograd wiring; data moves through the backend's copy.
#include "ops/concat.h"

#include <algorithm>

#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"

namespace engine {
namespace {

struct ConcatNode : Node {
  int64_t dim = 0;
  std::vector<int64_t> sizes;  // each input's extent along dim
  const char* name() const override { return "concat"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    std::vector<Tensor> out(sizes.size());
    int64_t start = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (needs_input_grad(i)) out[i] = grads[0].slice(dim, start, start + sizes[i]);
      start += sizes[i];
    }
    return out;
  }
};

}  // namespace

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  ENGINE_CHECK(!xs.empty(), "[concat] needs at least one tensor");
  for (size_t i = 0; i < xs.size(); ++i)
    ENGINE_CHECK(xs[i].defined(), "[concat] input ", i, " is undefined");
  const Tensor& first = xs[0];
  ENGINE_CHECK(first.dim() >= 1, "[concat] cannot concatenate 0-dim tensors, got ",
               describe(first));
  const int64_t d = wrap_dim(dim, first.dim(), "concat");
  Shape shape = first.shape();
  shape[d] = 0;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    ENGINE_CHECK(x.dtype() == first.dtype(), "[concat] input ", i, " ", describe(x),
                 " has a different dtype from input 0 ", describe(first));
    ENGINE_CHECK(x.device() == first.device(), "[concat] input ", i, " ", describe(x),
                 " is on a different device from input 0 ", describe(first));
    bool same = x.dim() == first.dim();
    for (int64_t k = 0; same && k < x.dim(); ++k) same = k == d || x.shape()[k] == first.shape()[k];
    ENGINE_CHECK(same, "[concat] input ", i, " ", describe(x), " does not match input 0 ",
                 describe(first), " outside dim ", d);
    sizes.push_back(x.shape()[d]);
    shape[d] += x.shape()[d];
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t start = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].numel() > 0)
      backend_for(out).copy(xs[i].detach(), out.slice(d, start, start + sizes[i]));
    start += sizes[i];
  }
  bool any = false;
  for (const Tensor& x : xs) any = any || needs_grad(x);
  if (any) {
    auto node = std::make_shared<ConcatNode>();
    node->dim = d;
    node->sizes = std::move(sizes);
    record(node, xs, {out});
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  ENGINE_CHECK(x.defined(), "[split] got an undefined input");
  ENGINE_CHECK(x.dim() >= 1, "[split] cannot split a 0-dim tensor ", describe(x));
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    ENGINE_CHECK(s >= 0, "[split] negative size ", s, " in sizes ", shape_str(sizes));
    total += s;
  }
  ENGINE_CHECK(total == x.shape()[d], "[split] sizes ", shape_str(sizes), " sum to ", total,
               " but dim ", d, " of ", describe(x), " has size ", x.shape()[d]);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(x.slice(d, start, start + s));
    start += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  ENGINE_CHECK(x.defined(), "[split] got an undefined input");
  ENGINE_CHECK(x.dim() >= 1, "[split] cannot split a 0-dim tensor ", describe(x));
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.shape()[d];
  ENGINE_CHECK(split_size > 0 || (split_size == 0 && n == 0),
               "[split] split_size must be > 0, got ", split_size, " for ", describe(x));
  if (n == 0) return {x.slice(d, 0, 0)};  // one empty piece, as torch.split
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size)
    sizes.push_back(std::min(split_size, n - start));
  return split(x, sizes, d);
}

}  // namespace engine
