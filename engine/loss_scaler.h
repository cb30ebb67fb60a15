// Dynamic loss scaling for fp16 training (PyTorch GradScaler's rules). The loss is multiplied by
// scale() before backward so small fp16 gradients do not flush to zero; the gradients are
// divided by it before clipping and the optimizer. When the unscaled gradients hold inf/NaN the
// step is skipped and the scale backs off; after growth_interval clean steps in a row it grows.
// A scale below the floor stops the run with a clear message instead of skipping forever.
#pragma once

#include <cstdint>

#include "engine/module.h"

namespace engine {

struct LossScalerOptions {
  bool enabled = false;         // off: scale() is 1 and update() never skips
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps in a row before growing
  double min_scale = 1.0;          // the floor: falling below it is an error
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  double scale() const { return options_.enabled ? scale_ : 1.0; }
  bool enabled() const { return options_.enabled; }
  // After backward: `found_nonfinite` says whether the gradients hold inf/NaN. Returns true when
  // the optimizer step should be applied, false when it is skipped (the scale then backs off).
  // Throws when the scale falls below min_scale.
  bool update(bool found_nonfinite);

  int64_t skipped_steps() const { return skipped_; }  // over the whole run
  int64_t consecutive_skips() const { return consecutive_skips_; }
  int64_t clean_streak() const { return clean_streak_; }  // clean steps since the last change
  const LossScalerOptions& options() const { return options_; }

  // "scaler.scale" (f64), "scaler.clean_streak", "scaler.skipped", "scaler.consecutive_skips"
  // (i64) scalars, for checkpoints.
  NamedTensors state() const;
  void load_state(const NamedTensors& state);  // ignores names outside "scaler."

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_streak_ = 0, skipped_ = 0, consecutive_skips_ = 0;
};

}  // namespace engine
