// The residual join of a transformer block as one op, one pass over memory each way:
//
//   sum    = residual + dropout(x + bias, p)
//   normed = layer_norm(sum, weight, ln_bias, eps)
//
// x is a sublayer's output before its bias (the attention's output projection, the second FFN
// GEMM), residual the block's input. Unfused, this is a bias epilogue, dropout, an add and
// layer_norm: seven passes over (rows, C) forward (dropout 2, the add 3, layer_norm 2) and eight
// backward (layer_norm's input gradient 3 and its parameter sums 2, dropout's 2, the bias sum 1).
// Fused, the forward reads x and residual and writes sum and normed (4); the backward reads sum
// and the gradient and writes the residual's and x's gradients (4), with the three parameter
// gradients (bias, weight, ln_bias) summed in the same pass.
//
// The dropout mask is the one dropout(x + bias, p, training, gen) draws from the same generator
// (gen.reserve_words(x.numel()), element i the row-major index), so the fused and the unfused
// paths drop the same elements; no mask is stored (the backward redraws it).
//
// The same kernels serve the embeddings' LayerNorm, whose dropout comes after it:
//
//   y = dropout(layer_norm(x, weight, ln_bias, eps), p)       (layer_norm_dropout)
//
// Unfused, layer_norm then dropout: four passes forward, and backward dropout's 2, layer_norm's
// input gradient 3 and its parameter sums 2 more. Fused, the forward reads x and writes y (2); the
// backward reads x and dy and writes dx (3), the mask applied to dy as it is loaded and the
// parameter gradients summed in the same pass. The unfused pair's mask and roundings (layer_norm's
// output rounded, then dropout's product).
#pragma once

#include <vector>

#include "engine/kernel.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "engine/work_log.h"

namespace engine {

class Node;  // engine/autograd.h

struct DropoutAddNorm {
  Tensor sum;  // residual + dropout(x + bias): a post-LN block drops it, a pre-LN block carries it
  Tensor normed;  // layer_norm(sum, weight, ln_bias, eps)
};

// x, residual: floating (..., C) of one shape; bias, weight, ln_bias: (C) or undefined (none).
// Every defined tensor has x's dtype after autocast (the compute dtype; statistics in f32 for
// bf16 / f16, as layer_norm keeps them) and x's device. Dropout as in ops/dropout.h: identity when
// !training or p == 0 (no random numbers taken), everything dropped at p == 1 (none taken).
DropoutAddNorm dropout_add_layer_norm(const Tensor& x, const Tensor& bias, const Tensor& residual,
                                      double p, bool training, Generator& gen, const Tensor& weight,
                                      const Tensor& ln_bias, double eps = 1e-12);

// dropout(layer_norm(x, weight, ln_bias, eps), p, training, gen) as one op (see the top): x
// floating (..., C), weight / ln_bias (C) or undefined, autocast as dropout_add_layer_norm; the
// mask is dropout's (gen.reserve_words(x.numel()) when it draws).
Tensor layer_norm_dropout(const Tensor& x, const Tensor& weight, const Tensor& ln_bias, double p,
                          bool training, Generator& gen, double eps = 1e-12);

// ---- kernels (one table per launch; backends register implementations) ----------------------
// The launch arguments. Tensors are contiguous; optional ones may be undefined. `drop`: 0 <= p <=
// 1 (0: nothing dropped and no draw; 1: everything dropped and no draw), state the stream of
// x.numel() words.
// drop_normed (layer_norm_dropout): the dropout is on the normalised output instead of on x;
// bias, residual and sum are undefined (x is what is normalised) and normed =
// dropout(layer_norm(x)) rounded as the unfused pair rounds (layer_norm's output, then dropout's
// product).
struct DropoutAddNormForward {
  Tensor x, bias, residual, weight, ln_bias;  // inputs (bias, weight, ln_bias optional)
  double p = 0, eps = 0;
  PhiloxState state;
  bool drop_normed = false;
  Tensor sum, normed, mean, rstd;  // outputs; mean / rstd (rows) in layer_norm_stats_dtype
};
inline Kernel<void(const DropoutAddNormForward&)> dropout_add_layer_norm_kernel{
    "dropout_add_layer_norm"};

// dsum_total = layer_norm's input gradient from dnormed + dsum (dsum optional: the sum output's
// own gradient); d_residual = dsum_total; dx = dsum_total * keep / (1 - p); dbias = column sums
// of dx; dweight = column sums of dnormed * xhat; dln_bias = column sums of dnormed. Every output
// is optional (undefined: not written); the column sums are reduced in an order fixed by the
// shape (the same bits on every run of a backend). On a device, dbias, dweight and dln_bias of a
// bf16 / f16 problem may be f32: the sums are then added into them in f32 (the f32 .grad behind
// autocast's cast of the parameter), not written.
// drop_normed (layer_norm_dropout's backward): `sum` is the normalised input x, dnormed the
// gradient of the dropped output (the mask and scale applied to it as loaded, rounded as
// dropout's backward rounds), d_residual x's gradient; dsum, dx and dbias undefined.
struct DropoutAddNormBackward {
  Tensor sum, weight, mean, rstd;  // saved by the forward (weight optional)
  Tensor dnormed, dsum;            // incoming gradients (dsum optional)
  double p = 0;
  PhiloxState state;
  bool drop_normed = false;
  Tensor d_residual, dx, dbias, dweight, dln_bias;  // outputs, each optional
  // An f32 parameter gradient of a 16-bit problem (added into: Node::grad_sink_f32) written
  // instead, where its .grad's zero was deferred (the first writer). Device kernels only: the CPU
  // never gets such a gradient.
  bool write_dbias = false, write_dweight = false, write_dln_bias = false;
};
inline Kernel<void(const DropoutAddNormBackward&)> dropout_add_layer_norm_backward_kernel{
    "dropout_add_layer_norm_backward"};

// The backward of a LayerNorm (x (..., C), weight / ln_bias (C) or undefined: the node's inputs
// 0, 1, 2) through the join's backward kernel: x's gradient with the parameter gradients summed in
// the same pass, dy first through dropout's mask when p > 0 (layer_norm_dropout's; `state` its
// forward's). layer_norm's device backward and layer_norm_dropout's. Returns the node's three input
// gradients (undefined where added into an f32 .grad: Node::grad_sink_f32).
std::vector<Tensor> layer_norm_backward_one_pass(const Node& node, const Tensor& x,
                                                 const Tensor& weight, const Tensor& mean,
                                                 const Tensor& rstd, const Tensor& dy, double p,
                                                 PhiloxState state);

// The keep mask (u8, 1 where kept, x's shape) of a layer_norm_dropout node's dropout, or an
// undefined tensor for any other node, or one that dropped nothing (p == 0). pretrain_app's --dump
// lists the graph's masks with it (dropout's own nodes give theirs through their backward).
Tensor layer_norm_dropout_mask(const Node& node);

// The performance model's cost of a launch (engine/work_log.h): each defined tensor once.
void add_work_cost(WorkCost& cost, const DropoutAddNormForward& a);
void add_work_cost(WorkCost& cost, const DropoutAddNormBackward& a);

// The dropout parameters a kernel uses: keep iff dropout_keep(word, threshold); a kept element is
// multiplied by scale. p == 0: threshold 0 (every word keeps: kernels skip the draw), scale 1;
// p == 1: threshold 0, scale 0 (no draw, every element 0).
struct DropoutRule {
  uint32_t threshold = 0;
  double scale = 1;
  bool draws = false;  // whether the keep bits come from the stream
};
DropoutRule dropout_rule(double p);

}  // namespace engine
