// Progress display (see progress.h).
#include "models/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace models {

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = static_cast<long long>(s);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  return buf;
}

ProgressLine::ProgressLine(bool enabled) : tty_(enabled && isatty(STDERR_FILENO)) {}

void ProgressLine::print(const std::string& line) {
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    open_ = true;
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

void ProgressLine::end_line() {
  if (!open_) return;
  std::fprintf(stderr, "\n");
  open_ = false;
}

}  // namespace models
