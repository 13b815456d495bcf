// Checks of tools/cli_common.h on their own: n_comm against the SM count (which needs a GPU to
// run through the CLI), refused by option and value before a sweep starts; the paths of
// --trace, --save and tune --out; the workload caps; tuning tables named by an option.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "cli_common.h"

namespace comet::tools {
namespace {

namespace fs = std::filesystem;

// A fresh directory for one test, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "comet-cli-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// What `option` refuses `path` with; "" when it takes it. A std::filesystem error escaping
// would end the command as an "unexpected failure" (exit 3), not as bad input: it fails here.
std::string output_refusal(const std::string& path, const std::string& option = "--save") {
  try {
    check_output_path(path, option);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::string errno_text(int code) { return std::error_code(code, std::generic_category()).message(); }

// `args` parsed as `comet plan`'s workload options, then validated.
Workload workload_of(const std::string& args) {
  CLI::App app;
  WorkloadOptions options;
  add_workload_options(app, options, TileConfig{});
  read_integers_as_decimal(app);
  app.parse(args);
  return build_workload(options, TileConfig{});
}

std::string workload_refusal(const std::string& args) {
  try {
    workload_of(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

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

// The trace's two files are written as FILE.tmp and renamed: a temporary file that cannot be
// created (a directory of that name, as in the test below) is refused before the run, for the
// picture as for the JSON.
TEST(CliCommon, TracePathNeedsBothTemporaryFiles) {
  const ScratchDir dir;
  const std::string json = dir / "t.json";
  EXPECT_NO_THROW(check_trace_path(json));
  EXPECT_FALSE(fs::exists(json + ".tmp"));
  for (const std::string& blocked : {json + ".tmp", dir / "t.svg.tmp"}) {
    fs::create_directory(blocked);
    try {
      check_trace_path(json);
      ADD_FAILURE() << "a directory " << blocked << " was not refused";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--trace: cannot create \"" + blocked + "\""), std::string::npos) << e.what();
    }
    fs::remove(blocked);
  }
}

// A look-up that fails for another reason than a missing file is refused by option, path and
// reason: a name longer than a file system takes (255 bytes) and a loop of symbolic links, both
// as the file and as its directory.
TEST(CliCommon, OutputPathLookUpErrorsNameTheOptionAndThePath) {
  const std::string long_name = "/tmp/" + std::string(256, 'a');
  EXPECT_EQ(output_refusal(long_name + "/t.json"),
            "--save: \"" + long_name + "/t.json\": " + errno_text(ENAMETOOLONG));
  EXPECT_EQ(output_refusal(long_name, "--trace"), "--trace: \"" + long_name + "\": " + errno_text(ENAMETOOLONG));

  const ScratchDir dir;
  fs::create_symlink(dir / "b", dir / "a");
  fs::create_symlink(dir / "a", dir / "b");
  EXPECT_EQ(output_refusal(dir / "a"), "--save: \"" + (dir / "a") + "\": " + errno_text(ELOOP));
  EXPECT_EQ(output_refusal(dir / "a/t.json", "--out"), "--out: \"" + (dir / "a/t.json") + "\": " + errno_text(ELOOP));
  // A FIFO would hold the write until something read it.
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(output_refusal(dir / "fifo", "--trace"), "--trace: \"" + (dir / "fifo") + "\" is a FIFO, not a file");
  // Not found is still no error: the file is to be written, in a directory that exists.
  EXPECT_EQ(output_refusal(dir / "new.json"), "");
  EXPECT_NE(output_refusal(dir / "missing/new.json").find("does not exist"), std::string::npos);
}

// The slot cap alone let E grow the routing (slots x E steps) and the plan's counts
// (W x W x E/EP) to 2^40 and 2^28: each is refused by its product and limit before anything is
// generated.
TEST(CliCommon, WorkloadCapsCountTheExperts) {
  EXPECT_EQ(workload_refusal("--hidden 64 --ffn 64 --experts 65536 --topk 64 --ep 64 --tokens 4096"),
            "W 64 x 4096 tokens per rank x topk 64 x E 65536 = 1099511627776 (routing slots x experts), more than "
            "the 4294967296 this tool routes (fewer --experts, --tokens, ranks or --topk)");
  EXPECT_EQ(workload_refusal("--hidden 64 --ffn 64 --experts 65536 --topk 1 --ep 1 --tp 64 --tokens 1"),
            "W 64 x W 64 x E/EP 65536 = 268435456 (plan counts, one per src rank, dst rank and local expert), more "
            "than the 4194304 this tool plans for (fewer --experts or ranks, or a larger --ep)");
  // Each slot is a row on every TP rank of its expert: at the slot cap, TP 64 asked for about 20 GB.
  EXPECT_EQ(workload_refusal("--model deepseek-v3 --ep 1 --tp 64 --tokens 32768"),
            "16777216 routing slots x TP 64 = 1073741824 expert rows (every TP rank of an expert holds each of its "
            "rows), more than the 67108864 this tool plans for (fewer --tokens, ranks or --topk, or a smaller --tp)");
  EXPECT_EQ(workload_refusal("--model deepseek-v3 --ep 16 --tp 4 --tokens 32768"), "");
  // At the caps themselves: accepted.
  EXPECT_EQ(workload_refusal("--hidden 64 --ffn 64 --experts 65536 --topk 1 --ep 1 --tokens 65536"), "");
  EXPECT_EQ(workload_refusal("--hidden 64 --ffn 64 --experts 1024 --topk 1 --ep 1 --tp 64 --tokens 1"), "");
}

// Every preset at every layout of up to 64 ranks, with as many tokens per rank as the slot and
// expert-row caps allow (at most 65536), passes the caps on E: they refuse only custom shapes.
TEST(CliCommon, EveryPresetAtTheSlotCapPassesTheCapsOnExperts) {
  int layouts = 0;
  for (const ModelShape& m : ModelPresets::all())
    for (int ep = 1; ep <= kMaxRanks; ++ep)
      for (int tp = 1; ep * tp <= kMaxRanks; ++tp) {
        if (m.num_experts % ep != 0 || m.ffn % tp != 0) continue;
        const int64_t per_token = int64_t(ep) * tp * m.topk;
        const int64_t tokens = std::min({int64_t(kMaxTokensPerRank), kMaxRoutingSlots / per_token, kMaxExpertRows / (per_token * tp)});
        const std::string args = "--model " + m.name + " --ep " + std::to_string(ep) + " --tp " + std::to_string(tp) +
                                 " --tokens " + std::to_string(tokens);
        EXPECT_EQ(workload_refusal(args), "") << args;
        ++layouts;
      }
  EXPECT_GT(layouts, 100);
}

// tune --out: FILE.tmp is created before the sweep, and what stops it is refused then. A
// directory of that name stands in for a directory that may not be written, which a test
// running as root cannot make.
TEST(CliCommon, ReplaceableOutputNeedsItsTemporaryFile) {
  const ScratchDir dir;
  const std::string out = dir / "t.json";
  EXPECT_NO_THROW(check_replaceable_output(out, "--out"));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  EXPECT_FALSE(fs::exists(out));
  // A FILE.tmp that a killed writer left is the writer's to replace: kept.
  std::ofstream(out + ".tmp") << "partial";
  EXPECT_NO_THROW(check_replaceable_output(out, "--out"));
  EXPECT_TRUE(fs::exists(out + ".tmp"));
  fs::remove(out + ".tmp");

  fs::create_directory(out + ".tmp");
  try {
    check_replaceable_output(out, "--out");
    ADD_FAILURE() << "a directory " << out << ".tmp was not refused";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--out: cannot create \"" + out + ".tmp\" (" + errno_text(EISDIR) +
                                         "), which is written first and renamed over \"" + out + "\"");
  }
  fs::remove(out + ".tmp");
  // A FIFO of that name would block the open until a reader came: refused at once.
  ASSERT_EQ(::mkfifo((out + ".tmp").c_str(), 0600), 0);
  try {
    check_replaceable_output(out, "--out");
    ADD_FAILURE() << "a FIFO " << out << ".tmp was not refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--out: \"" + out + ".tmp\", which is written first"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
  }
  fs::remove(out + ".tmp");
  if (::geteuid() != 0) {
    fs::permissions(dir / "", fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW(check_replaceable_output(out, "--out"), UsageError);
  }
}

// bench layer --tuning and an existing tune --out: a table that is not one is bad input,
// refused naming the option (it was an exit 3, a runtime failure).
TEST(CliCommon, MalformedTuningTableIsBadInputNamingTheOption) {
  const ScratchDir dir;
  const std::string path = dir / "t.json";
  std::ofstream(path) << R"({"format": "comet-tuning-1", "entries": 5})";
  try {
    load_tuning_option(path, "--tuning");
    ADD_FAILURE() << "a malformed table was loaded";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--tuning: tuning table " + path + ": no \"entries\" array");
  }
  std::ofstream(path) << R"({"format": "comet-tuning-1", "entries": []})";
  EXPECT_TRUE(load_tuning_option(path, "--out").entries().empty());
  EXPECT_THROW(load_tuning_option(dir / "missing.json", "--tuning"), UsageError);
}

}  // namespace
}  // namespace comet::tools
