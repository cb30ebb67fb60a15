// Strict reading of YAML configs: every value is read through a key path ("model.position.preset"),
// a wrong type names the file, the line and the key path, and keys nobody read are errors that list
// the allowed keys, so a typo never silently falls back to a default.
//
//   Config cfg = Config::load_file("configs/tiny.yaml");
//   cfg.set("optim.lr", "3e-4");                 // --set overrides
//   ConfigSection model = cfg.root().section("model");
//   int64_t layers = model.get_int("num_layers", 12);
//   model.finish();                               // unknown keys under model -> error
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace engine {

struct ConfigData;  // the parsed YAML (yaml-cpp stays out of this header)

class ConfigSection {
 public:
  // Scalars; `fallback` when the key is absent. A present key of the wrong type is an error.
  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  // One of `choices`, else an error listing them.
  std::string get_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& choices) const;
  // A nested mapping (an empty one when absent).
  ConfigSection section(const std::string& key) const;
  // Errors on any key of this mapping that no get_*/section call asked for, naming it and listing
  // the keys that were read (the allowed ones).
  void finish() const;
  // Marks a key as allowed without reading it (it is read elsewhere).
  void allow(const std::string& key) const;

  const std::string& path() const { return path_; }  // "model.position" ("" at the root)
  std::string where(const std::string& key) const;   // "file.yaml:12: model.position.preset"

 private:
  friend class Config;
  ConfigSection(std::shared_ptr<ConfigData> data, std::string path);
  std::string key_path(const std::string& key) const;
  std::shared_ptr<ConfigData> data_;
  std::string path_;
};

class Config {
 public:
  Config();  // an empty mapping
  static Config load_file(const std::string& file);
  static Config parse(const std::string& text, const std::string& source = "<string>");

  // Sets "a.b.c" to a YAML scalar written as text ("3e-4", "true", "tupe_r"), creating mappings
  // on the way; `--set key.path=value` on command lines. Errors when a path component is a scalar.
  void set(const std::string& key_path, const std::string& value);
  // Parses "key.path=value" and calls set().
  void set_assignment(const std::string& assignment);

  ConfigSection root() const;
  const std::string& source() const;
  std::string dump() const;  // YAML text

 private:
  std::shared_ptr<ConfigData> data_;
};

}  // namespace engine
