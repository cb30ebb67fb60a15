// The command-line conventions every app shares: a bad command line prints one message naming the
// flag, "<program>: <message>" and "(run <program> --help for the options)", and exits 2;
// -h/--help prints the usage and exits 0; --version prints the version and git commit and exits 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/device.h"

namespace cli {

// Prints "<program>: <msg>" and the --help hint and exits 2; under mpirun (inside
// engine::run_job) it throws an engine::Error with exit code 2 instead, so the job reports it once.
[[noreturn]] void usage_error(const std::string& program, const std::string& msg);

// "0.1.0 (commit 1a2b3c4d5e6f)": the version and the git commit the program was built from;
// every app prints it for --version (generated at build time by cmake/engine_version.cmake).
const char* version();

// Walks argv: `while (p.next()) { if (p.arg() == "--steps") n = p.int_value(0); ... else
// p.unknown(); }`
class ArgParser {
 public:
  ArgParser(std::string program, const char* usage, int argc, char** argv, int first = 1);
  // Moves to the next argument; false at the end. -h and --help print the usage and exit 0.
  bool next();
  const std::string& arg() const { return arg_; }
  bool is_flag() const { return arg_.rfind("--", 0) == 0; }
  // The current flag's value (the next argument): "<flag> needs a value" when there is none.
  std::string value();
  int64_t int_value(int64_t min) { return to_int(arg_, value(), min); }
  double double_value(double min, double max) { return to_double(arg_, value(), min, max); }
  // --device: cpu, cuda or cuda:N ("<flag> expects cpu, cuda or cuda:N, got '<v>'").
  engine::Device device_value();
  // --precision: f32, bf16 or fp16.
  std::string precision_value();
  // The arguments after the current flag up to the next --flag: "<flag> needs at least one value".
  std::vector<std::string> values_until_flag();
  // "<flag> expects an integer >= <min>, got '<v>'"; "<flag> expects a number in [min, max], ...".
  int64_t to_int(const std::string& flag, const std::string& v, int64_t min) const;
  double to_double(const std::string& flag, const std::string& v, double min, double max) const;
  [[noreturn]] void fail(const std::string& msg) const { usage_error(program_, msg); }
  [[noreturn]] void unknown() const { fail("unknown argument '" + arg_ + "'"); }

 private:
  std::string program_;
  const char* usage_;
  int argc_;
  char** argv_;
  int i_;
  std::string arg_;
};

}  // namespace cli
