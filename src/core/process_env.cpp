// Reading the process environment (core/process_env.h).
#include "core/process_env.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <sstream>
#include <tuple>
#include <utility>

#include "comet/error.h"

namespace comet {

namespace {

using Getter = std::function<const char*(const char*)>;

// An unset and an empty variable mean the same: launchers export empty values at times.
std::optional<std::string> lookup(const Getter& get, const char* name) {
  const char* v = get(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& text, const char* name) {
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  COMET_CHECK(ec != std::errc::result_out_of_range, name << "=\"" << text << "\" is out of range");
  COMET_CHECK(ec == std::errc() && ptr == end, name << "=\"" << text << "\" is not a decimal integer");
  return value;
}

double parse_seconds(const std::string& text, const char* name) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  COMET_CHECK(ec == std::errc() && ptr == end && std::isfinite(value) && value > 0,
              name << "=\"" << text << "\" is not a positive number of seconds");
  return value;
}

// A pair of variables that must be set together. Returns nullopt when both are unset.
std::optional<std::pair<int, int>> read_pair(const Getter& get, const char* index_name, const char* size_name) {
  const auto index = lookup(get, index_name);
  const auto size = lookup(get, size_name);
  if (!index && !size) return std::nullopt;
  COMET_CHECK(index, size_name << " is set but " << index_name << " is not; a launcher sets both");
  COMET_CHECK(size, index_name << " is set but " << size_name << " is not; a launcher sets both");
  return std::pair{parse_int(*index, index_name), parse_int(*size, size_name)};
}

// Keeps a derived file name to [A-Za-z0-9._-]: run ids and host names are user text.
std::string file_name_part(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == '_';
    if (!ok) c = '_';
  }
  return out;
}

// torchrun has no file of ours: name one under /tmp from what identifies the run. Every
// rank of the run sees the same variables, so every rank derives the same name.
void derive_bootstrap_file(const Getter& get, long parent_pid, ProcessEnv& env) {
  const auto run_id = lookup(get, "TORCHELASTIC_RUN_ID");
  const auto addr = lookup(get, "MASTER_ADDR");
  const auto port = lookup(get, "MASTER_PORT");
  const auto restart = lookup(get, "TORCHELASTIC_RESTART_COUNT");
  if (!run_id && !(addr && port))
    throw NoBootstrapError(
        "RANK and WORLD_SIZE are set, but there is no way to meet the other ranks: set "
        "COMET_BOOTSTRAP_FILE to a path every rank can reach (`comet launch` does), or run under "
        "torchrun (which sets TORCHELASTIC_RUN_ID, MASTER_ADDR and MASTER_PORT)");
  // The user's id keeps runs of two users on one node apart (in a shared /tmp one could not
  // replace the other's file, and would read its id), and a batch job's id two jobs of one user
  // that export the same MASTER_PORT.
  std::string name = "/tmp/comet-bootstrap-uid-" + std::to_string(::getuid());
  std::ostringstream source;
  source << "derived from";
  const char* sep = " ";
  if (const auto job = lookup(get, "SLURM_JOB_ID")) {
    name += "-job-" + file_name_part(*job);
    source << sep << "SLURM_JOB_ID=" << *job;
    sep = ", ";
  }
  if (run_id) {
    // torchrun's agent starts every rank of the node: its pid separates runs that reuse a run
    // id and port ("none" and 29500 by default) from a file a killed earlier run left behind.
    // So every rank must be the agent's own child: a wrapper script must exec the program.
    name += "-run-" + file_name_part(*run_id) + "-agent-" + std::to_string(parent_pid);
    source << sep << "TORCHELASTIC_RUN_ID=" << *run_id << " (agent process " << parent_pid
           << ", this process's parent: a wrapper between torchrun and the program must exec it, or set "
              "COMET_BOOTSTRAP_FILE)";
    sep = ", ";
  }
  if (addr && port) {
    name += "-master-" + file_name_part(*addr) + "-" + file_name_part(*port);
    source << sep << "MASTER_ADDR=" << *addr << ", MASTER_PORT=" << *port;
    sep = ", ";
  }
  if (restart) {
    name += "-restart-" + file_name_part(*restart);
    source << sep << "TORCHELASTIC_RESTART_COUNT=" << *restart;
  }
  env.bootstrap_file = name + ".id";
  env.source = source.str();
}

}  // namespace

long parent_process_id() { return long(::getppid()); }

std::optional<ProcessEnv> read_process_env(const Getter& get, long parent_pid) {
  const auto global = read_pair(get, "RANK", "WORLD_SIZE");
  if (!global) return std::nullopt;
  ProcessEnv env;
  std::tie(env.rank, env.world) = *global;
  COMET_CHECK(env.world >= 1 && env.world <= kMaxProcessWorld,
              "WORLD_SIZE=" << env.world << " is outside [1, " << kMaxProcessWorld << "]");
  COMET_CHECK(env.rank >= 0 && env.rank < env.world,
              "RANK=" << env.rank << " is outside [0, WORLD_SIZE=" << env.world << ")");

  if (const auto local = read_pair(get, "LOCAL_RANK", "LOCAL_WORLD_SIZE")) {
    std::tie(env.local_rank, env.local_world) = *local;
    COMET_CHECK(env.local_world >= 1 && env.local_world <= env.world,
                "LOCAL_WORLD_SIZE=" << env.local_world << " is outside [1, WORLD_SIZE=" << env.world << "]");
    COMET_CHECK(env.local_rank >= 0 && env.local_rank < env.local_world,
                "LOCAL_RANK=" << env.local_rank << " is outside [0, LOCAL_WORLD_SIZE=" << env.local_world << ")");
  } else {
    env.local_rank = env.rank;  // one node: the global numbering is the local one
    env.local_world = env.world;
    env.local_rank_source = "RANK";
  }

  if (const auto timeout = lookup(get, "COMET_FABRIC_TIMEOUT_S"))
    env.timeout_s = parse_seconds(*timeout, "COMET_FABRIC_TIMEOUT_S");

  if (const auto file = lookup(get, "COMET_BOOTSTRAP_FILE")) {
    env.bootstrap_file = *file;
    env.source = "COMET_BOOTSTRAP_FILE";
  } else {
    derive_bootstrap_file(get, parent_pid, env);
  }
  return env;
}

}  // namespace comet
