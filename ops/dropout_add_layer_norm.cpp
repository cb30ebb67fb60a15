// dropout_add_layer_norm: argument checks, autograd wiring (the mask redrawn from the saved stream
// state) and the CPU kernels.
#include "ops/dropout_add_layer_norm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/cpu/chunk_sums.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/philox.h"
#include "engine/cpu/scratch.h"
#include "engine/cpu/vmath.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "ops/dropout.h"
#include "ops/layer_norm.h"

namespace engine {

DropoutRule dropout_rule(double p) {
  DropoutRule r;
  if (p >= 1.0) {
    r.scale = 0;
  } else if (p > 0.0) {
    r.threshold = dropout_threshold(p);
    r.scale = 1.0 / (1.0 - p);
    r.draws = true;
  }
  return r;
}

void add_work_cost(WorkCost& cost, const DropoutAddNormForward& a) {
  for (const Tensor* t :
       {&a.x, &a.bias, &a.residual, &a.weight, &a.ln_bias, &a.sum, &a.normed, &a.mean, &a.rstd})
    if (t->defined()) add_work_cost(cost, *t);
}

void add_work_cost(WorkCost& cost, const DropoutAddNormBackward& a) {
  for (const Tensor* t : {&a.sum, &a.weight, &a.mean, &a.rstd, &a.dnormed, &a.dsum, &a.d_residual,
                          &a.dx, &a.dbias, &a.dweight, &a.dln_bias})
    if (t->defined()) add_work_cost(cost, *t);
}

namespace {

// Input i's gradient buffer for the join's backward kernel: undefined when not wanted; for a
// parameter (`write` given) that is autocast's 16-bit cast of an f32 leaf, on a device, the leaf's
// f32 .grad (Node::grad_sink_f32: the kernel's column sums add into it in f32, or write it where
// its zero was deferred, *write set); otherwise a new tensor of the input's dtype.
Tensor grad_buffer(const Node& node, size_t i, Device device, bool* write) {
  if (!node.needs_input_grad(i)) return Tensor();
  if (write && !device.is_cpu())
    if (const Tensor* f32 = node.grad_sink_f32(i, write)) return *f32;
  return Tensor::empty(node.inputs[i].shape, node.inputs[i].dtype, device);
}

// What the node returns for input i: g, or nothing where g went into an f32 sink (another dtype
// than the input's).
Tensor returned_grad(const Node& node, size_t i, const Tensor& g) {
  return g.defined() && g.dtype() != node.inputs[i].dtype ? Tensor() : g;
}

}  // namespace

std::vector<Tensor> layer_norm_backward_one_pass(const Node& node, const Tensor& x,
                                                 const Tensor& weight, const Tensor& mean,
                                                 const Tensor& rstd, const Tensor& dy, double p,
                                                 PhiloxState state) {
  DropoutAddNormBackward a;
  a.sum = x;
  a.weight = weight;
  a.mean = mean;
  a.rstd = rstd;
  a.p = p;
  a.state = state;
  a.drop_normed = p > 0;  // p == 0: the plain LayerNorm backward (nothing to mask)
  a.dnormed = dy.contiguous();
  a.d_residual = grad_buffer(node, 0, x.device(), nullptr);
  a.dweight = grad_buffer(node, 1, x.device(), &a.write_dweight);
  a.dln_bias = grad_buffer(node, 2, x.device(), &a.write_dln_bias);
  dropout_add_layer_norm_backward_kernel(x.device(), a);
  return {a.d_residual, returned_grad(node, 1, a.dweight), returned_grad(node, 2, a.dln_bias)};
}

namespace {

constexpr const char* kOp = "dropout_add_layer_norm";

void check_like(const Tensor& x, const Tensor& t, const char* what, bool row,
                const char* op = kOp) {
  if (!t.defined()) return;
  const int64_t c = x.shape().back();
  if (row) {
    ENGINE_CHECK(t.shape() == x.shape(), "[", op, "] ", what, " ", describe(t),
                 " does not match the shape of x ", describe(x));
  } else {
    ENGINE_CHECK(t.dim() == 1 && t.size(0) == c, "[", op, "] ", what, " ", describe(t),
                 " does not match x ", describe(x), ": expected shape (", c, ")");
  }
  ENGINE_CHECK(t.dtype() == x.dtype(), "[", op, "] ", what, " ", describe(t),
               " does not match the dtype of x ", describe(x), " (convert one with .to())");
  ENGINE_CHECK(t.device() == x.device(), "[", op, "] ", what, " ", describe(t),
               " is not on the device of x ", describe(x));
}

Tensor detached(const Tensor& t) { return t.defined() ? t.detach().contiguous() : Tensor(); }

struct DropoutAddNormNode : Node {
  Tensor sum, weight, mean, rstd;
  double p = 0;
  PhiloxState state;
  const char* name() const override { return kOp; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    DropoutAddNormBackward a;
    a.sum = sum;
    a.weight = weight;
    a.mean = mean;
    a.rstd = rstd;
    a.p = p;
    a.state = state;
    a.dnormed = grads[1].defined() ? grads[1].contiguous()
                                   : Tensor::zeros(sum.shape(), sum.dtype(), sum.device());
    if (grads[0].defined()) a.dsum = grads[0].contiguous();
    // A parameter (bias, weight, ln_bias) that is autocast's 16-bit cast of an f32 leaf: on a
    // device its gradient is added in f32 into the leaf's .grad by the kernel's column sums, not
    // written in 16 bits and added by a launch of its own; written rather than added where the
    // .grad's zero was deferred (no zero fill of it first). grad_buffer, returned_grad.
    const Device dev = sum.device();
    a.dx = grad_buffer(*this, 0, dev, nullptr);
    a.dbias = grad_buffer(*this, 1, dev, &a.write_dbias);
    a.d_residual = grad_buffer(*this, 2, dev, nullptr);
    a.dweight = grad_buffer(*this, 3, dev, &a.write_dweight);
    a.dln_bias = grad_buffer(*this, 4, dev, &a.write_dln_bias);
    dropout_add_layer_norm_backward_kernel(dev, a);
    return {a.dx, returned_grad(*this, 1, a.dbias), a.d_residual,
            returned_grad(*this, 3, a.dweight), returned_grad(*this, 4, a.dln_bias)};
  }
  void release_saved() override { sum = weight = mean = rstd = Tensor(); }
};

// layer_norm_dropout's: x's gradient and the parameters', the mask redrawn from the state.
struct LayerNormDropoutNode : Node {
  Tensor x, weight, mean, rstd;
  double p = 0;
  PhiloxState state;
  const char* name() const override { return "layer_norm_dropout"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return layer_norm_backward_one_pass(*this, x, weight, mean, rstd, grads[0], p, state);
  }
  void release_saved() override { x = weight = mean = rstd = Tensor(); }
};

// ---- CPU kernels -----------------------------------------------------------------------------

namespace cpu {

constexpr int64_t kParallelElems = ::engine::cpu::kParallelMinElems;
// The parameter gradients are summed per chunk of rows, then the chunks in order (boundaries
// fixed by the row count: the same bits at any thread count), as layer_norm's are.
constexpr int64_t kMaxChunks = 64;

// `p`, or a row of c copies of `fill` when p is null (this thread's, kept between calls): an
// absent bias or weight as a row, so the row loops have no branch and vectorise.
template <class T>
const T* row_or(const T* p, int64_t c, T fill) {
  if (p) return p;
  thread_local std::vector<T> zeros, ones;
  std::vector<T>& row = fill == T(0) ? zeros : ones;
  if (static_cast<int64_t>(row.size()) < c) row.assign(static_cast<size_t>(c), fill);
  return row.data();
}

// keep ? v : +0 as a bitwise and: GCC sinks a value used on one arm of a select into a branch
// and, under -ftrapping-math, will not vectorise it back (the loops below stayed scalar: twice the
// fused forward's time); an and of the bits vectorises and is the same value, NaN and inf included.
template <class T>
inline T keep_or_zero(bool keep, T v) {
  using U = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  return std::bit_cast<T>(std::bit_cast<U>(v) & (U(0) - U(keep)));
}

// out[j] = r[j] + (keep_j ? x[j] + b[j] : 0) * scale, keep_j from words (all kept when null).
template <class T>
void drop_add_row(const T* __restrict x, const T* __restrict b, const T* __restrict r,
                  const uint32_t* __restrict words, uint32_t th, T scale, T* __restrict out,
                  int64_t c) {
  if (words) {
    for (int64_t j = 0; j < c; ++j)
      out[j] = r[j] + keep_or_zero(dropout_keep(words[j], th), x[j] + b[j]) * scale;
  } else {
    for (int64_t j = 0; j < c; ++j) out[j] = r[j] + (x[j] + b[j]) * scale;
  }
}

// y[j] = (z[j] - mu) rs w[j] + b[j]: a LayerNorm row from its statistics.
template <class T>
void normalise_row(const T* __restrict z, T mu, T rs, const T* __restrict w, const T* __restrict b,
                   T* __restrict y, int64_t c) {
  for (int64_t j = 0; j < c; ++j) y[j] = (z[j] - mu) * rs * w[j] + b[j];
}

// A row of layer_norm's input gradient plus the sum output's own (gs, may be null) into out:
// rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w stored first (as layer_norm's
// kernel does), then + gs, each step rounded to T as the unfused ops round it.
template <class T>
void ln_input_grad_row(const T* __restrict z, const T* __restrict g, const T* __restrict w,
                       const T* __restrict gs, T mu, T rs, T* __restrict out, int64_t c) {
  for (int64_t j = 0; j < c; ++j) out[j] = g[j] * w[j];
  T sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < c; ++j) {
    sum_g += out[j];
    sum_gx += out[j] * ((z[j] - mu) * rs);
  }
  const T mean_g = sum_g / T(c), mean_gx = sum_gx / T(c);
  for (int64_t j = 0; j < c; ++j) out[j] = rs * (out[j] - mean_g - ((z[j] - mu) * rs) * mean_gx);
  if (gs)
    for (int64_t j = 0; j < c; ++j) out[j] += gs[j];
}

// dx[j] = (keep_j ? d[j] : 0) * scale; dx may be d itself.
template <class T>
void drop_row(const T* d, const uint32_t* __restrict words, uint32_t th, T scale, T* dx,
              int64_t c) {
  if (words) {
    for (int64_t j = 0; j < c; ++j) dx[j] = keep_or_zero(dropout_keep(words[j], th), d[j]) * scale;
  } else {
    for (int64_t j = 0; j < c; ++j) dx[j] = d[j] * scale;
  }
}

// The keep words of row r (elements r * c ..), or nullptr when the rule draws none.
const uint32_t* row_words(const DropoutRule& rule, PhiloxState s, int64_t r, int64_t c,
                          std::vector<uint32_t>& fresh) {
  if (!rule.draws) return nullptr;
  namespace ph = ::engine::cpu::philox;
  uint32_t* buf = ::engine::cpu::thread_scratch<uint32_t, 0>(ph::stream_words_size(c), fresh);
  return ph::stream_words(s, r * c, c, buf);
}

void forward(const DropoutAddNormForward& a) {
  dispatch_floating(a.x.dtype(), kOp, [&]<class T>() {
    const int64_t c = a.x.shape().back();
    const int64_t rows = a.x.numel() / c;
    const T* px = a.x.data<T>();
    const T* pr = a.residual.defined() ? a.residual.data<T>() : nullptr;
    const T* pb_in = a.bias.defined() ? a.bias.data<T>() : nullptr;
    const T* pw_in = a.weight.defined() ? a.weight.data<T>() : nullptr;
    const T* plb_in = a.ln_bias.defined() ? a.ln_bias.data<T>() : nullptr;
    T* ps = a.sum.defined() ? a.sum.data<T>() : nullptr;
    T* py = a.normed.data<T>();
    T* pmean = a.mean.data<T>();
    T* prstd = a.rstd.data<T>();
    const DropoutRule rule = dropout_rule(a.p);
#pragma omp parallel for if (rows * c > kParallelElems)
    for (int64_t r = 0; r < rows; ++r) {
      const T* pb = row_or(pb_in, c, T(0));
      const T* pw = row_or(pw_in, c, T(1));
      const T* plb = row_or(plb_in, c, T(0));
      std::vector<uint32_t> fresh;
      const uint32_t* words = row_words(rule, a.state, r, c, fresh);
      const T* xr = px + r * c;
      T* yr = py + r * c;
      const T scale = static_cast<T>(rule.scale);
      const uint32_t th = rule.threshold;
      if (a.drop_normed) {  // dropout(layer_norm(x)): layer_norm's row, then dropout's
        const T mu = ::engine::cpu::row_sum(xr, c) / T(c);
        const T v = ::engine::cpu::row_sum_sq_dev(xr, mu, c);
        const T rs = T(1) / std::sqrt(v / T(c) + T(a.eps));
        pmean[r] = mu;
        prstd[r] = rs;
        normalise_row(xr, mu, rs, pw, plb, yr, c);
        if (!words && rule.scale == 0)  // p == 1: everything dropped
          std::fill(yr, yr + c, T(0));
        else if (words)
          drop_row(yr, words, th, scale, yr, c);
        continue;
      }
      const T* rr = pr + r * c;
      T* sr = ps + r * c;
      if (!words && rule.scale == 0)  // p == 1: everything dropped
        std::copy(rr, rr + c, sr);
      else
        drop_add_row(xr, pb, rr, words, th, scale, sr, c);
      const T mu = ::engine::cpu::row_sum(sr, c) / T(c);
      const T v = ::engine::cpu::row_sum_sq_dev(sr, mu, c);
      const T rs = T(1) / std::sqrt(v / T(c) + T(a.eps));
      pmean[r] = mu;
      prstd[r] = rs;
      normalise_row(sr, mu, rs, pw, plb, yr, c);
    }
  });
}

void backward(const DropoutAddNormBackward& a) {
  dispatch_floating(a.sum.dtype(), "dropout_add_layer_norm_backward", [&]<class T>() {
    const int64_t c = a.sum.shape().back();
    const int64_t rows = a.sum.numel() / c;
    const T* pz = a.sum.data<T>();
    const T* pw_in = a.weight.defined() ? a.weight.data<T>() : nullptr;
    const T* pmean = a.mean.data<T>();
    const T* prstd = a.rstd.data<T>();
    const T* pg = a.dnormed.data<T>();
    const T* pgs = a.dsum.defined() ? a.dsum.data<T>() : nullptr;
    T* pdr = a.d_residual.defined() ? a.d_residual.data<T>() : nullptr;
    T* pdx = a.dx.defined() ? a.dx.data<T>() : nullptr;
    const bool want_b = a.dbias.defined(), want_w = a.dweight.defined(),
               want_lb = a.dln_bias.defined();
    const bool want_dz = pdr || pdx || want_b;
    const DropoutRule rule = dropout_rule(a.p);
    const int64_t chunks = std::min(rows, kMaxChunks);
    // Partial sums per chunk in double, one block of chunks x c per wanted gradient.
    const int64_t outputs = want_b + want_w + want_lb;
    std::vector<double> fresh_part;
    double* part = ::engine::cpu::thread_scratch<double, 0>(outputs * chunks * c, fresh_part);
    std::fill(part, part + outputs * chunks * c, 0.0);
    double* part_b = want_b ? part : nullptr;
    double* part_w = want_w ? part + (want_b ? chunks * c : 0) : nullptr;
    double* part_lb = want_lb ? part + (outputs - 1) * chunks * c : nullptr;
#pragma omp parallel for schedule(static) if (rows * c > kParallelElems)
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t r0 = rows * k / chunks, r1 = rows * (k + 1) / chunks;
      double* acc_b = part_b ? part_b + k * c : nullptr;
      double* acc_w = part_w ? part_w + k * c : nullptr;
      double* acc_lb = part_lb ? part_lb + k * c : nullptr;
      std::vector<uint32_t> fresh_words;
      std::vector<T> fresh_d, fresh_g;
      T* d = ::engine::cpu::thread_scratch<T, 1>(c, fresh_d);  // dxhat, then dsum_total
      // drop_normed: the row's dnormed through dropout's backward first (its rounding)
      T* gd = a.drop_normed ? ::engine::cpu::thread_scratch<T, 2>(c, fresh_g) : nullptr;
      const T* pw = row_or(pw_in, c, T(1));
      const T scale = static_cast<T>(rule.scale);
      const uint32_t th = rule.threshold;
      for (int64_t r = r0; r < r1; ++r) {
        const T* zr = pz + r * c;
        const T* gr = pg + r * c;
        if (gd) {
          const uint32_t* words = row_words(rule, a.state, r, c, fresh_words);
          if (!words && rule.scale == 0)  // p == 1: nothing reaches the LayerNorm
            std::fill(gd, gd + c, T(0));
          else
            drop_row(gr, words, th, scale, gd, c);
          gr = gd;
        }
        const T mu = pmean[r], rs = prstd[r];
        if (acc_w)
          for (int64_t j = 0; j < c; ++j)
            acc_w[j] += static_cast<double>(gr[j] * ((zr[j] - mu) * rs));
        if (acc_lb)
          for (int64_t j = 0; j < c; ++j) acc_lb[j] += static_cast<double>(gr[j]);
        if (!want_dz) continue;
        // The residual's gradient straight into its row (else the scratch row).
        T* dz = pdr ? pdr + r * c : d;
        ln_input_grad_row(zr, gr, pw, pgs ? pgs + r * c : nullptr, mu, rs, dz, c);
        if (!pdx && !acc_b) continue;
        const uint32_t* words = row_words(rule, a.state, r, c, fresh_words);
        // dx = dsum_total x keep / (1 - p) into dx's row (or the scratch row), then its sums.
        T* v = pdx ? pdx + r * c : d;  // the scratch row: dz may be the residual's gradient
        drop_row(dz, words, th, scale, v, c);
        if (acc_b)
          for (int64_t j = 0; j < c; ++j) acc_b[j] += static_cast<double>(v[j]);
      }
    }
    if (want_b) ::engine::cpu::sum_chunks_in_order(part_b, chunks, c, a.dbias.data<T>());
    if (want_w) ::engine::cpu::sum_chunks_in_order(part_w, chunks, c, a.dweight.data<T>());
    if (want_lb) ::engine::cpu::sum_chunks_in_order(part_lb, chunks, c, a.dln_bias.data<T>());
  });
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(dropout_add_layer_norm_kernel, DeviceType::CPU, cpu::forward);
ENGINE_REGISTER_KERNEL(dropout_add_layer_norm_backward_kernel, DeviceType::CPU, cpu::backward);

}  // namespace

DropoutAddNorm dropout_add_layer_norm(const Tensor& x_in, const Tensor& bias_in,
                                      const Tensor& residual_in, double p, bool training,
                                      Generator& gen, const Tensor& weight_in,
                                      const Tensor& ln_bias_in, double eps) {
  ENGINE_CHECK(x_in.defined() && residual_in.defined(), "[", kOp,
               "] x and residual must be defined");
  const Tensor x = autocast_to_compute(x_in), residual = autocast_to_compute(residual_in),
               bias = autocast_to_compute(bias_in), weight = autocast_to_compute(weight_in),
               ln_bias = autocast_to_compute(ln_bias_in);
  ENGINE_CHECK(is_floating(x.dtype()), "[", kOp, "] expects a floating x, got ", describe(x));
  ENGINE_CHECK(x.dim() >= 1 && x.shape().back() > 0, "[", kOp,
               "] expects a non-empty last dim to normalise over, got x ", describe(x));
  check_like(x, residual, "residual", true);
  check_like(x, bias, "bias", false);
  check_like(x, weight, "weight", false);
  check_like(x, ln_bias, "ln_bias", false);
  ENGINE_CHECK(p >= 0.0 && p <= 1.0, "[", kOp, "] p must be in [0, 1], got ", p);
  ENGINE_CHECK(eps >= 0, "[", kOp, "] eps must be >= 0, got ", eps);

  DropoutAddNormForward a;
  a.x = detached(x);
  a.bias = detached(bias);
  a.residual = detached(residual);
  a.weight = detached(weight);
  a.ln_bias = detached(ln_bias);
  a.p = training ? p : 0.0;
  a.eps = eps;
  if (a.p > 0.0 && a.p < 1.0) a.state = gen.reserve_words(static_cast<uint64_t>(x.numel()));
  const int64_t rows = x.numel() / x.shape().back();
  a.sum = Tensor::empty(x.shape(), x.dtype(), x.device());
  a.normed = Tensor::empty(x.shape(), x.dtype(), x.device());
  const DType sd = layer_norm_stats_dtype(x.dtype());
  a.mean = Tensor::empty({rows}, sd, x.device());
  a.rstd = Tensor::empty({rows}, sd, x.device());
  dropout_add_layer_norm_kernel(x.device(), a);
  if (needs_grad({&x, &bias, &residual, &weight, &ln_bias})) {
    auto n = std::make_shared<DropoutAddNormNode>();
    // The saved sum is a detached alias: the output itself holds the node (its grad_fn), so
    // keeping it here would make a cycle that a graph dropped without a backward never frees.
    n->sum = a.sum.detach();
    n->weight = a.weight;  // read by the input gradient even when it needs no gradient itself
    n->mean = a.mean;
    n->rstd = a.rstd;
    n->p = a.p;
    n->state = a.state;
    record(n, {x, bias, residual, weight, ln_bias}, {a.sum, a.normed});
  }
  return {a.sum, a.normed};
}

Tensor layer_norm_dropout_mask(const Node& node) {
  const auto* n = dynamic_cast<const LayerNormDropoutNode*>(&node);
  if (!n || n->p == 0.0) return Tensor();
  const TensorMeta& m = n->inputs.at(0);
  if (n->p >= 1.0) return Tensor::zeros(m.shape, DType::u8, m.device);  // no draw: all dropped
  return dropout_mask(m.shape, n->p, n->state, DType::u8, m.device);
}

Tensor layer_norm_dropout(const Tensor& x_in, const Tensor& weight_in, const Tensor& ln_bias_in,
                          double p, bool training, Generator& gen, double eps) {
  ENGINE_CHECK(x_in.defined(), "[layer_norm_dropout] x must be defined");
  const Tensor x = autocast_to_compute(x_in), weight = autocast_to_compute(weight_in),
               ln_bias = autocast_to_compute(ln_bias_in);
  ENGINE_CHECK(is_floating(x.dtype()), "[layer_norm_dropout] expects a floating x, got ",
               describe(x));
  ENGINE_CHECK(x.dim() >= 1 && x.shape().back() > 0,
               "[layer_norm_dropout] expects a non-empty last dim to normalise over, got x ",
               describe(x));
  check_like(x, weight, "weight", false, "layer_norm_dropout");
  check_like(x, ln_bias, "ln_bias", false, "layer_norm_dropout");
  ENGINE_CHECK(p >= 0.0 && p <= 1.0, "[layer_norm_dropout] p must be in [0, 1], got ", p);
  ENGINE_CHECK(eps >= 0, "[layer_norm_dropout] eps must be >= 0, got ", eps);

  DropoutAddNormForward a;
  a.x = detached(x);
  a.weight = detached(weight);
  a.ln_bias = detached(ln_bias);
  a.p = training ? p : 0.0;
  a.eps = eps;
  a.drop_normed = true;
  // dropout's draw: only where it draws (0 < p < 1 in training)
  if (a.p > 0.0 && a.p < 1.0) a.state = gen.reserve_words(static_cast<uint64_t>(x.numel()));
  const int64_t rows = x.numel() / x.shape().back();
  a.normed = Tensor::empty(x.shape(), x.dtype(), x.device());
  const DType sd = layer_norm_stats_dtype(x.dtype());
  a.mean = Tensor::empty({rows}, sd, x.device());
  a.rstd = Tensor::empty({rows}, sd, x.device());
  dropout_add_layer_norm_kernel(x.device(), a);
  if (needs_grad({&x, &weight, &ln_bias})) {
    auto n = std::make_shared<LayerNormDropoutNode>();
    n->x = a.x;
    n->weight = a.weight;
    n->mean = a.mean;
    n->rstd = a.rstd;
    n->p = a.p;
    n->state = a.state;
    record(n, {x, weight, ln_bias}, {a.normed});
  }
  return a.normed;
}

}  // namespace engine
