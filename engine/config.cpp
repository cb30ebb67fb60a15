// Strict YAML config reading on top of yaml-cpp (see config.h).
#include "engine/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/error.h"

namespace engine {

struct ConfigData {
  YAML::Node root;
  std::string source;
  std::set<std::string> read;  // full key paths that were read or allowed
};

namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : path) {
    if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!path.empty()) parts.push_back(cur);
  return parts;
}

std::string join(const std::vector<std::string>& xs) {
  std::string s;
  for (size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + xs[i];
  return s;
}

// The node at `path` (a mapping path from the root); an undefined node when absent.
YAML::Node lookup(const YAML::Node& root, const std::string& path) {
  YAML::Node cur;
  cur.reset(root);
  for (const std::string& part : split_path(path)) {
    if (!cur.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& c = cur;  // const operator[] never inserts into the shared tree
    YAML::Node next = c[part];
    if (!next.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    cur.reset(next);
  }
  return cur;
}

std::string line_of(const YAML::Node& n, const std::string& source) {
  const YAML::Mark m = n.Mark();
  if (m.line < 0) return source + " (--set)";
  return source + ":" + std::to_string(m.line + 1);
}

}  // namespace

ConfigSection::ConfigSection(std::shared_ptr<ConfigData> data, std::string path)
    : data_(std::move(data)), path_(std::move(path)) {}

std::string ConfigSection::key_path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

std::string ConfigSection::where(const std::string& key) const {
  YAML::Node n = lookup(data_->root, key_path(key));
  if (!n.IsDefined()) n = lookup(data_->root, path_);
  return (n.IsDefined() ? line_of(n, data_->source) : data_->source) + ": " + key_path(key);
}

bool ConfigSection::has(const std::string& key) const {
  YAML::Node n = lookup(data_->root, key_path(key));
  return n.IsDefined() && !n.IsNull();
}

namespace {

template <class T>
T read_scalar(const ConfigSection& s, const std::shared_ptr<ConfigData>& data,
              const std::string& full, const std::string& key, const T& fallback,
              const char* expected) {
  data->read.insert(full);
  YAML::Node n = lookup(data->root, full);
  if (!n.IsDefined() || n.IsNull()) return fallback;
  ENGINE_CHECK(n.IsScalar(), "[config] ", s.where(key), ": expected ", expected, ", got a ",
               n.IsMap() ? "mapping" : "list");
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    ENGINE_FAIL("[config] ", s.where(key), ": expected ", expected, ", got '", n.Scalar(), "'");
  }
}

}  // namespace

int64_t ConfigSection::get_int(const std::string& key, int64_t fallback) const {
  return read_scalar<int64_t>(*this, data_, key_path(key), key, fallback, "an integer");
}

double ConfigSection::get_double(const std::string& key, double fallback) const {
  return read_scalar<double>(*this, data_, key_path(key), key, fallback, "a number");
}

bool ConfigSection::get_bool(const std::string& key, bool fallback) const {
  return read_scalar<bool>(*this, data_, key_path(key), key, fallback, "true or false");
}

std::string ConfigSection::get_string(const std::string& key, const std::string& fallback) const {
  return read_scalar<std::string>(*this, data_, key_path(key), key, fallback, "a string");
}

std::string ConfigSection::get_choice(const std::string& key, const std::string& fallback,
                                      const std::vector<std::string>& choices) const {
  std::string v = get_string(key, fallback);
  ENGINE_CHECK(std::find(choices.begin(), choices.end(), v) != choices.end(), "[config] ",
               where(key), ": '", v, "' is not one of: ", join(choices));
  return v;
}

ConfigSection ConfigSection::section(const std::string& key) const {
  const std::string full = key_path(key);
  data_->read.insert(full);
  YAML::Node n = lookup(data_->root, full);
  ENGINE_CHECK(!n.IsDefined() || n.IsNull() || n.IsMap(), "[config] ", where(key),
               ": expected a mapping of keys, got ",
               n.IsScalar() ? "'" + n.Scalar() + "'" : "a list");
  return ConfigSection(data_, full);
}

void ConfigSection::allow(const std::string& key) const { data_->read.insert(key_path(key)); }

void ConfigSection::finish() const {
  YAML::Node n = lookup(data_->root, path_);
  if (!n.IsDefined() || !n.IsMap()) return;
  std::vector<std::string> allowed;
  const std::string prefix = path_.empty() ? "" : path_ + ".";
  for (const std::string& r : data_->read) {
    if (r.rfind(prefix, 0) != 0) continue;
    std::string rest = r.substr(prefix.size());
    if (rest.empty() || rest.find('.') != std::string::npos) continue;
    allowed.push_back(rest);
  }
  for (auto it = n.begin(); it != n.end(); ++it) {
    // YAML allows any node as a key ("? [a, b]: 1", "~: 1"); a config's keys are names.
    ENGINE_CHECK(it->first.IsScalar(), "[config] ", line_of(it->first, data_->source),
                 ": a key in '", path_.empty() ? "(top level)" : path_, "' is ",
                 it->first.IsMap()        ? "a mapping"
                 : it->first.IsSequence() ? "a list"
                                          : "null",
                 ", expected a name");
    const std::string k = it->first.Scalar();
    if (data_->read.count(key_path(k))) continue;
    ENGINE_FAIL("[config] ", line_of(it->first, data_->source), ": unknown key '", key_path(k), "'",
                path_.empty() ? "" : " in '" + path_ + "'", "; allowed keys: ", join(allowed));
  }
}

Config::Config() : data_(std::make_shared<ConfigData>()) {
  data_->root = YAML::Node(YAML::NodeType::Map);
  data_->source = "<config>";
}

Config Config::parse(const std::string& text, const std::string& source) {
  Config c;
  c.data_->source = source;
  try {
    YAML::Node n = YAML::Load(text);
    ENGINE_CHECK(!n.IsDefined() || n.IsNull() || n.IsMap(), "[config] ", source,
                 ": expected a mapping of keys at the top level");
    c.data_->root = (n.IsDefined() && !n.IsNull()) ? n : YAML::Node(YAML::NodeType::Map);
  } catch (const YAML::Exception& e) {
    ENGINE_FAIL("[config] ", source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                ": not valid YAML: ", e.msg);
  }
  return c;
}

Config Config::load_file(const std::string& file) {
  ENGINE_CHECK(std::filesystem::is_regular_file(file), "[config] ", file,
               ": no such file (expected a YAML config)");
  std::ifstream in(file);
  ENGINE_CHECK(in.good(), "[config] ", file, ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), file);
}

void Config::set(const std::string& key_path, const std::string& value) {
  std::vector<std::string> parts = split_path(key_path);
  ENGINE_CHECK(!parts.empty(), "[config] --set needs a key path, got '", key_path, "'");
  for (const auto& p : parts)
    ENGINE_CHECK(!p.empty(), "[config] --set: bad key path '", key_path, "'");
  YAML::Node cur;
  cur.reset(data_->root);
  std::string done;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    done += (i ? "." : "") + parts[i];
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = cur[parts[i]];
    }
    ENGINE_CHECK(next.IsMap(), "[config] --set ", key_path, ": '", done,
                 "' is a value, not a mapping");
    cur.reset(next);
  }
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    ENGINE_FAIL("[config] --set ", key_path, "=", value, ": not a valid YAML value: ", e.msg);
  }
  ENGINE_CHECK(!parsed.IsMap() && !parsed.IsSequence(), "[config] --set ", key_path,
               ": expected a single value, got '", value, "'");
  cur[parts.back()] = value;  // stored as text; typed when read
}

void Config::set_assignment(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  ENGINE_CHECK(eq != std::string::npos && eq > 0, "[config] --set expects key.path=value, got '",
               assignment, "'");
  set(assignment.substr(0, eq), assignment.substr(eq + 1));
}

ConfigSection Config::root() const { return ConfigSection(data_, ""); }
const std::string& Config::source() const { return data_->source; }

std::string Config::dump() const {
  YAML::Emitter out;
  out << data_->root;
  return out.c_str();
}

}  // namespace engine
