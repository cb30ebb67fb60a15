// The progress display the training loops share (pretraining and finetuning): durations as
// "12m05s" / "3h07m", and one progress line that rewrites itself on a terminal (stderr) and is a
// plain line otherwise (stdout, for logs).
#pragma once

#include <string>

namespace models {

std::string format_duration(double seconds);  // "?" when not finite or negative

class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);  // a terminal only when enabled and stderr is one
  void print(const std::string& line);  // "\r" + line on a terminal, else line + "\n" on stdout
  void end_line();                      // before other output: ends the rewritten line
  bool tty() const { return tty_; }

 private:
  bool tty_ = false, open_ = false;
};

}  // namespace models
