// core/process_env.h: who this process is in a multi-process run (one process per GPU), read
// from the environment in one place.
//
// Launchers set the variables: `comet launch` (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// COMET_BOOTSTRAP_FILE) and torchrun (the same four, plus TORCHELASTIC_RUN_ID, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_RESTART_COUNT). The Nccl fabric uses the result
// (src/fabric/fabric.h); docs/fabric.md describes the bootstrap.
//
// Variables read (and only here):
//   RANK, WORLD_SIZE             required together; both unset means "not a multi-process run"
//   LOCAL_RANK, LOCAL_WORLD_SIZE required together; both unset means one node (= RANK, WORLD_SIZE)
//   COMET_BOOTSTRAP_FILE         where rank 0 publishes the communicator id for the others
//   TORCHELASTIC_RUN_ID, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT
//                                without COMET_BOOTSTRAP_FILE: the bootstrap file name under
//                                /tmp is derived from these (torchrun)
//   COMET_FABRIC_TIMEOUT_S       seconds any host-side wait for the other ranks may last
//                                (bootstrap file, communicator set-up, barriers); default 60
//
// Pitfall: the derived /tmp name must differ between runs that could overlap or leave a file
// behind; it includes the run id, master address and port and the restart count, and under
// torchrun (TORCHELASTIC_RUN_ID set) the parent process id: torchrun's agent, which starts every
// rank of a node, so a file that a killed earlier run left under the same run id and port is
// never read. Rank 0 deletes the file once every rank has joined, or when the join fails.
#pragma once

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "comet/config.h"
#include "comet/error.h"

namespace comet {

inline constexpr int kMaxProcessWorld = kMaxWorldSize;  // the most ranks a plan supports
inline constexpr double kDefaultFabricTimeoutS = 60.0;

struct ProcessEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;   // the GPU ordinal this process drives
  int local_world = 1;  // processes on this node
  // Where local_rank came from, for messages: "LOCAL_RANK", or "RANK" when LOCAL_RANK and
  // LOCAL_WORLD_SIZE are unset (one node).
  std::string local_rank_source = "LOCAL_RANK";
  std::string bootstrap_file;
  // Where the bootstrap file came from, for messages: "COMET_BOOTSTRAP_FILE" or
  // "derived from TORCHELASTIC_RUN_ID=..., MASTER_ADDR=..., ...".
  std::string source;
  double timeout_s = kDefaultFabricTimeoutS;
};

// RANK and WORLD_SIZE are set and valid, but nothing names a bootstrap file: neither
// COMET_BOOTSTRAP_FILE nor torchrun's variables. A process that only asks whether it is one rank
// of a launch tells this apart from a malformed value (which it should not run past).
class NoBootstrapError : public Error {
 public:
  explicit NoBootstrapError(const std::string& message) : Error(message) {}
};

// The id of the process that started this one (getppid()).
long parent_process_id();

// Reads the variables above through `get` (std::getenv by default; tests pass a fake) and, for
// a derived bootstrap file under torchrun, the parent process id `parent_pid`.
// Returns nullopt when RANK and WORLD_SIZE are both unset. Throws comet::Error naming the
// variable for a malformed or inconsistent value: not a decimal integer, only one of a pair
// set, WORLD_SIZE outside [1, 64], RANK outside [0, WORLD_SIZE), LOCAL_WORLD_SIZE outside
// [1, WORLD_SIZE], LOCAL_RANK outside [0, LOCAL_WORLD_SIZE), a timeout that is not a positive
// number; NoBootstrapError when no bootstrap file can be named (every other check passed).
std::optional<ProcessEnv> read_process_env(
    const std::function<const char*(const char*)>& get = [](const char* name) { return std::getenv(name); },
    long parent_pid = parent_process_id());

}  // namespace comet
