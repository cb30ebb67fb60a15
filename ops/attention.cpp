// The attention op: two strided-batched GEMMs around one fused kernel each way
// (attention_softmax: scale + positional bias + key mask + softmax + dropout; its backward:
// dropout + softmax backward), so every backend that has those kernels runs it; a flash-style
// kernel can replace the body for CUDA without changing the interface. The bias (TUPE's
// (1, H, T, T) positional term) is read through a stride-0 view, once per layer's forward, never
// expanded over the batch. Backward by hand:
//   dV = P_d^T dO,  dP_d = dO V^T,  dP = dropout(dP_d),  dS = P (dP - rowsum(dP * P)),
//   dQ = scale dS K,  dK = scale dS^T Q,  dbias = sum of dS over the broadcast dims.
#include "ops/attention.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <omp.h>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/layout.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/flash_attention.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/relative.h"
#include "ops/softmax.h"

namespace engine {
namespace {

// The CPU runs the attention of one batch entry (its H heads) at a time per thread: scores,
// softmax (+ dropout) and mixing back to back while that entry's (H, Tq, Tk) scores sit in the
// core's cache, instead of three passes over all B*H score matrices through memory. The same
// kernels on views of the same buffers (and the dropout stream at the same element offsets), so
// the results are the same bits as the whole-batch calls; devices take the whole batch at once.
bool by_batch_entry(Device dev, int64_t b, int64_t h, int64_t tq, int64_t tk) {
  return dev.is_cpu() && b > 1 && (h * tq * tk) % 8 == 0;  // Philox blocks: 8 elements each
}

// Runs body(b0, nb) over batch entries [b0, b0 + nb): every entry on its own (in parallel) or
// the whole batch in one call; an exception from a thread is rethrown here. By entry, the body
// may use per-thread buffers indexed by omp_get_thread_num() (< omp_get_max_threads() at the
// call); the whole batch runs on the calling thread.
template <class F>
void over_batch_entries(bool by_entry, int64_t b, F&& body) {
  if (!by_entry) {
    body(int64_t{0}, b);
    return;
  }
  std::exception_ptr error;
  // Entries as the threads come free: one vCPU of a VM often runs slower than the other for a
  // while, and with a fixed half each the fast thread waited (engine/cpu/gemm.cpp, dE's blocks). An
  // entry's work and bits do not depend on the thread that runs it.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bi = 0; bi < b; ++bi) {
    try {
      body(bi, int64_t{1});
    } catch (...) {
#pragma omp critical(engine_attention_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// The Philox state of the scores from batch entry b0 on (`per_entry` scores each).
PhiloxState entry_state(PhiloxState s, int64_t b0, int64_t per_entry) {
  s.offset += static_cast<uint64_t>(b0 * per_entry / 8);  // attention's rule: ops/dropout.h
  return s;
}

struct AttentionNode : Node {
  Tensor q, k, v;  // (B*H, T, D), contiguous
  Tensor probs;    // (B*H, Tq, Tk): softmax output before dropout
  // (B*H, Tq, Tk): the dropped probabilities, kept on a device (not the CPU, which makes them
  // again per batch entry in its cache): the backward multiplies dO by them and reads its mask
  // from them -- no dropout pass and no Philox draw again.
  Tensor dropped;
  Shape out_shape, probs_shape4;
  double scale = 1.0, p = 0.0;
  PhiloxState state;
  const char* name() const override { return "attention"; }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Device dev = q.device();
    const DType dt = q.dtype();
    const int64_t bh = q.size(0), tq = q.size(1), tk = k.size(1), d = q.size(2), dv = v.size(2);
    Tensor dout = grads[0].contiguous().view({bh, tq, dv});

    const int64_t b = out_shape[0], h = out_shape[1];
    const bool by_entry = by_batch_entry(dev, b, h, tq, tk);
    const bool want_dv = needs_input_grad(2);
    const bool want_ds = needs_input_grad(0) || needs_input_grad(1) || needs_input_grad(3);
    // The probabilities the forward multiplied V with. With dropout they are made again; by
    // batch entry they live only while their entry is worked on: one (H, Tq, Tk) set per thread,
    // written and read back in the core's cache, not a (B*H, Tq, Tk) tensor through memory.
    Tensor pd = dropped.defined() ? dropped : probs;
    const bool pd_per_thread = by_entry && p > 0 && want_dv && !dropped.defined();
    const bool remake = p > 0 && want_dv && !dropped.defined();
    if (remake)
      pd = Tensor::empty(pd_per_thread ? Shape{omp_get_max_threads() * h, tq, tk} : probs.shape(),
                         dt, dev);
    Tensor dq, dk, dv_, dbias, ds;
    if (want_dv) dv_ = Tensor::empty({bh, tk, dv}, dt, dev);
    if (want_ds) ds = Tensor::empty({bh, tq, tk}, dt, dev);
    if (want_ds && needs_input_grad(0)) dq = Tensor::empty({bh, tq, d}, dt, dev);
    if (want_ds && needs_input_grad(1)) dk = Tensor::empty({bh, tk, d}, dt, dev);
    over_batch_entries(by_entry, b, [&](int64_t b0, int64_t nb) {
      auto rows = [&](const Tensor& t) { return t.slice(0, b0 * h, (b0 + nb) * h); };
      const PhiloxState st = entry_state(state, b0, h * tq * tk);
      const Tensor probs_c = rows(probs), dout_c = rows(dout);
      if (want_dv) {
        const int64_t t = pd_per_thread ? omp_get_thread_num() : 0;
        const Tensor pd_c = pd_per_thread ? pd.slice(0, t * h, (t + 1) * h) : rows(pd);
        if (remake) attention_dropout_kernel(dev, probs_c, pd_c, p, st);
        gemm(pd_c, true, dout_c, false, rows(dv_));
      }
      if (want_ds) {
        const Tensor ds_c = rows(ds);
        gemm(dout_c, false, rows(v), true, ds_c);  // dP_d
        attention_softmax_backward_raw(probs_c, ds_c, p, st, ds_c,
                                       dropped.defined() ? rows(dropped) : Tensor());  // dS
        if (dq.defined()) gemm(ds_c, false, rows(k), false, rows(dq), scale);
        if (dk.defined()) gemm(ds_c, true, rows(q), false, rows(dk), scale);
      }
    });
    if (want_ds && needs_input_grad(3))
      dbias = sum_to_shape(ds.view(probs_shape4), inputs[3].shape);
    auto shape4 = [&](const Tensor& t, int64_t rows, int64_t cols) {
      return t.defined() ? t.view({out_shape[0], out_shape[1], rows, cols}) : t;
    };
    return {shape4(dq, tq, d), shape4(dk, tk, d), shape4(dv_, tk, dv), dbias, Tensor()};
  }
  void release_saved() override { q = k = v = probs = dropped = Tensor(); }
};

// An operand as the fused kernels take it: itself where its layout fits, else a contiguous copy.
Tensor in_fused_layout(const Tensor& t) {
  return flash_attention_layout_fits(t) ? t : t.contiguous();
}

// dq, dk and dv in q's, k's and v's layouts; when q, k and v are the three slices of one tensor
// along a dimension of its own (the projection's (B, T, 3, H, D) output unbound), their gradients
// are the three slices of one tensor laid out the same way, which the unbind's backward hands on
// without a copy.
void gradients_in_layout(FlashAttentionBackward& a) {
  const Device dev = a.q.device();
  if (const Tensor qkv = stacked_view({a.q, a.k, a.v}, 0); qkv.defined()) {
    const Tensor g = empty_in_stride_order(qkv.shape(), qkv.strides(), a.q.dtype(), dev);
    a.dq = g.select(0, 0);
    a.dk = g.select(0, 1);
    a.dv = g.select(0, 2);
    if (flash_attention_layout_fits(a.dq)) return;
  }
  a.dq = empty_in_stride_order(a.q.shape(), a.q.strides(), a.q.dtype(), dev);
  a.dk = empty_in_stride_order(a.k.shape(), a.k.strides(), a.k.dtype(), dev);
  a.dv = empty_in_stride_order(a.v.shape(), a.v.strides(), a.v.dtype(), dev);
}

// A (B, H, T, X) operand as (H, B T, X), the batch and position dims merged: a view where its
// layout allows (the model's q, dout and the relative tables below), else a copy.
Tensor rows_by_head(const Tensor& t) {
  return t.permute({1, 0, 2, 3}).reshape({t.size(1), t.size(0) * t.size(2), t.size(3)});
}

// A (B, H, Tq, R) relative table for the kernels to write, laid out (B, Tq, H, R) as the model's
// q is (rows_by_head then a view).
Tensor relative_rows(const Tensor& q, int64_t nrel) {
  return Tensor::empty({q.size(0), q.size(2), q.size(1), nrel}, q.dtype(), q.device())
      .permute({0, 2, 1, 3});
}

// The relative vectors' gradient from the kernels' tables: sum over (b, h, i) of drel_i^T q_i +
// W_i^T dout_i, as products batched over the heads (f32 sums, K = B Tq) and a sum over them.
Tensor relative_table_grad(const FlashAttentionBackward& a) {
  const int64_t h = a.q.size(1), nrel = a.rel_table.size(0), d = a.rel_table.size(1);
  const Tensor per_head = Tensor::empty({h, nrel, d}, DType::f32, a.q.device());
  double beta = 0.0;
  for (const auto& [table, rows] : {std::pair{a.drel, a.q}, std::pair{a.rel_weights, a.dout}}) {
    if (!table.defined()) continue;
    gemm(rows_by_head(table), true, rows_by_head(rows), false, per_head, 1.0, beta);
    beta = 1.0;
  }
  return sum(per_head, {0}).to(a.rel_table.dtype());
}

// The fused path's node: the backward is flash_attention_backward_kernel on the saved inputs,
// output and log-sum-exp. Inputs q, k, v, bias, key_mask and the relative vectors.
struct FlashAttentionNode : Node {
  // q, k, v, bias, key_mask, out, lse, mask_bits, scale, p, state; the relative positions'
  FlashAttentionBackward args;
  Shape bias_shape;  // the bias input's own shape (its gradient's)
  const char* name() const override { return "attention"; }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    FlashAttentionBackward a = args;
    const Device dev = a.q.device();
    a.dout = in_fused_layout(grads[0]);
    const bool want_table = a.rel_table.defined() && needs_input_grad(5);
    if (want_table && a.rel_keys) a.drel = relative_rows(a.q, a.rel_table.size(0));
    if (want_table && a.rel_values) a.rel_weights = relative_rows(a.q, a.rel_table.size(0));
    gradients_in_layout(a);
    const int64_t h = a.q.size(1), tq = a.q.size(2), tk = a.k.size(2);
    if (a.bias.defined() && needs_input_grad(3)) {
      // An f32 bias whose gradient other layers have already passed back (the positional term
      // every layer reads): this layer's is added to it by the kernel's last pass.
      const Tensor* sink = a.bias.dtype() == DType::f32 && shape_numel(bias_shape) == h * tq * tk
                               ? grad_sink(3, DType::f32)
                               : nullptr;
      a.accumulate_dbias = sink != nullptr;
      a.dbias = sink ? sink->view({h, tq, tk}) : Tensor::empty({h, tq, tk}, DType::f32, dev);
    }
    flash_attention_backward_kernel(dev, a);
    Tensor dbias;
    if (a.dbias.defined() && !a.accumulate_dbias) {
      dbias = sum_to_shape(a.dbias.view({1, h, tq, tk}), bias_shape);
      if (a.bias.dtype() != DType::f32) dbias = dbias.to(a.q.dtype());
    }
    return {needs_input_grad(0) ? a.dq : Tensor(),
            needs_input_grad(1) ? a.dk : Tensor(),
            needs_input_grad(2) ? a.dv : Tensor(),
            dbias,
            Tensor(),
            want_table ? relative_table_grad(a) : Tensor()};
  }
  void release_saved() override { args = FlashAttentionBackward(); }
};

// The bias as the fused kernels read it, an (H, Tq, Tk) view shared by the batch: undefined when
// there is none; `ok` false when it differs between batch entries.
Tensor shared_bias(const Tensor& bias, int64_t b, int64_t h, int64_t tq, int64_t tk, bool& ok) {
  ok = true;
  if (!bias.defined()) return Tensor();
  const Tensor e = bias.expand({b, h, tq, tk});
  if (b > 1 && e.stride(0) != 0) {
    ok = false;
    return Tensor();
  }
  return e.select(0, 0);
}

// The relative positions by composed ops (the reference, and where the fused kernels do not
// run): scores + the key term q A^T gathered per (i, j), scaled; softmax with the bias and mask;
// attention's dropout; the mixing, + the probabilities' sums per bucket times A.
Tensor composed_relative(const Tensor& q, const Tensor& k, const Tensor& v,
                         const RelativeTerms& rel, const Tensor& bias, const Tensor& mask4,
                         double scale, const AttentionOptions& opt) {
  const int64_t tq = q.size(2), tk = k.size(2), nrel = 2 * rel.clip + 1;
  const Tensor index =
      rel.index.defined() ? rel.index : relative_clip_index(tq, tk, rel.clip, q.device());
  const Tensor inverse = rel.inverse.defined() || rel.index.defined()
                             ? rel.inverse
                             : relative_index_inverse(index, nrel);
  Tensor scores = matmul(q, k.transpose(2, 3));
  if (rel.keys)
    scores = scores + relative_gather(matmul(q, rel.table.transpose(0, 1)), index, inverse);
  Tensor probs = softmax(scores * scale, bias, mask4);
  probs = attention_dropout(probs, opt.dropout_p, opt.training,
                            opt.generator ? *opt.generator : default_generator());
  Tensor out = matmul(probs, v);
  if (rel.values) out = out + matmul(relative_scatter(probs, index, nrel, inverse), rel.table);
  return out;
}

}  // namespace

namespace {
std::atomic<int> g_fused_attention{-1};  // -1: not read from the environment yet
}  // namespace

FusedAttention default_fused_attention() {
  int mode = g_fused_attention.load(std::memory_order_relaxed);
  if (mode >= 0) return static_cast<FusedAttention>(mode);
  FusedAttention m = FusedAttention::always;
  const char* v = std::getenv("ENGINE_FUSED_ATTENTION");
  if (v != nullptr && *v != 0) {
    const std::string s(v);
    if (s == "never")
      m = FusedAttention::never;
    else if (s == "without_dropout")
      m = FusedAttention::without_dropout;
    else
      ENGINE_CHECK(s == "always", "ENGINE_FUSED_ATTENTION is '", s,
                   "'; expected never, without_dropout or always");
  }
  g_fused_attention.store(static_cast<int>(m), std::memory_order_relaxed);
  return m;
}

void set_default_fused_attention(FusedAttention mode) {
  g_fused_attention.store(static_cast<int>(mode), std::memory_order_relaxed);
}

namespace {

// attention(), and with relative positions (rel non-null) their form.
Tensor attention_impl(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                      const AttentionOptions& opt_in, const RelativeTerms* rel) {
  // Autocast: q, k, v and the bias in the compute dtype (recorded casts); an f32 bias once the
  // path is known (the fused kernels read it as it is).
  const Tensor q = autocast_to_compute(q_in), k = autocast_to_compute(k_in),
               v = autocast_to_compute(v_in);
  AttentionOptions opt = opt_in;
  if (opt.bias.defined() && opt.bias.dtype() != DType::f32)
    opt.bias = autocast_to_compute(opt.bias);
  ENGINE_CHECK(q.defined() && k.defined() && v.defined(), "[attention] q, k and v must be defined");
  ENGINE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
               "[attention] expected q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv); got q ",
               describe(q), ", k ", describe(k), ", v ", describe(v));
  const int64_t b = q.size(0), h = q.size(1), tq = q.size(2), d = q.size(3);
  const int64_t tk = k.size(2), dv = v.size(3);
  ENGINE_CHECK(k.size(0) == b && k.size(1) == h && k.size(3) == d, "[attention] k ", describe(k),
               " does not match q ", describe(q), " (expected (", b, ", ", h, ", Tk, ", d, "))");
  ENGINE_CHECK(v.size(0) == b && v.size(1) == h && v.size(2) == tk, "[attention] v ", describe(v),
               " does not match k ", describe(k), " (expected (", b, ", ", h, ", ", tk, ", Dv))");
  ENGINE_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
               "[attention] q, k and v must share a dtype, got ", describe(q), ", ", describe(k),
               ", ", describe(v));
  ENGINE_CHECK(q.device() == k.device() && q.device() == v.device(),
               "[attention] q, k and v must be on one device, got ", describe(q), ", ", describe(k),
               ", ", describe(v));
  const Shape probs_shape4{b, h, tq, tk};
  if (opt.bias.defined()) {
    ENGINE_CHECK(is_broadcastable_to(opt.bias.shape(), probs_shape4), "[attention] bias ",
                 describe(opt.bias), " is not broadcastable to the scores (", b, ", ", h, ", ", tq,
                 ", ", tk, ")");
    ENGINE_CHECK((opt.bias.dtype() == q.dtype() || opt.bias.dtype() == DType::f32) &&
                     opt.bias.device() == q.device(),
                 "[attention] bias ", describe(opt.bias), " must be on q's device and in q's dtype",
                 " or f32 (q ", describe(q), ")");
  }
  Tensor mask4;
  if (opt.key_mask.defined()) {
    ENGINE_CHECK(opt.key_mask.shape() == Shape({b, tk}), "[attention] key_mask ",
                 describe(opt.key_mask), " must be (B, Tk) = (", b, ", ", tk, ")");
    ENGINE_CHECK(opt.key_mask.device() == q.device(), "[attention] key_mask ",
                 describe(opt.key_mask), " is not on ", q.device().str());
    mask4 = opt.key_mask.detach().reshape({b, 1, 1, tk});
  }
  ENGINE_CHECK(opt.dropout_p >= 0.0 && opt.dropout_p < 1.0,
               "[attention] dropout_p must be in "
               "[0, 1), got ",
               opt.dropout_p);
  const double scale = opt.scale != 0.0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(d));
  const double p = opt.training ? opt.dropout_p : 0.0;
  const Device dev = q.device();
  const DType dt = q.dtype();
  Tensor table;  // the relative vectors, in q's dtype (for the fused kernels)
  if (rel != nullptr) {
    ENGINE_CHECK(rel->clip >= 1, "[attention] relative positions need clip >= 1, got ", rel->clip);
    ENGINE_CHECK(rel->table.defined() && rel->table.shape() == Shape({2 * rel->clip + 1, d}) &&
                     rel->table.device() == dev && dv == d,
                 "[attention] the relative vectors ", describe(rel->table),
                 " must be (2 clip + 1, D) = (", 2 * rel->clip + 1, ", ", d,
                 ") on q's device, with v's head width ", dv, " = D");
    for (const Tensor* t : {&rel->index, &rel->inverse})
      ENGINE_CHECK(!t->defined() || t->device() == dev, "[attention] the relative index ",
                   describe(*t), " must be on q's device");
    ENGINE_CHECK(!rel->index.defined() || rel->index.shape() == Shape({tq, tk}),
                 "[attention] the relative index ", describe(rel->index), " must be (Tq, Tk) = (",
                 tq, ", ", tk, ")");
  }

  // The fused kernels where they fit: one launch forward, no (B, H, Tq, Tk) tensor.
  const FusedAttention mode = opt.fused.value_or(default_fused_attention());
  const bool try_fused =
      (mode == FusedAttention::always || (mode == FusedAttention::without_dropout && p == 0)) &&
      flash_attention_fits(q.device(), q.dtype(), b, h, d, dv) &&
      (rel == nullptr || 2 * rel->clip + 1 <= kFlashMaxRelBuckets);
  bool bias_shared = false;
  Tensor bias3 = try_fused ? shared_bias(opt.bias.defined() ? opt.bias.detach() : Tensor(), b, h,
                                         tq, tk, bias_shared)
                           : Tensor();
  // The bias in q's dtype (autocast's cast, recorded), except an f32 one for the fused kernels:
  // TUPE's positional term, built once a step in f32, is read by every layer without a cast,
  // and its gradient stays f32 (summed layer by layer into one tensor; FlashAttentionNode).
  const bool f32_bias = try_fused && bias_shared && opt.bias.defined() &&
                        opt.bias.dtype() == DType::f32 && dt != DType::f32;
  if (opt.bias.defined() && !f32_bias && opt.bias.dtype() != dt) {
    opt.bias = autocast_to_compute(opt.bias);
    if (opt.bias.dtype() != dt) opt.bias = opt.bias.to(dt);
    if (bias3.defined()) bias3 = shared_bias(opt.bias.detach(), b, h, tq, tk, bias_shared);
  }
  if (try_fused && bias_shared) {
    FlashAttentionForward f;
    // The heads' split and merge as views: q, k, v in their own layouts, out in q's.
    f.q = in_fused_layout(q.detach());
    f.k = in_fused_layout(k.detach());
    f.v = in_fused_layout(v.detach());
    f.bias = bias3;
    if (opt.key_mask.defined()) f.key_mask = opt.key_mask.detach().to(DType::f32).contiguous();
    f.scale = scale;
    f.p = p;
    if (p > 0) {
      Generator& gen = opt.generator ? *opt.generator : default_generator();
      f.state = gen.reserve_words(attention_dropout_words(static_cast<uint64_t>(b * h * tq * tk)));
    }
    f.out = empty_in_stride_order({b, h, tq, dv}, f.q.strides(), q.dtype(), q.device());
    f.lse = Tensor::empty({b, h, tq}, DType::f32, q.device());
    if (p > 0) f.mask_bits = Tensor::empty({b, h, tq, (tk + 3) / 4}, DType::u8, q.device());
    if (rel != nullptr) {
      table = autocast_to_compute(rel->table);  // a recorded cast: A's gradient flows back
      if (table.dtype() != dt) table = table.to(dt);
      f.rel_table = table.detach().contiguous();
      f.rel_clip = rel->clip;
      f.rel_keys = rel->keys;
      f.rel_values = rel->values;
    }
    flash_attention_forward_kernel(q.device(), f);
    if (needs_grad({&q, &k, &v, &opt.bias, &table})) {
      auto n = std::make_shared<FlashAttentionNode>();
      FlashAttentionBackward& a = n->args;
      a.q = f.q;
      a.k = f.k;
      a.v = f.v;
      a.bias = f.bias;
      a.key_mask = f.key_mask;
      a.out = f.out.detach();
      a.lse = f.lse;
      a.mask_bits = f.mask_bits;
      a.scale = scale;
      a.p = p;
      a.state = f.state;
      a.rel_table = f.rel_table;
      a.rel_clip = f.rel_clip;
      a.rel_keys = f.rel_keys;
      a.rel_values = f.rel_values;
      a.clusters = flash_attention_clusters();
      if (opt.bias.defined()) n->bias_shape = opt.bias.shape();
      record(n, {q, k, v, opt.bias, opt.key_mask, table}, {f.out});
    }
    return f.out;
  }
  if (rel != nullptr) return composed_relative(q, k, v, *rel, opt.bias, mask4, scale, opt);

  // (B, H, T, D) -> (B*H, T, D): one strided-batched GEMM per product.
  Tensor q3 = q.detach().contiguous().view({b * h, tq, d});
  Tensor k3 = k.detach().contiguous().view({b * h, tk, d});
  Tensor v3 = v.detach().contiguous().view({b * h, tk, dv});

  Tensor probs = Tensor::empty({b * h, tq, tk}, dt, dev);
  Tensor bias = opt.bias.defined() ? opt.bias.detach() : Tensor();
  Tensor mixed = probs;
  PhiloxState state;
  if (p > 0) {
    Generator& gen = opt.generator ? *opt.generator : default_generator();
    state = gen.reserve_words(attention_dropout_words(static_cast<uint64_t>(probs.numel())));
    mixed = Tensor::empty(probs.shape(), dt, dev);
  }
  Tensor out3 = Tensor::empty({b * h, tq, dv}, dt, dev);
  over_batch_entries(by_batch_entry(dev, b, h, tq, tk), b, [&](int64_t b0, int64_t nb) {
    auto rows = [&](const Tensor& t) { return t.slice(0, b0 * h, (b0 + nb) * h); };
    const Shape shape4{nb, h, tq, tk};
    // A per-entry bias or mask is sliced to the entries; a broadcast one is read as it is.
    const Tensor bias_c = bias.defined() && bias.dim() == 4 && bias.size(0) == b && nb != b
                              ? bias.slice(0, b0, b0 + nb)
                              : bias;
    const Tensor mask_c = mask4.defined() && nb != b ? mask4.slice(0, b0, b0 + nb) : mask4;
    const Tensor probs_c = rows(probs), mixed_c = rows(mixed);
    gemm(rows(q3), false, rows(k3), true, probs_c);  // raw scores q k^T
    // One kernel: scale, bias, mask, softmax (probs, kept for the backward) and dropout (mixed).
    attention_softmax_raw(probs_c.view(shape4), scale, bias_c, mask_c, p,
                          entry_state(state, b0, h * tq * tk), probs_c.view(shape4),
                          p > 0 ? mixed_c.view(shape4) : Tensor());
    gemm(mixed_c, false, rows(v3), false, rows(out3));
  });
  Tensor out = out3.view({b, h, tq, dv});

  if (needs_grad({&q, &k, &v, &opt.bias})) {
    auto n = std::make_shared<AttentionNode>();
    n->q = q3;
    n->k = k3;
    n->v = v3;
    n->probs = probs;
    if (p > 0 && !dev.is_cpu()) n->dropped = mixed;
    n->out_shape = out.shape();
    n->probs_shape4 = probs_shape4;
    n->scale = scale;
    n->p = p;
    n->state = state;
    record(n, {q, k, v, opt.bias, opt.key_mask}, {out});
  }
  return out;
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  return attention_impl(q, k, v, opt, nullptr);
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt,
                 const RelativeTerms& relative) {
  return attention_impl(q, k, v, opt, &relative);
}

}  // namespace engine
