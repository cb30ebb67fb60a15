// Matrix products: shape/layout checks, autograd wiring for matmul and linear, and the raw gemm()
// helper. The CPU kernel is the GEMM engine of engine/cpu/gemm.cpp (oneDNN, OpenBLAS or Eigen).
#include "ops/matmul.h"

#include <algorithm>
#include <optional>
#include <string>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/cpu/gemm.h"
#include "engine/error.h"
#include "ops/reduce.h"

namespace engine {
namespace {

// ---- layouts ---------------------------------------------------------------------------------

// How the GEMM can read the matrix in the last two dims (rows, cols) of a tensor in place.
struct MatLayout {
  bool ok = false;
  bool transposed = false;  // stored column-major (a transposed view): the GEMM reads t^T
  int64_t ld = 0;           // row-major leading dim of the matrix as stored
};

MatLayout mat_layout(const Tensor& t) {
  const int64_t r = t.size(-2), c = t.size(-1);
  const int64_t sr = t.stride(-2), sc = t.stride(-1);
  // Nothing is read from an empty matrix; any legal ld will do.
  if (t.numel() == 0) return {true, false, std::max<int64_t>(c, 1)};
  // Size-1 dims carry arbitrary strides; they get the smallest legal ld instead (cuBLAS rejects
  // ld < stored columns even when it never steps by it). ld >= cols also rules out overlapping
  // rows (stride-0 broadcast matrices), which BLAS cannot read.
  if ((c == 1 || sc == 1) && (r == 1 || sr >= c)) return {true, false, r == 1 ? c : sr};
  if ((r == 1 || sr == 1) && (c == 1 || sc >= r)) return {true, true, c == 1 ? r : sc};
  return {};
}

// The single stride that steps through dims [begin, end) of (shape, strides) as one flattened
// dim, if there is one. Size-1 dims are skipped; all-size-1 (or empty) ranges give 0.
std::optional<int64_t> collapse_stride(const Shape& shape, const std::vector<int64_t>& strides,
                                       size_t begin, size_t end) {
  std::optional<int64_t> inner;
  int64_t next = 0;  // the stride the next outer non-1 dim must have
  for (size_t d = end; d-- > begin;) {
    if (shape[d] == 1) continue;
    if (!inner) {
      inner = strides[d];
    } else if (strides[d] != next) {
      return std::nullopt;
    }
    next = strides[d] * shape[d];
  }
  return inner.value_or(0);
}

// `t` as is when the GEMM can read its last two dims in place, else a contiguous copy.
Tensor gemm_ready(const Tensor& t) { return mat_layout(t).ok ? t : t.contiguous(); }

// `t` (..., r, c) broadcast to batch + (r, c) and viewed as (B, r, c) with one batch stride.
// No copy when the batch dims collapse to one stride (contiguous batches, or a matrix shared by
// every item); otherwise the broadcast is materialised.
Tensor as_batched(Tensor t, const Shape& batch) {
  t = gemm_ready(t);
  const int64_t r = t.size(-2), c = t.size(-1), nb = shape_numel(batch);
  Shape full = batch;
  full.push_back(r);
  full.push_back(c);
  std::vector<int64_t> st = broadcast_strides(t.shape(), t.strides(), full);
  if (auto bs = collapse_stride(full, st, 0, batch.size()))
    return make_view(t, {nb, r, c}, {*bs, st[st.size() - 2], st.back()}, t.storage_offset());
  Tensor copy = make_view(t, full, st, t.storage_offset()).contiguous();
  return make_view(copy, {nb, r, c}, {r * c, c, 1}, copy.storage_offset());
}

// `t` (..., r, c) viewed as (prod(...) * r, c), one GEMM operand, if its rows collapse to one
// stride in place.
std::optional<Tensor> fold_rows(const Tensor& t) {
  const size_t nd = t.shape().size();
  auto rs = collapse_stride(t.shape(), t.strides(), 0, nd - 1);
  if (!rs) return std::nullopt;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < nd; ++d) rows *= t.shape()[d];
  Tensor v = make_view(t, {rows, t.size(-1)}, {*rs, t.stride(-1)}, t.storage_offset());
  if (!mat_layout(v).ok) return std::nullopt;
  return v;
}

// `t` (..., c) as a 2-D (rows, c) GEMM operand: in place when possible, else copied.
Tensor rows_of(const Tensor& t) {
  if (auto v = fold_rows(t)) return *v;
  Tensor copy = t.contiguous();
  return *fold_rows(copy);
}

Shape batch_dims(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// ---- checks ----------------------------------------------------------------------------------

void check_pair(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  ENGINE_CHECK(a.defined() && b.defined(), "[", op, "] got an undefined input: ", na, " ",
               describe(a), ", ", nb, " ", describe(b));
  ENGINE_CHECK(a.device() == b.device(), "[", op, "] inputs are on different devices: ", na, " ",
               describe(a), ", ", nb, " ", describe(b));
  ENGINE_CHECK(a.dtype() == b.dtype(), "[", op, "] dtype mismatch: ", na, " ", describe(a), ", ",
               nb, " ", describe(b), " (convert one with .to())");
  ENGINE_CHECK(is_floating(a.dtype()), "[", op, "] expects floating tensors, got ", na, " ",
               describe(a), ", ", nb, " ", describe(b));
}

// ---- forward without autograd ----------------------------------------------------------------

// x (..., M, K) @ y (..., K, N), both at least 2-D and detached, shapes already checked.
Tensor matmul_raw(const Tensor& x, const Tensor& y) {
  const int64_t m = x.size(-2), n = y.size(-1);
  const Shape batch = broadcast_shapes(batch_dims(x), batch_dims(y), "matmul");
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  // A 2-D right operand (a weight): fold x's batch into its rows, one (B*M, K) @ (K, N) GEMM,
  // instead of B small ones.
  if (y.dim() == 2 && x.dim() > 2) {
    if (auto x2 = fold_rows(x)) {
      gemm(*x2, false, y, false, make_view(out, {x2->size(0), n}, {n, 1}, 0));
      return out;
    }
  }
  const int64_t nb = shape_numel(batch);
  gemm(as_batched(x, batch), false, as_batched(y, batch), false,
       make_view(out, {nb, m, n}, {m * n, n, 1}, 0));
  return out;
}

// ---- autograd --------------------------------------------------------------------------------

struct MatmulNode : Node {
  Tensor a;  // (..., M, K), saved when b needs a gradient
  Tensor b;  // (..., K, N), saved when a needs a gradient
  // b a view whose last two dims are swapped (stride 1 down its rows: x^T of an (..., N, K)
  // tensor, TUPE's and attention's q k^T) with the output's batch dims: its gradient is made as
  // dC^T A, (..., N, K) row-major, and handed back transposed, so that the transpose before it
  // returns a row-major gradient instead of a copy through a strided layout.
  bool b_transposed = false;
  const char* name() const override { return "matmul"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];  // (batch..., M, N)
    Tensor ga, gb;
    if (needs_input_grad(0)) {
      // dA = dC @ B^T; B^T is a transposed view, read in place by the GEMM.
      ga = sum_to_shape(matmul_raw(g, b.transpose(-1, -2)), inputs[0].shape);
    }
    if (needs_input_grad(1)) {
      if (b_is_2d()) {
        // dB = sum over every row of the batch of A^T dC: one (K, B*M) @ (B*M, N) GEMM over
        // the folded rows instead of B products and a reduction; added straight into B's .grad
        // when the engine offers it (beta 1).
        Tensor a2 = rows_of(a);  // (B*M, K)
        Tensor g2 = rows_of(g);  // (B*M, N)
        bool write = false;      // a deferred zero: beta 0 (Node::grad_sink)
        if (const Tensor* sink = grad_sink(1, g.dtype(), &write)) {
          gemm(a2, true, g2, false, *sink, 1.0, write ? 0.0 : 1.0);
        } else if (const Tensor* f32 = grad_sink_f32(1, &write)) {
          gemm(a2, true, g2, false, *f32, 1.0, write ? 0.0 : 1.0);  // 16-bit product, f32 sums
        } else {
          gb = Tensor::empty(inputs[1].shape, g.dtype(), g.device());
          gemm(a2, true, g2, false, gb);
        }
      } else if (b_transposed) {
        gb = matmul_raw(g.transpose(-1, -2), a).transpose(-1, -2);
      } else {
        gb = sum_to_shape(matmul_raw(a.transpose(-1, -2), g), inputs[1].shape);
      }
    }
    return {ga, gb};
  }
  bool b_is_2d() const { return inputs[1].shape.size() == 2; }
  void release_saved() override { a = b = Tensor(); }
};

struct LinearNode : Node {
  Tensor x;       // (..., in)
  Tensor weight;  // (out, in)
  const char* name() const override { return "linear"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor g2 = rows_of(grads[0]);  // (R, out), R = prod of x's leading dims
    const Device dev = g2.device();
    const DType dt = g2.dtype();
    Tensor gx, gw, gbias;
    if (needs_input_grad(0)) {
      // dX = dY W (..., in); on a device, added straight into the gradient already summed for x
      // when the engine offers it (beta 1: the residual stream's sum, one pass fewer a sublayer;
      // the CPU keeps its bits, c + (a b) rounded as two steps)
      const Tensor* sink = dev.is_cpu() ? nullptr : grad_sink(0, dt);
      if (!sink) gx = Tensor::empty(inputs[0].shape, dt, dev);
      const Tensor& dst = sink ? *sink : gx;
      gemm(g2, false, gemm_ready(weight), false,
           make_view(dst, {g2.size(0), weight.size(1)}, {weight.size(1), 1}, dst.storage_offset()),
           1.0, sink ? 1.0 : 0.0);
    }
    bool bias_done = false;
    if (needs_input_grad(1)) {
      // (out, in) = dY^T X over all rows; added straight into the weight's .grad (beta 1) when the
      // engine offers it: the tied embeddings' 15.6 MB dE of the tiny model then costs no second
      // pass to add it.
      // Written (beta 0) where the .grad's zero was deferred: the step's first writer.
      bool write = false;
      if (const Tensor* sink = grad_sink(1, dt, &write)) {
        gemm(g2, true, rows_of(x), false, *sink, 1.0, write ? 0.0 : 1.0);
      } else if (const Tensor* f32 = grad_sink_f32(1, &write)) {
        // 16-bit product added in f32; on a device the bias's gradient (the column sums of dY)
        // comes from the same GEMM's epilogue when both go to f32 .grads (no pass over dY of
        // its own), written straight into the bias's .grad where its zero was deferred
        bool write_b = false;
        const Tensor* f32b =
            needs_input_grad(2) && !dev.is_cpu() ? grad_sink_f32(2, &write_b) : nullptr;
        if (f32b) {
          gemm(g2.contiguous(), true, rows_of(x), false, *f32, 1.0, write ? 0.0 : 1.0,
               GemmEpilogue::bias_grad, *f32b, !write_b);
          bias_done = true;
        } else {
          gemm(g2, true, rows_of(x), false, *f32, 1.0, write ? 0.0 : 1.0);
        }
      } else {
        gw = Tensor::empty(inputs[1].shape, dt, dev);
        gemm(g2, true, rows_of(x), false, gw);
      }
    }
    if (needs_input_grad(2) && !bias_done) {
      // (out): column sums of dY; added in f32 straight into the f32 .grad behind autocast's
      // cast of the bias when the engine offers it (no 16-bit gradient, no separate add).
      if (const Tensor* f32 = grad_sink_f32(2))
        column_sums_add_kernel(dev, g2.contiguous(), *f32);
      else
        gbias = sum_to_shape(g2, inputs[2].shape);
    }
    return {gx, gw, gbias};
  }
  void release_saved() override { x = weight = Tensor(); }
};

ENGINE_REGISTER_KERNEL(gemm_kernel, DeviceType::CPU, cpu::gemm);

}  // namespace

// ---- public ----------------------------------------------------------------------------------

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          double alpha, double beta, GemmEpilogue epilogue, const Tensor& bias,
          bool bias_grad_add) {
  ENGINE_CHECK(a.defined() && b.defined() && c.defined(), "[gemm] got an undefined tensor: a ",
               describe(a), ", b ", describe(b), ", c ", describe(c));
  ENGINE_CHECK(a.device() == c.device() && b.device() == c.device(),
               "[gemm] tensors are on different devices: a ", describe(a), ", b ", describe(b),
               ", c ", describe(c));
  // One dtype, or 16-bit a and b accumulated into an f32 c (a gradient added straight into an
  // f32 master's .grad; the CUDA GEMM only).
  const bool c_f32 = c.dtype() == DType::f32 && a.dtype() != DType::f32 &&
                     (a.dtype() == DType::bf16 || a.dtype() == DType::f16);
  ENGINE_CHECK(a.dtype() == b.dtype() && (a.dtype() == c.dtype() || c_f32),
               "[gemm] dtype mismatch: a ", describe(a), ", b ", describe(b), ", c ", describe(c),
               " (one dtype, or bf16 / f16 a and b with an f32 c)");
  ENGINE_CHECK(is_floating(c.dtype()), "[gemm] expects floating tensors, got c ", describe(c));
  for (const Tensor* t : {&a, &b, &c})
    ENGINE_CHECK(t->dim() == 2 || t->dim() == 3,
                 "[gemm] expects 2-D (rows, cols) or 3-D (batch, rows, cols) tensors, got a ",
                 describe(a), ", b ", describe(b), ", c ", describe(c));
  const int64_t batch = c.dim() == 3 ? c.size(0) : 1;
  const int64_t m = c.size(-2), n = c.size(-1);
  const int64_t am = trans_a ? a.size(-1) : a.size(-2), k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t bk = trans_b ? b.size(-1) : b.size(-2), bn = trans_b ? b.size(-2) : b.size(-1);
  ENGINE_CHECK(am == m && bk == k && bn == n, "[gemm] shapes do not match: op(a) ", am, "x", k,
               " @ op(b) ", bk, "x", bn, " -> c ", m, "x", n, " (a ", describe(a),
               trans_a ? " transposed" : "", ", b ", describe(b), trans_b ? " transposed" : "",
               ", c ", describe(c), ")");
  auto batch_stride = [&](const Tensor& t, const char* name) -> int64_t {
    if (t.dim() == 2 || t.size(0) == 1) return 0;  // one matrix shared by the batch
    ENGINE_CHECK(t.size(0) == batch, "[gemm] ", name, " ", describe(t), " has batch ", t.size(0),
                 " but c ", describe(c), " has batch ", batch);
    return t.stride(0);
  };
  const int64_t sa = batch_stride(a, "a"), sb = batch_stride(b, "b");
  const int64_t sc = batch_stride(c, "c");
  ENGINE_CHECK(batch <= 1 || sc != 0, "[gemm] c ", describe(c),
               " has batch stride 0: every batch item would write the same matrix");
  const MatLayout la = mat_layout(a), lb = mat_layout(b), lc = mat_layout(c);
  auto check_layout = [](const MatLayout& l, const Tensor& t, const char* name) {
    ENGINE_CHECK(l.ok, "[gemm] ", name, " ", describe(t), " with strides ", shape_str(t.strides()),
                 " is not a matrix the GEMM can read in place: it needs stride 1 in its last "
                 "or second-last dim (call .contiguous() first)");
  };
  check_layout(la, a, "a");
  check_layout(lb, b, "b");
  check_layout(lc, c, "c");

  const bool with_bias = epilogue == GemmEpilogue::bias || epilogue == GemmEpilogue::bias_gelu_tanh;
  const bool bias_grad = epilogue == GemmEpilogue::bias_grad;
  ENGINE_CHECK(!c_f32 || epilogue == GemmEpilogue::none || bias_grad,
               "[gemm] an epilogue with 16-bit a and b into an f32 c is not supported");
  if (bias_grad) {
    ENGINE_CHECK(trans_a && a.dim() == 2 && a.is_contiguous() && c.dim() == 2,
                 "[gemm] the bias_grad epilogue takes a contiguous 2-D a read transposed and a 2-D "
                 "c, got a ",
                 describe(a), trans_a ? " transposed" : "", ", c ", describe(c));
    ENGINE_CHECK(bias.defined() && bias.dim() == 1 && bias.size(0) == m && bias.is_contiguous() &&
                     bias.dtype() == DType::f32 && bias.device() == c.device(),
                 "[gemm] the bias_grad epilogue adds into a contiguous (", m,
                 ") f32 tensor on c's "
                 "device, got ",
                 describe(bias), " for c ", describe(c));
  } else if (with_bias) {
    ENGINE_CHECK(bias.defined() && bias.dim() == 1 && bias.size(0) == n && bias.is_contiguous() &&
                     bias.dtype() == c.dtype() && bias.device() == c.device(),
                 "[gemm] the bias epilogue needs a contiguous (", n,
                 ") bias of c's dtype and "
                 "device, got ",
                 describe(bias), " for c ", describe(c));
    ENGINE_CHECK(!lc.transposed, "[gemm] the bias epilogue needs a row-major c, got ", describe(c),
                 " with strides ", shape_str(c.strides()));
  } else {
    ENGINE_CHECK(!bias.defined(), "[gemm] a bias was given without a bias epilogue");
  }
  ENGINE_CHECK(epilogue == GemmEpilogue::none || !lc.transposed,
               "[gemm] an epilogue needs a row-major c, got ", describe(c), " with strides ",
               shape_str(c.strides()));

  GemmArgs g;
  g.epilogue = epilogue;
  g.bias = with_bias ? bias.raw_data() : nullptr;
  // bias_grad: the sums go to a scratch the kernel writes (cuBLASLt's epilogue writes, it does
  // not add), then into `bias` — or straight into `bias` when they are to be written
  // (!bias_grad_add); a backend without the epilogue leaves them to column_sums_add.
  bool bias_grad_done = false;
  Tensor scratch;
  if (bias_grad) {
    if (c.device().is_cpu()) {
      g.epilogue = GemmEpilogue::none;
    } else {
      if (bias_grad_add) scratch = Tensor::empty(Shape{m}, DType::f32, c.device());
      g.bias = bias_grad_add ? scratch.raw_data() : bias.raw_data();
      g.bias_grad_done = &bias_grad_done;
    }
  }
  g.k = k;
  g.batch = batch;
  g.alpha = alpha;
  g.beta = beta;
  g.dtype = a.dtype();
  g.c_f32 = c_f32;
  g.device = c.device();
  g.c = c.raw_data();
  g.ldc = lc.ld;
  g.stride_c = sc;
  // The flag the kernel sees is the caller's transpose combined with the storage order.
  const bool ta = trans_a != la.transposed, tb = trans_b != lb.transposed;
  if (!lc.transposed) {
    g.m = m, g.n = n;
    g.a = a.raw_data(), g.lda = la.ld, g.stride_a = sa, g.trans_a = ta;
    g.b = b.raw_data(), g.ldb = lb.ld, g.stride_b = sb, g.trans_b = tb;
  } else {
    // c is stored column-major: write C^T (n x m, row-major) = op(B)^T @ op(A)^T.
    g.m = n, g.n = m;
    g.a = b.raw_data(), g.lda = lb.ld, g.stride_a = sb, g.trans_a = !tb;
    g.b = a.raw_data(), g.ldb = la.ld, g.stride_b = sa, g.trans_b = !ta;
  }
  gemm_kernel(c.device(), g);
  if (bias_grad) {
    if (bias_grad_done) {
      if (bias_grad_add) bias.add_(scratch);
    } else {  // a is (k, m): the sums of op(a)'s rows are its column sums
      if (!bias_grad_add) bias.fill_(0.0);
      column_sums_add_kernel(c.device(), a.device().is_cpu() ? a.to(DType::f32) : a, bias);
    }
  }
}

void add_work_cost(WorkCost& cost, const GemmArgs& g) {
  const double e = double(dtype_size(g.dtype)), ec = g.c_f32 ? 4.0 : e;
  const double ba = g.stride_a == 0 ? 1 : double(g.batch),
               bb = g.stride_b == 0 ? 1 : double(g.batch);
  cost.bytes +=
      e * (ba * double(g.m * g.k) + bb * double(g.k * g.n) + (g.bias ? double(g.n) : 0.0)) +
      ec * double(g.batch) * double(g.m * g.n) * (g.beta != 0.0 ? 2 : 1);
  cost.flops += 2.0 * double(g.batch) * double(g.m) * double(g.n) * double(g.k);
  if (!cost.shape.empty()) cost.shape += " ";
  if (g.epilogue == GemmEpilogue::bias_grad) cost.bytes += 4.0 * double(g.m);  // the sums
  cost.shape +=
      "m" + std::to_string(g.m) + " n" + std::to_string(g.n) + " k" + std::to_string(g.k) +
      " batch" + std::to_string(g.batch) + " " + std::string(dtype_name(g.dtype)) +
      (g.c_f32 ? " c_f32" : "") + (g.trans_a ? " Ta" : "") + (g.trans_b ? " Tb" : "") +
      (g.beta != 0.0 ? " beta" : "") + (g.epilogue == GemmEpilogue::bias_grad ? " bgrad" : "");
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast_to_compute(a_in), b = autocast_to_compute(b_in);
  check_pair(a, b, "matmul", "a", "b");
  ENGINE_CHECK(a.dim() >= 1 && b.dim() >= 1, "[matmul] expects tensors with at least 1 dim: a ",
               describe(a), " @ b ", describe(b));
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  ENGINE_CHECK(ka == kb, "[matmul] inner dims do not match: a ", describe(a), " @ b ", describe(b),
               " (", ka, " vs ", kb, ")");
  // NumPy 1-D rules: a (K) is a row (1, K), b (K) a column (K, 1); the added dim is dropped.
  // Done with views so autograd routes the gradients back through them.
  if (a.dim() == 1 || b.dim() == 1) {
    Tensor out = matmul(a.dim() == 1 ? a.unsqueeze(0) : a, b.dim() == 1 ? b.unsqueeze(-1) : b);
    if (a.dim() == 1) out = out.squeeze(-2);  // (..., 1, N) -> (..., N)
    if (b.dim() == 1) out = out.squeeze(-1);  // (..., M, 1) -> (..., M)
    return out;
  }
  {
    const Shape ba = batch_dims(a), bb = batch_dims(b);
    const size_t nd = std::max(ba.size(), bb.size());
    for (size_t i = 1; i <= nd; ++i) {
      int64_t x = i <= ba.size() ? ba[ba.size() - i] : 1;
      int64_t y = i <= bb.size() ? bb[bb.size() - i] : 1;
      ENGINE_CHECK(x == y || x == 1 || y == 1, "[matmul] batch dims do not broadcast: a ",
                   describe(a), " @ b ", describe(b), " (", shape_str(ba), " vs ", shape_str(bb),
                   ")");
    }
  }
  Tensor out = matmul_raw(a.detach(), b.detach());
  if (needs_grad(a, b)) {
    auto n = std::make_shared<MatmulNode>();
    if (b.requires_grad()) n->a = a.detach();
    if (a.requires_grad()) n->b = b.detach();
    n->b_transposed =
        b.dim() > 2 && b.stride(-2) == 1 && b.stride(-1) != 1 && batch_dims(b) == batch_dims(out);
    record(n, {a, b}, {out});
  }
  return out;
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const Tensor x = autocast_to_compute(x_in), weight = autocast_to_compute(weight_in),
               bias = autocast_to_compute(bias_in);
  check_pair(x, weight, "linear", "x", "weight");
  ENGINE_CHECK(weight.dim() == 2, "[linear] weight must be 2-D (out, in), got weight ",
               describe(weight), " for x ", describe(x));
  ENGINE_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "[linear] x ", describe(x),
               " does not match weight ", describe(weight), ": expected x (..., ", weight.size(1),
               ")");
  const int64_t out_f = weight.size(0);
  if (bias.defined()) {
    check_pair(weight, bias, "linear", "weight", "bias");
    ENGINE_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "[linear] bias ", describe(bias),
                 " does not match weight ", describe(weight), ": expected bias (", out_f, ")");
  }
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_f);
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());    // (..., out)
  Tensor x2 = rows_of(x.detach());                               // (R, in)
  Tensor y2 = make_view(y, {x2.size(0), out_f}, {out_f, 1}, 0);  // (R, out)
  if (bias.defined()) {
    // The bias added by the GEMM's epilogue (CPU: one vectorised pass over y; CUDA: cuBLASLt's
    // BIAS epilogue, in the kernel that stores y): no broadcast copy of the bias into y first.
    gemm(x2, false, gemm_ready(weight.detach()), true, y2, 1.0, 0.0, GemmEpilogue::bias,
         bias.detach().contiguous());
  } else {
    gemm(x2, false, gemm_ready(weight.detach()), true, y2);
  }
  if (needs_grad(x, weight, bias)) {
    auto n = std::make_shared<LinearNode>();
    // dX needs W, dW needs X; db needs neither.
    if (weight.requires_grad()) n->x = x.detach();
    if (x.requires_grad()) n->weight = weight.detach();
    record(n, {x, weight, bias}, {y});
  }
  return y;
}

}  // namespace engine
