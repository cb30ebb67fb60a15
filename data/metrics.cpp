// Evaluation metrics (data/metrics.h): accuracy, binary F1, Matthews correlation, Pearson and
// Spearman correlation, with scikit-learn's / scipy's definitions.
#include "data/metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "engine/error.h"

namespace data::metrics {
namespace {

template <class T>
void check_pair(std::span<const T> a, std::span<const T> b, const char* fn) {
  ENGINE_CHECK(!a.empty() && !b.empty(), "[metrics] ", fn, ": empty input (", a.size(), " and ",
               b.size(), " values)");
  ENGINE_CHECK(a.size() == b.size(), "[metrics] ", fn, ": inputs differ in size (", a.size(),
               " predictions vs ", b.size(), " gold values)");
}

void check_finite(std::span<const double> v, const char* fn, const char* which) {
  for (size_t i = 0; i < v.size(); ++i)
    ENGINE_CHECK(std::isfinite(v[i]), "[metrics] ", fn, ": ", which, "[", i, "] is ", v[i],
                 ", expected a finite value");
}

// Pearson's r on checked input. Two passes (means first) so large offsets do not cancel.
double pearson_unchecked(std::span<const double> x, std::span<const double> y) {
  const double n = static_cast<double>(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n;
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double dx = x[i] - mx, dy = y[i] - my;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  if (sxx == 0 || syy == 0) return 0;  // constant input: no correlation (documented)
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

// 1-based ranks; a run of tied values gets the mean of the ranks it spans.
std::vector<double> average_ranks(std::span<const double> v) {
  std::vector<size_t> order(v.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> rank(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    while (j < order.size() && v[order[j]] == v[order[i]]) ++j;
    const double r = 0.5 * static_cast<double>(i + 1 + j);  // mean of ranks i+1 .. j
    for (size_t k = i; k < j; ++k) rank[order[k]] = r;
    i = j;
  }
  return rank;
}

}  // namespace

double accuracy(std::span<const int64_t> pred, std::span<const int64_t> gold) {
  check_pair(pred, gold, "accuracy");
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == gold[i];
  return static_cast<double>(correct) / static_cast<double>(pred.size());
}

double f1_binary(std::span<const int64_t> pred, std::span<const int64_t> gold, int64_t positive) {
  check_pair(pred, gold, "f1_binary");
  int64_t tp = 0, fp = 0, fn = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    const bool p = pred[i] == positive, g = gold[i] == positive;
    tp += p && g;
    fp += p && !g;
    fn += !p && g;
  }
  if (tp == 0) return 0;
  return 2.0 * static_cast<double>(tp) / static_cast<double>(2 * tp + fp + fn);
}

double matthews_corrcoef(std::span<const int64_t> pred, std::span<const int64_t> gold) {
  check_pair(pred, gold, "matthews_corrcoef");
  // Per class: t = gold count, p = predicted count.
  std::map<int64_t, std::pair<double, double>> counts;
  double correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    counts[gold[i]].first += 1;
    counts[pred[i]].second += 1;
    correct += pred[i] == gold[i];
  }
  const double s = static_cast<double>(pred.size());
  double pt = 0, pp = 0, tt = 0;
  for (const auto& [cls, tp] : counts) {
    const auto [t, p] = tp;
    pt += p * t;
    pp += p * p;
    tt += t * t;
  }
  // Counts are integers below 2^53 for any realistic n, so these products are exact up to n ~ 9e7
  // (s² < 2^53); beyond that the rounding is far below what a metric reports.
  const double cov_ytyp = correct * s - pt;
  const double cov_ypyp = s * s - pp;
  const double cov_ytyt = s * s - tt;
  if (cov_ypyp == 0 || cov_ytyt == 0) return 0;
  return std::clamp(cov_ytyp / std::sqrt(cov_ytyt * cov_ypyp), -1.0, 1.0);
}

double pearson(std::span<const double> x, std::span<const double> y) {
  check_pair(x, y, "pearson");
  check_finite(x, "pearson", "x");
  check_finite(y, "pearson", "y");
  return pearson_unchecked(x, y);
}

double spearman(std::span<const double> x, std::span<const double> y) {
  check_pair(x, y, "spearman");
  check_finite(x, "spearman", "x");
  check_finite(y, "spearman", "y");
  const std::vector<double> rx = average_ranks(x), ry = average_ranks(y);
  return pearson_unchecked(rx, ry);
}

}  // namespace data::metrics
