// The progress bar of the GPU sweeps (tools/progress.h).
#include "progress.h"

#include <algorithm>
#include <cmath>

namespace comet::tools {

std::string progress_line(int done, int total, const std::string& what, double elapsed_s) {
  constexpr int kWidth = 30;
  const int clamped = std::clamp(done, 0, std::max(total, 0));
  const int filled = total > 0 ? kWidth * clamped / total : kWidth;
  std::string line = "[";
  line.append(size_t(filled), '#').append(size_t(kWidth - filled), ' ').append("] ");
  line.append(std::to_string(done)).append("/").append(std::to_string(total)).append("  ").append(what);
  if (clamped > 0 && clamped < total)
    line += "  ETA " + std::to_string(std::lround(elapsed_s / clamped * (total - clamped))) + " s";
  return line;
}

void ProgressBar::operator()(int done, int total, const std::string& what) {
  if (!enabled_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string line = progress_line(done, total, what, elapsed);
  // Blank out what a longer previous line left behind.
  const size_t pad = last_width_ > line.size() ? last_width_ - line.size() : 0;
  os_ << "\r" << line << std::string(pad, ' ') << (done >= total ? "\n" : "") << std::flush;
  last_width_ = line.size();
  line_open_ = done < total;
}

ProgressBar::~ProgressBar() { end_line(); }

void ProgressBar::end_line() {
  if (line_open_) os_ << "\n" << std::flush;
  line_open_ = false;
}

}  // namespace comet::tools
