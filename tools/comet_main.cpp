// tools/comet_main.cpp: entry point of the `comet` command-line tool.
//
//   comet run  --model mixtral-8x7b --ep 8          (one verified MoE layer forward)
//   comet plan --model deepseek-v3 --ep 8 --rank 0  (dispatch plan and tile schedules)
//   comet bench gemm --models mixtral-8x7b          (grouped GEMM vs cuBLAS, needs a GPU)
//   comet bench layer --models mixtral-8x7b         (fused vs unfused vs compute-only, needs a GPU)
//   comet tune --models mixtral-8x7b --out tuning/nvidia-h200.json   (n_comm table, needs a GPU)
//   comet launch -n 4 -- ./my_program               (4 processes with RANK, WORLD_SIZE set)
//   comet run --help                                (every option of a subcommand)
//
// Every failure ends here as exactly one line `comet: error: <reason>` on stderr and an exit
// code: 2 for bad input (including CLI11's own parse errors, whose codes are remapped), 3 for a
// runtime failure such as a protocol timeout; 1 is reserved for a failed verification.
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "comet/error.h"
#include "commands.h"

#ifndef COMET_VERSION
#define COMET_VERSION "unknown"
#endif

namespace {

int fail(int code, const std::string& message) {
  std::cout.flush();
  std::cerr << "comet: error: " << comet::tools::one_line(message) << "\n";
  return code;
}

// The first word of argv[1, argc) that names no subcommand where one is expected ("comet ru",
// "comet bench foo"), as a message; empty when there is none. CLI11 would report either as "A
// subcommand is required".
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path;  // the commands before the word ("bench")
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const std::vector<CLI::App*> subs = at->get_subcommands([](CLI::App*) { return true; });
    if (word.empty() || subs.empty()) return "";  // a command's own options: CLI11's to judge
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* s : subs) {
      if (s->get_name() == word) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (word[0] == '-') {
      // Where a command is expected, only --help and --version are options ("comet --bogus" was
      // reported as "A subcommand is required").
      if (at->get_option_no_throw(word.substr(0, word.find('='))) != nullptr) return "";
      return "unknown option \"" + word + "\" where a command is expected (" + (path.empty() ? "" : path + "takes ") +
             "one of " + names + ")";
    }
    if (next == nullptr)
      return "unknown command \"" + path + word + "\" (" + (path.empty() ? "" : path + "takes ") + "one of " + names + ")";
    at = next;
    path += word + " ";
  }
  return "";
}

// Two of CLI11's messages in this tool's words: an option given twice ("--ep: At Most 1
// required but received 2"), and arguments nothing took, named in the order given (CLI11's
// message lists them last one first).
std::string parse_error_message(const CLI::App& app, const std::string& what) {
  const std::string twice = ": At Most 1 required but received ";
  if (const size_t at = what.find(twice); at != std::string::npos)
    return what.substr(0, at) + ": given " + what.substr(at + twice.size()) + " times; give it once";
  if (what.rfind("The following argument", 0) == 0) {
    const std::vector<std::string> left = app.remaining(true);
    if (!left.empty()) {
      std::string joined;
      for (const std::string& w : left)
        joined += (joined.empty() ? "" : " ") + (w.empty() || w.find(' ') != std::string::npos ? "\"" + w + "\"" : w);
      return "unexpected argument" + std::string(left.size() == 1 ? "" : "s") + ": " + joined;
    }
  }
  return what;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace comet::tools;
  CLI::App app{"comet: fine-grained computation/communication overlap for MoE layers"};
  app.name("comet");
  app.set_version_flag("--version", std::string("comet ") + COMET_VERSION);
  app.require_subcommand(1);
  RunOptions run_options;
  PlanOptions plan_options;
  CLI::App* run_cmd = add_run_command(app, run_options);
  CLI::App* plan_cmd = add_plan_command(app, plan_options);
  BenchOptions bench_options;
  BenchLayerOptions bench_layer_options;
  CLI::App* bench_gemm_cmd = nullptr;
  CLI::App* bench_layer_cmd = nullptr;
  add_bench_command(app, bench_options, &bench_gemm_cmd, bench_layer_options, &bench_layer_cmd);
  TuneOptions tune_options;
  CLI::App* tune_cmd = add_tune_command(app, tune_options);
  LaunchOptions launch_options;
  CLI::App* launch_cmd = add_launch_command(app, launch_options);
  read_integers_as_decimal(app);

  const int parse_end = launch_parse_end(argc, argv);
  try {
    refuse_empty_list_items(app, parse_end, argv);
  } catch (const UsageError& e) {
    return fail(kExitUsage, e.what());
  }
  try {
    app.parse(parse_end, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const std::string unknown = unknown_command(app, parse_end, argv);
    return fail(kExitUsage, (unknown.empty() ? parse_error_message(app, e.what()) : unknown) + " (see comet --help)");
  }

  // What a command printed must reach its standard output (`comet run --json > run.json` on a
  // full disk exited 0 with a truncated file): a failed write is a failed command.
  const auto flushed = [](int code) {
    std::cout.flush();
    if (!std::cout) {
      const int failed = fail(kExitRuntime, "could not write the standard output");
      return code != 0 ? code : failed;
    }
    return code;
  };
  try {
    if (run_cmd->parsed()) return flushed(run_command(run_options));
    if (plan_cmd->parsed()) return flushed(plan_command(plan_options));
    if (bench_gemm_cmd->parsed()) return flushed(bench_gemm_command(bench_options));
    if (bench_layer_cmd->parsed()) return flushed(bench_layer_command(bench_layer_options));
    if (tune_cmd->parsed()) return flushed(tune_command(tune_options));
    if (launch_cmd->parsed()) {
      set_launch_command(launch_options, *launch_cmd, argc, argv, parse_end);
      return launch_command(launch_options);
    }
    return fail(kExitUsage, "no subcommand (see comet --help)");
  } catch (const UsageError& e) {
    return fail(kExitUsage, e.what());
  } catch (const comet::TimeoutError& e) {
    return fail(kExitRuntime, std::string("protocol timeout: ") + user_message(e.what()));
  } catch (const comet::Error& e) {
    return fail(kExitRuntime, user_message(e.what()));
  } catch (const std::exception& e) {
    return fail(kExitRuntime, std::string("unexpected failure: ") + e.what());
  }
}
