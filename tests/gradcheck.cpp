// Central-difference gradient checks (see gradcheck.h).
#include "gradcheck.h"

#include <cmath>
#include <sstream>

namespace engine::testing {
namespace {

double dot(const Tensor& a, const std::vector<double>& w) {
  std::vector<double> v = a.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}

}  // namespace

Tensor rand_input(const Shape& shape, uint64_t seed, bool requires_grad) {
  Generator g(seed);
  Tensor t = Tensor::randn(shape, g, 0.0, 1.0, DType::f64);
  t.set_requires_grad(requires_grad);
  return t;
}

GradcheckReport gradcheck(const TestFn& f, const std::vector<Tensor>& inputs, double eps) {
  for (const Tensor& t : inputs) {
    t.set_grad(Tensor());
  }
  Tensor out = f(inputs);
  Generator g(1234);
  Tensor w = Tensor::randn(out.shape(), g, 0.0, 1.0, DType::f64);
  std::vector<double> wv = w.to_vector<double>();
  out.backward(w);

  GradcheckReport rep;
  std::ostringstream os;
  NoGrad ng;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    if (!x.is_contiguous() || x.dtype() != DType::f64)
      throw Error("[gradcheck] inputs must be contiguous f64 tensors");
    std::vector<double> analytic(static_cast<size_t>(x.numel()), 0.0);
    if (x.grad().defined()) analytic = x.grad().to_vector<double>();
    double* p = x.data<double>();
    double num2 = 0, diff2 = 0;
    for (int64_t j = 0; j < x.numel(); ++j) {
      double orig = p[j];
      p[j] = orig + eps;
      double fp = dot(f(inputs), wv);
      p[j] = orig - eps;
      double fm = dot(f(inputs), wv);
      p[j] = orig;
      double numeric = (fp - fm) / (2 * eps);
      num2 += numeric * numeric;
      diff2 += (numeric - analytic[j]) * (numeric - analytic[j]);
    }
    double rel = std::sqrt(num2) > 1e-8 ? std::sqrt(diff2 / num2) : std::sqrt(diff2);
    rep.max_rel_error = std::max(rep.max_rel_error, rel);
    os << "input " << k << " " << shape_str(x.shape()) << ": rel error " << rel << " (|numeric| "
       << std::sqrt(num2) << ")\n";
  }
  rep.detail = os.str();
  return rep;
}

}  // namespace engine::testing
