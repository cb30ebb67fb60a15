// The learned positional correlations of a BERT encoder, as the two papers draw and measure them
// (docs/poscorr.md, docs/positional-encodings.md "What `poscorr_app` shows"):
//   extract_correlations  the matrices of the model's preset: TUPE's term after the [CLS] reset,
//                         P P^T and the first layer's per-head (p W^Q)(p W^K), the relative bias
//                         per offset, Shaw's a_r . a_s, and the identical-word probe for every
//                         preset;
//   measure               translation invariance, symmetry and the monotonic window of one matrix;
//   classify_pattern      a logit matrix's pattern among global / local / broad / previous / next.
// Matrices are CPU f32 tensors; the measures are plain functions of a row-major (n, n) array.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "models/bert.h"

namespace models {

// CorrelationMatrix: models/position/component.h (each positional family describes its own).

struct ProbeOptions {
  int64_t tokens = 10;  // random token ids averaged over (identical-word probing)
  uint64_t seed = 1234;
  std::vector<int64_t> ids;  // explicit ids instead of random ones
};

// Every matrix the model's preset has, over positions 0..seq_len-1 (the model is put in eval
// mode; no gradients are recorded). `probe_ids` receives the token ids the probe used.
std::vector<CorrelationMatrix> extract_correlations(BertModel& bert, int64_t seq_len,
                                                    const ProbeOptions& probe,
                                                    std::vector<int64_t>* probe_ids = nullptr);

// The (T, T) matrix b[j - i] of a per-offset row b (2T - 1 values for offsets -(T-1)..T-1).
std::vector<float> toeplitz_of_offsets(const float* offsets, int64_t t);

// The second paper's properties of an (n, n) matrix m (row-major), over rows and columns
// first..n-1 (docs/poscorr.md gives the definitions):
struct Properties {
  double translation_invariance = 1;  // 1 - within-diagonal variance / total variance, in [0, 1]
  double symmetry = 1;                // |sym(m - mean)|^2 / |m - mean|^2, in [0, 1]
  // f(r) is the mean of diagonal r = j - i; from its peak p among r = -1, 0, 1, the windows are
  // the farthest offsets the profile reaches while strictly falling: f(p) > f(p+1) > ... > f(w)
  // forward (w >= 0), and likewise backward to -w.
  int64_t profile_peak = 0;
  int64_t window_forward = 0;
  int64_t window_backward = 0;
  double min = 0, max = 0;
};
Properties measure(const float* m, int64_t n, int64_t first = 0);

// Each row's softmax is the attention the positional logits alone would give; then
//   global    mean normalised entropy >= 0.9 (no positional preference)
//   previous  else, if the mean attention by offset peaks at r = -1
//   next      else, if it peaks at r = +1
//   local     else, if the mean mass within |r| <= 2 is >= 0.5
//   broad     otherwise.
struct Pattern {
  std::string name;
  double entropy = 0;       // mean over rows of H(p_i) / log(n - first)
  int64_t peak_offset = 0;  // argmax over |r| < (n - first) / 2 of the mean attention at offset r
  double local_mass = 0;    // mean over rows of the attention within |r| <= 2
};
Pattern classify_pattern(const float* m, int64_t n, int64_t first = 0);

}  // namespace models
