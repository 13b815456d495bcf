// tools/cli_common.h: what every `comet` subcommand shares: the workload options (model shape,
// parallel layout, tokens, routing, dtype, seed), their validation into a LayerConfig, the
// exit codes, and the error type for bad input.
//
//   comet run  --model deepseek-v3 --ep 4 --tp 2 --tokens 64 --routing zipf:1.2
//   comet plan --hidden 1024 --ffn 2048 --experts 16 --topk 2 --ep 4 --tokens 128,0,64,32
//
// Every problem with the command line becomes a UsageError whose message is one line naming
// the option and the reason; main() prints it as `comet: error: <reason>` and exits 2.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "comet/config.h"
#include "comet/layer0_mode.h"
#include "comet/layer1_combine.h"
#include "comet/routing.h"
#include "comet/tuning.h"

namespace comet::tools {

// The largest workloads the CLI accepts (UsageError beyond them).
inline constexpr int kMaxTokensPerRank = 65536;
inline constexpr int kMaxRanks = kMaxWorldSize;  // LayerConfig::validate()'s bound
// Routing slots of a workload, W x tokens per rank x topk: the full-size plan holds all of them,
// and the two caps above still allow 64 x 65536 x topk (topk 64: 2^28 slots, over 10 GB). At
// this cap a plan takes about 1 GB at TP 1 (each slot is a row on every TP rank of its expert,
// so TP multiplies the rows); the documented workloads have at most 2^18 slots.
inline constexpr int64_t kMaxRoutingSlots = int64_t(1) << 24;
// Expert rows of a workload, routing slots x TP: the rows the plan holds. At the slot cap with
// TP 1 the plan took 1.3 GB, with EP 8 x TP 8 3.7 GB, with TP 64 about 20 GB (deepseek-v3, EP 1 x
// TP 64 at 32768 tokens per rank, which the slot cap alone let through); this cap allows TP 4 at
// the slot cap.
inline constexpr int64_t kMaxExpertRows = int64_t(1) << 26;
// The largest `run --cpu-budget-gflop` (hours of CPU work per forward).
inline constexpr double kMaxCpuBudgetGflop = 1e6;
// The largest --block-m: each expert segment is padded to a whole M tile.
inline constexpr int kMaxBlockM = 4096;
// Routing slots x E: generating the routing walks the E expert loads for every slot
// (core/routing.cpp), which the slot cap alone left at up to 2^40 steps (--experts 65536 --topk
// 64 --ep 64). At this cap every preset still runs at the slot cap (deepseek-v3: 2^24 x 256),
// in seconds.
inline constexpr int64_t kMaxRoutingWork = int64_t(1) << 32;
// W x W x E / EP: the plan keeps a row count per (src rank, dst rank, local expert), and
// `comet plan` a copy of them; --experts 65536 --ep 1 --tp 64 asked for 2^28 of them (1 GB) for
// one token per rank. Every preset at every layout of up to 64 ranks needs at most 2^20
// (deepseek-v3 at EP 1 x TP 64); at this cap the counts take 16 MB, and `comet plan`'s copy 32 MB.
inline constexpr int64_t kMaxPlanCounts = int64_t(1) << 22;

// --n-comm0/--n-comm1 (bench layer, tune): more than any GPU's SMs (H200: 132); MoeLayer then
// refuses what the GPU at hand cannot run.
inline constexpr int kMaxCommBlocks = 1024;
// Worker threads of a `comet run` on the cpu backend, W x (comm + compute): 64 ranks x 2 x 32.
inline constexpr int64_t kMaxWorkerThreads = 4096;

// --n-comm0/--n-comm1 values (bench layer, tune) against the GPU at hand: the fused kernels
// need an SM for the GEMM, so each value must be below `num_sms` (MoeLayer refuses the others
// when the sweep reaches them, after the rows before them ran). UsageError naming the option
// and the value; `gpu` names the GPU in it.
void check_comm_blocks(const std::vector<int>& n_comm0, const std::vector<int>& n_comm1, int num_sms,
                       const std::string& gpu);

// Exit codes of every subcommand (documented in docs/cli.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitVerifyFailed = 1;  // ran, but the output does not match the oracle
inline constexpr int kExitUsage = 2;         // bad option, impossible configuration
inline constexpr int kExitRuntime = 3;       // a protocol timeout, an I/O error, a library bug

// Bad command-line input. The message is one line a user can act on.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

// comet::Error messages from COMET_CHECK end in " (check `cond` failed at file:line)"; that
// helps a developer, but a user (of a wrong option or of a run that failed) needs only the reason.
std::string user_message(const std::string& what);
// Newlines folded into "; " so that an error is always exactly one line.
std::string one_line(const std::string& text);
// An output file option (`option` FILE): its directory must exist and it must not be a
// directory, so that a typo fails before the run, not after it; a look-up that fails for
// another reason than a missing file (a name too long, a loop of symbolic links) is refused
// with the system's reason. UsageError naming the option and the path. An empty path is no file.
void check_output_path(const std::string& path, const std::string& option);
// An output that replace_file writes to `path`.tmp and then renames over `path` (tune --out,
// run --save): `path`.tmp must be creatable now, so that a sweep of minutes does not end in a
// write that fails. UsageError naming the option, the file and the reason otherwise; leaves
// nothing behind that was not there. Nothing to check for a device (/dev/null), which
// replace_file writes in place.
void check_replaceable_output(const std::string& path, const std::string& option);
// The tuning table at `path` that `option` names (bench layer --tuning, an existing tune
// --out): one that cannot be read or is malformed is bad input, a UsageError naming the option.
TuningTable load_tuning_option(const std::string& path, const std::string& option);
// --trace FILE.json (run, bench layer): FILE.json and the FILE.svg written beside it
// (io::trace_svg_path) both pass check_output_path, and a path ending in .svg is refused (the
// JSON would be written there and the picture to FILE.svg.svg). `written` is the JSON path the
// command writes when it differs from `path` (a -rank<r> suffix); empty: `path`.
void check_trace_path(const std::string& path, const std::string& written = "");
// Whether two paths name the same file (after resolving ".", ".." and symbolic links of the
// parts that exist).
bool same_file(const std::string& a, const std::string& b);

// A check that a number option is within [min, max]. CLI::Range(double, double) prints its
// bounds with std::to_string ("0.000000"), and CLI::NonNegativeNumber's upper bound is DBL_MAX
// in 309 digits; this prints them as %g ("--warmup-ms: Value -1 not in range 0 to 60000").
// Integer options take CLI::Range(int, int), which prints integers as they are.
CLI::Validator number_range(double min, double max);
// For unsigned options (--seed): CLI11 would read "-1" as 2^64 - 1, clamp a larger value to it
// and read "" as 0; each is refused instead (a decimal integer within [0, 2^64 - 1]).
CLI::Validator non_negative_integer();
// A file path given on the command line: an empty one (`--save ""`) is refused, not read as
// "no file".
CLI::Validator file_path();
// For string options whose empty value would read as "not given" (--emulate-link "" ran
// unpaced): refused as "an empty value is not <what>"; `type_name` is the help's.
CLI::Validator non_empty(const std::string& what, const std::string& type_name = "");
// Makes every integer option of `app` and its subcommands read its value in decimal. CLI11
// parses with base 0, so "--tp 010" was 8 and "--ep 0x8" was 8; a leading zero now reads as
// decimal ("010" is 10, as --tokens reads it) and a 0x, 0b or 0o prefix is refused by name, as
// is an empty value (CLI11 reads it as 0).
void read_integers_as_decimal(CLI::App& app);
// Throws UsageError naming the option where a comma list value (an option with delimiter ',')
// of the subcommand argv names has an empty item ("--tokens 1,,2", "--models a,"): CLI11 drops
// empty items before any check sees them. Only that subcommand's list options are checked
// (`comet launch -n 1 prog --tokens 1,,2` passes the program's words on as they are).
// argv[1..argc) as the command line has them.
void refuse_empty_list_items(const CLI::App& app, int argc, const char* const* argv);

// --fabric loopback|local|nccl for the GPU commands that measure (bench layer, tune); with nccl,
// one process per rank under `comet launch`, and rank 0 speaks for the run.
void add_fabric_option(CLI::App& app, std::string& fabric);
// Whether this process is a rank other than 0 of a `--fabric nccl` run (it measures, it does
// not print or write).
bool quiet_rank(const std::string& fabric);

// --copies0 and --order0 (bench layer, tune): how the fused layer0 moves rows, swept lists of
// names; "auto" leaves the choice to MoeLayer (its tuning table). The lists as options.
void add_layer0_mode_options(CLI::App& app, std::vector<std::string>& copies, std::vector<std::string>& orders);
std::vector<std::optional<Layer0Copies>> layer0_copies_list(const std::vector<std::string>& names);
// --combine1 (auto | blocks | gemm, comma separated; LayerOptions::layer1_combine, auto: unset).
void add_layer1_combine_option(CLI::App& app, std::vector<std::string>& combine);
std::vector<std::optional<Layer1Combine>> layer1_combine_list(const std::vector<std::string>& names);
std::vector<std::optional<DispatchOrder>> dispatch_orders_list(const std::vector<std::string>& names);

// A --routing value (uniform, zipf:S, imbalance:STD); UsageError "--routing: ..." otherwise.
RoutingSpec parse_routing_option(const std::string& text);

struct WorkloadOptions {
  std::string model = "mixtral-8x7b";
  int hidden = 0;
  int ffn = 0;
  int experts = 0;
  int topk = 0;
  std::string activation = "swiglu";
  std::string tokens = "4096";  // per rank: one value for all ranks, or W comma-separated
  int ep = 8;
  int tp = 1;
  std::string routing = "uniform";
  double mask_fraction = 0.0;
  std::string dtype = "bf16";
  uint64_t seed = 1;
  int block_m = 0;  // only when given: the subcommands have different default tile shapes
  int block_n0 = 0;
  int block_n1 = 0;

  // Which of the options were given (set by add_workload_options, read after parsing).
  CLI::Option* model_opt = nullptr;
  std::vector<CLI::Option*> shape_opts;  // --hidden --ffn --experts --topk --activation
  std::vector<CLI::Option*> tile_opts;   // --block-m --block-n0 --block-n1
};

// `default_tiles` only labels the help text; build_workload applies it.
void add_workload_options(CLI::App& app, WorkloadOptions& options, const TileConfig& default_tiles);

// The validated workload at its requested (full) size.
struct Workload {
  LayerConfig config;                // T_max = the largest requested tokens per rank
  std::vector<int> tokens_per_rank;  // W entries
  RoutingSpec routing;
  uint64_t seed = 1;
};

// Throws UsageError naming the option at fault. `default_tiles` fills the block sizes not
// given on the command line.
Workload build_workload(const WorkloadOptions& options, const TileConfig& default_tiles);

// Routing of every rank at the workload's size: generate_routing(spec, T_r, E, topk, seed, r).
std::vector<Routing> generate_all_routing(const Workload& workload);

// "1,2,4,8": the divisors of n, for messages that suggest valid values.
std::string divisors_text(int n);

}  // namespace comet::tools
