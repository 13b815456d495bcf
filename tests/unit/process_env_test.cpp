// unit/process_env_test.cpp: reading RANK, WORLD_SIZE, LOCAL_* and the bootstrap file name
// from the environment (core/process_env.h), and the bootstrap file hand-over
// (core/bootstrap_file.h). The environment is a fake getter over a map, never the real one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "core/bootstrap_file.h"
#include "core/process_env.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::contains;
using test::throws_with;
using Vars = std::map<std::string, std::string>;

// `parent_pid`: the process that started this one (under torchrun its agent).
std::optional<ProcessEnv> read(const Vars& vars, long parent_pid = 4242) {
  return read_process_env(
      [&vars](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      parent_pid);
}

// What `comet launch -n 4` exports for its third process.
Vars launcher_vars() {
  return {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"},
          {"COMET_BOOTSTRAP_FILE", "/tmp/comet-launch-xyz/bootstrap.id"}};
}

TEST(ProcessEnv, UnsetMeansNotLaunched) {
  EXPECT_FALSE(read({}).has_value());
  // Unrelated variables (a torchrun master without ranks) do not make a launch.
  EXPECT_FALSE(read({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}).has_value());
  // Empty values count as unset: some launchers export empty variables.
  EXPECT_FALSE(read({{"RANK", ""}, {"WORLD_SIZE", ""}}).has_value());
}

TEST(ProcessEnv, LauncherVariables) {
  const auto env = read(launcher_vars());
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 2);
  EXPECT_EQ(env->world, 4);
  EXPECT_EQ(env->local_rank, 2);
  EXPECT_EQ(env->local_world, 4);
  EXPECT_EQ(env->bootstrap_file, "/tmp/comet-launch-xyz/bootstrap.id");
  EXPECT_EQ(env->source, "COMET_BOOTSTRAP_FILE");
  EXPECT_EQ(env->timeout_s, kDefaultFabricTimeoutS);
}

TEST(ProcessEnv, BootstrapFileWinsOverTorchrunVariables) {
  Vars v = launcher_vars();
  v["TORCHELASTIC_RUN_ID"] = "abc";
  v["MASTER_ADDR"] = "node0";
  v["MASTER_PORT"] = "29500";
  EXPECT_EQ(read(v)->bootstrap_file, "/tmp/comet-launch-xyz/bootstrap.id");
}

TEST(ProcessEnv, LocalDefaultsToGlobalOnOneNode) {
  const auto env = read({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"COMET_BOOTSTRAP_FILE", "/x"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->local_rank, 3);
  EXPECT_EQ(env->local_world, 8);
  EXPECT_EQ(env->local_rank_source, "RANK");  // a message about its GPU names RANK, not LOCAL_RANK
}

TEST(ProcessEnv, TwoNodesKeepTheirLocalNumbering) {
  const auto env = read({{"RANK", "13"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "8"},
                         {"COMET_BOOTSTRAP_FILE", "/x"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 13);
  EXPECT_EQ(env->local_rank, 5);
  EXPECT_EQ(env->local_world, 8);
  EXPECT_EQ(env->local_rank_source, "LOCAL_RANK");
}

// Derived names begin with the user's id: two users' runs on one node never share a file.
std::string uid_prefix() { return "/tmp/comet-bootstrap-uid-" + std::to_string(::getuid()); }

TEST(ProcessEnv, TorchrunDerivesAFileFromTheRun) {
  const Vars base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}};
  Vars v = base;
  v["TORCHELASTIC_RUN_ID"] = "job/42 x";  // user text: made file-name safe
  v["MASTER_ADDR"] = "127.0.0.1";
  v["MASTER_PORT"] = "29500";
  v["TORCHELASTIC_RESTART_COUNT"] = "1";
  const auto env = read(v);
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->bootstrap_file, uid_prefix() + "-run-job_42_x-agent-4242-master-127.0.0.1-29500-restart-1.id");
  EXPECT_TRUE(contains(env->source, "TORCHELASTIC_RUN_ID=job/42 x (agent process 4242, this process's parent"));
  EXPECT_TRUE(contains(env->source, "MASTER_PORT=29500"));

  // Every rank of the run derives the same name; another port (another run) another one.
  Vars other_rank = v;
  other_rank["RANK"] = "1";
  other_rank["LOCAL_RANK"] = "1";
  EXPECT_EQ(read(other_rank)->bootstrap_file, env->bootstrap_file);
  Vars other_run = v;
  other_run["MASTER_PORT"] = "29501";
  EXPECT_NE(read(other_run)->bootstrap_file, env->bootstrap_file);
  Vars restarted = v;
  restarted["TORCHELASTIC_RESTART_COUNT"] = "2";
  EXPECT_NE(read(restarted)->bootstrap_file, env->bootstrap_file);
  // A later run with the same run id and port has another agent: a file a killed run left
  // behind is not read.
  EXPECT_NE(read(v, 4343)->bootstrap_file, env->bootstrap_file);

  // Either the run id or the master address and port suffices.
  Vars only_master = base;
  only_master["MASTER_ADDR"] = "h";
  only_master["MASTER_PORT"] = "1";
  EXPECT_EQ(read(only_master)->bootstrap_file, uid_prefix() + "-master-h-1.id");
  EXPECT_EQ(read(only_master, 4343)->bootstrap_file, uid_prefix() + "-master-h-1.id");  // not torchrun's agent
  Vars only_run = base;
  only_run["TORCHELASTIC_RUN_ID"] = "r";
  EXPECT_EQ(read(only_run)->bootstrap_file, uid_prefix() + "-run-r-agent-4242.id");
  // A batch job's id keeps two jobs of one user with the same MASTER_PORT apart.
  Vars in_job = only_master;
  in_job["SLURM_JOB_ID"] = "77";
  EXPECT_EQ(read(in_job)->bootstrap_file, uid_prefix() + "-job-77-master-h-1.id");
  EXPECT_TRUE(contains(read(in_job)->source, "SLURM_JOB_ID=77"));
}

TEST(ProcessEnv, NoBootstrapSourceExplainsWhatToSet) {
  EXPECT_TRUE(throws_with<NoBootstrapError>([] { read({{"RANK", "0"}, {"WORLD_SIZE", "2"}}); },
                                            {"COMET_BOOTSTRAP_FILE", "torchrun", "MASTER_ADDR"}));
  // A master address without a port is not enough.
  EXPECT_TRUE(throws_with<NoBootstrapError>([] { read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}); },
                                            {"COMET_BOOTSTRAP_FILE"}));
}

// `comet run` lets a process with RANK and WORLD_SIZE but no bootstrap run (not a launch), and
// refuses a malformed value: the two must not share a type. Without a bootstrap file too, a
// malformed value is reported as such, not as the missing file.
TEST(ProcessEnv, MalformedValuesAreNotAMissingBootstrap) {
  for (const Vars& vars : {Vars{{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, Vars{{"RANK", "0"}, {"WORLD_SIZE", "100"}},
                           Vars{{"RANK", "5"}, {"WORLD_SIZE", "2"}}}) {
    for (const bool with_file : {false, true}) {
      Vars v = vars;
      if (with_file) v["COMET_BOOTSTRAP_FILE"] = "/tmp/unused.id";
      try {
        read(v);
        ADD_FAILURE() << "RANK=" << v["RANK"] << " WORLD_SIZE=" << v["WORLD_SIZE"] << " was accepted";
      } catch (const NoBootstrapError& e) {
        ADD_FAILURE() << "RANK=" << v["RANK"] << " WORLD_SIZE=" << v["WORLD_SIZE"] << ": " << e.what();
      } catch (const Error& e) {
        EXPECT_TRUE(contains(e.what(), v["RANK"] == "abc" ? "RANK=\"abc\"" : v["RANK"] == "5" ? "RANK=5" : "WORLD_SIZE=100"));
      }
    }
  }
}

TEST(ProcessEnv, TimeoutVariable) {
  Vars v = launcher_vars();
  v["COMET_FABRIC_TIMEOUT_S"] = "2.5";
  EXPECT_EQ(read(v)->timeout_s, 2.5);
  for (const char* bad : {"0", "-1", "abc", "5s", "inf", "nan"}) {
    v["COMET_FABRIC_TIMEOUT_S"] = bad;
    EXPECT_TRUE(throws_with<Error>([&] { read(v); }, {"COMET_FABRIC_TIMEOUT_S", bad})) << bad;
  }
}

// One malformed or inconsistent variable per case; the message must name it and its value.
struct BadCase {
  const char* name;
  Vars changes;
  std::vector<std::string> parts;
};

TEST(ProcessEnv, MalformedValuesNameTheVariable) {
  const BadCase cases[] = {
      {"rank_not_a_number", {{"RANK", "two"}}, {"RANK=\"two\"", "not a decimal integer"}},
      {"rank_trailing_text", {{"RANK", "2 "}}, {"RANK=\"2 \""}},
      {"world_hex", {{"WORLD_SIZE", "0x4"}}, {"WORLD_SIZE=\"0x4\""}},
      {"world_overflow", {{"WORLD_SIZE", "99999999999"}}, {"WORLD_SIZE"}},
      {"rank_equals_world", {{"RANK", "4"}}, {"RANK=4", "WORLD_SIZE=4"}},
      {"rank_negative", {{"RANK", "-1"}}, {"RANK=-1"}},
      {"world_zero", {{"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0", "[1, 64]"}},
      {"world_too_large", {{"WORLD_SIZE", "65"}, {"LOCAL_WORLD_SIZE", "65"}}, {"WORLD_SIZE=65", "64"}},
      {"local_rank_too_large", {{"LOCAL_RANK", "4"}}, {"LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4"}},
      {"local_world_larger_than_world", {{"LOCAL_WORLD_SIZE", "5"}}, {"LOCAL_WORLD_SIZE=5", "WORLD_SIZE=4"}},
      {"local_world_zero", {{"LOCAL_WORLD_SIZE", "0"}}, {"LOCAL_WORLD_SIZE=0"}},
      {"local_rank_text", {{"LOCAL_RANK", "a"}}, {"LOCAL_RANK=\"a\""}},
      {"world_without_rank", {{"RANK", ""}}, {"WORLD_SIZE is set but RANK is not"}},
      {"rank_without_world", {{"WORLD_SIZE", ""}}, {"RANK is set but WORLD_SIZE is not"}},
      {"local_world_without_local_rank", {{"LOCAL_RANK", ""}}, {"LOCAL_WORLD_SIZE is set but LOCAL_RANK is not"}},
      {"local_rank_without_local_world", {{"LOCAL_WORLD_SIZE", ""}}, {"LOCAL_RANK is set but LOCAL_WORLD_SIZE"}},
  };
  for (const BadCase& c : cases) {
    Vars v = launcher_vars();
    for (const auto& [k, value] : c.changes) v[k] = value;
    EXPECT_TRUE(throws_with<Error>([&] { read(v); }, c.parts)) << "case " << c.name;
  }
}

// ---- bootstrap file ----

class BootstrapFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("comet-bootstrap-test-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const char* name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

// A payload with every byte value, NUL included: the NCCL id is binary.
std::string binary_payload(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(i * 37 + 11);
  return s;
}

TEST_F(BootstrapFile, PublishedPayloadReadsBackExactly) {
  const std::string payload = binary_payload(128);
  publish_bootstrap_file(path("id"), payload);
  EXPECT_EQ(wait_bootstrap_file(path("id"), 128, 1.0), payload);
  // Publishing again replaces the file; no temporary is left next to it.
  const std::string second = binary_payload(128).replace(0, 4, "next");
  publish_bootstrap_file(path("id"), second);
  EXPECT_EQ(wait_bootstrap_file(path("id"), 128, 1.0), second);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  remove_bootstrap_file(path("id"));
  EXPECT_FALSE(std::filesystem::exists(path("id")));
  remove_bootstrap_file(path("id"));  // absent: no error
}

TEST_F(BootstrapFile, ReaderWaitsForALateWriter) {
  const std::string payload = binary_payload(128);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    publish_bootstrap_file(path("late"), payload);
  });
  std::string got;
  EXPECT_NO_THROW(got = wait_bootstrap_file(path("late"), 128, 10.0));
  writer.join();
  EXPECT_EQ(got, payload);
}

TEST_F(BootstrapFile, MissingWriterTimesOutNamingTheFile) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws_with<TimeoutError>([&] { wait_bootstrap_file(path("never"), 128, 0.2); },
                                        {path("never"), "0.2 s", "rank 0", "COMET_FABRIC_TIMEOUT_S"}));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 5.0);
}

TEST_F(BootstrapFile, BadPathsAndForeignFilesAreErrors) {
  EXPECT_TRUE(throws_with<Error>([&] { publish_bootstrap_file(path("no/such/dir/id"), "x"); },
                                 {"no/such/dir/id", "does not exist"}));
  EXPECT_TRUE(throws_with<Error>([] { publish_bootstrap_file("", "x"); }, {"empty path"}));
  // A reader whose directory does not exist says so at once, not after its timeout.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws_with<Error>([&] { wait_bootstrap_file(path("no/such/dir/id"), 128, 30.0); },
                                 {"no/such/dir/id", "does not exist"}));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  {
    std::ofstream(path("foreign")) << "something else entirely";
  }
  EXPECT_TRUE(throws_with<Error>([&] { wait_bootstrap_file(path("foreign"), 128, 1.0); },
                                 {path("foreign"), "not a comet bootstrap file"}));
  publish_bootstrap_file(path("short"), binary_payload(16));
  EXPECT_TRUE(throws_with<Error>([&] { wait_bootstrap_file(path("short"), 128, 1.0); },
                                 {"holds 16 payload bytes, expected 128"}));
}

}  // namespace
}  // namespace comet
