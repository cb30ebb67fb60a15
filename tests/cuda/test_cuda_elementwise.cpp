// [cuda] The elementwise ops (add/sub/mul/div, affine, gelu/tanh/sin/cos) on the CUDA device
// against the CPU backend, forward and backward through autograd, in every floating dtype, on
// awkward shapes: sizes that are not multiples of a warp or of the vector width, broadcasts,
// scalars, transposed and misaligned views, empty tensors.
//
// The CPU computes in f32 or f64 only, so a bf16 / f16 run is compared with the CPU's f32 run on
// the same (rounded) inputs. Tolerances, |cuda - cpu| <= rtol |cpu| + atol on values of order 1
// (worst seen in emulation, as a fraction of the tolerance, in brackets):
//
//   dtype  rtol   atol   why
//   f32    1e-5   1e-6   CUDA's erff / tanhf / sinf / cosf / expf against Eigen's vectorised
//                        approximations: a few ulp; atol for GELU's 1 + erf(x) cancellation in
//                        the left tail, where both sides round near 1 (GELU forward 0.78, the
//                        rest <= 0.03)
//   f64    1e-12  1e-14  the CUDA math library against glibc (identical in emulation)
//   bf16   1e-2   1e-2   8 significant bits (a rounding is 2^-9 relative); a backward rounds up
//                        to three intermediates, and sum_to adds rounded terms (cancellation)
//                        (div's grad b 0.77, mul's grad b 0.71, the rest <= 0.35)
//   f16    2e-3   2e-3   11 significant bits (2^-12 relative per rounding), same chains (div's
//                        grad b 0.49, the rest <= 0.22)
//
// Bit-identical (asserted): add / sub / mul / div, forward and backward (but the sum_to of a
// broadcast operand's gradient, which adds in the GPU's order), in f32 and f64, and
// their bf16 / f16 forward against the CPU's f32 result rounded to bf16 / f16; affine likewise
// when both backends fuse alpha * x + beta into an FMA alike (probed; they do in the default
// -march=native build); in the emulation build (glibc's math on both sides) every f64 forward
// result, and the f64 backwards where the CPU's build contracts a * b + c as the emulated device
// code does (-O2 and up with FMA; the -O1 sanitizer builds do not). For the per-op figures:
//   ELEMENTWISE_REPORT=1 engine_cuda_tests "*match the CPU*,elementwise parity figures"
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ops/ops.h"

using namespace engine;

namespace {

const Device kGpu = Device::cuda(0);
#if defined(ENGINE_CUDA_EMULATION)
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

struct Tol {
  double rtol, atol;
};
Tol tolerance(DType dt) {
  switch (dt) {
    case DType::f32:
      return {1e-5, 1e-6};
    case DType::f64:
      return {1e-12, 1e-14};
    case DType::bf16:
      return {1e-2, 1e-2};
    default:
      return {2e-3, 2e-3};
  }
}

// The CPU's compute dtype for a run in `dt`.
DType cpu_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }
bool is_half(DType dt) { return dt == DType::bf16 || dt == DType::f16; }

// Largest error seen per (op, dtype, forward/backward), in units of the tolerance, printed at the
// end when ELEMENTWISE_REPORT is set (the figures behind the table above).
struct Seen {
  double worst_ratio = 0, worst_rel = 0;
  int64_t n = 0, identical = 0;
};
std::map<std::string, Seen>& seen() {
  static std::map<std::string, Seen> m;
  return m;
}

// got: the CUDA result in `dt`; want: the CPU result in cpu_dtype(dt). `exact`: got must equal
// want (rounded to dt for bf16 / f16) bit for bit.
void expect_close(const Tensor& got, const Tensor& want, DType dt, bool exact,
                  const std::string& what) {
  INFO(what);
  REQUIRE(got.defined() == want.defined());
  if (!got.defined()) return;
  REQUIRE(got.device() == kGpu);
  REQUIRE(got.dtype() == dt);
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = got.to_vector<double>();
  const std::vector<double> w = want.to_vector<double>();
  const std::vector<double> wr = want.to(dt).to_vector<double>();
  const Tol tol = tolerance(dt);
  Seen& s =
      seen()[what.substr(0, what.find(' ', what.find(' ') + 1)) + what.substr(what.rfind(' '))];
  double worst = 0;
  size_t at = 0;
  int64_t identical = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    identical += g[i] == wr[i];
    const double err = std::fabs(g[i] - w[i]);
    const double ratio = err / (tol.rtol * std::fabs(w[i]) + tol.atol);
    if (!(ratio <= worst)) {  // NaN counts as the worst
      worst = ratio;
      at = i;
    }
    if (w[i] != 0) s.worst_rel = std::max(s.worst_rel, err / std::fabs(w[i]));
  }
  s.worst_ratio = std::max(s.worst_ratio, worst);
  s.n += static_cast<int64_t>(g.size());
  s.identical += identical;
  INFO("worst element " << at << ": cuda " << (g.empty() ? 0.0 : g[at]) << ", cpu "
                        << (g.empty() ? 0.0 : w[at]));
  if (exact) {
    REQUIRE(identical == static_cast<int64_t>(g.size()));
  } else {
    REQUIRE(worst <= 1.0);
  }
}

// Host values of `shape` rounded to `dt` (f64 storage of the rounded values).
Tensor values(const Shape& shape, uint64_t seed, DType dt, double mean, double std,
              bool away_from_zero = false) {
  Generator g(seed);
  Tensor x = Tensor::randn(shape, g, mean, std, DType::f64);
  if (away_from_zero) {  // denominators: |x| in [0.5, 2.5), either sign
    std::vector<double> v = x.to_vector<double>();
    for (double& e : v) e = (e < 0 ? -1 : 1) * (0.5 + std::fmod(std::fabs(e), 2.0));
    x = Tensor::from_vector(v, shape);
  }
  return x.to(dt).to(DType::f64);
}

// A leaf of `dt` on `device` holding `v`, and the op's input made from it: the leaf itself, its
// transpose (the leaf is stored transposed), or a misaligned contiguous view (offset 1).
enum class Layout { plain, transposed, offset };
struct Input {
  Tensor leaf, view;
};
Input make_input(const Tensor& v, Layout layout, DType dt, Device device) {
  Tensor stored = v;
  if (layout == Layout::transposed) stored = v.transpose(0, 1).contiguous();
  if (layout == Layout::offset) {
    Tensor padded = Tensor::zeros({v.numel() + 1}, DType::f64);
    padded.slice(0, 1, v.numel() + 1).copy_(v.reshape({v.numel()}));
    stored = padded;
  }
  Tensor leaf = stored.to(dt).to(device).detach();
  leaf.set_requires_grad();
  Tensor view = leaf;
  if (layout == Layout::transposed) view = leaf.transpose(0, 1);
  if (layout == Layout::offset) view = leaf.slice(0, 1, v.numel() + 1).reshape(v.shape());
  return {leaf, view};
}

const char* layout_name(Layout l) {
  return l == Layout::plain ? "plain" : l == Layout::transposed ? "transposed" : "offset";
}

std::string describe_case(const Shape& a, Layout la, const Shape& b, Layout lb) {
  return shape_str(a) + "/" + layout_name(la) + " and " + shape_str(b) + "/" + layout_name(lb);
}

// ---- binary ops ---------------------------------------------------------------------------------

struct BinaryCase {
  Shape a, b;
  Layout la = Layout::plain, lb = Layout::plain;
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {{1}, {1}},
      {{3}, {3}},
      {{33}, {33}},
      {{1031}, {1031}},
      {{70001}, {70001}},
      {{3, 1, 5}, {4, 5}},                                    // broadcast both ways
      {{}, {4, 5}},                                           // scalar lhs
      {{4, 5}, {}},                                           // scalar rhs
      {{}, {}},                                               // both scalars
      {{7, 33}, {7, 33}, Layout::transposed, Layout::plain},  // non-contiguous lhs
      {{7, 33}, {7, 33}, Layout::transposed, Layout::transposed},
      {{7, 33}, {33}, Layout::transposed, Layout::plain},  // transposed + broadcast
      {{1031}, {1031}, Layout::offset, Layout::plain},     // misaligned: scalar path
      {{0}, {0}},                                          // empty
      {{0, 5}, {5}},                                       // empty after broadcast
  };
  return cases;
}

// Broadcasts that collapse to rows x cols (binary_bcast): a row repeated (a bias, a position
// table over the batch), a value a row, on either side, in 16-byte vectors and not. (A list of
// their own: the cases above keep their seeds.)
const std::vector<BinaryCase>& bcast_cases() {
  static const std::vector<BinaryCase> cases = {
      {{4, 6, 40}, {6, 40}},   {{6, 40}, {4, 6, 40}}, {{4, 6, 40}, {4, 6, 1}},
      {{4, 6, 1}, {4, 6, 40}}, {{64, 8}, {8}},        {{5, 7}, {7}},
      {{3, 5}, {3, 1}},
  };
  return cases;
}

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
struct NamedBinary {
  const char* name;
  BinaryFn fn;
};
const NamedBinary kBinary[] = {
    {"add", &engine::add}, {"sub", &engine::sub}, {"mul", &engine::mul}, {"div", &engine::div}};

// reduced_half_grads: check a broadcast operand's bf16 / f16 gradient too (its sum_to adds
// products the device rounded to 16 bits and the CPU did not: within the per-element tolerance
// only where the sums do not cancel much, so the new cases leave it to f32 and f64).
void run_binary(const NamedBinary& op, DType dt, const BinaryCase& c, uint64_t seed,
                bool reduced_half_grads = true) {
  const std::string what = std::string(op.name) + " " + std::string(dtype_name(dt)) + " " +
                           describe_case(c.a, c.la, c.b, c.lb);
  const bool div = std::string(op.name) == "div";
  const Tensor va = values(c.a, seed, dt, 0.0, 1.5);
  const Tensor vb = values(c.b, seed + 1, dt, 0.0, 1.5, div);
  const Shape out_shape = broadcast_shapes(c.a, c.b, op.name);
  const Tensor vw = values(out_shape, seed + 2, dt, 0.0, 1.0);

  const DType ct = cpu_dtype(dt);
  Input ca = make_input(va, c.la, ct, Device::cpu()), cb = make_input(vb, c.lb, ct, Device::cpu());
  Input da = make_input(va, c.la, dt, kGpu), db = make_input(vb, c.lb, dt, kGpu);

  Tensor cy = op.fn(ca.view, cb.view);
  Tensor dy = op.fn(da.view, db.view);
  // Forward: one correctly rounded operation on both sides, whatever the dtype.
  expect_close(dy, cy, dt, true, what + " forward");

  cy.backward(vw.to(ct));
  dy.backward(vw.to(dt).to(kGpu));
  // Backward in f32 / f64: the same operations on the same values, bit for bit where the
  // operand has the output's shape; a broadcast operand's gradient is a sum_to, which the GPU
  // adds in another order than the CPU (within the tolerance, not bit for bit).
  const bool exact_a = !is_half(dt) && c.a == out_shape, exact_b = !is_half(dt) && c.b == out_shape;
  if (reduced_half_grads || !is_half(dt) || c.a == out_shape)
    expect_close(da.leaf.grad(), ca.leaf.grad(), dt, exact_a, what + " grad a");
  if (reduced_half_grads || !is_half(dt) || c.b == out_shape)
    expect_close(db.leaf.grad(), cb.leaf.grad(), dt, exact_b, what + " grad b");
}

// ---- unary ops ----------------------------------------------------------------------------------

struct UnaryCase {
  Shape x;
  Layout layout = Layout::plain;
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {{1}},
      {{3}},
      {{33}},
      {{1031}},
      {{70001}},
      {{3, 4, 5}},
      {{}},
      {{7, 33}, Layout::transposed},
      {{1031}, Layout::offset},
      {{0, 5}},
  };
  return cases;
}

using UnaryFn = Tensor (*)(const Tensor&);
struct NamedUnary {
  const char* name;
  UnaryFn fn;
};
const NamedUnary kUnary[] = {
    {"gelu", &engine::gelu}, {"tanh", &engine::tanh}, {"sin", &engine::sin}, {"cos", &engine::cos}};

// Whether `device` computes affine's alpha * x + beta in `dt` as one FMA: with e = 2^-13 (f32) or
// 2^-27 (f64), (1 + e)(1 + e) - (1 + 2e) is e^2 when fused and 0 when the product is rounded
// first. nvcc fuses by default; the CPU kernel is fused by g++ when -march=native has FMA (the
// default ENGINE_NATIVE build), and the emulated kernel is compiled with the CPU's flags.
bool fuses_affine(Device device, DType dt) {
  const double e = std::ldexp(1.0, dt == DType::f64 ? -27 : -13);
  return affine(Tensor::full({1}, 1 + e, dt, device), 1 + e, -(1 + 2 * e)).item() != 0.0;
}

// Whether the CPU kernels and the device kernels contract a * b + c alike in `dt` (the emulation
// build's device code always does, like nvcc; the CPU's only where its flags let g++ fuse): the
// f64 backward formulas, which have products followed by sums, agree bit for bit only then.
bool same_contraction(DType dt) {
  return fuses_affine(Device::cpu(), dt) == fuses_affine(kGpu, dt);
}

void run_unary(const NamedUnary& op, DType dt, const UnaryCase& c, uint64_t seed) {
  const std::string what = std::string(op.name) + " " + std::string(dtype_name(dt)) + " " +
                           shape_str(c.x) + "/" + layout_name(c.layout);
  // N(0, 2.5): GELU's tails (x < -4, where 1 + erf cancels) and several periods of sin / cos.
  const Tensor vx = values(c.x, seed, dt, 0.0, 2.5);
  const Tensor vw = values(c.x, seed + 1, dt, 0.0, 1.0);
  const DType ct = cpu_dtype(dt);
  Input cx = make_input(vx, c.layout, ct, Device::cpu());
  Input dx = make_input(vx, c.layout, dt, kGpu);
  Tensor cy = op.fn(cx.view);
  Tensor dy = op.fn(dx.view);
  // f64: the same formula over the same libm in emulation; the backward's products and sums bit
  // for bit only where both sides contract them alike.
  const bool exact = dt == DType::f64 && kEmulated;
  const bool exact_grad = exact && same_contraction(dt);
  expect_close(dy, cy, dt, exact, what + " forward");
  dy.backward(vw.to(dt).to(kGpu));
  if (std::string(op.name) == "tanh") {
    // tanh's backward reads its saved output y: 1 - y^2 near |y| = 1 keeps only the last bits
    // of y, so it amplifies whatever separates the two forwards (a bf16 rounding of y, or an
    // ulp between libms). The reference is therefore the CPU kernel's 1 - y^2 over the device's
    // y, applied through a product with that constant (whose backward is g (1 - y^2)); GELU's,
    // sin's and cos's backwards read x, the same on both sides.
    Tensor y = dy.detach().to(Device::cpu()).to(ct);
    Tensor one_minus_y2 = Tensor::empty(y.shape(), ct);
    unary_backward_kernel(Device::cpu(), UnaryOp::tanh, y, Tensor::ones(y.shape(), ct),
                          one_minus_y2);
    Tensor z = cx.view * one_minus_y2;
    z.backward(vw.to(ct));
    expect_close(dx.leaf.grad(), cx.leaf.grad(), dt, exact_grad, what + " grad");
    return;
  }
  cy.backward(vw.to(ct));
  expect_close(dx.leaf.grad(), cx.leaf.grad(), dt, exact_grad, what + " grad");
}

}  // namespace

TEST_CASE("add, sub, mul, div match the CPU forward and backward in every dtype", "[cuda]") {
  uint64_t seed = 100;
  for (const NamedBinary& op : kBinary)
    for (DType dt : kDtypes)
      for (const BinaryCase& c : binary_cases()) run_binary(op, dt, c, seed += 3);
  seed = 5000;
  for (const NamedBinary& op : kBinary)
    for (DType dt : kDtypes)
      for (const BinaryCase& c : bcast_cases()) run_binary(op, dt, c, seed += 3, false);
}

TEST_CASE("gelu, tanh, sin, cos match the CPU forward and backward in every dtype", "[cuda]") {
  uint64_t seed = 500;
  for (const NamedUnary& op : kUnary)
    for (DType dt : kDtypes)
      for (const UnaryCase& c : unary_cases()) run_unary(op, dt, c, seed += 2);
}

TEST_CASE("bias_gelu matches the CPU forward and backward in every dtype", "[cuda]") {
  // Rows of one, widths around a warp and a block, 16-byte vectors (widths a multiple of 8) or
  // not, enough rows for several chunks of the bias gradient, a transposed (strided) x.
  struct Case {
    Shape x;
    Layout layout;
  };
  const Case cases[] = {{{1, 1}, Layout::plain},       {{3, 33}, Layout::plain},
                        {{70, 300}, Layout::plain},    {{2, 3, 257}, Layout::plain},
                        {{33, 7}, Layout::transposed}, {{0, 5}, Layout::plain},
                        {{900, 64}, Layout::plain}};
  uint64_t seed = 900;
  for (DType dt : kDtypes)
    for (const Case& c : cases) {
      const int64_t n = c.x.back();
      const std::string what = "bias_gelu " + std::string(dtype_name(dt)) + " " + shape_str(c.x) +
                               "/" + layout_name(c.layout);
      const Tensor vx = values(c.x, seed, dt, 0.0, 2.5), vb = values({n}, seed + 1, dt, 0.0, 1.0);
      const Tensor vw = values(c.x, seed + 2, dt, 0.0, 1.0);
      seed += 3;
      const DType ct = cpu_dtype(dt);
      Input cx = make_input(vx, c.layout, ct, Device::cpu()),
            dx = make_input(vx, c.layout, dt, kGpu);
      Input cb = make_input(vb, Layout::plain, ct, Device::cpu());
      Input db = make_input(vb, Layout::plain, dt, kGpu);
      Tensor cy = bias_gelu(cx.view, cb.view), dy = bias_gelu(dx.view, db.view);
      // f64 in emulation: the same formulas over the same libm -- bit for bit (the bias
      // gradient's column sums add in the GPU's order: within the tolerance).
      const bool exact = dt == DType::f64 && kEmulated;
      expect_close(dy, cy, dt, exact, what + " forward");
      cy.backward(vw.to(ct));
      dy.backward(vw.to(dt).to(kGpu));
      expect_close(dx.leaf.grad(), cx.leaf.grad(), dt, exact && same_contraction(dt),
                   what + " grad x");
      expect_close(db.leaf.grad(), cb.leaf.grad(), dt, false, what + " grad bias");
    }
}

TEST_CASE("affine and scale match the CPU forward and backward in every dtype", "[cuda]") {
  struct Case {
    Shape x;
    Layout layout;
    Shape expand_to;  // non-empty: the input is a stride-0 broadcast view of this shape
  };
  const Case cases[] = {
      {{1}, Layout::plain, {}},    {{33}, Layout::plain, {}},          {{70001}, Layout::plain, {}},
      {{}, Layout::plain, {}},     {{7, 33}, Layout::transposed, {}},  {{1031}, Layout::offset, {}},
      {{0, 5}, Layout::plain, {}}, {{1, 5}, Layout::plain, {3, 4, 5}},
  };
  const double params[][2] = {{0.3, -1.25}, {-1.0, 0.0}, {1.0 / 3.0, 0.1}};
  uint64_t seed = 900;
  for (DType dt : kDtypes) {
    // Bit-identical when both backends fuse alike (bf16 / f16 compute in f32); a CPU built
    // without FMA rounds the product first and differs by up to an ulp.
    const bool same_fusion =
        fuses_affine(Device::cpu(), cpu_dtype(dt)) == fuses_affine(kGpu, cpu_dtype(dt));
    if (!same_fusion) WARN("affine in " << dtype_name(dt) << ": one backend fuses, one does not");
    for (const Case& c : cases) {
      for (const auto& p : params) {
        const std::string what = std::string("affine ") + std::string(dtype_name(dt)) + " " +
                                 shape_str(c.x) + "/" + layout_name(c.layout) + " alpha " +
                                 std::to_string(p[0]) + " beta " + std::to_string(p[1]);
        const Tensor vx = values(c.x, seed += 2, dt, 0.0, 2.0);
        const DType ct = cpu_dtype(dt);
        Input cx = make_input(vx, c.layout, ct, Device::cpu());
        Input dx = make_input(vx, c.layout, dt, kGpu);
        Tensor cin = c.expand_to.empty() ? cx.view : cx.view.expand(c.expand_to);
        Tensor din = c.expand_to.empty() ? dx.view : dx.view.expand(c.expand_to);
        Tensor cy = affine(cin, p[0], p[1]);
        Tensor dy = affine(din, p[0], p[1]);
        expect_close(dy, cy, dt, same_fusion, what + " forward");
        const Tensor vw = values(cy.shape(), seed + 1, dt, 0.0, 1.0);
        cy.backward(vw.to(ct));
        dy.backward(vw.to(dt).to(kGpu));
        // The backward is affine(g, alpha, 0): one product, fused or not (then summed over the
        // broadcast by sum_to, in the GPU's order).
        expect_close(dx.leaf.grad(), cx.leaf.grad(), dt, !is_half(dt) && c.expand_to.empty(),
                     what + " grad");
      }
    }
  }
  // scale is affine(x, alpha, 0); the operators route through it.
  Generator g(7);
  Tensor x = Tensor::randn({5, 13}, g);
  Tensor dx = x.to(kGpu);
  expect_close(-dx, -x, DType::f32, true, "scale f32 negate");
  expect_close(dx / 3.0, x / 3.0, DType::f32, true, "scale f32 divide");
  expect_close(dx - 0.5, x - 0.5, DType::f32, true, "scale f32 shift");  // 1 * x exact
}

TEST_CASE("the CUDA elementwise kernels refuse integer tensors naming the op", "[cuda][errors]") {
  using Catch::Contains;
  Tensor i = Tensor::ones({3}, DType::i32, kGpu), o = Tensor::empty({3}, DType::i32, kGpu);
  // The ops refuse before any kernel runs ...
  REQUIRE_THROWS_WITH(engine::gelu(i), Contains("[gelu] expects a floating tensor"));
  REQUIRE_THROWS_WITH(i * i, Contains("[mul] expects floating tensors"));
  // ... and the kernels themselves, called through their tables, name the op and the dtype.
  REQUIRE_THROWS_WITH(binary_kernel(kGpu, BinaryOp::div, i, i, o),
                      Contains("[div]") && Contains("i32"));
  REQUIRE_THROWS_WITH(unary_kernel(kGpu, UnaryOp::tanh, i, o),
                      Contains("[tanh]") && Contains("i32"));
  REQUIRE_THROWS_WITH(unary_backward_kernel(kGpu, UnaryOp::sin, i, i, o),
                      Contains("[sin]") && Contains("i32"));
  REQUIRE_THROWS_WITH(affine_kernel(kGpu, i, 2.0, 1.0, o), Contains("[affine]") && Contains("i32"));
  // Operands that do not match the output are refused, not read out of bounds.
  Tensor f = Tensor::ones({3}, DType::f32, kGpu), f4 = Tensor::ones({4}, DType::f32, kGpu);
  REQUIRE_THROWS_WITH(binary_kernel(kGpu, BinaryOp::add, f, f4, f), Contains("[add]"));
}

TEST_CASE("elementwise parity figures", "[cuda][.report]") {
  // Run with ELEMENTWISE_REPORT=1 after the cases above (same process) to print the worst errors.
  if (!std::getenv("ELEMENTWISE_REPORT")) return;
  std::printf("affine fused: cpu f32 %d f64 %d, cuda f32 %d f64 %d\n",
              fuses_affine(Device::cpu(), DType::f32), fuses_affine(Device::cpu(), DType::f64),
              fuses_affine(kGpu, DType::f32), fuses_affine(kGpu, DType::f64));
  for (const auto& [key, s] : seen())
    std::printf("%-22s n %8lld identical %8lld  worst rel %.3g  worst/tol %.3g\n", key.c_str(),
                static_cast<long long>(s.n), static_cast<long long>(s.identical), s.worst_rel,
                s.worst_ratio);
}
