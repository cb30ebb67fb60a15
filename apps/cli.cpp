#include "apps/cli.h"

#include "engine/comm.h"
#include "engine/error.h"

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
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

// How long an idle OpenMP thread spins before it sleeps. With libgomp's default (300000 spins)
// the tiny model's step on 2 threads of the development VM ran at 10.9k tokens/s, about what 1
// thread does; with 10000 spins at 16.5k (bench/bench_step.py, docs/benchmarks.md). Between the
// step's many short parallel regions the idle thread spins while the other works, and a spinning
// virtual CPU (PAUSE loops) costs the working one. libgomp reads GOMP_SPINCOUNT once, in its own
// initialiser, before any code of this program runs (an executable's .preinit_array included), so
// when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set the app sets the short spin and starts
// itself again (same pid, arguments and environment otherwise; under valgrind it does not).
__attribute__((constructor)) void set_openmp_spin(int argc, char** argv, char** envp) {
  (void)argc;
  (void)envp;
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY") || !argv || !argv[0]) return;
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload && std::strstr(preload, "vgpreload")) return;  // valgrind: keep its process
  if (setenv("GOMP_SPINCOUNT", "10000", 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("GOMP_SPINCOUNT");  // no /proc: run on with libgomp's default
}

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
