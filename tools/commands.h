// tools/commands.h: the `comet` subcommands. Each registers its options on the CLI11 app and
// runs from the parsed options, returning the process exit code (tools/cli_common.h).
//
//   comet run  --model mixtral-8x7b --ep 8
//   comet plan --model deepseek-v3 --ep 8 --rank 3
//   comet launch -n 4 -- ./my_program --flag
//
// Bad input throws UsageError; main() turns it (and any other exception) into one line on
// stderr and an exit code, so no subcommand prints errors itself.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "comet/link_emulation.h"

namespace comet::tools {

struct RunOptions {
  WorkloadOptions workload;
  std::string backend = "auto";
  std::string fabric = "loopback";  // cuda: loopback, local or nccl (docs/fabric.md)
  bool fused = false;               // cuda: the fused Comet kernels instead of the unfused pipeline
  int comm_workers = 2;
  int compute_workers = 2;
  int chunk_tokens = 16;
  int layer0_stages = 0;  // stages of the layer0 tile order (0 chooses)
  int timeout_ms = 5000;
  double cpu_budget_gflop = 0;    // CPU work of one forward before scaling; 0: the library's
  std::string gpu = "H200";       // the GPU the full-size lower bound is computed for
  std::string save;
  std::string trace;  // Chrome trace JSON path; an SVG timeline is written beside it
  std::string emulate_link;  // cuda backend: GBPS[,LATENCY_US] (comet/link_emulation.h); empty: off
  bool json = false;
  // Options only the CPU backend uses (--comm-workers, --compute-workers, --chunk-tokens): a run
  // on the CUDA backend refuses them when given rather than ignoring them.
  std::vector<CLI::Option*> cpu_only;
};
CLI::App* add_run_command(CLI::App& app, RunOptions& options);
int run_command(const RunOptions& options);

struct PlanOptions {
  WorkloadOptions workload;
  int rank = 0;
  int max_lines = 40;
  int chunk_tokens = 16;
  int layer0_stages = 0;  // 0: one per ring position (the CPU backend's order)
  bool json = false;
};
CLI::App* add_plan_command(CLI::App& app, PlanOptions& options);
int plan_command(const PlanOptions& options);

// comet bench gemm: the grouped GEMM against cuBLAS (bench/gemm_bench.h). Needs a build with
// CUDA and a GPU; otherwise it fails with a clear message.
struct BenchOptions {
  std::vector<std::string> models;  // empty: every preset
  std::vector<int> tokens{2048, 4096, 8192};
  int ep = 8;
  int iters = 20;
  double warmup_ms = 300;
  uint64_t seed = 1;
  bool json = false;
};
// comet bench layer: the MoE layer at full size on one GPU, W virtual ranks (bench/layer_bench.h).
struct BenchLayerOptions {
  std::vector<std::string> models;
  std::vector<int> tokens{1024, 4096, 8192};
  int ep = 8, tp = 1;
  CLI::Option* ep_opt = nullptr;      // --ep and --tp: refused beside --layouts rather than ignored
  CLI::Option* tp_opt = nullptr;
  std::vector<std::string> layouts;   // "EPxTP" swept instead of --ep/--tp
  std::vector<std::string> routings;  // routing generators swept (default: uniform)
  std::vector<int> n_comm0{0}, n_comm1{0}, layer0_group_m{0}, layer0_stages{0};  // swept lists
  std::string tuning_file;                                      // comet tune's table, optional
  int iters = 20;
  double warmup_ms = 300;
  uint64_t seed = 1;
  std::vector<int> chunks{2, 4};  // chunked baseline: the fastest of these chunk counts
  CLI::Option* chunks_opt = nullptr;  // refused beside --no-baselines rather than ignored
  std::string emulate_link;       // GBPS[,LATENCY_US] (comet/link_emulation.h); empty: off
  bool no_baselines = false;
  std::vector<std::string> dispatch_orders{"auto"};  // each auto | ring | rows (LayerOptions::dispatch_order), swept
  std::vector<std::string> layer0_copies{"auto"};    // each auto | blocks | gemm (LayerOptions::layer0_copies), swept
  std::vector<std::string> unfused_gemms{"fused"};  // each fused | auto (LayerOptions::unfused_gemms), swept
  std::vector<std::string> epilogue_combine{"on"};  // each on | off (LayerOptions::epilogue_combine), swept
  std::vector<std::string> layer1_combine{"auto"};    // each auto | blocks | gemm (LayerOptions::layer1_combine), swept
  std::vector<std::string> split_gemms{"auto"};       // each auto | on | off (LayerOptions::split_gemms), swept
  bool json = false;
  std::string fabric = "loopback";  // loopback, local or nccl (bench/layer_bench.h)
  std::string trace;                // timeline of one traced fused forward per row (FILE.json + FILE.svg)
  std::vector<int> trace_ranks{0};  // ranks drawn in the SVG
  CLI::Option* trace_ranks_opt = nullptr;  // refused without --trace rather than ignored
};
// --emulate-link's value (empty: off); UsageError naming the option for a bad one.
LinkEmulation parse_emulate_link_option(const std::string& value);
// Presets, token counts and (EP, TP) layouts of a GPU command, every model with every layout
// (UsageError naming the option and the reason, before any GPU work), then that a GPU is there
// (UsageError naming `command`). No layouts: only models and tokens. `ranks_run`: the command runs
// the layout's ranks, which LayerConfig::validate() must accept (at most kMaxRanks of them);
// false (bench gemm times rank 0's expert shapes only): each E divisible by EP is all.
void check_bench_inputs(const std::vector<std::string>& models, const std::vector<int>& tokens,
                        const std::string& command, const std::vector<std::pair<int, int>>& layouts = {},
                        bool ranks_run = true);

// comet tune: n_comm sweep -> tuning table (tools/cmd_tune.cpp). Needs a GPU.
struct TuneOptions {
  std::vector<std::string> models;
  std::vector<int> tokens{1024, 4096, 8192};
  int ep = 8, tp = 1;
  // With claimed tiles, layer0 blocks return to the GEMM after the dispatch, so larger n_comm0
  // are cheap (docs/results/2026-11-29-claimed-tiles-h200.md, W = 8: 32 within 0.6% of the best
  // n_comm0 tried, for every preset).
  std::vector<int> n_comm0{8, 16, 32, 64}, n_comm1{2, 8};
  // Layer0 modes and layer1 combines swept with them (comet/layer0_mode.h,
  // comet/layer1_combine.h); with gemm copies n_comm0 is unused, with the gemm combine n_comm1.
  std::vector<std::string> layer0_copies{"blocks", "gemm"}, dispatch_orders{"ring", "rows"};
  std::vector<std::string> layer1_combine{"blocks", "gemm"};
  int iters = 10;
  bool rows = false;                // print every candidate's row, not only the winners
  std::string fabric = "loopback";  // entries record the GPUs the ranks ran on (TuningKey::gpus)
  std::string out;
};
CLI::App* add_tune_command(CLI::App& app, TuneOptions& options);
int tune_command(const TuneOptions& options);

CLI::App* add_bench_command(CLI::App& app, BenchOptions& options, CLI::App** gemm, BenchLayerOptions& layer_options,
                            CLI::App** layer);
int bench_gemm_command(const BenchOptions& options);
int bench_layer_command(const BenchLayerOptions& options);

// comet launch: N processes of one command with RANK, WORLD_SIZE, ... set (tools/launch.h).
// The command is what follows launch's options: after `--`, or from the first word that is not
// an option (a word before `--` that starts with '-' but is not one of launch's options is
// refused: a mistyped option is not a command). CLI11 hands a subcommand's `--` back to the
// parent app, which would reject the words after it, so main() parses only argv[0,
// launch_parse_end) and set_launch_command collects the command from what CLI11 left over plus
// the words after that `--` (UsageError for the unknown option).
struct LaunchOptions {
  int num_ranks = 0;
  double timeout_s = 0;
  CLI::Option* num_ranks_opt = nullptr;
  CLI::Option* timeout_opt = nullptr;
  std::vector<std::string> command;
};
CLI::App* add_launch_command(CLI::App& app, LaunchOptions& options);
int launch_parse_end(int argc, const char* const* argv);  // argc, or the index of launch's `--`
void set_launch_command(LaunchOptions& options, const CLI::App& launch_cmd, int argc,
                        const char* const* argv, int parse_end);
int launch_command(const LaunchOptions& options);

}  // namespace comet::tools
