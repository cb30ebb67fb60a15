// Metrics (data/metrics.h) against values computed by hand; the arithmetic is in the comments.
// (Cross-checked once with scipy 1.10 spearmanr / pearsonr where noted; the tests need no Python.)
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "data/metrics.h"
#include "engine/error.h"
#include "test_support.h"

namespace m = data::metrics;
using I = std::vector<int64_t>;
using D = std::vector<double>;

using engine::testing::error_of;

TEST_CASE("metrics: accuracy, F1 and MCC of a binary confusion matrix", "[metrics]") {
  // TP = 3 (rows 0-2), FN = 1 (row 3), FP = 2 (rows 4-5), TN = 4 (rows 6-9); n = 10.
  const I pred = {1, 1, 1, 0, 1, 1, 0, 0, 0, 0};
  const I gold = {1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
  // (TP + TN) / n = 7 / 10.
  CHECK(m::accuracy(pred, gold) == Approx(0.7).epsilon(1e-15));
  // precision 3/5, recall 3/4: F1 = 2·TP / (2·TP + FP + FN) = 6 / 9 = 2/3.
  CHECK(m::f1_binary(pred, gold) == Approx(2.0 / 3.0).epsilon(1e-15));
  // Class 0 as positive: TP = 4, FP = 1 (row 3), FN = 2 (rows 4-5): 8 / 11.
  CHECK(m::f1_binary(pred, gold, 0) == Approx(8.0 / 11.0).epsilon(1e-15));
  // (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (12 − 2) / sqrt(5·4·6·5)
  // = 10 / sqrt(600) = 1 / sqrt(6) = 0.40824829...
  CHECK(m::matthews_corrcoef(pred, gold) == Approx(1.0 / std::sqrt(6.0)).epsilon(1e-14));
  // Symmetric in its arguments.
  CHECK(m::matthews_corrcoef(gold, pred) == Approx(1.0 / std::sqrt(6.0)).epsilon(1e-14));
}

TEST_CASE("metrics: MCC degenerate and extreme cases", "[metrics]") {
  const I gold = {0, 1, 1, 0, 1};
  // A constant predictor: Σp² = s², the denominator is 0 → 0 (sklearn: 0).
  CHECK(m::matthews_corrcoef(I{1, 1, 1, 1, 1}, gold) == 0.0);
  CHECK(m::matthews_corrcoef(I{0, 0, 0, 0, 0}, gold) == 0.0);
  // A constant gold (one class only) → 0 as well, even if the prediction matches it.
  CHECK(m::matthews_corrcoef(I{1, 1, 1}, I{1, 1, 1}) == 0.0);
  CHECK(m::matthews_corrcoef(gold, gold) == Approx(1.0));
  CHECK(m::matthews_corrcoef(I{1, 0, 0, 1, 0}, gold) == Approx(-1.0));
  // Labels need not be 0/1.
  CHECK(m::matthews_corrcoef(I{7, -3, -3, 7}, I{7, -3, -3, 7}) == Approx(1.0));
}

TEST_CASE("metrics: multiclass MCC", "[metrics]") {
  // gold 0 0 1 1 2 2, pred 0 1 1 1 2 0: correct c = 4 (rows 0, 2, 3, 4), s = 6,
  // t = (2, 2, 2), p = (2, 3, 1): Σp·t = 4 + 6 + 2 = 12, Σp² = 4 + 9 + 1 = 14, Σt² = 12.
  // (c·s − Σp·t) / sqrt((s² − Σp²)(s² − Σt²)) = (24 − 12) / sqrt(22 · 24) = 12 / sqrt(528)
  // = 0.52223296786...
  CHECK(m::matthews_corrcoef(I{0, 1, 1, 1, 2, 0}, I{0, 0, 1, 1, 2, 2}) ==
        Approx(12.0 / std::sqrt(528.0)).epsilon(1e-14));
  // gold 0 0 0 1 1 1 2 2 2, pred 0 0 1 1 1 2 2 2 0: c = 6, t = p = (3, 3, 3):
  // (6·9 − 27) / sqrt((81 − 27)(81 − 27)) = 27 / 54 = 0.5.
  CHECK(m::matthews_corrcoef(I{0, 0, 1, 1, 1, 2, 2, 2, 0}, I{0, 0, 0, 1, 1, 1, 2, 2, 2}) ==
        Approx(0.5).epsilon(1e-14));
  // A class that only the prediction has (3) still enters p: gold 0 1 2, pred 0 1 3:
  // c = 2, s = 3, t = (1, 1, 1, 0), p = (1, 1, 0, 1): Σp·t = 2, Σp² = 3, Σt² = 3:
  // (6 − 2) / sqrt(6 · 6) = 4 / 6.
  CHECK(m::matthews_corrcoef(I{0, 1, 3}, I{0, 1, 2}) == Approx(2.0 / 3.0).epsilon(1e-14));
}

TEST_CASE("metrics: F1 without true positives is 0", "[metrics]") {
  CHECK(m::f1_binary(I{0, 0, 0}, I{1, 1, 0}) == 0.0);  // no positive predicted
  CHECK(m::f1_binary(I{1, 1, 0}, I{0, 0, 0}) == 0.0);  // no positive in gold
  CHECK(m::f1_binary(I{0, 0}, I{0, 0}) == 0.0);        // neither (sklearn: 0 with a warning)
  CHECK(m::f1_binary(I{1, 0}, I{1, 0}) == 1.0);
}

TEST_CASE("metrics: Pearson and Spearman", "[metrics]") {
  // Perfect and inverse linear relations.
  CHECK(m::pearson(D{1, 2, 3, 4}, D{2, 4, 6, 8}) == Approx(1.0));
  CHECK(m::pearson(D{1, 2, 3, 4}, D{-1, -2, -3, -4}) == Approx(-1.0));
  CHECK(m::spearman(D{1, 2, 3, 4}, D{10, 7, 3, -2}) == Approx(-1.0));
  // x = 1 2 3, y = 1 3 2: means 2, 2; dx = −1 0 1, dy = −1 1 0; Σdx·dy = 1, Σdx² = Σdy² = 2:
  // r = 1 / sqrt(4) = 0.5 (scipy pearsonr: 0.4999999999999999).
  CHECK(m::pearson(D{1, 2, 3}, D{1, 3, 2}) == Approx(0.5).epsilon(1e-14));
  // Monotonic but not linear: Spearman 1, Pearson below 1.
  CHECK(m::spearman(D{1, 2, 3, 4}, D{1, 4, 9, 16}) == Approx(1.0));
  CHECK(m::pearson(D{1, 2, 3, 4}, D{1, 4, 9, 16}) < 0.99);
}

TEST_CASE("metrics: Spearman with ties uses average ranks", "[metrics]") {
  // x = 1 2 2 3 → ranks 1 2.5 2.5 4; y = 1 3 2 4 → ranks 1 3 2 4. Both rank means are 2.5:
  // dx = −1.5 0 0 1.5, dy = −1.5 0.5 −0.5 1.5; Σdx·dy = 2.25 + 2.25 = 4.5, Σdx² = 4.5,
  // Σdy² = 2.25 + 0.25 + 0.25 + 2.25 = 5: rho = 4.5 / sqrt(4.5 · 5) = sqrt(0.9) = 0.948683298...
  // (scipy spearmanr: 0.9486832980505139).
  CHECK(m::spearman(D{1, 2, 2, 3}, D{1, 3, 2, 4}) == Approx(std::sqrt(0.9)).epsilon(1e-14));
  // Order of the input does not matter, only the pairing.
  CHECK(m::spearman(D{2, 3, 1, 2}, D{3, 4, 1, 2}) == Approx(std::sqrt(0.9)).epsilon(1e-14));
}

TEST_CASE("metrics: constant input to a correlation gives 0", "[metrics]") {
  CHECK(m::pearson(D{2, 2, 2}, D{1, 2, 3}) == 0.0);
  CHECK(m::pearson(D{1, 2, 3}, D{5, 5, 5}) == 0.0);
  CHECK(m::spearman(D{2, 2, 2}, D{1, 2, 3}) == 0.0);
  CHECK(m::pearson(D{1}, D{4}) == 0.0);  // one sample: constant
  // A large common offset does not leak into the result (two-pass means).
  CHECK(m::pearson(D{1e9 + 1, 1e9 + 2, 1e9 + 3}, D{1, 3, 2}) == Approx(0.5).epsilon(1e-9));
}

TEST_CASE("metrics: bad input fails clearly", "[metrics]") {
  CHECK_THAT(error_of([] {
               m::accuracy(I{1, 0}, I{1});
             }),
             Catch::Contains("[metrics] accuracy: inputs differ in size (2 predictions vs 1"));
  CHECK_THAT(error_of([] { m::matthews_corrcoef(I{}, I{}); }),
             Catch::Contains("[metrics] matthews_corrcoef: empty input"));
  CHECK_THAT(error_of([] { m::f1_binary(I{}, I{1}); }), Catch::Contains("empty input"));
  CHECK_THAT(error_of([] {
               m::spearman(D{1, 2}, D{1, 2, 3});
             }),
             Catch::Contains("[metrics] spearman: inputs differ in size"));
  CHECK_THAT(error_of([] {
               m::pearson(D{1, NAN}, D{1, 2});
             }),
             Catch::Contains("[metrics] pearson: x[1] is nan, expected a finite value"));
}
