// Dynamic loss scaling (see loss_scaler.h).
#include "engine/loss_scaler.h"

#include <cmath>

#include "engine/error.h"

namespace engine {

LossScaler::LossScaler(LossScalerOptions o) : options_(o), scale_(o.init_scale) {
  ENGINE_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0,
               "[loss_scaler] init_scale must be positive, got ", o.init_scale);
  ENGINE_CHECK(o.growth_factor > 1, "[loss_scaler] growth_factor must be > 1, got ",
               o.growth_factor);
  ENGINE_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1,
               "[loss_scaler] backoff_factor must be in (0, 1), got ", o.backoff_factor);
  ENGINE_CHECK(o.growth_interval >= 1, "[loss_scaler] growth_interval must be at least 1, got ",
               o.growth_interval);
  ENGINE_CHECK(o.min_scale > 0 && o.min_scale <= o.init_scale,
               "[loss_scaler] min_scale must be in (0, init_scale], got ", o.min_scale);
}

bool LossScaler::update(bool found_nonfinite) {
  if (!options_.enabled) {
    // Without scaling there is nothing to adjust; a non-finite gradient is still not applied.
    if (found_nonfinite)
      ++skipped_, ++consecutive_skips_;
    else
      consecutive_skips_ = 0;
    return !found_nonfinite;
  }
  if (found_nonfinite) {
    ++skipped_;
    ++consecutive_skips_;
    clean_streak_ = 0;
    scale_ *= options_.backoff_factor;
    ENGINE_CHECK(scale_ >= options_.min_scale, "[loss_scaler] the loss scale fell to ", scale_,
                 ", below the floor ", options_.min_scale, " after ", consecutive_skips_,
                 " skipped steps in a row: the gradients are inf/NaN even unscaled (lower the "
                 "learning rate, check the data, or train in bf16)");
    return false;
  }
  consecutive_skips_ = 0;
  if (++clean_streak_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    clean_streak_ = 0;
  }
  return true;
}

NamedTensors LossScaler::state() const {
  return {{"scaler.scale", Tensor::scalar(scale_, DType::f64)},
          {"scaler.clean_streak", Tensor::scalar(double(clean_streak_), DType::i64)},
          {"scaler.skipped", Tensor::scalar(double(skipped_), DType::i64)},
          {"scaler.consecutive_skips", Tensor::scalar(double(consecutive_skips_), DType::i64)}};
}

void LossScaler::load_state(const NamedTensors& state) {
  bool seen[4] = {false, false, false, false};
  const char* names[4] = {"scaler.scale", "scaler.clean_streak", "scaler.skipped",
                          "scaler.consecutive_skips"};
  for (auto& [name, t] : state) {
    if (name.rfind("scaler.", 0) != 0) continue;
    int k = -1;
    for (int i = 0; i < 4; ++i)
      if (name == names[i]) k = i;
    ENGINE_CHECK(k >= 0, "[loss_scaler] unknown state tensor '", name, "'");
    ENGINE_CHECK(t.numel() == 1, "[loss_scaler] state '", name, "' must be a scalar, got ",
                 describe(t));
    const double v = t.to(Device::cpu()).to(DType::f64).item();
    seen[k] = true;
    if (k == 0) {
      ENGINE_CHECK(std::isfinite(v) && v > 0,
                   "[loss_scaler] state 'scaler.scale' must be positive, got ", v);
      scale_ = v;
    } else {
      ENGINE_CHECK(v >= 0, "[loss_scaler] state '", name, "' must be non-negative, got ", v);
      (k == 1 ? clean_streak_ : k == 2 ? skipped_ : consecutive_skips_) = static_cast<int64_t>(v);
    }
  }
  for (int i = 0; i < 4; ++i)
    ENGINE_CHECK(seen[i], "[loss_scaler] state '", names[i], "' is missing");
}

}  // namespace engine
