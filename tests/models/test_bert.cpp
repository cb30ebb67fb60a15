// The BERT model's properties: the T5 bucket table, permutation equivariance without positions,
// TUPE's positional term (token-independent, computed once, the [CLS] reset), parameter counts,
// every preset running forward and backward, configs, checkpoints and batch files.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/autograd.h"
#include "engine/config.h"
#include "engine/safetensors.h"
#include "models/bert.h"
#include "models/checkpoint.h"
#include "models/model_support.h"
#include "models/position/alibi.h"
#include "models/position/untied.h"
#include "ops/ops.h"

using namespace models;
using Catch::Contains;
using engine::DType;
using engine::Tensor;

namespace {

BertConfig tiny(const std::string& preset, const std::string& reset = "paper") {
  BertConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.ffn_size = 64;
  c.max_positions = 24;
  c.hidden_dropout = c.attention_dropout = 0.0;
  apply_position_preset(c.position, preset, reset);
  c.position.rpe_clip = 5;
  c.validate();
  return c;
}

BertInputs random_inputs(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  engine::Generator g(seed);
  std::vector<float> r = Tensor::rand({b, t}, g).to_vector<float>();
  std::vector<int64_t> ids(r.size());
  for (size_t i = 0; i < r.size(); ++i) ids[i] = 1 + int64_t(r[i] * float(vocab - 1)) % (vocab - 1);
  BertInputs in;
  in.input_ids = Tensor::from_vector<int64_t>(ids, {b, t});
  return in;
}

// The MLM head on inputs and (B, T) labels (-100 = not predicted), as a batch the pipeline makes.
MlmOutput mlm_forward(const BertForMaskedLM& m, const BertInputs& in, const Tensor& labels,
                      engine::Generator& g) {
  return m.forward(data::make_mlm_batch(in.input_ids, in.attention_mask, labels, in.token_type_ids,
                                        m.config().vocab_size, "test"),
                   g);
}

// A generator for a constructor argument (BertModel draws its initial weights from it).
engine::Generator& seeded(uint64_t seed) {
  static engine::Generator g;
  g.manual_seed(seed);
  return g;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.contiguous().to_vector<float>(), y = b.contiguous().to_vector<float>();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(double(x[i]) - double(y[i])));
  return m;
}

std::filesystem::path temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("engine_test_bert_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace

TEST_CASE("T5 buckets equal the document's table", "[bert]") {
  // |r| 0->0, 1..7->1..7, 8..11->8, 12..15->9, 16..22->10, 23..31->11, 32..45->12, 46..63->13,
  // 64..90->14, >=91->15; r < 0 uses the left value, r > 0 adds 16.
  auto table = [](int64_t n) -> int64_t {
    if (n < 8) return n;
    const int64_t lo[] = {8, 12, 16, 23, 32, 46, 64, 91};
    int64_t b = 0;
    for (int64_t k = 0; k < 8; ++k)
      if (n >= lo[k]) b = 8 + k;
    return b;
  };
  for (int64_t r = -300; r <= 300; ++r) {
    const int64_t n = std::llabs(r);
    INFO("r = " << r);
    REQUIRE(t5_bucket(r) == table(n) + (r > 0 ? 16 : 0));
  }
  REQUIRE(t5_bucket(16) == 16 + 10);  // exact-arithmetic boundaries
  REQUIRE(t5_bucket(-32) == 12);
  REQUIRE(t5_bucket(64) == 16 + 14);
  REQUIRE(t5_bucket(100000) == 31);
}

TEST_CASE("no_pe is permutation-equivariant on the non-[CLS] tokens", "[bert]") {
  BertModel model(tiny("no_pe"), seeded(3));
  model.train(false);
  engine::Generator g(1);
  const int64_t t = 9;
  BertInputs in = random_inputs(2, t, 50, 5);
  std::vector<int64_t> perm = {0, 4, 7, 1, 8, 2, 6, 3, 5};  // keeps position 0
  std::vector<int64_t> ids = in.input_ids.to_vector<int64_t>(), pids(ids.size());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < t; ++i) pids[size_t(b * t + i)] = ids[size_t(b * t + perm[size_t(i)])];
  BertInputs pin;
  pin.input_ids = Tensor::from_vector<int64_t>(pids, {2, t});
  engine::NoGrad ng;
  Tensor y = model.forward(in, g), py = model.forward(pin, g);
  Tensor idx = Tensor::from_vector<int64_t>(perm, {t});
  // py[:, i] == y[:, perm[i]]
  Tensor expected = engine::index_select(y.permute({1, 0, 2}).contiguous(), idx).permute({1, 0, 2});
  REQUIRE(max_abs_diff(py, expected) < 1e-5);
  // ... and bert_a is not.
  BertModel ape(tiny("bert_a"), seeded(3));
  ape.train(false);
  Tensor ya = ape.forward(in, g), pya = ape.forward(pin, g);
  Tensor expa = engine::index_select(ya.permute({1, 0, 2}).contiguous(), idx).permute({1, 0, 2});
  REQUIRE(max_abs_diff(pya, expa) > 1e-3);
}

TEST_CASE("TUPE's positional term: token-independent, once per forward, reset to theta",
          "[bert][tupe]") {
  for (std::string preset : {"tupe_a", "tupe_r"}) {
    for (std::string reset : {"paper", "code"}) {
      INFO(preset << " cls_reset " << reset);
      BertConfig c = tiny(preset, reset);
      c.num_layers = 3;
      engine::Generator init(11);
      BertModel model(c, init);
      model.train(false);
      engine::Generator g(1);
      const int64_t t = 12;
      engine::NoGrad ng;
      model.forward(random_inputs(2, t, 50, 1), g);
      REQUIRE(model.attention_terms_computed() == 1);  // 3 layers, one computation
      Tensor bias1 = model.position->attention_terms(t, engine::Device::cpu()).bias.clone();
      REQUIRE(bias1.shape() == engine::Shape{1, 4, t, t});  // (1, H, T, T): never per example
      model.forward(random_inputs(5, t, 50, 2), g);
      REQUIRE(model.attention_terms_computed() == 2);
      REQUIRE(max_abs_diff(bias1, model.position->attention_terms(t, engine::Device::cpu()).bias) ==
              0.0);

      // Row 0 holds theta1 and column 0 below it theta2 (plus the [CLS] buckets' scalars in
      // the code's TUPE-R).
      const UntiedTerm& untied = untied_term_of(*model.position);
      auto [th1, th2] = untied.cls_thetas();
      std::vector<float> b = bias1.to_vector<float>(), t1 = th1.to_vector<float>(),
                         t2 = th2.to_vector<float>();
      std::vector<float> rel;
      if (preset == "tupe_r" && reset == "code")
        rel = model.position->parameter("relative_table").to_vector<float>();  // (34, H)
      const int64_t h = 4, nb = 32;
      for (int64_t hh = 0; hh < h; ++hh) {
        for (int64_t j = 0; j < t; ++j) {
          float want = t1[size_t(hh)] + (rel.empty() ? 0.f : rel[size_t(nb * h + hh)]);
          REQUIRE(b[size_t(hh * t * t + j)] == Approx(want).margin(1e-6));
        }
        for (int64_t i = 1; i < t; ++i) {
          float want = t2[size_t(hh)] + (rel.empty() ? 0.f : rel[size_t((nb + 1) * h + hh)]);
          REQUIRE(b[size_t(hh * t * t + i * t)] == Approx(want).margin(1e-6));
        }
      }
      // Elsewhere it is the untied term (plus the relative bias for tupe_r).
      Tensor v = untied.untied_term(t);
      std::vector<float> vv = v.to_vector<float>();
      if (preset == "tupe_a") REQUIRE(std::fabs(b[size_t(t + 1)] - vv[size_t(t + 1)]) < 1e-6);
      // theta differs from the untied (0, 0) entry: the reset did something.
      REQUIRE(std::fabs(t1[0] - vv[0]) > 1e-7);
    }
  }
  // tupe_a_tie_cls: no reset, the term is the untied one.
  BertModel tie(tiny("tupe_a_tie_cls"), seeded(4));
  engine::Generator g(1);
  engine::NoGrad ng;
  tie.forward(random_inputs(1, 7, 50, 1), g);
  REQUIRE(max_abs_diff(tie.position->attention_terms(7, engine::Device::cpu()).bias,
                       untied_term_of(*tie.position).untied_term(7)) == 0.0);
}

TEST_CASE("alibi: the paper's slopes, a constant bias -m_h |j - i|, no parameters", "[bert]") {
  REQUIRE(alibi_slopes(8) == std::vector<double>{1. / 2, 1. / 4, 1. / 8, 1. / 16, 1. / 32, 1. / 64,
                                                 1. / 128, 1. / 256});
  REQUIRE(alibi_slopes(1) == std::vector<double>{1. / 256});
  // Not a power of two: the 8 slopes of 8, then every other slope of 16 (2^-0.5, 2^-1.5, ...).
  const std::vector<double> s12 = alibi_slopes(12);
  REQUIRE(s12.size() == 12);
  for (int h = 0; h < 8; ++h) REQUIRE(s12[size_t(h)] == std::ldexp(1.0, -(h + 1)));
  for (int k = 0; k < 4; ++k) REQUIRE(s12[size_t(8 + k)] == Approx(std::pow(2.0, -0.5 - k)));
  REQUIRE(alibi_slopes(6) == std::vector<double>{1. / 4, 1. / 16, 1. / 64, 1. / 256,
                                                 std::pow(2.0, -1.0), std::pow(2.0, -3.0)});

  BertConfig c = tiny("alibi");
  c.num_heads = 4;
  BertModel model(c, seeded(3));
  REQUIRE(model.position->named_parameters().empty());
  const int64_t t = 9;
  const AttentionTerms terms = model.position->attention_terms(t, engine::Device::cpu());
  REQUIRE(terms.bias.shape() == engine::Shape{1, 4, t, t});
  REQUIRE_FALSE(terms.bias.requires_grad());
  const std::vector<float> b = terms.bias.to_vector<float>();
  const std::vector<double> m = alibi_slopes(4);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j)
        REQUIRE(b[size_t((h * t + i) * t + j)] == float(-m[size_t(h)] * double(std::llabs(j - i))));
  // A shorter length is the leading block, a longer one any length (no table).
  const AttentionTerms t4 = model.position->attention_terms(4, engine::Device::cpu());
  REQUIRE(max_abs_diff(t4.bias, terms.bias.slice(2, 0, 4).slice(3, 0, 4)) == 0.0);
  REQUIRE(model.position->attention_terms(40, engine::Device::cpu()).bias.size(3) == 40);
  REQUIRE(terms.scale_factor == 1.0);
}

TEST_CASE("rope: q.k of identical tokens depends on j - i only, no parameters", "[bert]") {
  for (const char* preset : {"rope", "alibi"}) {
    INFO(preset);
    BertConfig c = tiny(preset);
    BertModel model(c, seeded(5));
    model.train(false);
    REQUIRE(model.position->named_parameters().empty());
    engine::NoGrad ng;
    const int64_t t = 11;
    // One token repeated: every position has the same x, so the logits differ by position only
    // through the encoding, which is relative: the (T, T) logits are Toeplitz.
    BertInputs in;
    in.input_ids = Tensor::from_vector<int64_t>(std::vector<int64_t>(size_t(t), 7), {1, t});
    engine::Generator g(1);
    const AttentionTerms terms = model.position->attention_terms(t, engine::Device::cpu());
    Tensor logits = model.layers.at(0)->attention_logits(model.embed(in, g), terms);
    const std::vector<float> v = logits.to_vector<float>();
    for (int64_t h = 0; h < c.num_heads; ++h)
      for (int64_t i = 1; i < t; ++i)
        for (int64_t j = 1; j < t; ++j)
          REQUIRE(v[size_t((h * t + i) * t + j)] ==
                  Approx(v[size_t((h * t + i - 1) * t + j - 1)]).margin(1e-5));
    // Not constant along a row: the positions do something.
    REQUIRE(std::fabs(v[0] - v[size_t(t - 1)]) > 1e-4);
  }
  BertModel rope(tiny("rope"), seeded(5));
  const AttentionTerms terms = rope.position->attention_terms(6, engine::Device::cpu());
  REQUIRE(terms.rotary_cos.shape() == engine::Shape{6, 4});  // d_h 8: 4 pairs
  REQUIRE_FALSE(terms.bias.defined());
  // Position 0 is not rotated; position 1's first pair by 1 radian, its last by 10000^(-6/8).
  const std::vector<float> cs = terms.rotary_cos.to_vector<float>(),
                           sn = terms.rotary_sin.to_vector<float>();
  REQUIRE(cs[0] == 1.f);
  REQUIRE(sn[0] == 0.f);
  REQUIRE(cs[4] == float(std::cos(1.0)));
  REQUIRE(sn[7] == float(std::sin(std::pow(10000.0, -6.0 / 8.0))));
  BertConfig odd = tiny("rope");
  odd.hidden_size = 18;
  odd.num_heads = 2;  // d_h 9
  REQUIRE_THROWS_WITH(odd.validate(), Contains("rope") && Contains("even head size"));
}

TEST_CASE("every TUPE-R parameter receives a gradient through the shared term", "[bert][tupe]") {
  BertConfig c = tiny("tupe_r");
  BertForMaskedLM m(c, 2);
  m.train(false);
  BertInputs in = random_inputs(2, 8, 50, 3);
  std::vector<int64_t> lab(16, -100);
  lab[3] = 7;
  lab[12] = 9;
  engine::Generator g(1);
  MlmOutput out = mlm_forward(m, in, Tensor::from_vector<int64_t>(lab, {2, 8}), g);
  out.loss.backward();
  for (auto& [name, p] : m.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
  }
  // The [CLS] vectors and the relative table got nonzero gradients.
  for (const char* name : {"cls_theta", "relative_table"}) {
    const Tensor grad = m.bert.position->parameter(name).grad();
    REQUIRE(engine::sum(engine::mul(grad, grad)).item() > 0);
  }
}

TEST_CASE("every preset runs forward and backward with a finite loss", "[bert]") {
  for (const std::string& preset : position_presets()) {
    for (bool pre_ln : {false, true}) {
      INFO(preset << (pre_ln ? " pre-LN" : " post-LN"));
      BertConfig c = tiny(preset);
      c.pre_layer_norm = pre_ln;
      c.type_vocab_size = 2;
      c.hidden_dropout = c.attention_dropout = 0.1;
      BertForMaskedLM m(c, 5);
      m.train(true);
      BertInputs in = random_inputs(3, 10, 50, 6);
      std::vector<int64_t> mask(30, 1), lab(30, -100);
      for (int64_t j = 6; j < 10; ++j) mask[size_t(20 + j)] = 0;
      lab[2] = 4, lab[15] = 8, lab[21] = 30;
      in.attention_mask = Tensor::from_vector<int64_t>(mask, {3, 10});
      std::vector<int64_t> types(30, 0);
      for (int64_t j = 5; j < 10; ++j) types[size_t(j)] = 1;
      in.token_type_ids = Tensor::from_vector<int64_t>(types, {3, 10});
      engine::Generator g(9);
      MlmOutput out = mlm_forward(m, in, Tensor::from_vector<int64_t>(lab, {3, 10}), g);
      REQUIRE(out.logits.shape() == engine::Shape{3, 50});
      const float loss = out.loss.item();
      REQUIRE(std::isfinite(loss));
      REQUIRE(loss == Approx(std::log(50.0)).margin(1.0));  // near uniform at init
      out.loss.backward();
      for (auto& [name, p] : m.named_parameters()) {
        INFO(name);
        REQUIRE(p.grad().defined());
        for (float v : p.grad().to_vector<float>()) REQUIRE(std::isfinite(v));
      }
    }
  }
}

TEST_CASE("sequence length: learned tables refuse T > max_positions, formulas extrapolate",
          "[bert]") {
  engine::Generator g(1);
  engine::NoGrad ng;
  BertModel ape(tiny("bert_a"), seeded(1));
  REQUIRE_THROWS_WITH(ape.forward(random_inputs(1, 30, 50, 1), g),
                      Contains("sequence length 30 exceeds model.max_positions 24"));
  for (std::string preset : {"sin_ape", "sin_rpe", "learned_rpe", "no_pe", "learnable_sin_rpe"}) {
    BertModel m(tiny(preset), seeded(1));
    REQUIRE(m.forward(random_inputs(1, 30, 50, 1), g).shape() == engine::Shape{1, 30, 32});
  }
}

TEST_CASE("BERT-Base parameter counts: bert_a, tupe_r, rope, alibi at vocab 32768", "[bert]") {
  // layers: BERT-Base's 12, or 1 for the presets whose difference is in the embeddings (each
  // BERT-Base build draws ~110 M initial values: seconds, most of it under the sanitizers).
  auto count = [](const std::string& preset, int layers = 12) {
    BertConfig c = bert_base();
    c.vocab_size = 32768;
    c.num_layers = layers;
    apply_position_preset(c.position, preset);
    BertForMaskedLM m(c, 1);
    return m.num_parameters();
  };
  const int64_t bert_a = count("bert_a"), tupe_r = count("tupe_r");
  WARN("BERT-Base at vocab 32768: bert_a " << bert_a << ", tupe_r " << tupe_r << " parameters");
  // Embeddings 32768*768 + positions 512*768 + LN, 12 layers of 7,087,872, MLM head 591,104 +
  // 32768.
  const int64_t layer = (3 * 768 * 768 + 3 * 768) + (768 * 768 + 768) + 2 * 768 +
                        (3072 * 768 + 3072) + (768 * 3072 + 768) + 2 * 768;
  REQUIRE(bert_a ==
          32768 * 768 + 512 * 768 + 2 * 768 + 12 * layer + (768 * 768 + 768) + 2 * 768 + 32768);
  // TUPE adds U^Q, U^K with biases (~1.18 M), the position LN, theta1/theta2 and a 32 x 12 table.
  const int64_t extra = tupe_r - bert_a;
  REQUIRE(extra == 2 * (768 * 768 + 768) + 2 * 768 + 2 * 768 + 32 * 12);
  REQUIRE(extra == Approx(1.18e6).epsilon(0.01));
  // rope and alibi have no positional parameter: bert_a less its 512 x 768 table (1 layer).
  const int64_t bert_a1 = count("bert_a", 1);
  REQUIRE(bert_a1 == bert_a - 11 * layer);
  REQUIRE(count("rope", 1) == bert_a1 - 512 * 768);
  REQUIRE(count("alibi", 1) == bert_a1 - 512 * 768);
}

TEST_CASE("model configs from YAML: sizes, presets and clear errors", "[bert][config]") {
  auto parse = [](const std::string& yaml) {
    engine::Config cfg = engine::Config::parse(yaml, "test.yaml");
    return BertConfig::from_config(cfg.root().section("model"));
  };
  BertConfig base =
      parse("model:\n  size: base\n  vocab_size: 30522\n  position:\n    preset: tupe_r\n");
  REQUIRE(base.hidden_size == 768);
  REQUIRE(base.position.has("t5_bias"));
  REQUIRE(base.position.has("untied"));
  REQUIRE(base.position.cls_reset == ClsReset::paper);
  BertConfig large = parse("model:\n  size: large\n  num_layers: 4\n");
  REQUIRE(large.hidden_size == 1024);
  REQUIRE(large.num_layers == 4);
  REQUIRE(parse("model:\n  position:\n    preset: bert_a+learnable_sin_rpe\n").position.families ==
          std::vector<std::string>{"learned", "shaw_learnable_sinusoid"});
  REQUIRE(BertConfig::from_json(base.to_json(), "x") == base);

  REQUIRE_THROWS_WITH(
      parse("model:\n  hidden_sise: 3\n"),
      Contains("test.yaml:2: unknown key 'model.hidden_sise'") && Contains("hidden_size"));
  REQUIRE_THROWS_WITH(parse("model:\n  num_layers: two\n"),
                      Contains("test.yaml:2: model.num_layers: expected an integer, got 'two'"));
  REQUIRE_THROWS_WITH(
      parse("model:\n  position:\n    preset: tupe\n"),
      Contains("model.position.preset: 'tupe' is not one of") && Contains("tupe_r"));
  REQUIRE_THROWS_WITH(parse("model:\n  hidden_size: 30\n  num_heads: 4\n"),
                      Contains("hidden_size 30 is not divisible by model.num_heads 4"));
  REQUIRE_THROWS_WITH(parse("model:\n  position: tupe_r\n"),
                      Contains("model.position: expected a mapping"));
  REQUIRE_THROWS_WITH(engine::Config::parse("model: [1, 2\n", "bad.yaml"),
                      Contains("bad.yaml:") && Contains("not valid YAML"));
  engine::Config cfg = engine::Config::parse("model:\n  num_layers: 2\n", "t.yaml");
  cfg.set_assignment("model.position.preset=sin_rpe");
  REQUIRE(BertConfig::from_config(cfg.root().section("model")).position.preset == "sin_rpe");
  REQUIRE_THROWS_WITH(cfg.set_assignment("model.num_layers.x=3"),
                      Contains("'model.num_layers' is a value"));
  REQUIRE_THROWS_WITH(cfg.set_assignment("novalue"), Contains("expects key.path=value"));
}

TEST_CASE("position families: every preset's are registered by their files, checks run at parse",
          "[bert][config]") {
  REQUIRE(position_families_linked());
  for (const std::string& preset : position_presets()) {
    PositionConfig pc;
    apply_position_preset(pc, preset, "paper");
    REQUIRE(pc.linked_families().size() == pc.families.size());
    for (const PositionFamily* f : pc.linked_families()) REQUIRE(f->make);
  }
  // A family's own checks, registered in its file, run when the config is read.
  auto parse = [](const std::string& yaml) {
    engine::Config cfg = engine::Config::parse(yaml, "test.yaml");
    return BertConfig::from_config(cfg.root().section("model"));
  };
  REQUIRE_THROWS_WITH(
      parse("model:\n  hidden_size: 12\n  num_heads: 4\n  position:\n    preset: rope\n"),
      Contains("rope rotates pairs of dimensions") && Contains("got 3"));
  REQUIRE_THROWS_WITH(parse("model:\n  position:\n    preset: bert_r\n    relative_buckets: 7\n"),
                      Contains("relative_buckets must be even"));
  // A second registration of a name, or a family without a factory, is refused.
  auto none = [](PositionContext&) { return std::unique_ptr<PositionComponent>(); };
  REQUIRE_THROWS_WITH(register_position_family(PositionFamily{.name = "rope", .make = none}),
                      Contains("'rope' registered twice"));
  REQUIRE_THROWS_WITH(register_position_family(PositionFamily{.name = "new_family"}),
                      Contains("needs a name and a factory"));
  // A preset naming an unregistered family fails with the name.
  PositionConfig typo;
  typo.preset = "custom";
  typo.families = {"learned", "rotary"};
  REQUIRE_THROWS_WITH(
      typo.linked_families(),
      Contains("preset custom names the position family 'rotary'") && Contains("models/position/"));
  // The HF verdict is the families' own (TUPE's names its [CLS] reset).
  PositionConfig tupe;
  apply_position_preset(tupe, "tupe_r", "paper");
  REQUIRE_THAT(tupe.hf_blocker(), Contains("untied positional attention") &&
                                      Contains("[CLS] reset") && Contains("relative_table"));
}

TEST_CASE("checkpoints describe themselves and load exactly", "[bert][checkpoint]") {
  auto dir = temp_dir("ckpt");
  const std::string path = (dir / "m.safetensors").string();
  BertConfig c = tiny("tupe_r", "code");
  BertForMaskedLM a(c, 1);
  save_checkpoint(path, a);
  BertConfig back = read_checkpoint_config(path);
  REQUIRE(back == c);
  BertForMaskedLM b(back, 2);
  load_checkpoint(path, b);
  auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    REQUIRE(pa[i].first == pb[i].first);
    REQUIRE(max_abs_diff(pa[i].second, pb[i].second) == 0.0);
  }
  // A model of another shape: the first mismatching tensor is named.
  BertConfig other = c;
  other.ffn_size = 48;
  BertForMaskedLM wrong(other, 1);
  REQUIRE_THROWS_WITH(load_checkpoint(path, wrong),
                      Contains("bert.encoder.layer.0.ffn.fc1.weight"));
  BertForMaskedLM wrong_preset(tiny("bert_a"), 1);
  REQUIRE_THROWS_AS(load_checkpoint(path, wrong_preset), engine::Error);
  // Truncated: a clear error, no crash.
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  REQUIRE_THROWS_AS(load_checkpoint(path, b), engine::Error);
  // A safetensors file without our config.
  engine::save_safetensors(path, {{"x", Tensor::zeros({2})}});
  REQUIRE_THROWS_WITH(read_checkpoint_config(path),
                      Contains("not a checkpoint written by this engine"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("MLM batch files are validated", "[bert][batch]") {
  auto dir = temp_dir("batch");
  const std::string path = (dir / "b.safetensors").string();
  BertConfig c = tiny("bert_a");
  auto ids = Tensor::from_vector<int64_t>({1, 5, 7, 1, 9, 0}, {2, 3});
  auto mask = Tensor::from_vector<int64_t>({1, 1, 1, 1, 1, 0}, {2, 3});
  auto labels = Tensor::from_vector<int64_t>({-100, 5, -100, -100, 9, -100}, {2, 3});
  engine::save_safetensors(path,
                           {{"input_ids", ids}, {"attention_mask", mask}, {"labels", labels}});
  data::MlmBatch b = load_mlm_batch(path, c);
  REQUIRE(b.inputs.input_ids.shape() == engine::Shape{2, 3});
  REQUIRE_FALSE(b.inputs.token_type_ids.defined());
  // The predicted positions (flat b * T + t) and their targets, and the token count, come with it.
  REQUIRE(b.positions.to_vector<int64_t>() == std::vector<int64_t>{1, 4});
  REQUIRE(b.targets.to_vector<int64_t>() == std::vector<int64_t>{5, 9});
  REQUIRE(b.num_predicted() == 2);
  REQUIRE(b.num_tokens == 5);
  engine::save_safetensors(
      path, {{"input_ids", ids},
             {"attention_mask", mask},
             {"labels", Tensor::from_vector<int64_t>({-100, 5, -100, -100, 50, -100}, {2, 3})}});
  REQUIRE_THROWS_WITH(
      load_mlm_batch(path, c),
      Contains("labels[1, 1] = 50 is not -100 or a token id in [0, vocab_size 50)"));

  auto bad_ids = Tensor::from_vector<int64_t>({1, 5, 70, 1, 9, 0}, {2, 3});
  engine::save_safetensors(path,
                           {{"input_ids", bad_ids}, {"attention_mask", mask}, {"labels", labels}});
  REQUIRE_THROWS_WITH(load_mlm_batch(path, c), Contains("input_ids[0, 2] = 70 is not a token id"));
  engine::save_safetensors(path, {{"input_ids", ids}, {"labels", labels}});
  REQUIRE_THROWS_WITH(load_mlm_batch(path, c), Contains("missing tensor 'attention_mask'"));
  engine::save_safetensors(path, {{"input_ids", ids},
                                  {"attention_mask", mask},
                                  {"labels", Tensor::from_vector<int64_t>({1, 2, 3}, {1, 3})}});
  REQUIRE_THROWS_WITH(load_mlm_batch(path, c), Contains("'labels' has shape (1, 3)"));
  engine::save_safetensors(path, {{"input_ids", ids},
                                  {"attention_mask", mask},
                                  {"labels", labels},
                                  {"token_type_ids", Tensor::zeros({2, 3}, DType::i64)}});
  REQUIRE_THROWS_WITH(load_mlm_batch(path, c), Contains("no segment embeddings"));
  engine::save_safetensors(
      path, {{"input_ids", ids.to(DType::f32)}, {"attention_mask", mask}, {"labels", labels}});
  REQUIRE_THROWS_WITH(load_mlm_batch(path, c), Contains("'input_ids' must hold integers"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a staged MLM batch: padded predictions keep the loss, refills in place, grows",
          "[bert][batch]") {
  // data::StagedMlmBatch (train.cuda_graph's inputs), here on the CPU: the same code as on a
  // device.
  const BertConfig c = engine::testing::tiny_bert("tupe_r");
  BertForMaskedLM model(c, 3);
  model.train(false);
  engine::Generator g(1);
  const auto loss_of = [&](const data::MlmBatch& b) { return model.forward(b, g).loss.item(); };
  const data::MlmBatch h1 = engine::testing::host_mlm_batch(3, 12, c.vocab_size, 1);
  const std::vector<int64_t> h1_ids = h1.inputs.input_ids.to_vector<int64_t>();
  data::StagedMlmBatch staged;
  REQUIRE(staged.stage(h1, engine::Device::cpu()));  // the first: allocated
  const int64_t m = h1.num_predicted(), capacity = staged.batch().num_predicted();
  CHECK(capacity == (m + 8 + 7) / 8 * 8);
  const std::vector<int64_t> pos = staged.batch().positions.to_vector<int64_t>(),
                             tgt = staged.batch().targets.to_vector<int64_t>();
  CHECK(std::vector<int64_t>(pos.begin(), pos.begin() + m) == h1.positions.to_vector<int64_t>());
  CHECK(std::vector<int64_t>(tgt.begin(), tgt.begin() + m) == h1.targets.to_vector<int64_t>());
  // Padded at the smallest positions no prediction takes: the padded positions stay unique (the
  // head's gradient then goes back one row add each).
  REQUIRE(h1.positions_unique);
  CHECK(staged.batch().positions_unique);
  std::vector<int64_t> unused;
  for (int64_t p = 0; int64_t(unused.size()) < capacity - m; ++p)
    if (std::find(pos.begin(), pos.begin() + m, p) == pos.begin() + m) unused.push_back(p);
  for (int64_t i = m; i < capacity; ++i) {
    CHECK(pos[size_t(i)] == unused[size_t(i - m)]);
    CHECK(tgt[size_t(i)] == -100);
  }
  CHECK(loss_of(staged.batch()) == Approx(loss_of(h1)).epsilon(1e-6));
  {
    // The general scatter's gradients through the unique one (within rounding: the head's sums
    // over its rows take the padding's zero rows too).
    BertForMaskedLM ma(c, 3), mb(c, 3);
    ma.train(false);
    mb.train(false);
    data::MlmBatch general = h1;  // the general scatter
    general.positions_unique = false;
    ma.forward(staged.batch(), g).loss.backward();
    mb.forward(general, g).loss.backward();
    const auto pa = ma.named_parameters(), pb = mb.named_parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].first);
      const std::vector<float> ga = pa[i].second.grad().to_vector<float>(),
                               gb = pb[i].second.grad().to_vector<float>();
      for (size_t k = 0; k < ga.size(); ++k) CHECK(ga[k] == Approx(gb[k]).margin(1e-6));
    }
  }
  // Another batch of the same shapes (seed 6: the same count, other tokens and targets): refilled
  // in place, and the first host batch is left as it was.
  const void* ids_at = staged.batch().inputs.input_ids.raw_data();
  const data::MlmBatch h2 = engine::testing::host_mlm_batch(3, 12, c.vocab_size, 6);
  REQUIRE_FALSE(staged.stage(h2, engine::Device::cpu()));
  CHECK(staged.batch().inputs.input_ids.raw_data() == ids_at);
  CHECK(staged.batch().inputs.input_ids.to_vector<int64_t>() ==
        h2.inputs.input_ids.to_vector<int64_t>());
  CHECK(h1.inputs.input_ids.to_vector<int64_t>() == h1_ids);
  CHECK(loss_of(staged.batch()) == Approx(loss_of(h2)).epsilon(1e-6));
  // More predictions than the capacity: allocated afresh, the capacity grown by an eighth (>= 8).
  std::vector<int64_t> all(36, 3);  // every token but the last row's 3 padding positions
  std::fill(all.end() - 3, all.end(), int64_t{-100});
  const data::MlmBatch many = data::make_mlm_batch(h1.inputs.input_ids, h1.inputs.attention_mask,
                                                   Tensor::from_vector(all, {3, 12}),
                                                   h1.inputs.token_type_ids, c.vocab_size, "test");
  REQUIRE(many.num_predicted() == 33);
  REQUIRE(staged.stage(many, engine::Device::cpu()));
  CHECK(staged.batch().num_predicted() == 48);
  CHECK(loss_of(staged.batch()) == Approx(loss_of(many)).epsilon(1e-6));
  // 33 of 36 slots predicted: too few unused positions for 15 pads, so position 0 pads and the
  // batch is not unique.
  CHECK_FALSE(staged.batch().positions_unique);
  // A smaller batch fits the grown capacity (48 pads > 36 - m unused: position 0 again, no
  // recapture); another shape does not.
  REQUIRE_FALSE(staged.stage(h1, engine::Device::cpu()));
  CHECK_FALSE(staged.batch().positions_unique);
  CHECK(loss_of(staged.batch()) == Approx(loss_of(h1)).epsilon(1e-6));
  {
    // Uniqueness changing between batches of the same shapes asks for a new capture (the head's
    // backward takes another path).
    data::StagedMlmBatch s2;
    REQUIRE(s2.stage(h1, engine::Device::cpu()));
    CHECK(s2.batch().positions_unique);
    data::MlmBatch by_hand = h2;
    by_hand.positions_unique = false;
    CHECK(s2.stage(by_hand, engine::Device::cpu()));
    CHECK_FALSE(s2.batch().positions_unique);
    CHECK_FALSE(s2.stage(by_hand, engine::Device::cpu()));
  }
  REQUIRE(
      staged.stage(engine::testing::host_mlm_batch(2, 12, c.vocab_size, 1), engine::Device::cpu()));
}

TEST_CASE("model.embedding_size: embeddings of their own width, projected, JSON only when set",
          "[bert][config]") {
  BertConfig c = engine::testing::tiny_bert("tupe_r");
  const std::string plain = c.to_json();
  REQUIRE(plain.find("embedding_size") == std::string::npos);  // old checkpoints stay the same
  c.embedding_size = 12;
  c.validate();
  REQUIRE(BertConfig::from_json(c.to_json(), "t") == c);
  REQUIRE(c.first_difference(engine::testing::tiny_bert("tupe_r")) ==
          "embedding_size: 12 vs (unset)");
  REQUIRE(engine::testing::tiny_bert("tupe_r").first_difference(c) ==
          "embedding_size: (unset) vs 12");
  BertForMaskedLM m(c, 2);
  for (auto& [n, t] : m.named_parameters()) {
    INFO(n);
    if (n == "bert.embeddings.token") REQUIRE(t.shape() == engine::Shape{40, 12});
    if (n == "bert.embeddings.project.weight") REQUIRE(t.shape() == engine::Shape{16, 12});
    if (n == "bert.position.table") REQUIRE(t.shape() == engine::Shape{24, 12});
    if (n == "bert.position.query.weight") REQUIRE(t.shape() == engine::Shape{16, 12});
    if (n == "mlm.dense.weight") REQUIRE(t.shape() == engine::Shape{12, 16});
  }
  engine::Generator gen(1);
  m.train(false);
  const data::MlmBatch b = engine::testing::host_mlm_batch(2, 9, 40, 1);
  REQUIRE(std::isfinite(m.forward(b, gen).loss.item()));
  // With embedding_size equal to the width nothing is added: the same model value for value.
  BertConfig same = engine::testing::tiny_bert("tupe_r");
  same.embedding_size = same.hidden_size;
  BertForMaskedLM x(same, 4), y(engine::testing::tiny_bert("tupe_r"), 4);
  REQUIRE(x.named_parameters().size() == y.named_parameters().size());
  REQUIRE(x.bert.token_embedding.to_vector<float>() == y.bert.token_embedding.to_vector<float>());
  c.embedding_size = -1;
  REQUIRE_THROWS_WITH(c.validate(), Contains("model.embedding_size must be 0"));
  BertConfig odd = engine::testing::tiny_bert("sin_ape");
  odd.embedding_size = 7;
  REQUIRE_THROWS_WITH(odd.validate(), Contains("even embedding width"));
}
