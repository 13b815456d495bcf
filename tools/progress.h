// tools/progress.h: the progress bar of the GPU sweeps (`comet bench layer`, `comet tune`), on
// stderr, redrawn in place with '\r':
//   [##########                    ] 4/12  mixtral-8x7b T=4096  ETA 31 s
#pragma once

#include <chrono>
#include <ostream>
#include <string>

namespace comet::tools {

// One line of the bar (no '\r' or newline). The ETA extrapolates the mean time per finished
// step and is left out before the first one.
std::string progress_line(int done, int total, const std::string& what, double elapsed_s);

class ProgressBar {
 public:
  // `enabled` false prints nothing (e.g. a rank other than 0).
  ProgressBar(std::ostream& os, bool enabled) : os_(os), enabled_(enabled) {}
  // Ends a line left open by a sweep that stopped before done == total: the bar is destroyed
  // while the error unwinds, so main()'s `comet: error:` line starts on a line of its own
  // instead of after the bar.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  // The run_layer_bench progress callback: redraws the bar; a newline once done == total.
  void operator()(int done, int total, const std::string& what);
  // Ends a line left open (before a sweep that stopped prints the rows it finished).
  void end_line();

 private:
  std::ostream& os_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  size_t last_width_ = 0;
  bool line_open_ = false;  // a bar is drawn and no newline followed it
};

}  // namespace comet::tools
