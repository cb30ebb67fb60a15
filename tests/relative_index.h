// Shared by the relative-op tests (CPU and device): Shaw et al.'s clipped relative distance as a
// bucket, c(j - i) = clamp(j - i, -k, k) + k, so R = 2k + 1 and every bucket on the edges repeats
// (which makes the scatter sum).
#pragma once

#include <algorithm>
#include <vector>

#include "engine/tensor.h"

namespace engine::testing {

inline Tensor shaw_index(int64_t tq, int64_t tk, int64_t k) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j) v.push_back(std::clamp(j - i, -k, k) + k);
  return Tensor::from_vector(v, {tq, tk});
}

}  // namespace engine::testing
