// Evaluation metrics for finetuning: accuracy, binary F1, Matthews correlation (GLUE's CoLA and
// diagnostic metric), Pearson and Spearman correlation (STS-B). Each returns a fraction (1.0 =
// perfect), not a percentage. The definitions and degenerate cases are those of scikit-learn's
// accuracy_score / f1_score / matthews_corrcoef and scipy.stats.pearsonr / spearmanr, except
// where noted (constant input to a correlation gives 0, not NaN). docs/finetune.md ("Data formats
// and metrics") has the formulas.
//
// Errors (engine::Error, "[metrics] ..."): empty input, inputs of different sizes, non-finite
// values in a correlation.
#pragma once

#include <cstdint>
#include <span>

namespace data::metrics {

// Fraction of positions where pred[i] == gold[i].
double accuracy(std::span<const int64_t> pred, std::span<const int64_t> gold);

// F1 of the class `positive` (sklearn f1_score, average="binary"): 2·TP / (2·TP + FP + FN).
// 0 when there is no true positive (also when neither side ever has the positive class: sklearn
// returns 0 there too, with a warning).
double f1_binary(std::span<const int64_t> pred, std::span<const int64_t> gold,
                 int64_t positive = 1);

// Matthews correlation coefficient for any number of classes (sklearn's general formula over the
// confusion matrix C, classes = the values seen in either input):
//   (c·s − Σ_k p_k·t_k) / sqrt((s² − Σ_k p_k²)·(s² − Σ_k t_k²))
// with s = n samples, c = trace(C) (correct predictions), t_k = gold count of class k, p_k =
// predicted count of class k. For two classes this is (TP·TN − FP·FN) / sqrt(...) of the binary
// confusion matrix. 0 when the denominator is 0 (a constant predictor, or a constant gold).
double matthews_corrcoef(std::span<const int64_t> pred, std::span<const int64_t> gold);

// Pearson's r = Σ(x−x̄)(y−ȳ) / sqrt(Σ(x−x̄)² · Σ(y−ȳ)²), clamped to [−1, 1].
// Constant x or y (including a single sample): 0 (scipy returns NaN; 0 keeps a "best score"
// comparison and a logged average meaningful — a constant prediction carries no correlation).
double pearson(std::span<const double> x, std::span<const double> y);

// Spearman's rho: Pearson's r of the ranks, tied values getting the average of the ranks they
// span (scipy.stats.spearmanr, rankdata(method="average")). Constant input: 0, as pearson.
double spearman(std::span<const double> x, std::span<const double> y);

}  // namespace data::metrics
