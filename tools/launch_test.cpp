// tools/launch_test.cpp: `comet launch` through the built binary (COMET_EXE), with sh scripts as
// the ranks (label unit).
//
//   ctest --test-dir build -R Launch
//
// Each test runs one shell script with $COMET (the binary) and $WORK (a fresh directory)
// set, capturing stdout and stderr apart. Ranks that would sleep 60 s show that a stop really
// stops them: the elapsed-time bounds are far from both the stop (milliseconds) and the sleep.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#ifndef COMET_EXE
#error "COMET_EXE must name the comet binary"
#endif

namespace {

namespace fs = std::filesystem;

constexpr double kStopWithinS = 20;  // a stopped sleep-60 rank ends long before this

struct Outcome {
  int code = -1;  // exit code of the script (its last command), -1 when it did not exit
  std::string out, err;
  double seconds = 0;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines = lines_of(text);
  std::sort(lines.begin(), lines.end());
  return lines;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Gone, or a zombie nobody has reaped yet (a container's pid 1 may never reap): not running.
bool process_running(const std::string& pid) {
  const std::string stat = read_text("/proc/" + pid + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// A signal is delivered after kill() returns: a process sent SIGKILL may run a moment longer.
bool process_ends_within(const std::string& pid, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (process_running(pid)) {
    if (std::chrono::steady_clock::now() > until) return false;
    ::usleep(10000);
  }
  return true;
}

// What run_behind_stuck_reader saw: the shell's outcome, the launcher's exit code and run time.
struct StuckReaderRun {
  Outcome shell;
  int code = -1;
  int ms = -1;
};

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "comet-launch-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    work_ = tmpl;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(work_, ignored);
  }

  Outcome sh(const std::string& script) {
    const fs::path out = work_ / "captured.stdout", err = work_ / "captured.stderr";
    const std::string command = "COMET='" COMET_EXE "'; WORK='" + work_.string() +
                                "'; export COMET WORK; {\n" + script + "\n} >'" + out.string() + "' 2>'" +
                                err.string() + "'";
    const auto start = std::chrono::steady_clock::now();
    const int status = std::system(command.c_str());
    Outcome o;
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    o.code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    o.out = read_text(out);
    o.err = read_text(err);
    return o;
  }

  // Runs `comet launch <args>` behind a reader that takes nothing for 8 s (a paused pager, a full
  // log pipe), and returns the launcher's exit code and how long it ran, measured inside the
  // pipeline so the reader's sleep does not count.
  StuckReaderRun run_behind_stuck_reader(const std::string& launch_args) {
    StuckReaderRun r;
    r.shell = sh("start=$(date +%s%N)\n{ \"$COMET\" launch " + launch_args +
                   "\n  echo \"code $? ms $(( ($(date +%s%N) - start) / 1000000 ))\" > \"$WORK/result\"; }"
                   " | { sleep 8; cat > /dev/null; }\ncat \"$WORK/result\"");
    std::smatch m;
    if (std::regex_search(r.shell.out, m, std::regex("code (\\d+) ms (\\d+)"))) {
      r.code = std::stoi(m[1].str());
      r.ms = std::stoi(m[2].str());
    }
    return r;
  }

  // The launcher's temporary directories left in $WORK (TMPDIR points there).
  std::vector<std::string> leftover_launch_dirs() const {
    std::vector<std::string> dirs;
    for (const auto& entry : fs::directory_iterator(work_))
      if (entry.path().filename().string().rfind("comet-launch-", 0) == 0) dirs.push_back(entry.path());
    return dirs;
  }

  // Rank r wrote the pid of a process it left running into $WORK/<stem><r>: each must end within
  // `seconds`.
  void expect_leftovers_end(const std::string& stem, int ranks, double seconds) {
    for (int r = 0; r < ranks; ++r) {
      std::string pid = read_text(work_ / (stem + std::to_string(r)));
      pid.erase(pid.find_last_not_of(" \n") + 1);
      ASSERT_FALSE(pid.empty()) << stem << r << " is empty";
      EXPECT_TRUE(process_ends_within(pid, seconds)) << "rank " << r << "'s " << stem << " pid " << pid << " still runs";
    }
  }

  fs::path work_;
};

std::string shown(const Outcome& o) {
  return "exit " + std::to_string(o.code) + " after " + std::to_string(o.seconds) + " s\nstdout:\n" + o.out +
         "\nstderr:\n" + o.err;
}

TEST_F(LaunchTest, EveryRankGetsItsRankVariables) {
  const Outcome o = sh(R"(unset MASTER_ADDR MASTER_PORT
RANK=99 WORLD_SIZE=7 COMET_TEST_MARK=kept "$COMET" launch -n 3 -- sh -c \
  'echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE $COMET_TEST_MARK $MASTER_ADDR; echo port $MASTER_PORT >&2')");
  ASSERT_EQ(o.code, 0) << shown(o);
  EXPECT_EQ(sorted_lines(o.out), (std::vector<std::string>{"[rank 0] 0/3/0/3 kept 127.0.0.1",
                                                           "[rank 1] 1/3/1/3 kept 127.0.0.1",
                                                           "[rank 2] 2/3/2/3 kept 127.0.0.1"}))
      << shown(o);
  // One free port, the same for every rank.
  const std::vector<std::string> ports = sorted_lines(o.err);
  ASSERT_EQ(ports.size(), 3u) << shown(o);
  std::smatch m;
  ASSERT_TRUE(std::regex_match(ports[0], m, std::regex(R"(\[rank 0\] port ([0-9]+))"))) << shown(o);
  const std::string port = m[1];
  EXPECT_GT(std::stoi(port), 0);
  EXPECT_LT(std::stoi(port), 65536);
  EXPECT_EQ(ports[1], "[rank 1] port " + port);
  EXPECT_EQ(ports[2], "[rank 2] port " + port);
}

TEST_F(LaunchTest, CallerRendezvousIsKept) {
  const Outcome o = sh(R"(MASTER_ADDR=10.1.2.3 MASTER_PORT=1234 "$COMET" launch -n 2 -- sh -c 'echo $MASTER_ADDR:$MASTER_PORT')");
  ASSERT_EQ(o.code, 0) << shown(o);
  EXPECT_EQ(sorted_lines(o.out), (std::vector<std::string>{"[rank 0] 10.1.2.3:1234", "[rank 1] 10.1.2.3:1234"}));
}

TEST_F(LaunchTest, BootstrapFileIsSharedPrivateAndRemoved) {
  // Rank 0 publishes an id the way the NCCL fabric does (write, then rename); the others wait
  // for it. The launcher's --timeout-s bounds the wait if the path were not shared.
  const Outcome o = sh(R"sh(TMPDIR="$WORK" "$COMET" launch -n 3 --timeout-s 30 -- sh -c '
f=$COMET_BOOTSTRAP_FILE
if [ "$RANK" = 0 ]; then
  if [ -e "$f" ]; then echo present; else echo absent; fi
  ls -ld "$(dirname "$f")" | cut -c1-10
  echo id-42 > "$f.tmp" && mv "$f.tmp" "$f"
else
  while [ ! -e "$f" ]; do sleep 0.01; done
fi
echo "file $f $(cat "$f")"')sh");
  ASSERT_EQ(o.code, 0) << shown(o);
  EXPECT_EQ(o.err, "");
  const std::vector<std::string> lines = lines_of(o.out);
  EXPECT_EQ(count_of(o.out, "[rank 0] absent\n"), 1u) << shown(o);
  EXPECT_EQ(count_of(o.out, "[rank 0] drwx------\n"), 1u) << shown(o);
  std::vector<std::string> paths;
  for (int r = 0; r < 3; ++r) {
    const std::regex re("\\[rank " + std::to_string(r) + "\\] file (.*) id-42");
    for (const std::string& line : lines) {
      std::smatch m;
      if (std::regex_match(line, m, re)) paths.push_back(m[1]);
    }
  }
  ASSERT_EQ(paths.size(), 3u) << shown(o);
  EXPECT_EQ(paths[0], paths[1]);
  EXPECT_EQ(paths[0], paths[2]);
  const fs::path dir = fs::path(paths[0]).parent_path();
  EXPECT_EQ(dir.parent_path(), work_) << paths[0];
  EXPECT_FALSE(fs::exists(dir)) << "the launcher left " << dir;
  EXPECT_TRUE(leftover_launch_dirs().empty());
}

TEST_F(LaunchTest, StderrIsPrefixedAndPartialLinesAreFlushed) {
  const Outcome o = sh(R"("$COMET" launch -n 2 -- sh -c 'echo out $RANK; echo err $RANK >&2; printf "tail $RANK"; printf "etail $RANK" >&2')");
  ASSERT_EQ(o.code, 0) << shown(o);
  EXPECT_EQ(sorted_lines(o.out),
            (std::vector<std::string>{"[rank 0] out 0", "[rank 0] tail 0", "[rank 1] out 1", "[rank 1] tail 1"}));
  EXPECT_EQ(sorted_lines(o.err),
            (std::vector<std::string>{"[rank 0] err 0", "[rank 0] etail 0", "[rank 1] err 1", "[rank 1] etail 1"}));
  EXPECT_EQ(o.out.back(), '\n');
  EXPECT_EQ(o.err.back(), '\n');
  // A rank's lines keep their order.
  EXPECT_LT(o.out.find("[rank 0] out 0"), o.out.find("[rank 0] tail 0"));
}

TEST_F(LaunchTest, LinesOfDifferentRanksNeverMix) {
  // yes(1) writes in large blocks, so lines arrive cut at arbitrary places in every read.
  const Outcome o = sh(R"("$COMET" launch -n 4 -- sh -c 'yes "line of rank $RANK: abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789" | head -n 20000')");
  ASSERT_EQ(o.code, 0) << "exit " << o.code << "\nstderr:\n" << o.err;
  const std::regex re(R"(\[rank ([0-3])\] line of rank \1: abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789)");
  int per_rank[4] = {0, 0, 0, 0};
  int bad = 0;
  for (const std::string& line : lines_of(o.out)) {
    std::smatch m;
    if (std::regex_match(line, m, re)) {
      ++per_rank[std::stoi(m[1])];
    } else if (++bad <= 3) {
      ADD_FAILURE() << "malformed line: " << line;
    }
  }
  EXPECT_EQ(bad, 0);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(per_rank[r], 20000) << "rank " << r;
}

TEST_F(LaunchTest, FailingRankStopsTheOthers) {
  const Outcome o = sh(R"("$COMET" launch -n 3 -- sh -c 'if [ "$RANK" = 1 ]; then echo failing >&2; exit 3; fi; sleep 60')");
  EXPECT_EQ(o.code, 3) << shown(o);
  EXPECT_LT(o.seconds, kStopWithinS) << shown(o);
  const std::string line = "comet launch: error: rank 1 exited with status 3 (stopping the other ranks)\n";
  EXPECT_EQ(count_of(o.err, line), 1u) << shown(o);
  EXPECT_EQ(count_of(o.err, "comet launch: error:"), 1u) << shown(o);
  // The rank's own output comes before the line about its end.
  EXPECT_LT(o.err.find("[rank 1] failing\n"), o.err.find(line)) << shown(o);
}

// A clean run ends what its ranks left running in the background too.
TEST_F(LaunchTest, BackgroundProcessesOfRanksEndWithTheRun) {
  const Outcome o = sh(R"("$COMET" launch -n 2 -- sh -c 'sleep 60 & echo $! > "$WORK/bg$RANK"; echo started')");
  EXPECT_EQ(o.code, 0) << shown(o);
  EXPECT_LT(o.seconds, kStopWithinS) << shown(o);
  expect_leftovers_end("bg", 2, kStopWithinS);
}

// What ignores SIGTERM gets SIGKILL after the grace period (3 s by default); a clean run whose
// leftovers obey SIGTERM does not wait for it. The leftover is a copy of sleep whose name holds
// ")", spaces and a newline, which /proc/PID/stat prints as they are. The rank exits only once
// the leftover ignores SIGTERM (else the launcher's SIGTERM could end it first).
TEST_F(LaunchTest, BackgroundProcessIgnoringSigtermIsKilledAfterTheGracePeriod) {
  // Against the same launch with nothing left running, so that the machine's load cancels out:
  // waiting out the grace would add 3 s.
  const Outcome plain = sh(R"("$COMET" launch -n 2 -- sh -c 'echo started')");
  const Outcome quick = sh(R"("$COMET" launch -n 2 -- sh -c 'sleep 60 & echo started')");
  EXPECT_EQ(plain.code, 0) << shown(plain);
  EXPECT_EQ(quick.code, 0) << shown(quick);
  EXPECT_LT(quick.seconds, plain.seconds + 2.5) << shown(quick) << "\nwithout a leftover: " << plain.seconds << " s";
  const Outcome o = sh(R"sh("$COMET" launch -n 2 -- sh -c '
odd="$WORK/$(printf "x)\nZ 1 2")$RANK"
cp "$(command -v sleep)" "$odd"
(trap "" TERM; touch "$WORK/ignoring$RANK"; exec "$odd" 60) &
echo $! > "$WORK/stubborn$RANK"
while [ ! -e "$WORK/ignoring$RANK" ]; do sleep 0.01; done
echo started')sh");
  EXPECT_EQ(o.code, 0) << shown(o);
  EXPECT_GE(o.seconds, 2.5) << shown(o);
  EXPECT_LT(o.seconds, kStopWithinS) << shown(o);
  expect_leftovers_end("stubborn", 2, 1.0);
}

TEST_F(LaunchTest, RankKilledBySignal) {
  const Outcome o = sh(R"("$COMET" launch -n 2 -- sh -c 'if [ "$RANK" = 1 ]; then kill -KILL $$; fi; sleep 60')");
  EXPECT_EQ(o.code, 128 + 9) << shown(o);
  EXPECT_LT(o.seconds, kStopWithinS) << shown(o);
  EXPECT_EQ(count_of(o.err, "comet launch: error: rank 1 killed by signal SIGKILL (stopping the other ranks)\n"), 1u)
      << shown(o);
}

TEST_F(LaunchTest, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  // Rank 0 and the sleeps it starts ignore SIGTERM: only the SIGKILL after the 3 s grace ends it.
  const Outcome o = sh(R"("$COMET" launch -n 2 -- sh -c '
if [ "$RANK" = 1 ]; then sleep 0.2; exit 4; fi
trap "" TERM
while true; do sleep 0.1; done')");
  EXPECT_EQ(o.code, 4) << shown(o);
  EXPECT_GE(o.seconds, 2.5) << shown(o);
  EXPECT_LT(o.seconds, kStopWithinS) << shown(o);
  EXPECT_EQ(count_of(o.err, "comet launch: error: rank 1 exited with status 4"), 1u) << shown(o);
}

TEST_F(LaunchTest, TimeoutNamesTheRanksStillRunning) {
  const Outcome o = sh(R"("$COMET" launch -n 3 --timeout-s 1 -- sh -c 'if [ "$RANK" = 0 ]; then echo done; exit 0; fi; sleep 60')");
  EXPECT_EQ(o.code, 124) << shown(o);
  EXPECT_GE(o.seconds, 0.9) << shown(o);
  EXPECT_LT(o.seconds, kStopWithinS) << shown(o);
  EXPECT_EQ(o.out, "[rank 0] done\n");
  EXPECT_EQ(count_of(o.err, "comet launch: error: timeout after 1 s: ranks 1, 2 still running (stopping them)\n"), 1u)
      << shown(o);
}

// SIGINT, SIGTERM, SIGHUP (a closed terminal or ssh session) and SIGQUIT to the launcher reach
// every rank, and what the ranks started in the background (which a non-interactive sh starts
// with SIGINT ignored) ends too.
class LaunchSignalTest : public LaunchTest, public ::testing::WithParamInterface<std::pair<const char*, int>> {};

TEST_P(LaunchSignalTest, SignalIsForwardedAndEveryRankStops) {
  const std::string sig = GetParam().first;
  // Each rank reports ready once its trap is set; the script then signals the launcher.
  const Outcome o = sh(R"("$COMET" launch -n 2 -- sh -c '
trap "echo got )" + sig + R"(; exit 7" )" + sig + R"(
sleep 60 &
echo $! > "$WORK/background.$RANK"
touch "$WORK/ready.$RANK"
wait' &
launcher=$!
i=0
while [ $i -lt 400 ] && ! { [ -e "$WORK/ready.0" ] && [ -e "$WORK/ready.1" ]; }; do sleep 0.05; i=$((i+1)); done
kill -)" + sig + R"( $launcher
wait $launcher)");
  EXPECT_EQ(o.code, 128 + GetParam().second) << shown(o);
  EXPECT_LT(o.seconds, kStopWithinS) << shown(o);
  EXPECT_EQ(count_of(o.out, "[rank 0] got " + sig + "\n"), 1u) << shown(o);
  EXPECT_EQ(count_of(o.out, "[rank 1] got " + sig + "\n"), 1u) << shown(o);
  EXPECT_EQ(count_of(o.err, "comet launch: error: interrupted by SIG" + sig + " (forwarded to every rank"), 1u)
      << shown(o);
  expect_leftovers_end("background.", 2, 5);
}

INSTANTIATE_TEST_SUITE_P(Signals, LaunchSignalTest,
                         ::testing::Values(std::make_pair("TERM", SIGTERM), std::make_pair("INT", SIGINT),
                                           std::make_pair("HUP", SIGHUP), std::make_pair("QUIT", SIGQUIT)),
                         [](const auto& info) { return std::string(info.param.first); });

// SIGKILL cannot be forwarded: the kernel kills each rank when the launcher dies.
TEST_F(LaunchTest, RanksDieWithAKilledLauncher) {
  const Outcome o = sh(R"("$COMET" launch -n 2 -- sh -c 'echo $$ > "$WORK/pid.$RANK"; exec sleep 60' &
launcher=$!
i=0
while [ $i -lt 400 ] && ! { [ -s "$WORK/pid.0" ] && [ -s "$WORK/pid.1" ]; }; do sleep 0.05; i=$((i+1)); done
sleep 0.2
kill -KILL $launcher
wait $launcher)");
  EXPECT_EQ(o.code, 128 + SIGKILL) << shown(o);
  for (int r = 0; r < 2; ++r) {
    std::string pid = read_text(work_ / ("pid." + std::to_string(r)));
    pid.erase(pid.find_last_not_of(" \n") + 1);
    ASSERT_FALSE(pid.empty());
    EXPECT_TRUE(process_ends_within(pid, 5)) << "rank " << r << " (" << pid << ") outlived the killed launcher";
  }
}

// A stuck reader does not hold off the timeout: the rank's output beyond what the pipe takes is
// dropped once it fires.
TEST_F(LaunchTest, StuckReaderDoesNotHoldOffTheTimeout) {
  const StuckReaderRun r = run_behind_stuck_reader(
      R"(-n 1 --timeout-s 1 -- sh -c 'head -c 4000000 /dev/zero | tr "\0" x; echo; sleep 60')");
  ASSERT_GE(r.ms, 0) << shown(r.shell);
  EXPECT_EQ(r.code, 124) << shown(r.shell);
  EXPECT_LT(r.ms, 6000) << "the launcher waited for the reader; " << shown(r.shell);
}

// Nor does it hold off the stop after a failed rank: rank 1 fails at once while rank 0's output
// fills the stuck reader's pipe, and rank 0 is stopped within seconds, not when the reader
// comes back (8 s).
TEST_F(LaunchTest, StuckReaderDoesNotHoldOffTheStopAfterAFailure) {
  const StuckReaderRun r = run_behind_stuck_reader(R"(-n 2 -- sh -c 'if [ "$RANK" = 1 ]; then sleep 0.5; exit 7; fi
    head -c 4000000 /dev/zero | tr "\0" x | fold -w 100; sleep 60')");
  ASSERT_GE(r.ms, 0) << shown(r.shell);
  EXPECT_EQ(r.code, 7) << shown(r.shell);
  EXPECT_LT(r.ms, 6000) << "the launcher waited for the reader; " << shown(r.shell);
  EXPECT_NE(r.shell.err.find("rank 1 exited with status 7 (stopping the other ranks)"), std::string::npos)
      << shown(r.shell);
}

// A script whose interpreter is missing fails with ENOENT like a missing command; the message
// tells them apart.
TEST_F(LaunchTest, MissingInterpreterIsNamed) {
  const Outcome o = sh(R"(printf '#!/comet-no-such-interpreter\necho hi\n' > "$WORK/script"
chmod +x "$WORK/script"
"$COMET" launch -n 1 -- "$WORK/script")");
  EXPECT_EQ(o.code, 2) << shown(o);
  EXPECT_NE(o.err.find("exists, but its interpreter (its #! line) or a library it needs was not found"),
            std::string::npos)
      << shown(o);
}

TEST_F(LaunchTest, ExecFailureIsOneErrorLineAndLeavesNothing) {
  const Outcome o = sh(R"(TMPDIR="$WORK" "$COMET" launch -n 3 -- comet-no-such-command --flag)");
  EXPECT_EQ(o.code, 2) << shown(o);
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "comet: error: launch: rank 0 cannot run \"comet-no-such-command\": command not found (searched PATH)\n");
  EXPECT_TRUE(leftover_launch_dirs().empty());
}

// A word before `--` that looks like an option but is not one of launch's (--timeout for
// --timeout-s) is refused by name; it was started as the command.
TEST_F(LaunchTest, UnknownLaunchOptionIsRefusedNotRun) {
  for (const char* options : {"-n 2 --timeout 5 --", "--timeout 5 -n 2 --", "-n 2 -x sh -c true"}) {
    const Outcome o = sh(std::string("TMPDIR=\"$WORK\" \"$COMET\" launch ") + options + " sh -c true");
    EXPECT_EQ(o.code, 2) << options << "\n" << shown(o);
    EXPECT_EQ(o.out, "");
    const std::string word = std::string(options).find("-x") != std::string::npos ? "-x" : "--timeout";
    EXPECT_EQ(o.err, "comet: error: unknown launch option \"" + word +
                         "\" (usage: comet launch -n N [--timeout-s S] -- <command> [args...])\n")
        << options;
    EXPECT_TRUE(leftover_launch_dirs().empty());
  }
  // After `--` a word starting with '-' is the command's, as before.
  const Outcome o = sh(R"("$COMET" launch -n 1 -- -comet-no-such-command)");
  EXPECT_EQ(o.code, 2) << shown(o);
  EXPECT_NE(o.err.find("cannot run \"-comet-no-such-command\": command not found"), std::string::npos) << shown(o);
}

TEST_F(LaunchTest, ProgramArgumentsAreNotParsed) {
  // After `--` (or from the first word that is not an option) everything is the program's,
  // including its own `--` and options that launch also has.
  const Outcome a = sh(R"("$COMET" launch -n 1 -- sh -c 'printf "%s\n" "$*"' zero -n 5 -- --timeout-s x)");
  ASSERT_EQ(a.code, 0) << shown(a);
  EXPECT_EQ(a.out, "[rank 0] -n 5 -- --timeout-s x\n");
  const Outcome b = sh(R"("$COMET" launch -n 1 sh -c 'printf "%s\n" "$*"' zero -n 5 -- --timeout-s x)");
  ASSERT_EQ(b.code, 0) << shown(b);
  EXPECT_EQ(b.out, "[rank 0] -n 5 -- --timeout-s x\n");
}

}  // namespace
