// index_select / embedding: shape and index checks, autograd wiring and the CPU kernels.
#include "ops/embedding.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/autograd.h"
#include "engine/cpu/parallel.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

// "3" for a 1-D index, "(1, 2)" for a multi-dim one: where the bad id sits in the caller's
// tensor, not in our flattened copy.
std::string position_str(int64_t flat, const Shape& shape) {
  if (shape.size() == 1) return std::to_string(flat);
  Shape pos(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    pos[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_str(pos);
}

// Host-side range check of a contiguous CPU index. Reading device memory here would cost a
// synchronisation per call, so for other devices the check is the device kernel's job.
void check_in_range(const Tensor& index, const Shape& user_shape, int64_t rows, const char* op,
                    const char* what) {
  if (!index.device().is_cpu()) return;
  dispatch_index(index.dtype(), op, [&]<class I>() {
    const I* p = index.data<I>();
    const int64_t m = index.numel();
    for (int64_t i = 0; i < m; ++i) {
      const int64_t v = static_cast<int64_t>(p[i]);
      ENGINE_CHECK(v >= 0 && v < rows, "[", op, "] ", what, " ", v, " at position ",
                   position_str(i, user_shape), " is out of range for a table of ", rows,
                   " rows (expected 0 <= ", what, " < ", rows, ")");
    }
  });
}

void check_index_tensor(const Tensor& x, const Tensor& index, const char* op, const char* what) {
  ENGINE_CHECK(x.defined() && index.defined(), "[", op, "] got an undefined input");
  ENGINE_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, "[", op, "] ", what,
               " tensor must be i32 or i64, got ", describe(index));
  ENGINE_CHECK(x.device() == index.device(), "[", op,
               "] inputs are on different devices: ", describe(x), " and ", what, " ",
               describe(index));
}

// Host-side check of a contiguous CPU index that its caller says is unique: a repeat names both
// positions. (A device index is not read: the caller's word, see index_select.)
void check_unique(const Tensor& index, int64_t rows, const char* op) {
  if (!index.device().is_cpu()) return;
  dispatch_index(index.dtype(), op, [&]<class I>() {
    const I* p = index.data<I>();
    std::vector<int64_t> first(static_cast<size_t>(rows), -1);
    for (int64_t i = 0; i < index.numel(); ++i) {
      int64_t& f = first[static_cast<size_t>(p[i])];
      ENGINE_CHECK(f < 0, "[", op, "] index ", static_cast<int64_t>(p[i]), " at positions ", f,
                   " and ", i,
                   " repeats, but the index was given as unique (expected distinct "
                   "values; pass unique = false for an index that repeats)");
      f = i;
    }
  });
}

struct GatherRowsNode : Node {
  const char* op = "gather_rows";
  Tensor index;         // (M) contiguous, detached: the only thing the scatter-add needs
  Tensor inverted;      // its sorted_index_keys when the caller made them once, else undefined
  bool unique = false;  // index's values distinct: one row add each (add_rows)
  const char* name() const override { return op; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const TensorMeta& m = inputs[0];
    const int64_t n = m.shape[0];
    const int64_t d = shape_numel(m.shape) / std::max<int64_t>(n, 1);
    // Scattered straight into the table's .grad when the engine offers it: no zeroed (N, D)
    // table and no second pass to add it (the word embeddings: 15.6 MB a step in the tiny model).
    // A 16-bit table that is autocast's cast of an f32 leaf (the model's token embeddings, read
    // from the parameter slab's 16-bit copy): the 16-bit gradient rows scattered straight into
    // the leaf's f32 .grad (no 16-bit table, no conversion of it, no add into the slab).
    if (!unique && !m.device.is_cpu() && grads[0].dtype() != DType::f32 &&
        grads[0].dtype() != DType::f64) {
      if (const Tensor* f32 = grad_sink_f32(0)) {
        if (n > 0 && d > 0)
          scatter_add_rows_kernel(m.device, grads[0].contiguous().view({index.numel(), d}), index,
                                  inverted, f32->view({n, d}));
        return {Tensor()};
      }
    }
    const Tensor* sink = grad_sink(0, grads[0].dtype());
    Tensor gx = sink ? Tensor() : Tensor::zeros(m.shape, grads[0].dtype(), m.device);
    if (n > 0 && d > 0) {
      Tensor g = grads[0].contiguous().view({index.numel(), d});  // (M, D)
      if (unique)
        add_rows_kernel(m.device, g, index, (sink ? *sink : gx).view({n, d}));
      else
        scatter_add_rows_kernel(m.device, g, index, inverted, (sink ? *sink : gx).view({n, d}));
    }
    return {gx};
  }
  void release_saved() override { index = inverted = Tensor(); }
};

// Shared body: x (N, ...) viewed as (N, D), a flattened index (M) -> out of `out_shape`
// (M * D elements), recorded when x requires grad.
Tensor gather_rows(const Tensor& x, const Tensor& index, const Shape& out_shape, const char* op,
                   const char* what, const Tensor& inverted = Tensor(), bool unique = false) {
  const int64_t n = x.shape()[0];
  const int64_t d = shape_numel(Shape(x.shape().begin() + 1, x.shape().end()));
  Tensor idx = index.detach().contiguous().reshape({index.numel()});  // (M)
  check_in_range(idx, index.shape(), n, op, what);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (out.numel() > 0)
    gather_rows_kernel(x.device(), x.detach().contiguous().view({n, d}), idx,
                       out.view({idx.numel(), d}));
  if (needs_grad(x)) {
    auto node = std::make_shared<GatherRowsNode>();
    node->op = op;
    node->index = idx;
    node->unique = unique;
    if (unique) check_unique(idx, n, op);
    if (inverted.defined()) {
      ENGINE_CHECK(inverted.dtype() == DType::i64 && inverted.numel() == idx.numel() &&
                       inverted.device() == idx.device(),
                   "[", op, "] the inverted index ", describe(inverted),
                   " does not match the index ", describe(index),
                   " (expected sorted_index_keys of it: i64, one key per id, on its device)");
      node->inverted = inverted;
    }
    record(node, {x}, {out});
  }
  return out;
}

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {

void gather_rows(const Tensor& table, const Tensor& index, const Tensor& out) {
  const int64_t m = out.shape()[0];
  const size_t row_bytes = static_cast<size_t>(out.shape()[1]) * dtype_size(out.dtype());
  if (m == 0 || row_bytes == 0) return;
  dispatch_index(index.dtype(), "gather_rows", [&]<class I>() {
    const I* idx = index.data<I>();
    const char* src = static_cast<const char*>(table.raw_data());
    char* dst = static_cast<char*>(out.raw_data());
    // A row copy is dtype-agnostic, so gathers work for every dtype (bf16 tables included). Over
    // the threads from kParallelMinElems f32s' worth of bytes, as the memory-bound loops (the
    // tiny model's (2048 x 128) f32 lookups, 1 MB, ran on one thread under a 1 MB threshold).
    const bool parallel = m * static_cast<int64_t>(row_bytes) >=
                              ::engine::cpu::kParallelMinElems * int64_t{sizeof(float)} &&
                          !omp_in_parallel();
#pragma omp parallel for if (parallel)
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(dst + i * row_bytes, src + static_cast<int64_t>(idx[i]) * row_bytes, row_bytes);
  });
}

void scatter_add_rows(const Tensor& grad_out, const Tensor& index, const Tensor& /*inverted*/,
                      const Tensor& grad_table) {
  const int64_t m = grad_out.shape()[0], d = grad_out.shape()[1];
  if (m == 0 || d == 0) return;
  dispatch_floating(grad_table.dtype(), "scatter_add_rows", [&]<class T>() {
    dispatch_index(index.dtype(), "scatter_add_rows", [&]<class I>() {
      const I* idx = index.data<I>();
      const T* src = grad_out.data<T>();
      T* dst = grad_table.data<T>();
      // Threads split the feature dim, and each walks every index in order: an element's sum
      // is always formed in index order whatever the thread count (deterministic), and no two
      // threads touch the same element (no atomics), even for repeated indices. One block of
      // whole cache lines per thread: fixed blocks of 256 left the tiny model's 128 features on
      // one thread and split BERT-Base's 768 two to one.
      const bool parallel = m * d > ::engine::cpu::kParallelMinElems && !omp_in_parallel();
      const int64_t threads = parallel ? omp_get_max_threads() : 1;
      const int64_t cols = std::min(d, ((d + threads - 1) / threads + 15) / 16 * 16);
      const int64_t blocks = (d + cols - 1) / cols;
#pragma omp parallel for if (parallel && blocks > 1)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t c0 = b * cols, c1 = std::min(d, c0 + cols);
        for (int64_t i = 0; i < m; ++i) {
          T* row = dst + static_cast<int64_t>(idx[i]) * d;
          const T* s = src + i * d;
          for (int64_t c = c0; c < c1; ++c) row[c] += s[c];
        }
      }
    });
  });
}

void add_rows(const Tensor& grad_out, const Tensor& index, const Tensor& grad_table) {
  const int64_t m = grad_out.shape()[0], d = grad_out.shape()[1];
  if (m == 0 || d == 0) return;
  dispatch_floating(grad_table.dtype(), "add_rows", [&]<class T>() {
    dispatch_index(index.dtype(), "add_rows", [&]<class I>() {
      const I* idx = index.data<I>();
      const T* src = grad_out.data<T>();
      T* dst = grad_table.data<T>();
      // Distinct rows: no two threads touch one.
      const bool parallel = m * d > ::engine::cpu::kParallelMinElems && !omp_in_parallel();
#pragma omp parallel for if (parallel)
      for (int64_t i = 0; i < m; ++i) {
        T* row = dst + static_cast<int64_t>(idx[i]) * d;
        const T* s = src + i * d;
        for (int64_t c = 0; c < d; ++c) row[c] += s[c];
      }
    });
  });
}

void sort_index_keys(const Tensor& index, int64_t rows, const Tensor& keys) {
  dispatch_index(index.dtype(), "sort_index_keys", [&]<class I>() {
    const I* idx = index.data<I>();
    int64_t* out = keys.data<int64_t>();
    const int64_t m = index.numel();
    for (int64_t i = 0; i < m; ++i) out[i] = (static_cast<int64_t>(idx[i]) << 32) | i;
    std::sort(out, out + m);
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(gather_rows_kernel, DeviceType::CPU, cpu::gather_rows);
ENGINE_REGISTER_KERNEL(scatter_add_rows_kernel, DeviceType::CPU, cpu::scatter_add_rows);
ENGINE_REGISTER_KERNEL(add_rows_kernel, DeviceType::CPU, cpu::add_rows);
ENGINE_REGISTER_KERNEL(sort_index_keys_kernel, DeviceType::CPU, cpu::sort_index_keys);

}  // namespace

Tensor index_select(const Tensor& x, const Tensor& index, bool unique) {
  check_index_tensor(x, index, "index_select", "index");
  ENGINE_CHECK(x.dim() >= 1, "[index_select] expects x with at least 1 dim, got ", describe(x));
  ENGINE_CHECK(index.dim() == 1, "[index_select] index must be 1-D, got ", describe(index));
  Shape out_shape = x.shape();
  out_shape[0] = index.numel();  // (M, ...)
  return gather_rows(x, index, out_shape, "index_select", "index", Tensor(), unique);
}

Tensor embedding(const Tensor& weight, const Tensor& ids, const Tensor& inverted) {
  check_index_tensor(weight, ids, "embedding", "id");
  ENGINE_CHECK(weight.dim() == 2, "[embedding] weight must be (V, D), got ", describe(weight));
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.shape()[1]);  // (*ids.shape, D)
  return gather_rows(weight, ids, out_shape, "embedding", "id", inverted);
}

Tensor sorted_index_keys(const Tensor& index, int64_t rows) {
  ENGINE_CHECK(index.defined() && (index.dtype() == DType::i32 || index.dtype() == DType::i64),
               "[sorted_index_keys] expects an i32 or i64 index, got ", describe(index));
  ENGINE_CHECK(index.numel() < (int64_t{1} << 32) && rows < (int64_t{1} << 31),
               "[sorted_index_keys] ", index.numel(), " ids into ", rows,
               " rows exceed the keys' 32-bit halves");
  Tensor idx = index.detach().contiguous().reshape({index.numel()});
  check_in_range(idx, index.shape(), rows, "sorted_index_keys", "id");
  Tensor keys = Tensor::empty({idx.numel()}, DType::i64, idx.device());
  if (idx.numel() > 0) sort_index_keys_kernel(idx.device(), idx, rows, keys);
  return keys;
}

}  // namespace engine
