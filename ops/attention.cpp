// The attention op: two strided-batched GEMMs around one fused kernel each way
// (attention_softmax: scale + positional bias + key mask + softmax + dropout; its backward:
// dropout + softmax backward), so every backend that has those kernels runs it; a flash-style
// kernel can replace the body for CUDA without changing the interface. The bias (TUPE's
// (1, H, T, T) positional term) is read through a stride-0 view, once per layer's forward, never
// expanded over the batch. Backward by hand:
//   dV = P_d^T dO,  dP_d = dO V^T,  dP = dropout(dP_d),  dS = P (dP - rowsum(dP * P)),
//   dQ = scale dS K,  dK = scale dS^T Q,  dbias = sum of dS over the broadcast dims.
#include "ops/attention.h"

#include <cmath>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "ops/dropout.h"
#include "ops/matmul.h"
#include "ops/softmax.h"

namespace engine {
namespace {

struct AttentionNode : Node {
  Tensor q, k, v;  // (B*H, T, D), contiguous
  Tensor probs;    // (B*H, Tq, Tk): softmax output before dropout
  Shape out_shape, probs_shape4;
  double scale = 1.0, p = 0.0;
  PhiloxState state;
  const char* name() const override { return "attention"; }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Device dev = q.device();
    const DType dt = q.dtype();
    const int64_t bh = q.size(0), tq = q.size(1), tk = k.size(1), d = q.size(2), dv = v.size(2);
    Tensor dout = grads[0].contiguous().view({bh, tq, dv});

    Tensor pd = probs;  // the probabilities the forward multiplied V with
    if (p > 0 && needs_input_grad(2)) {
      pd = Tensor::empty(probs.shape(), dt, dev);
      dropout_kernel(dev, probs, pd, p, state);
    }
    Tensor dq, dk, dv_, dbias;
    if (needs_input_grad(2)) {
      dv_ = Tensor::empty({bh, tk, dv}, dt, dev);
      gemm(pd, true, dout, false, dv_);
    }
    if (needs_input_grad(0) || needs_input_grad(1) || needs_input_grad(3)) {
      Tensor ds = Tensor::empty({bh, tq, tk}, dt, dev);
      gemm(dout, false, v, true, ds);                           // dP_d
      attention_softmax_backward_raw(probs, ds, p, state, ds);  // dS: dropout + softmax, in place
      if (needs_input_grad(0)) {
        dq = Tensor::empty({bh, tq, d}, dt, dev);
        gemm(ds, false, k, false, dq, scale);
      }
      if (needs_input_grad(1)) {
        dk = Tensor::empty({bh, tk, d}, dt, dev);
        gemm(ds, true, q, false, dk, scale);
      }
      if (needs_input_grad(3)) {
        dbias = sum_to_shape(ds.view(probs_shape4), inputs[3].shape);
      }
    }
    auto shape4 = [&](const Tensor& t, int64_t rows, int64_t cols) {
      return t.defined() ? t.view({out_shape[0], out_shape[1], rows, cols}) : t;
    };
    return {shape4(dq, tq, d), shape4(dk, tk, d), shape4(dv_, tk, dv), dbias, Tensor()};
  }
  void release_saved() override { q = k = v = probs = Tensor(); }
};

}  // namespace

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                 const AttentionOptions& opt_in) {
  // Autocast: q, k, v and the bias in the compute dtype (recorded casts).
  const Tensor q = autocast_to_compute(q_in), k = autocast_to_compute(k_in),
               v = autocast_to_compute(v_in);
  AttentionOptions opt = opt_in;
  opt.bias = autocast_to_compute(opt_in.bias);
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
    ENGINE_CHECK(opt.bias.dtype() == q.dtype() && opt.bias.device() == q.device(),
                 "[attention] bias ", describe(opt.bias), " must match q ", describe(q),
                 " in dtype and device");
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

  // (B, H, T, D) -> (B*H, T, D): one strided-batched GEMM per product.
  Tensor q3 = q.detach().contiguous().view({b * h, tq, d});
  Tensor k3 = k.detach().contiguous().view({b * h, tk, d});
  Tensor v3 = v.detach().contiguous().view({b * h, tk, dv});

  Tensor probs = Tensor::empty({b * h, tq, tk}, dt, dev);
  gemm(q3, false, k3, true, probs);  // raw scores q k^T
  Tensor bias = opt.bias.defined() ? opt.bias.detach() : Tensor();
  Tensor mixed = probs;
  PhiloxState state;
  if (p > 0) {
    Generator& gen = opt.generator ? *opt.generator : default_generator();
    state = gen.reserve_words(static_cast<uint64_t>(probs.numel()));
    mixed = Tensor::empty(probs.shape(), dt, dev);
  }
  // One kernel: scale, bias, mask, softmax (probs, kept for the backward) and dropout (mixed).
  attention_softmax_raw(probs.view(probs_shape4), scale, bias, mask4, p, state,
                        probs.view(probs_shape4), p > 0 ? mixed.view(probs_shape4) : Tensor());
  Tensor out3 = Tensor::empty({b * h, tq, dv}, dt, dev);
  gemm(mixed, false, v3, false, out3);
  Tensor out = out3.view({b, h, tq, dv});

  if (needs_grad({&q, &k, &v, &opt.bias})) {
    auto n = std::make_shared<AttentionNode>();
    n->q = q3;
    n->k = k3;
    n->v = v3;
    n->probs = probs;
    n->out_shape = out.shape();
    n->probs_shape4 = probs_shape4;
    n->scale = scale;
    n->p = p;
    n->state = state;
    record(n, {q, k, v, opt.bias, opt.key_mask}, {out});
  }
  return out;
}

}  // namespace engine
