// Strict YAML config reading: typed values with fallbacks, key paths and line numbers in errors,
// unknown keys listed against the allowed ones, --set overrides.
#include <catch2/catch.hpp>

#include "engine/config.h"
#include "engine/error.h"

using namespace engine;
using Catch::Contains;

TEST_CASE("config values are typed, defaulted and overridable", "[config]") {
  Config cfg = Config::parse("a: 3\nb: 2.5e-4\nc: true\nd: text\nsub:\n  x: 7\n", "t.yaml");
  ConfigSection r = cfg.root();
  REQUIRE(r.get_int("a", 0) == 3);
  REQUIRE(r.get_double("b", 0) == 2.5e-4);
  REQUIRE(r.get_double("a", 0) == 3.0);  // an integer is a number
  REQUIRE(r.get_bool("c", false));
  REQUIRE(r.get_string("d", "") == "text");
  REQUIRE(r.get_int("absent", 42) == 42);
  REQUIRE(r.section("sub").get_int("x", 0) == 7);
  REQUIRE(r.section("nothing").get_int("y", 5) == 5);  // absent sections are empty
  REQUIRE_NOTHROW(r.finish());

  cfg.set("sub.x", "8");
  cfg.set("new.deep.key", "tupe_r");
  REQUIRE(cfg.root().section("sub").get_int("x", 0) == 8);
  REQUIRE(cfg.root().section("new").section("deep").get_string("key", "") == "tupe_r");
  REQUIRE_THROWS_WITH(cfg.set("a.b", "1"), Contains("'a' is a value, not a mapping"));
  REQUIRE_THROWS_WITH(cfg.set_assignment("=3"), Contains("expects key.path=value"));
  REQUIRE_THROWS_WITH(cfg.set("sub.x", "[1, 2]"), Contains("expected a single value"));
}

TEST_CASE("config errors name the file, the line and the key path", "[config][errors]") {
  Config cfg = Config::parse("model:\n  layers: many\n  flag: maybe\n  list: [1, 2]\n", "m.yaml");
  ConfigSection m = cfg.root().section("model");
  REQUIRE_THROWS_WITH(m.get_int("layers", 1),
                      Contains("m.yaml:2: model.layers: expected an integer, got 'many'"));
  REQUIRE_THROWS_WITH(m.get_bool("flag", false),
                      Contains("m.yaml:3: model.flag: expected true or false"));
  REQUIRE_THROWS_WITH(m.get_int("list", 1),
                      Contains("m.yaml:4: model.list: expected an integer, got a list"));
  REQUIRE_THROWS_WITH(m.get_choice("layers", "a", {"a", "b"}),
                      Contains("'many' is not one of: a, b"));
  REQUIRE_THROWS_WITH(cfg.root().section("model").section("layers"),
                      Contains("expected a mapping"));

  Config typo = Config::parse("model:\n  size: 3\n  sise: 4\n", "typo.yaml");
  ConfigSection t = typo.root().section("model");
  t.get_int("size", 0);
  t.allow("other");
  REQUIRE_THROWS_WITH(
      t.finish(),
      Contains("typo.yaml:3: unknown key 'model.sise' in 'model'; allowed keys: other, size"));
  REQUIRE_NOTHROW(typo.root().finish());  // "model" was read at the top level
  REQUIRE_THROWS_WITH(Config::parse("a: [1, 2\n", "bad.yaml"),
                      Contains("bad.yaml:") && Contains("not valid YAML"));
  REQUIRE_THROWS_WITH(Config::parse("- 1\n- 2\n", "list.yaml"),
                      Contains("expected a mapping of keys at the top level"));
  REQUIRE_THROWS_WITH(Config::load_file("/nonexistent/x.yaml"),
                      Contains("/nonexistent/x.yaml: no such file"));
  REQUIRE_NOTHROW(Config::parse("", "empty.yaml").root().finish());
}
