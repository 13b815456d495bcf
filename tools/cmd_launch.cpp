// tools/cmd_launch.cpp: `comet launch`, N processes of one command on this machine with the
// rank variables torchrun sets (the supervision itself is tools/launch.cpp).
//
//   comet launch -n 8 -- ./build/my_moe_program --tokens 4096
//   comet launch -n 2 --timeout-s 60 -- sh -c 'echo $RANK of $WORLD_SIZE'
//
// The command is everything after `--` (or from the first word that is not an option of
// launch), passed to the ranks untouched, so its own options never reach CLI11. Before `--`, a
// word that starts with '-' and is not launch's is refused as an unknown option.
#include <sstream>
#include <string>
#include <string_view>

#include "commands.h"
#include "launch.h"

namespace comet::tools {
namespace {

constexpr const char* kUsage = "usage: comet launch -n N [--timeout-s S] -- <command> [args...]";

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

CLI::App* add_launch_command(CLI::App& app, LaunchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "launch", "start N processes of a command with RANK, WORLD_SIZE, LOCAL_RANK set (one machine)");
  o.num_ranks_opt = cmd->add_option("-n,--nproc-per-node", o.num_ranks,
                                    "number of processes (ranks), 1 to " + std::to_string(kMaxLaunchRanks));
  o.timeout_opt = cmd->add_option("--timeout-s", o.timeout_s,
                                  "stop every rank and exit 124 when they have not all finished after S seconds");
  // The first word that is not an option ends parsing: the rest is the command and its args.
  cmd->prefix_command();
  cmd->footer(kUsage);
  return cmd;
}

int launch_parse_end(int argc, const char* const* argv) {
  if (argc < 2 || std::string_view(argv[1]) != "launch") return argc;
  for (int i = 2; i < argc; ++i)
    if (std::string_view(argv[i]) == "--") return i;
  return argc;
}

void set_launch_command(LaunchOptions& o, const CLI::App& launch_cmd, int argc, const char* const* argv,
                        int parse_end) {
  // Words CLI11 left over started the command before the `--` (prefix_command keeps them in
  // order); that `--` is then the program's own and stays in its arguments.
  o.command = launch_cmd.remaining();
  // The first word launch does not know ends its options, so a mistyped option (--timeout for
  // --timeout-s) would be started as the command; a command whose name starts with '-' can
  // still come after `--`.
  if (!o.command.empty() && o.command[0].starts_with('-'))
    throw UsageError("unknown launch option \"" + o.command[0] + "\" (" + kUsage + ")");
  if (parse_end >= argc) return;
  if (!o.command.empty()) o.command.emplace_back("--");
  for (int i = parse_end + 1; i < argc; ++i) o.command.emplace_back(argv[i]);
}

int launch_command(const LaunchOptions& o) {
  if (o.num_ranks_opt->count() == 0) throw UsageError("-n N, the number of ranks, is missing (" + std::string(kUsage) + ")");
  if (o.num_ranks < 1) throw UsageError("-n must be at least 1, not " + std::to_string(o.num_ranks));
  if (o.num_ranks > kMaxLaunchRanks)
    throw UsageError("-n " + std::to_string(o.num_ranks) + " is more than the " + std::to_string(kMaxLaunchRanks) +
                     " ranks launch starts on one machine");
  if (o.timeout_opt->count() && !(o.timeout_s > 0 && o.timeout_s <= kMaxLaunchTimeoutS))
    throw UsageError("--timeout-s must be a positive number of seconds (at most " + number_text(kMaxLaunchTimeoutS) +
                     "), not " + number_text(o.timeout_s));
  if (o.command.empty() || o.command[0].empty())
    throw UsageError("no command to run (" + std::string(kUsage) + ")");

  LaunchSpec spec;
  spec.num_ranks = o.num_ranks;
  spec.argv = o.command;
  spec.timeout_s = o.timeout_opt->count() ? o.timeout_s : 0;
  try {
    return launch_ranks(spec);
  } catch (const LaunchExecError& e) {
    throw UsageError(e.what());  // the command named is wrong: bad input
  }
}

}  // namespace comet::tools
