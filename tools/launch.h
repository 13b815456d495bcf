// tools/launch.h: starts N processes of one command on this machine, one per rank, and
// supervises them (what `comet launch` runs; docs/cli.md).
//
//   comet launch -n 8 -- ./build/my_moe_program --tokens 4096
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (the names torchrun sets),
// COMET_BOOTSTRAP_FILE (a path in a private temporary directory, the same for every rank, the
// file not created; the directory is removed when launch_ranks returns) and, when they are not
// set already, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT. The ranks' stdout and stderr come
// back line by line behind `[rank i] `; a rank that fails, a timeout or a SIGINT/SIGTERM to this
// process stops every rank.
//
// Assumptions: POSIX (Linux), and a single-threaded caller: launch_ranks installs handlers for
// SIGCHLD, SIGINT, SIGTERM and ignores SIGPIPE while it runs (restoring them on return), so only
// one launch may run in a process at a time. Each rank runs in its own process group, so a stop
// reaches the processes a rank started too; its stdin is /dev/null (a rank outside the
// terminal's foreground group that read the terminal would stop, not fail).
#pragma once

#include <string>
#include <vector>

#include "comet/error.h"

namespace comet::tools {

inline constexpr int kMaxLaunchRanks = 64;
inline constexpr int kLaunchExitTimeout = 124;  // the exit code of timeout(1)
inline constexpr double kMaxLaunchTimeoutS = 1e8;  // about 3 years; keeps deadlines in range

struct LaunchSpec {
  int num_ranks = 1;              // 1..kMaxLaunchRanks
  std::vector<std::string> argv;  // argv[0] is looked up on PATH when it has no '/'
  double timeout_s = 0;           // > 0: stop every rank after this long; 0: no limit
  double grace_s = 3;             // between the polite signal of a stop and SIGKILL
};

// A rank's program could not be started (not found, not executable): bad input, reported
// before any rank runs (ranks already started are killed).
class LaunchExecError : public Error {
 public:
  explicit LaunchExecError(const std::string& message) : Error(message) {}
};

// Runs the ranks to the end and returns the exit code for the launcher:
//   0              every rank exited with status 0 (what they left running in their process
//                  groups was sent SIGTERM, and SIGKILL after grace_s if it was still there);
//   S              the first rank to fail exited with status S (128 + signal when a signal
//                  killed it); the others were sent SIGTERM, then SIGKILL after grace_s;
//   124            timeout_s ran out (the ranks still running were stopped the same way);
//   128 + signal   this process got SIGINT or SIGTERM, which was forwarded to every rank
//                  (a second one sends SIGKILL at once).
// Each of the failure cases prints one line `comet launch: error: ...` on stderr first.
// Throws LaunchExecError (see above) and comet::Error when the system refuses a resource
// (fork, pipe, temporary directory); no rank is left running either way.
int launch_ranks(const LaunchSpec& spec);

// "SIGTERM", or "signal 42" for one without a short name here.
std::string signal_name(int sig);

}  // namespace comet::tools
