// Checks of tools/cli_common.h on their own: n_comm against the SM count (which needs a GPU to
// run through the CLI), refused by option and value before a sweep starts; the paths of
// --trace and --save.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_common.h"

namespace comet::tools {
namespace {

std::string refusal(const std::vector<int>& n_comm0, const std::vector<int>& n_comm1, int num_sms) {
  try {
    check_comm_blocks(n_comm0, n_comm1, num_sms, "NVIDIA H200");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(CliCommon, CommBlocksMustLeaveTheGemmAnSm) {
  EXPECT_EQ(refusal({0, 8, 131}, {0, 2, 131}, 132), "");
  EXPECT_EQ(refusal({8, 132}, {2}, 132),
            "--n-comm0 132: the fused kernels need an SM for the GEMM, so n_comm must be below the 132 SMs of "
            "this NVIDIA H200 (at most 131)");
  EXPECT_NE(refusal({8}, {2, 200}, 132).find("--n-comm1 200: "), std::string::npos);
  EXPECT_NE(refusal({8}, {2}, 8).find("--n-comm0 8: "), std::string::npos);
}

// The unsigned integer options (--seed): what strtoull reads, strictly. Leading spaces are
// taken as strtoull takes them, so " 5" is 5 as it is for the other integer options.
TEST(CliCommon, NonNegativeIntegersAreReadStrictly) {
  auto check = [](std::string value) { return non_negative_integer()(value); };
  for (const char* ok : {"0", "5", "+5", " 5", "18446744073709551615"}) EXPECT_EQ(check(ok), "") << ok;
  for (const char* bad : {"", "-1", " -1", "x", "5x", "+", " ", "18446744073709551616"})
    EXPECT_NE(check(bad), "") << "'" << bad << "'";
}

// --save and --trace naming one file are refused, however the path is spelled, whether or not
// the file exists yet.
TEST(CliCommon, SameFileResolvesSpellingsOfOnePath) {
  EXPECT_TRUE(same_file("comet_no_such_file.json", "./comet_no_such_file.json"));
  EXPECT_TRUE(same_file("/tmp/comet_no_such_dir/../t.json", "/tmp/t.json"));
  EXPECT_FALSE(same_file("t.json", "t.svg"));
}

TEST(CliCommon, TracePathRefusesAnSvgNameAndChecksTheSvgBesideIt) {
  EXPECT_THROW(check_trace_path("t.svg"), UsageError);
  EXPECT_THROW(check_trace_path("/nonexistent/dir/t.json"), UsageError);
  EXPECT_NO_THROW(check_trace_path(""));
  EXPECT_NO_THROW(check_trace_path("t.json"));
}

}  // namespace
}  // namespace comet::tools
