#include "apps/cli.h"

#include "engine/comm.h"
#include "engine/error.h"

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <utility>

namespace cli {

namespace {

// A write beyond the file-size limit (RLIMIT_FSIZE, `ulimit -f`) raises SIGXFSZ, which by default
// kills the process before it can say what failed or clean up. Ignored, the write fails with
// EFBIG and the engine's error path runs: "[safetensors] <file>.tmp.<pid>: write failed (File too
// large)", the temporary removed and the previous checkpoint or corpus left as it was. Every app
// links this file (its argument parsing), so the disposition is set before main.
[[maybe_unused]] const bool kIgnoreFileSizeSignal = [] {
  std::signal(SIGXFSZ, SIG_IGN);
  return true;
}();

}  // namespace

void usage_error(const std::string& program, const std::string& msg) {
  const std::string help = "(run " + program + " --help for the options)";
  // Under mpirun every rank parses the same command line: engine::run_job reports it once.
  if (engine::world().size() > 1) throw engine::Error(msg + "\n" + help, 2);
  std::cerr << program << ": " << msg << "\n" << help << "\n";
  std::exit(2);
}

ArgParser::ArgParser(std::string program, const char* usage, int argc, char** argv, int first)
    : program_(std::move(program)), usage_(usage), argc_(argc), argv_(argv), i_(first - 1) {}

bool ArgParser::next() {
  if (++i_ >= argc_) return false;
  arg_ = argv_[i_];
  if (arg_ == "-h" || arg_ == "--help") {
    std::cout << usage_;
    std::exit(0);
  }
  if (arg_ == "--version") {
    std::cout << program_.substr(0, program_.find(' ')) << " " << version() << "\n";
    std::exit(0);
  }
  return true;
}

std::string ArgParser::value() {
  if (i_ + 1 >= argc_) fail(arg_ + " needs a value");
  return argv_[++i_];
}

engine::Device ArgParser::device_value() {
  const std::string v = value();
  try {
    return engine::parse_device(v);
  } catch (const engine::Error&) {
    fail(arg_ + " expects cpu, cuda or cuda:N, got '" + v + "'");
  }
}

std::string ArgParser::precision_value() {
  const std::string v = value();
  if (v != "f32" && v != "bf16" && v != "fp16")
    fail(arg_ + " expects f32, bf16 or fp16, got '" + v + "'");
  return v;
}

std::vector<std::string> ArgParser::values_until_flag() {
  std::vector<std::string> out;
  while (i_ + 1 < argc_ && std::string(argv_[i_ + 1]).rfind("--", 0) != 0)
    out.push_back(argv_[++i_]);
  if (out.empty()) fail(arg_ + " needs at least one value");
  return out;
}

int64_t ArgParser::to_int(const std::string& flag, const std::string& v, int64_t min) const {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min)
    fail(flag + " expects an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return n;
}

double ArgParser::to_double(const std::string& flag, const std::string& v, double min,
                            double max) const {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x < min || x > max) {
    std::ostringstream s;
    s << flag << " expects a number in [" << min << ", " << max << "], got '" << v << "'";
    fail(s.str());
  }
  return x;
}

}  // namespace cli
