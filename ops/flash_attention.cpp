// The fused attention kernels' contract on the CPU (flash_attention.h), written as the plain
// formulas in double: the reference the CUDA kernels are checked against (tests/cuda), and what
// the tables hold for the CPU. The attention op itself never takes this path on the CPU (its
// per-entry unfused path keeps the scores in cache already): flash_attention_fits is for devices.
#include "ops/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "engine/backend.h"
#include "engine/error.h"
#include "ops/dropout.h"

namespace engine {

void add_work_cost(WorkCost& cost, const FlashAttentionForward& a) {
  for (const Tensor* t :
       {&a.q, &a.k, &a.v, &a.bias, &a.key_mask, &a.out, &a.lse, &a.mask_bits, &a.rel_table})
    if (t->defined()) add_work_cost(cost, *t);
  cost.flops += 4.0 * a.q.size(0) * a.q.size(1) * a.q.size(2) * a.k.size(2) * a.q.size(3);
  // Shaw's relative vectors: q A^T (key term) and W A (value term).
  if (a.rel_table.defined())
    cost.flops += 2.0 * (int(a.rel_keys) + int(a.rel_values)) * a.q.size(0) * a.q.size(1) *
                  a.q.size(2) * a.rel_table.size(0) * a.q.size(3);
}

void add_work_cost(WorkCost& cost, const FlashAttentionBackward& a) {
  for (const Tensor* t :
       {&a.q, &a.k, &a.v, &a.bias, &a.key_mask, &a.out, &a.lse, &a.mask_bits, &a.dout, &a.dq, &a.dk,
        &a.dv, &a.dbias, &a.rel_table, &a.drel, &a.rel_weights})
    if (t->defined()) add_work_cost(cost, *t);
  if (a.accumulate_dbias && a.dbias.defined()) add_work_cost(cost, a.dbias);  // read, then written
  // The gradient's four products (dP_d, dV, dQ, dK): the scores made again are recomputation,
  // not model FLOPs (the performance model times the kernels by the products they compute).
  cost.flops += 8.0 * a.q.size(0) * a.q.size(1) * a.q.size(2) * a.k.size(2) * a.q.size(3);
  // Shaw's relative vectors: drel A into dq (key term), dout A^T into dP (value term); q A^T made
  // again is recomputation, and the vectors' gradient is the caller's GEMMs.
  if (a.rel_table.defined())
    cost.flops += 2.0 * (int(a.rel_keys) + int(a.rel_values)) * a.q.size(0) * a.q.size(1) *
                  a.q.size(2) * a.rel_table.size(0) * a.q.size(3);
}

bool flash_attention_clusters() {
  static const bool on = [] {
    const char* v = std::getenv("ENGINE_ATTENTION_CLUSTERS");
    if (v == nullptr || *v == 0) return true;
    const std::string s(v);
    ENGINE_CHECK(s == "on" || s == "off", "ENGINE_ATTENTION_CLUSTERS is '", s,
                 "'; expected on or off");
    return s == "on";
  }();
  return on;
}

bool flash_attention_fits(Device device, DType dtype, int64_t b, int64_t h, int64_t d, int64_t dv) {
  if (device.is_cpu() || !flash_attention_forward_kernel.has(device.type) ||
      !flash_attention_backward_kernel.has(device.type))
    return false;
  if (dtype != DType::bf16 && dtype != DType::f16) return false;
  return d == dv && (d == 32 || d == 64 || d == 128) && b * h >= 1 && b * h <= 65535;
}

void check_flash_relative(const Tensor& q, const Tensor& v, const Tensor& rel_table,
                          int64_t rel_clip, bool keys, bool values, const Tensor* drel,
                          const Tensor* weights, const char* op) {
  if (!rel_table.defined()) {
    ENGINE_CHECK(
        (drel == nullptr || !drel->defined()) && (weights == nullptr || !weights->defined()), "[",
        op, "] drel and rel_weights need a rel_table");
    return;
  }
  ENGINE_CHECK(rel_clip >= 1 && 2 * rel_clip + 1 <= kFlashMaxRelBuckets, "[", op, "] rel_clip ",
               rel_clip, " must be in [1, ", (kFlashMaxRelBuckets - 1) / 2, "]");
  const int64_t nrel = 2 * rel_clip + 1;
  ENGINE_CHECK(
      rel_table.shape() == Shape({nrel, q.size(3)}) && rel_table.dtype() == q.dtype() &&
          rel_table.is_contiguous() && rel_table.device() == q.device() && v.size(3) == q.size(3),
      "[", op, "] rel_table ", describe(rel_table), " must be contiguous (2 rel_clip + 1, D) = (",
      nrel, ", ", q.size(3), ") in q's dtype on q's device, with v's head width D (q ", describe(q),
      ", v ", describe(v), ")");
  const Shape want{q.size(0), q.size(1), q.size(2), nrel};
  for (const auto& [name, t, term] :
       {std::tuple{"drel", drel, keys}, std::tuple{"rel_weights", weights, values}}) {
    if (t == nullptr || !t->defined()) continue;
    ENGINE_CHECK(term, "[", op, "] ", name, " is given without its term");
    ENGINE_CHECK(t->shape() == want && t->dtype() == q.dtype() && t->device() == q.device() &&
                     t->stride(3) == 1,
                 "[", op, "] ", name, " ", describe(*t), " must be (B, H, Tq, R) = (", want[0],
                 ", ", want[1], ", ", want[2], ", ", want[3],
                 ") in q's dtype on q's device, its last dim contiguous");
  }
}

bool flash_attention_layout_fits(const Tensor& t) {
  if (!t.defined() || t.dim() != 4) return false;
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(t.dtype()));  // elements in 16 bytes
  if (t.size(3) > 1 && t.stride(3) != 1) return false;
  if (t.storage_offset() % vec != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (t.size(i) > 1 && t.stride(i) % vec != 0) return false;
  return true;
}

namespace {

std::vector<double> host(const Tensor& t) {
  return t.defined() ? t.contiguous().to(Device::cpu()).to(DType::f64).to_vector<double>()
                     : std::vector<double>();
}

void put(const Tensor& dst, const std::vector<double>& v) {
  dst.copy_(Tensor::from_vector(v, dst.shape()));
}

// The problem's sizes and the logits / keep decisions of one row, shared by both directions.
struct Problem {
  int64_t b, h, tq, tk, d;
  double scale, p;
  uint32_t threshold;
  PhiloxState state;
  std::vector<double> q, k, v, bias, mask;
  std::vector<double> bits;   // the forward's keep bits (the backward's mask_bits), or empty
  int64_t clip, nrel;         // relative positions: rel_clip and R = 2 clip + 1 (0 and 0: none)
  std::vector<double> table;  // (R, D), or empty
  bool keys, values;          // the terms there
  DType dtype;                // q's
  std::vector<double> qa;     // with the key term: q A^T (B H Tq, R), rounded to q's dtype

  template <class A>
  Problem(const A& a)
      : b(a.q.size(0)),
        h(a.q.size(1)),
        tq(a.q.size(2)),
        tk(a.k.size(2)),
        d(a.q.size(3)),
        scale(a.scale),
        p(a.p),
        threshold(attention_dropout_threshold(a.p)),
        state(a.state),
        q(host(a.q)),
        k(host(a.k)),
        v(host(a.v)),
        bias(host(a.bias)),
        mask(host(a.key_mask)),
        clip(a.rel_table.defined() ? a.rel_clip : 0),
        nrel(a.rel_table.defined() ? 2 * a.rel_clip + 1 : 0),
        table(host(a.rel_table)),
        keys(a.rel_table.defined() && a.rel_keys),
        values(a.rel_table.defined() && a.rel_values),
        dtype(a.q.dtype()) {
    ENGINE_CHECK(a.v.size(3) == d, "[flash_attention] v's head width ", a.v.size(3),
                 " differs from q's ", d);
    if (keys) qa = times_table(q);
    ENGINE_CHECK(!a.bias.defined() || a.bias.dtype() == a.q.dtype() || a.bias.dtype() == DType::f32,
                 "[flash_attention] bias ", describe(a.bias), " must be in q's dtype (",
                 dtype_name(a.q.dtype()), ") or f32");
  }
  // Row (bi, hi, i): logits (-inf where masked) into x.
  void logits(int64_t bi, int64_t hi, int64_t i, std::vector<double>& x) const {
    const int64_t bh = bi * h + hi;
    for (int64_t j = 0; j < tk; ++j) {
      if (!mask.empty() && mask[bi * tk + j] == 0) {
        x[j] = -std::numeric_limits<double>::infinity();
        continue;
      }
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += q[(bh * tq + i) * d + c] * k[(bh * tk + j) * d + c];
      if (keys) s += qa[(bh * tq + i) * nrel + bucket(i, j)];
      x[j] = s * scale + (bias.empty() ? 0.0 : bias[(hi * tq + i) * tk + j]);
    }
  }
  // x A^T for rows x of D (q, dout), rounded to q's dtype as the kernels round them.
  std::vector<double> times_table(const std::vector<double>& x) const {
    const int64_t rows = static_cast<int64_t>(x.size()) / d;
    std::vector<double> y(static_cast<size_t>(rows * nrel));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < nrel; ++c)
        for (int64_t e = 0; e < d; ++e) y[r * nrel + c] += x[r * d + e] * table[c * d + e];
    return Tensor::from_vector(y, {rows * nrel}).to(dtype).to(DType::f64).to_vector<double>();
  }
  // Key j's relative bucket for query i: clamp(j - i, -clip, clip) + clip.
  int64_t bucket(int64_t i, int64_t j) const { return std::clamp(j - i, -clip, clip) + clip; }
  // Element c of key j's value for query i: v_j (+ a_c(i, j) with the value term).
  double value(int64_t bh, int64_t i, int64_t j, int64_t c) const {
    return v[(bh * tk + j) * d + c] + (values ? table[bucket(i, j) * d + c] : 0.0);
  }
  int64_t groups() const { return (tk + 3) / 4; }
  // f(bi, hi, i, row) for every query row in order, row = (bi H + hi) Tq + i.
  template <class F>
  void for_rows(F&& f) const {
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t i = 0; i < tq; ++i) f(bi, hi, i, (bi * h + hi) * tq + i);
  }
  // Whether element (bi, hi, i, j) is kept: the stream's word (the forward), or the saved bits.
  bool kept(int64_t bi, int64_t hi, int64_t i, int64_t j) const {
    const int64_t row = (bi * h + hi) * tq + i;
    if (!bits.empty()) {
      const auto byte = static_cast<uint32_t>(bits[static_cast<size_t>(row * groups() + j / 4)]);
      return ((byte >> (j % 4)) & 1u) != 0;
    }
    return attention_keep(state, static_cast<uint64_t>(row * tk + j), threshold);
  }
  // The dropout factor of element (bi, hi, i, j): 1 / (1 - p) kept, 0 dropped, 1 without dropout.
  double keep(int64_t bi, int64_t hi, int64_t i, int64_t j) const {
    if (p == 0) return 1.0;
    return kept(bi, hi, i, j) ? 1.0 / (1.0 - p) : 0.0;
  }
  // Probabilities of a row from its logits and log-sum-exp (0 for masked keys and empty rows).
  static void probs(const std::vector<double>& x, double lse, std::vector<double>& pr) {
    for (size_t j = 0; j < x.size(); ++j) pr[j] = std::isinf(lse) ? 0.0 : std::exp(x[j] - lse);
  }
};

void forward(const FlashAttentionForward& a) {
  check_host_state(a.state, "flash_attention");
  check_flash_relative(a.q, a.v, a.rel_table, a.rel_clip, a.rel_keys, a.rel_values, nullptr,
                       nullptr, "flash_attention");
  const Problem P(a);
  ENGINE_CHECK(a.mask_bits.defined() == (a.p > 0),
               "[flash_attention] mask_bits must be given exactly when p > 0");
  if (a.mask_bits.defined()) {
    std::vector<double> bits(static_cast<size_t>(P.b * P.h * P.tq * P.groups()));
    P.for_rows([&](int64_t bi, int64_t hi, int64_t i, int64_t row) {
      for (int64_t j = 0; j < P.tk; ++j)
        if (P.kept(bi, hi, i, j))
          bits[static_cast<size_t>(row * P.groups() + j / 4)] += double(1 << (j % 4));
    });
    put(a.mask_bits, bits);
  }
  std::vector<double> out(static_cast<size_t>(P.b * P.h * P.tq * P.d)),
      lse(static_cast<size_t>(P.b * P.h * P.tq));
  std::vector<double> x(static_cast<size_t>(P.tk)), pr(x.size());
  P.for_rows([&](int64_t bi, int64_t hi, int64_t i, int64_t row) {
    const int64_t bh = bi * P.h + hi;
    P.logits(bi, hi, i, x);
    double m = -std::numeric_limits<double>::infinity();
    for (double e : x) m = std::max(m, e);
    double l = 0;
    if (!std::isinf(m))
      for (double e : x) l += std::exp(e - m);
    lse[row] = l > 0 ? m + std::log(l) : std::numeric_limits<double>::infinity();
    Problem::probs(x, lse[row], pr);
    for (int64_t j = 0; j < P.tk; ++j) {
      const double w = pr[j] * P.keep(bi, hi, i, j);
      for (int64_t c = 0; c < P.d; ++c) out[row * P.d + c] += w * P.value(bh, i, j, c);
    }
  });
  put(a.out, out);
  put(a.lse, lse);
}

void backward(const FlashAttentionBackward& a) {
  check_host_state(a.state, "flash_attention_backward");
  check_flash_relative(a.q, a.v, a.rel_table, a.rel_clip, a.rel_keys, a.rel_values, &a.drel,
                       &a.rel_weights, "flash_attention_backward");
  Problem P(a);
  ENGINE_CHECK(a.mask_bits.defined() == (a.p > 0),
               "[flash_attention_backward] mask_bits must be given exactly when p > 0");
  P.bits = host(a.mask_bits);
  const std::vector<double> out = host(a.out), dout = host(a.dout), lse = host(a.lse);
  // dout A^T, rounded as the kernels round it: the value term's share of dP_d.
  const std::vector<double> doa = P.values ? P.times_table(dout) : std::vector<double>();
  std::vector<double> drel(a.drel.defined() ? static_cast<size_t>(P.b * P.h * P.tq * P.nrel) : 0),
      weights(a.rel_weights.defined() ? static_cast<size_t>(P.b * P.h * P.tq * P.nrel) : 0);
  const int64_t n = P.b * P.h;
  std::vector<double> dq(static_cast<size_t>(n * P.tq * P.d)),
      dk(static_cast<size_t>(n * P.tk * P.d)), dv(dk.size());
  std::vector<double> ds_all(a.dbias.defined() ? static_cast<size_t>(n * P.tq * P.tk) : 0);
  std::vector<double> x(static_cast<size_t>(P.tk)), pr(x.size());
  P.for_rows([&](int64_t bi, int64_t hi, int64_t i, int64_t row) {
    const int64_t bh = bi * P.h + hi;
    P.logits(bi, hi, i, x);
    Problem::probs(x, lse[row], pr);
    double dsum = 0;  // rowsum(dout * out)
    for (int64_t c = 0; c < P.d; ++c) dsum += dout[row * P.d + c] * out[row * P.d + c];
    for (int64_t j = 0; j < P.tk; ++j) {
      const double kp = P.keep(bi, hi, i, j);
      double dpd = 0;  // dout_i . (v_j + a_c(i, j))
      for (int64_t c = 0; c < P.d; ++c) dpd += dout[row * P.d + c] * P.v[(bh * P.tk + j) * P.d + c];
      if (P.values) dpd += doa[row * P.nrel + P.bucket(i, j)];
      const double ds = pr[j] * (dpd * kp - dsum);
      if (!ds_all.empty()) ds_all[static_cast<size_t>(row * P.tk + j)] = ds;
      if (!drel.empty()) drel[row * P.nrel + P.bucket(i, j)] += P.scale * ds;
      if (!weights.empty()) weights[row * P.nrel + P.bucket(i, j)] += pr[j] * kp;
      if (P.keys)
        for (int64_t c = 0; c < P.d; ++c)
          dq[row * P.d + c] += P.scale * ds * P.table[P.bucket(i, j) * P.d + c];
      for (int64_t c = 0; c < P.d; ++c) {
        dq[row * P.d + c] += P.scale * ds * P.k[(bh * P.tk + j) * P.d + c];
        dk[(bh * P.tk + j) * P.d + c] += P.scale * ds * P.q[row * P.d + c];
        dv[(bh * P.tk + j) * P.d + c] += pr[j] * kp * dout[row * P.d + c];
      }
    }
  });
  put(a.dq, dq);
  put(a.dk, dk);
  put(a.dv, dv);
  if (a.drel.defined()) put(a.drel, drel);
  if (a.rel_weights.defined()) put(a.rel_weights, weights);
  if (a.dbias.defined()) {
    const int64_t per = P.h * P.tq * P.tk;
    std::vector<double> db =
        a.accumulate_dbias ? host(a.dbias) : std::vector<double>(static_cast<size_t>(per));
    for (int64_t bi = 0; bi < P.b; ++bi)
      for (int64_t e = 0; e < per; ++e) db[e] += ds_all[bi * per + e];
    put(a.dbias, db);
  }
}

}  // namespace

ENGINE_REGISTER_KERNEL(flash_attention_forward_kernel, DeviceType::CPU, forward);
ENGINE_REGISTER_KERNEL(flash_attention_backward_kernel, DeviceType::CPU, backward);

}  // namespace engine
