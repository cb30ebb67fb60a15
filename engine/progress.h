// The one progress display of the project (the training loops, corpus preparation): durations as
// "12m05s" / "3h07m", a text bar, and a progress line that rewrites itself on a terminal (stderr)
// and is a plain line otherwise, for logs (stdout by default).
#pragma once

#include <cstdio>
#include <string>

namespace engine {

std::string format_duration(double seconds);  // "?" when not finite or negative

// "[#########---------------------]": `fraction` (clamped to 0 .. 1) of `width` cells filled.
std::string progress_bar(double fraction, int width = 30);

class ProgressLine {
 public:
  // A terminal only when enabled and stderr is one; otherwise print() writes plain lines to `log`.
  explicit ProgressLine(bool enabled, std::FILE* log = stdout);
  void print(const std::string& line);  // "\r" + line on a terminal, else line + "\n" on `log`
  void end_line();                      // before other output: ends the rewritten line
  bool tty() const { return tty_; }

 private:
  bool tty_ = false, open_ = false;
  std::FILE* log_ = stdout;
};

}  // namespace engine
