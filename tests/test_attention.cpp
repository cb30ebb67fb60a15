// The fused attention op against its composed twin (matmul, softmax, attention's dropout rule,
// matmul), finite differences, padding and errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "ops/ops.h"

using namespace engine;
using namespace engine::testing;
using Catch::Contains;

namespace {

Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  double scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  Tensor scores = matmul(q, k.transpose(-1, -2)) * scale;
  Tensor mask4 = o.key_mask.defined() ? o.key_mask.reshape({q.size(0), 1, 1, k.size(2)}) : Tensor();
  Tensor p = softmax(scores, o.bias, mask4);
  // Attention's rule (ops/dropout.h), drawn as the op draws it.
  if (o.training && o.dropout_p > 0) p = attention_dropout(p, o.dropout_p, true, *o.generator);
  return matmul(p, v);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

// The fused op against the composed ops with the same random stream, forward and backward.
// bias_batch: the positional bias's first dim (1: shared by the batch, B: one per entry).
static void check_fused_vs_composed(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D,
                                    int64_t Dv, int64_t bias_batch) {
  Tensor q = rand_input({B, H, Tq, D}, 1), k = rand_input({B, H, Tk, D}, 2);
  Tensor v = rand_input({B, H, Tk, Dv}, 3), bias = rand_input({bias_batch, H, Tq, Tk}, 4);
  std::vector<int32_t> mv(size_t(B * Tk), 1);
  mv[size_t(Tk - 1)] = mv[size_t(Tk - 2)] = 0;  // batch 0: 2 pads
  Tensor mask = Tensor::from_vector<int32_t>(mv, {B, Tk});
  for (double p : {0.0, 0.3}) {
    INFO("dropout " << p);
    Generator g1(99), g2(99);
    AttentionOptions o1{.scale = 0.0,
                        .bias = bias,
                        .key_mask = mask,
                        .dropout_p = p,
                        .training = true,
                        .generator = &g1};
    AttentionOptions o2 = o1;
    o2.generator = &g2;
    Tensor fused = attention(q, k, v, o1);
    Tensor ref = composed(q, k, v, o2);
    REQUIRE(g1.offset() == g2.offset());  // the same random words were drawn
    REQUIRE(max_abs_diff(fused, ref) < 1e-12);

    Generator gw(5);
    Tensor w = Tensor::randn(fused.shape(), gw, 0, 1, DType::f64);
    std::vector<Tensor> params{q, k, v, bias};
    std::vector<std::vector<double>> grads_fused, grads_ref;
    for (auto* out : {&fused, &ref}) {
      for (auto& t : params) t.set_grad(Tensor());
      out->backward(w);
      auto& dst = out == &fused ? grads_fused : grads_ref;
      for (auto& t : params) dst.push_back(t.grad().to_vector<double>());
    }
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("input " << i);
      for (size_t j = 0; j < grads_fused[i].size(); ++j)
        REQUIRE(grads_fused[i][j] == Approx(grads_ref[i][j]).margin(1e-12));
    }
  }
}

TEST_CASE("fused attention equals the composed ops, forward and backward", "[attention]") {
  // H Tq Tk = 105, not a whole number of Philox blocks: the whole batch in one call.
  check_fused_vs_composed(2, 3, 5, 7, 4, 3, 1);
}

TEST_CASE("attention one batch entry per thread (CPU) equals the composed ops", "[attention]") {
  // H Tq Tk = 48: the CPU runs each batch entry on its own, the dropout stream at each entry's
  // offset; a bias shared by the batch, and one per entry.
  check_fused_vs_composed(3, 2, 4, 6, 4, 3, 1);
  check_fused_vs_composed(3, 2, 4, 6, 4, 3, 3);
}

TEST_CASE("attention of a batch equals the attention of each entry, bit for bit", "[attention]") {
  // f32, no dropout: the batch (per entry on the CPU) against B single-entry calls.
  const int64_t B = 4, H = 2, T = 8, D = 4;
  Generator g(3);
  Tensor q = Tensor::randn({B, H, T, D}, g), k = Tensor::randn({B, H, T, D}, g);
  Tensor v = Tensor::randn({B, H, T, D}, g), bias = Tensor::randn({1, H, T, T}, g);
  AttentionOptions o{.bias = bias};
  const std::vector<float> all = attention(q, k, v, o).to_vector<float>();
  std::vector<float> each;
  for (int64_t b = 0; b < B; ++b) {
    auto one = [&](const Tensor& t) { return t.slice(0, b, b + 1).contiguous(); };
    const std::vector<float> y = attention(one(q), one(k), one(v), o).to_vector<float>();
    each.insert(each.end(), y.begin(), y.end());
  }
  REQUIRE(all == each);
}

TEST_CASE("attention gradients match finite differences", "[attention][gradcheck]") {
  const int64_t B = 2, H = 3, Tq = 5, Tk = 7, D = 4, Dv = 3;
  Tensor q = rand_input({B, H, Tq, D}, 11), k = rand_input({B, H, Tk, D}, 12);
  Tensor v = rand_input({B, H, Tk, Dv}, 13), bias = rand_input({1, H, Tq, Tk}, 14);
  Tensor mask = Tensor::from_vector<uint8_t>({1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1}, {B, Tk});
  auto run = [&](double p, bool use_mask) {
    return [=](const std::vector<Tensor>& in) {
      Generator g(7);  // the same dropout mask at every evaluation
      AttentionOptions o{.scale = 1.0 / std::sqrt(2.0 * D),
                         .bias = in[3],
                         .key_mask = use_mask ? mask : Tensor(),
                         .dropout_p = p,
                         .training = true,
                         .generator = &g};
      return attention(in[0], in[1], in[2], o);
    };
  };
  for (double p : {0.0, 0.25}) {
    for (bool m : {false, true}) {
      GradcheckReport r = gradcheck(run(p, m), {q, k, v, bias});
      INFO("p " << p << " mask " << m << "\n" << r.detail);
      REQUIRE(r.max_rel_error < 1e-6);
    }
  }
  // A per-head bias (H, 1, Tk) broadcast over batch and queries.
  Tensor hb = rand_input({H, 1, Tk}, 15);
  GradcheckReport r = gradcheck(
      [&](const std::vector<Tensor>& in) {
        AttentionOptions o;
        o.bias = in[1];
        return attention(in[0], k, v, o);
      },
      {q, hb});
  INFO(r.detail);
  REQUIRE(r.max_rel_error < 1e-6);
}

TEST_CASE("relative attention (Shaw) is its formula, and its gradients match finite differences",
          "[attention][gradcheck]") {
  // logits scale (q_i . (k_j + a_c(j - i))) + bias, out_i = sum_j P_ij (v_j + a_c(j - i)), c the
  // clipped offset: element by element in f64 against the op (which makes the bucket map and its
  // inverse itself when not given), then finite differences through q, k, v, bias and A, each
  // term alone too. clip 2 < T: tails on both sides.
  const int64_t B = 2, H = 2, T = 6, D = 3, clip = 2, R = 2 * clip + 1;
  Tensor q = rand_input({B, H, T, D}, 21), k = rand_input({B, H, T, D}, 22);
  Tensor v = rand_input({B, H, T, D}, 23), bias = rand_input({1, H, T, T}, 24);
  Tensor a = rand_input({R, D}, 25);
  const double scale = 0.4;
  RelativeTerms rt;
  rt.clip = clip;
  rt.table = a;
  AttentionOptions o;
  o.scale = scale;
  o.bias = bias;
  const std::vector<double> got = attention(q, k, v, o, rt).to_vector<double>();
  const std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>(),
                            vv = v.to_vector<double>(), bv = bias.to_vector<double>(),
                            av = a.to_vector<double>();
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> x(T);
      double m = -1e300, l = 0;
      auto c = [&](int64_t j) { return std::clamp(j - i, -clip, clip) + clip; };
      for (int64_t j = 0; j < T; ++j) {
        double s = 0;
        for (int64_t e = 0; e < D; ++e)
          s += qv[(bh * T + i) * D + e] * (kv[(bh * T + j) * D + e] + av[c(j) * D + e]);
        x[j] = s * scale + bv[((bh % H) * T + i) * T + j];
        m = std::max(m, x[j]);
      }
      for (double& e : x) l += (e = std::exp(e - m));
      for (int64_t e = 0; e < D; ++e) {
        double want = 0;
        for (int64_t j = 0; j < T; ++j)
          want += x[j] / l * (vv[(bh * T + j) * D + e] + av[c(j) * D + e]);
        REQUIRE(got[(bh * T + i) * D + e] == Approx(want).epsilon(1e-12).margin(1e-12));
      }
    }
  for (int terms : {3, 1, 2}) {
    GradcheckReport r = gradcheck(
        [&](const std::vector<Tensor>& in) {
          Generator g(7);
          AttentionOptions oo{
              .scale = scale, .bias = in[3], .dropout_p = 0.25, .training = true, .generator = &g};
          RelativeTerms t{
              .clip = clip, .table = in[4], .keys = (terms & 1) != 0, .values = (terms & 2) != 0};
          return attention(in[0], in[1], in[2], oo, t);
        },
        {q, k, v, bias, a});
    INFO("terms " << terms << "\n" << r.detail);
    REQUIRE(r.max_rel_error < 1e-6);
  }
  // Bad vectors: one clear error naming the expected shape.
  rt.table = rand_input({R + 2, D}, 26);
  REQUIRE_THROWS_WITH(attention(q, k, v, o, rt),
                      Catch::Contains("relative vectors") && Catch::Contains("(5, 3)"));
}

TEST_CASE("attention handles padding, evaluation mode and a shared bias", "[attention]") {
  const int64_t B = 2, H = 2, T = 4, D = 3;
  Tensor q = rand_input({B, H, T, D}, 21, false), k = rand_input({B, H, T, D}, 22, false);
  Tensor v = rand_input({B, H, T, D}, 23, false);
  // Batch 1 has every key masked: its outputs are zeros, never NaN.
  Tensor mask = Tensor::from_vector<int64_t>({1, 1, 0, 1, 0, 0, 0, 0}, {B, T});
  AttentionOptions o;
  o.key_mask = mask;
  std::vector<double> out = attention(q, k, v, o).to_vector<double>();
  for (size_t i = out.size() / 2; i < out.size(); ++i) REQUIRE(out[i] == 0.0);
  for (size_t i = 0; i < out.size() / 2; ++i) REQUIRE(std::isfinite(out[i]));
  // A masked key does not influence the output: change v at key 2 of batch 0.
  Tensor v2 = v.clone();
  v2.slice(0, 0, 1).slice(2, 2, 3).fill_(100.0);
  std::vector<double> out2 = attention(q, k, v2, o).to_vector<double>();
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out2[i] == Approx(out[i]).margin(1e-12));
  // Evaluation: dropout off, no random numbers drawn.
  Generator g(3);
  AttentionOptions eval{.dropout_p = 0.5, .training = false, .generator = &g};
  attention(q, k, v, eval);
  REQUIRE(g.offset() == 0);
  // A (1, H, T, T) bias gets its gradient summed over the batch.
  Tensor bias = Tensor::zeros({1, H, T, T}, DType::f64).set_requires_grad();
  AttentionOptions ob;
  ob.bias = bias;
  Tensor qq = q.clone().set_requires_grad();
  Tensor y = attention(qq, k, v, ob);
  y.backward(Tensor::ones(y.shape(), DType::f64));
  REQUIRE(bias.grad().shape() == Shape{1, H, T, T});
}

TEST_CASE("attention errors name the tensors and the expected shapes", "[attention][errors]") {
  Tensor q = Tensor::zeros({2, 3, 5, 4}), k = Tensor::zeros({2, 3, 7, 4});
  Tensor v = Tensor::zeros({2, 3, 7, 6});
  REQUIRE_THROWS_WITH(attention(q.reshape({6, 5, 4}), k, v),
                      Contains("[attention] expected q (B, H, Tq, D)"));
  REQUIRE_THROWS_WITH(attention(q, Tensor::zeros({2, 3, 7, 5}), v),
                      Contains("[attention] k (2, 3, 7, 5)"));
  REQUIRE_THROWS_WITH(attention(q, k, Tensor::zeros({2, 3, 6, 6})),
                      Contains("[attention] v (2, 3, 6, 6)"));
  REQUIRE_THROWS_WITH(attention(q, k, v.to(DType::f64)), Contains("share a dtype"));
  AttentionOptions o;
  o.bias = Tensor::zeros({3, 5, 5});
  REQUIRE_THROWS_WITH(attention(q, k, v, o),
                      Contains("[attention] bias (3, 5, 5)") && Contains("not broadcastable"));
  o.bias = Tensor();
  o.key_mask = Tensor::ones({2, 5});
  REQUIRE_THROWS_WITH(attention(q, k, v, o),
                      Contains("key_mask (2, 5) f32 cpu must be (B, Tk) = (2, 7)"));
  o.key_mask = Tensor();
  o.dropout_p = 1.0;
  REQUIRE_THROWS_WITH(attention(q, k, v, o), Contains("dropout_p must be in [0, 1)"));
}
