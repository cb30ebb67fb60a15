// T5's bucketed relative bias (bert_r, tupe_r): b_h[bucket(j - i)], per head, shared by layers.
#pragma once

#include <cstdint>
#include <vector>

#include "models/bert_config.h"

namespace models {

// T5's bidirectional bucket of the relative position r = j - i: `num_buckets / 2` per direction,
// exact below a quarter of num_buckets, then logarithmic up to max_distance; r > 0 adds
// num_buckets / 2. Boundaries are those of exact arithmetic (a float log can shift one by one).
int64_t t5_bucket(int64_t r, int64_t num_buckets = 32, int64_t max_distance = 128);

// The (T, T) bucket map of a config's relative table (with the two [CLS] buckets of TUPE's
// cls_reset: code in row 0 and column 0).
std::vector<int64_t> relative_bucket_map(const PositionConfig& p, int64_t seq_len);
// Rows of the relative table: the buckets, plus two for [CLS] with cls_reset: code.
int64_t relative_bias_rows(const PositionConfig& p);

}  // namespace models
