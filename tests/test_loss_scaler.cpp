// The dynamic loss scaler's rules: grow after growth_interval clean steps in a row, back off and
// skip on inf/NaN, the streak restarts after a skip, the floor stops the run; state round trip.
#include <catch2/catch.hpp>

#include "engine/error.h"
#include "engine/loss_scaler.h"

using namespace engine;
using Catch::Contains;

namespace {
LossScalerOptions opts(int64_t interval = 3) {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = 1024;
  o.growth_interval = interval;
  o.min_scale = 1;
  return o;
}
}  // namespace

TEST_CASE("loss scaler grows after growth_interval clean steps", "[loss_scaler]") {
  LossScaler s(opts(3));
  REQUIRE(s.scale() == 1024);
  REQUIRE(s.update(false));
  REQUIRE(s.update(false));
  REQUIRE(s.scale() == 1024);  // 2 clean steps: not yet
  REQUIRE(s.update(false));
  REQUIRE(s.scale() == 2048);  // the 3rd: grows, streak restarts
  REQUIRE(s.clean_streak() == 0);
  for (int i = 0; i < 3; ++i) REQUIRE(s.update(false));
  REQUIRE(s.scale() == 4096);
  REQUIRE(s.skipped_steps() == 0);
}

TEST_CASE("loss scaler backs off and skips on inf/NaN, the streak restarts", "[loss_scaler]") {
  LossScaler s(opts(3));
  REQUIRE(s.update(false));
  REQUIRE(s.update(false));
  REQUIRE_FALSE(s.update(true));  // skipped
  REQUIRE(s.scale() == 512);
  REQUIRE(s.skipped_steps() == 1);
  REQUIRE(s.consecutive_skips() == 1);
  // Two clean steps before the overflow do not count: three more are needed to grow.
  REQUIRE(s.update(false));
  REQUIRE(s.update(false));
  REQUIRE(s.scale() == 512);
  REQUIRE(s.consecutive_skips() == 0);
  REQUIRE(s.update(false));
  REQUIRE(s.scale() == 1024);
  REQUIRE_FALSE(s.update(true));
  REQUIRE_FALSE(s.update(true));
  REQUIRE(s.scale() == 256);
  REQUIRE(s.skipped_steps() == 3);
  REQUIRE(s.consecutive_skips() == 2);
}

TEST_CASE("loss scaler floor stops the run with a clear message", "[loss_scaler][errors]") {
  LossScalerOptions o = opts(100);
  o.init_scale = 8;
  o.min_scale = 2;
  LossScaler s(o);
  REQUIRE_FALSE(s.update(true));  // 4
  REQUIRE_FALSE(s.update(true));  // 2: at the floor, still allowed
  REQUIRE(s.scale() == 2);
  REQUIRE_THROWS_WITH(s.update(true), Contains("below the floor 2 after 3 skipped steps in a row"));
}

TEST_CASE("a disabled scaler is 1 and only skips non-finite steps", "[loss_scaler]") {
  LossScaler s;  // disabled by default
  REQUIRE(s.scale() == 1.0);
  for (int i = 0; i < 5000; ++i) REQUIRE(s.update(false));
  REQUIRE(s.scale() == 1.0);
  REQUIRE_FALSE(s.update(true));
  REQUIRE(s.skipped_steps() == 1);
  REQUIRE(s.scale() == 1.0);
}

TEST_CASE("loss scaler state round trip and bad options", "[loss_scaler]") {
  LossScaler a(opts(3));
  a.update(false);
  a.update(true);
  a.update(false);
  LossScaler b(opts(3));
  b.load_state(a.state());
  REQUIRE(b.scale() == a.scale());
  REQUIRE(b.clean_streak() == a.clean_streak());
  REQUIRE(b.skipped_steps() == 1);
  // Both continue identically.
  for (bool inf : {false, false, true, false, false, false})
    REQUIRE(a.update(inf) == b.update(inf));
  REQUIRE(a.scale() == b.scale());
  NamedTensors partial = a.state();
  partial.pop_back();
  REQUIRE_THROWS_WITH(b.load_state(partial), Contains("'scaler.consecutive_skips' is missing"));
  LossScalerOptions bad = opts();
  bad.backoff_factor = 1.5;
  REQUIRE_THROWS_WITH(LossScaler(bad), Contains("backoff_factor must be in (0, 1)"));
  bad = opts();
  bad.growth_interval = 0;
  REQUIRE_THROWS_WITH(LossScaler(bad), Contains("growth_interval must be at least 1"));
}
