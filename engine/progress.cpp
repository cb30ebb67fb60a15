// Progress display (see progress.h).
#include "engine/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace engine {

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

std::string progress_bar(double fraction, int width) {
  const int filled = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * width);
  return "[" + std::string(size_t(filled), '#') + std::string(size_t(width - filled), '-') + "]";
}

ProgressLine::ProgressLine(bool enabled, std::FILE* log)
    : tty_(enabled && isatty(STDERR_FILENO)), log_(log) {}

void ProgressLine::print(const std::string& line) {
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    open_ = true;
  } else {
    std::fprintf(log_, "%s\n", line.c_str());
    std::fflush(log_);
  }
}

void ProgressLine::end_line() {
  if (!open_) return;
  std::fprintf(stderr, "\n");
  open_ = false;
}

}  // namespace engine
