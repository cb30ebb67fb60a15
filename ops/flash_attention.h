// Fused ("flash") attention kernels: the whole of
//   out = dropout(softmax(scale * q k^T + bias, key_mask)) v
// in one launch forward and three backward (four with the bias's gradient), without the
// (B, H, Tq, Tk) scores, probabilities or dropout mask in memory. The forward keeps one number per
// query row, the log-sum-exp of its logits; the backward makes every tile of probabilities again
// from it. The attention op (ops/attention.h) takes this path where a backend has it and
// flash_attention_fits() holds, and the unfused kernels (two GEMMs around attention_softmax)
// otherwise: they stay its reference.
//
// The same mask as the unfused path: element (b, h, i, j) is stream element
// ((b H + h) Tq + i) Tk + j, kept iff attention_keep(state, e, attention_dropout_threshold(p))
// (attention's rule, ops/dropout.h: a 16-bit uniform each, 8 a Philox block), a kept probability
// scaled by 1 / (1 - p). A query row with no kept key outputs zeros.
//
// Shaw et al.'s clipped relative positions (rel_clip C >= 1; R = 2C + 1 relative vectors a_r, the
// rows of rel_table; key j of query i in bucket c(i, j) = clamp(j - i, -C, C) + C) ride along
// without a (B, H, Tq, Tk) or (Tq, Tk, D) tensor:
//   key term     logit_ij = scale (q_i . k_j + QA_i,c(i,j)) + bias_ij, QA_i = q_i A^T made per
//                row block on tensor cores (16 queries against 64 vectors at a time), rounded to
//                the 16-bit type, kept in shared memory;
//   value term   out_i = sum_j P_d,ij (v_j + a_c(i,j)) = P_d V + W_i A, W_i,r the probabilities
//                of row i summed over bucket r, kept (f32) beside the output rows and rescaled
//                with them, multiplied by A at the end as 64 more "keys".
// Every interior bucket holds one key of a row, the two end buckets the tails, so a row's R
// sums stay in shared memory (R <= kFlashMaxRelBuckets).
#pragma once

#include <cstdint>

#include "engine/kernel.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "engine/work_log.h"

namespace engine {

// The launch arguments. q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, D): one floating dtype;
// q, k, v, out and the backward's dout, dq, dk, dv in any layout flash_attention_layout_fits
// takes (the head width contiguous): the heads' split and merge stay views, q, k and v read
// straight from the projection's (B, T, 3, H, D) output, out written into (B, T, H, D). bias:
// undefined, or an (H, Tq, Tk) view (any strides, stride 0 on broadcast dims) in q's dtype or in
// f32, the same for every batch entry (TUPE's positional term, T5 buckets, ALiBi): an f32 term is
// read as it is, so a model that builds it in f32 casts it to 16 bits in no layer. key_mask:
// undefined or (B, Tk) f32 contiguous, nonzero = attend. 0 <= p < 1.
constexpr int64_t kFlashMaxRelBuckets = 129;  // R = 2 rel_clip + 1 the kernels take (clip 64)

struct FlashAttentionForward {
  Tensor q, k, v, bias, key_mask;
  // Relative positions: rel_table (2 rel_clip + 1, D) contiguous in q's dtype, or undefined
  // (none); rel_keys / rel_values: whether the key / value term is there (Shaw: both).
  Tensor rel_table;
  int64_t rel_clip = 0;
  bool rel_keys = true, rel_values = true;
  double scale = 1, p = 0;
  PhiloxState state;
  Tensor out;  // (B, H, Tq, D), q's dtype
  Tensor lse;  // (B, H, Tq) f32: log sum_j exp(logit_ij) over the kept keys; +inf for none
  // With dropout (p > 0): (B, H, Tq, ceil(Tk / 4)) u8, the keep bits the forward drew, a byte
  // for each group of 4 keys of a row (bit q: key 4 g + q; 0 past Tk), for the backward to read
  // instead of drawing them again (a sixteenth of the bytes of 16-bit probabilities). Undefined
  // without dropout.
  Tensor mask_bits;
};
inline Kernel<void(const FlashAttentionForward&)> flash_attention_forward_kernel{"flash_attention"};

// The gradients from the forward's inputs, out, lse, mask_bits and dout (as the forward had
// them; the keep bits come from mask_bits when p > 0):
//   dP_d = dout v^T, dP = dropout(dP_d), dS = P (dP - rowsum(dout * out)),
//   dq = scale dS k, dk = scale dS^T q, dv = P_d^T dout, dbias = sum over the batch of dS.
// With relative positions (the forward's rel_table, rel_clip, rel_keys, rel_values) the value
// term adds (dout_i A^T)_c(i,j) to dP_d,ij (out, the whole output, gives the row sums as before),
// the key term adds drel_i A to dq_i, and the kernels write (where defined) the two tables the
// table's gradient is made of, d rel_table = sum over (b, h, i) of drel_i^T q_i + W_i^T dout_i:
//   drel         (B, H, Tq, R) in q's dtype, the last dim contiguous (any other strides; a view of
//                a (B, Tq, H, R) tensor lines its rows up with the model's q for that product):
//                scale times the sum of dS over each bucket's keys (only with the key term);
//   rel_weights  the same shape and rules: W, the probabilities summed per bucket (only with the
//                value term).
// dq, dk, dv: q's, k's and v's shapes and dtype. dbias: undefined (not wanted) or (H, Tq, Tk) f32
// contiguous, summed over the batch in an order fixed by the shape (the same bits every run);
// with accumulate_dbias that sum is added to what dbias holds (the gradient of a positional term
// every layer reads, summed layer by layer in place, without an add of its own).
struct FlashAttentionBackward {
  Tensor q, k, v, bias, key_mask, out, lse, mask_bits, dout;
  Tensor rel_table;  // relative positions, as the forward had them
  int64_t rel_clip = 0;
  bool rel_keys = true, rel_values = true;
  double scale = 1, p = 0;
  PhiloxState state;
  Tensor dq, dk, dv, dbias;
  Tensor drel, rel_weights;  // relative positions' outputs (see above)
  bool accumulate_dbias = false;
  // Groups the batch is split into for dbias where the (Tq / 64) (Tk / 64) H tiles are too few
  // blocks to fill the device (each group's entries summed in order into its own partial, the
  // partials then in group order): 0 lets the backend choose from the shape; tests set it to
  // cover groups of several entries.
  int64_t batch_groups = 0;
  // Where dbias is wanted and the device runs thread block clusters: dQ and dbias from one
  // kernel (CUDA's flash_backward_q_bias) rather than two. false: the two, as on a device without
  // clusters (ENGINE_ATTENTION_CLUSTERS=off for the attention op: flash_attention_clusters()).
  bool clusters = true;
};
inline Kernel<void(const FlashAttentionBackward&)> flash_attention_backward_kernel{
    "flash_attention_backward"};

// The performance model's cost of a launch: each defined tensor once, and the model FLOPs of the
// products (forward 2: 4 B H Tq Tk D; backward 4: 8 B H Tq Tk D, the recomputed scores apart).
void add_work_cost(WorkCost& cost, const FlashAttentionForward& a);
void add_work_cost(WorkCost& cost, const FlashAttentionBackward& a);

// The attention op's FlashAttentionBackward::clusters: the environment variable
// ENGINE_ATTENTION_CLUSTERS (on, the default, or off: to time the two-kernel backward beside the
// cluster kernel, or to rule the latter out; another value is an error naming it), read once.
bool flash_attention_clusters();

// Whether the fused kernels take this problem on `device`: a backend registered them; q's dtype
// bf16 or f16 (tensor-core products of 16-bit values, f32 accumulators; f32 and f64 keep the
// unfused path's precision); a head width D of 32, 64 or 128 for q, k and v alike; B H <= 65535.
bool flash_attention_fits(Device device, DType dtype, int64_t b, int64_t h, int64_t d, int64_t dv);

// The relative positions' arguments, checked ("[op] ..." otherwise): without rel_table nothing
// else; with it 1 <= rel_clip, 2 rel_clip + 1 <= kFlashMaxRelBuckets, rel_table (2 rel_clip + 1,
// D) contiguous in q's dtype on q's device, D == v's head width, and drel / weights (the
// backward's outputs; null: the forward) undefined or, only with their term, (B, H, Tq, R) in
// q's dtype on q's device with the last dim contiguous.
void check_flash_relative(const Tensor& q, const Tensor& v, const Tensor& rel_table,
                          int64_t rel_clip, bool keys, bool values, const Tensor* drel,
                          const Tensor* weights, const char* op);

// Whether a (B, H, T, D) operand or result can go to the fused kernels in its own layout: its
// head width contiguous (stride 1) and, on every dimension longer than one, strides and the
// first element on 16-byte boundaries (the kernels' vector loads). The attention op passes such
// a view as it is and a contiguous copy of any other; the kernels refuse the others.
bool flash_attention_layout_fits(const Tensor& t);

}  // namespace engine
