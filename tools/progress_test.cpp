// The progress bar's line: fill, counts, ETA, and the redraw that blanks a longer previous line.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "progress.h"

namespace comet::tools {
namespace {

TEST(Progress, LineFillsInProportionAndEstimatesTheRest) {
  EXPECT_EQ(progress_line(0, 4, "start", 0.0), "[                              ] 0/4  start");
  // 1 of 4 done after 10 s: 30 s to go.
  EXPECT_EQ(progress_line(1, 4, "mixtral-8x7b T=4096", 10.0),
            "[#######                       ] 1/4  mixtral-8x7b T=4096  ETA 30 s");
  EXPECT_EQ(progress_line(4, 4, "done", 40.0), "[##############################] 4/4  done");
  // Nothing to do is a full bar, and counts outside [0, total] never overfill it.
  EXPECT_EQ(progress_line(0, 0, "done", 0.0), "[##############################] 0/0  done");
  EXPECT_EQ(progress_line(9, 4, "x", 1.0).substr(0, 32), "[##############################]");
}

TEST(Progress, BarRedrawsInPlaceAndEndsWithANewline) {
  std::ostringstream os;
  ProgressBar bar(os, true);
  bar(0, 2, "a much longer first label");
  bar(1, 2, "b");
  bar(2, 2, "done");
  const std::string out = os.str();
  EXPECT_EQ(out.front(), '\r');
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\r'), 3);
  // The second line is padded to the first one's width.
  const size_t second = out.find('\r', 1), third = out.find('\r', second + 1);
  EXPECT_EQ(third - second, second);

  std::ostringstream quiet;
  ProgressBar off(quiet, false);
  off(1, 2, "x");
  EXPECT_TRUE(quiet.str().empty());
}

// A sweep that fails midway leaves the bar's line open; the error printed after it must start
// on a line of its own, not after the bar.
TEST(Progress, BarEndsAnOpenLineWhenDestroyed) {
  std::ostringstream os;
  {
    ProgressBar bar(os, true);
    bar(1, 4, "mixtral-8x7b T=4096");
  }
  const std::string out = os.str();
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);

  // A finished bar already ended its line, and a quiet one printed nothing.
  std::ostringstream done;
  {
    ProgressBar bar(done, true);
    bar(2, 2, "done");
  }
  const std::string finished = done.str();
  EXPECT_EQ(std::count(finished.begin(), finished.end(), '\n'), 1);
  std::ostringstream quiet;
  {
    ProgressBar bar(quiet, false);
    bar(1, 2, "x");
  }
  EXPECT_TRUE(quiet.str().empty());
}

}  // namespace
}  // namespace comet::tools
