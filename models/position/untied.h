// TUPE's untied positional term (tupe_a, tupe_r, tupe_a_tie_cls): what tests and poscorr_app read
// of it beyond its attention terms.
#pragma once

#include <utility>

#include "models/position/component.h"

namespace models {

class UntiedTerm : public PositionComponent {
 public:
  // (1, H, T, T): (p^ U^Q)(p^ U^K)^T / sqrt(2 d_h) before the relative bias and the reset.
  virtual Tensor untied_term(int64_t seq_len) const = 0;
  // theta1, theta2 (each (H)) of the [CLS] reset; fails for tupe_a_tie_cls.
  virtual std::pair<Tensor, Tensor> cls_thetas() const = 0;
};

// The untied component of an encoding; fails when the preset has none.
const UntiedTerm& untied_term_of(const PositionEncoding& encoding);

}  // namespace models
