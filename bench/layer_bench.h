// bench/layer_bench.h: `comet bench layer`: one MoE layer forward at full size, W ranks on the
// chosen fabric (W virtual ranks on one GPU by default): the fused Comet kernels, the unfused
// pipeline, the two grouped GEMMs alone (compute-only: data in place, no waits) and the
// dispatch + combine copies alone (communication-only). On one GPU communication is a local
// copy, so fused / compute-only measures what communication blocks, waits and signals cost on
// top of pure compute. With baselines on (the default), the same run also times the two
// baselines of DESIGN §6 (comet/baseline.h, docs/baselines.md) on the same kind of fabric with
// MoeLayer's weights and the same inputs: sequential (Megatron-style) and chunk-pipelined
// (FasterMoE/Tutel-style, the fastest of `chunks`), each verified against the unfused output
// first; the cuBLAS variant (per-expert loop or grouped) is the faster of a short timing.
// Consecutive timed forwards take two input sets in turn (the same routing, other tokens; the
// checks use the first).
// With `link` on, every inter-rank copy of Comet and the baselines is paced to that emulated
// link (docs/link_emulation.md), so the ratios approximate a node of real GPUs.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comet/layer.h"
#include "comet/link_emulation.h"
#include "comet/routing.h"
#include "comet/tuning.h"
#include "core/bench_metrics.h"

namespace comet::bench {

struct LayerBenchOptions {
  std::vector<std::string> models;             // empty: every preset
  std::vector<int> tokens{1024, 4096, 8192};   // tokens per rank
  int ep = 8, tp = 1;                          // W = ep * tp ranks
  std::vector<std::pair<int, int>> layouts;    // (EP, TP) swept; empty: {(ep, tp)}
  std::vector<RoutingSpec> routings{RoutingSpec{}};  // routing generators swept (default uniform)
  // Each list is swept (every combination is one row); 0: MoeLayer chooses (tuning table or
  // cost model for n_comm, its default for the raster group).
  std::vector<int> n_comm0{0}, n_comm1{0}, layer0_group_m{0}, layer0_stages{0};
  TuningTable tuning;  // what n_comm 0 looks up first (comet tune)
  int iters = 20;
  double warmup_ms = 300;
  uint64_t seed = 1;
  bool baselines = true;
  // The unfused forward's and compute-only's GEMMs (LayerOptions::unfused_gemms), swept: one row
  // each, so `fused,auto` times both on the same workload in one run.
  std::vector<UnfusedGemms> unfused_gemms{UnfusedGemms::kFusedSchedule};
  // How the fused layer0 moves rows (LayerOptions::layer0_copies, dispatch_order), swept: one
  // row each; unset: MoeLayer chooses (tuning table, else communication blocks in ring order).
  // With copies in the GEMM blocks n_comm0 is unused, so only the first n_comm0 gets a row.
  std::vector<std::optional<Layer0Copies>> layer0_copies{std::nullopt};
  std::vector<std::optional<DispatchOrder>> dispatch_orders{std::nullopt};
  // LayerOptions::epilogue_combine of the fused and unfused forwards, swept: one row each.
  std::vector<bool> epilogue_combine{true};
  // LayerOptions::split_gemms of the unfused forward and compute-only, swept: one row each;
  // unset: MoeLayer's default (the GEMMs that would split at T_max).
  std::vector<std::optional<bool>> split_gemms{std::nullopt};
  // LayerOptions::layer1_combine of the fused and unfused forwards (and so of compute-only's
  // GEMM1), swept: one row each; unset: MoeLayer chooses (tuning table, else communication
  // blocks). With the combine in the GEMM blocks n_comm1 is unused, so only the first n_comm1
  // gets a row.
  std::vector<std::optional<Layer1Combine>> layer1_combine{std::nullopt};
  std::vector<int> chunks{2, 4};               // chunk counts tried for the chunked baseline
  // loopback: W virtual ranks on one GPU; local: the ranks over the visible GPUs in this process; nccl: this
  // process's rank of a `comet launch` run (fabric::make_fabric). With several processes each
  // times its own rank's stream (the forward's barriers keep the ranks in step) and the warm-up
  // is a fixed number of rounds, so that every rank runs the same sequence of forwards.
  std::string fabric = "loopback";
  // Non-empty: after a row is timed, one more fused forward with LayerOptions::trace writes its
  // timeline (io/trace_writers.h) to this path, or, when the run has several rows, to the path
  // with the row's parameters before ".json" (docs/cli.md, "--trace"). The SVG draws
  // `trace_ranks` (empty: every rank); the JSON holds every rank.
  std::string trace_path;
  std::vector<int> trace_ranks{0};
  LinkEmulation link;                          // off: inter-rank copies are local copies
};

// "fused" or "auto": LayerOptions::unfused_gemms as `--unfused-gemms` and the tables name it.
inline const char* unfused_gemms_name(UnfusedGemms g) { return g == UnfusedGemms::kAuto ? "auto" : "fused"; }
// A switch as `--epilogue-combine` spells it (the table column `ec`, trace file names).
inline const char* on_off(bool on) { return on ? "on" : "off"; }

struct LayerBenchRow {
  std::string model;
  std::string routing;  // RoutingSpec::describe()
  std::string fabric;  // LayerBenchOptions::fabric
  int rank = 0;        // the rank whose stream was timed (nccl: this process's)
  int tokens = 0, world = 0, ep = 0, tp = 0;
  int n_comm0 = 0, n_comm1 = 0, layer0_group_m = 0;  // 0: MoeLayer's default group
  int layer0_stages = 0;                              // 0: MoeLayer's default
  UnfusedGemms unfused_gemms = UnfusedGemms::kFusedSchedule;  // of the unfused and compute-only times
  Layer0Mode layer0;  // how the fused forward's layer0 moved rows (as MoeLayer resolved it)
  bool epilogue_combine = true;  // LayerOptions::epilogue_combine of both forwards
  Layer1Combine layer1_combine = Layer1Combine::kCommBlocks;  // of both forwards (as MoeLayer resolved it)
  bool half_tiles = true;  // the GEMMs' (MoeLayer::half_tiles(), of both forwards)
  // The unfused GEMMs that build split schedules (MoeLayer::split_gemms: "-", "0", "1" or "01"),
  // and whether that unfused output is within the bf16 tolerance of the unsplit one.
  std::string split_gemms = "-";
  bool split_within_tolerance = true;
  std::string n_comm_source;
  double flop = 0;  // both GEMMs, all ranks
  double fused_us = 0, unfused_us = 0, compute_us = 0, comm_us = 0;
  double plan_us = 0;  // the device plan kernels alone (part of every forward)
  double fused_gemms_us = 0;  // the fused kernels with idle comm blocks and no waits (Part::kFusedGemms)
  // Bitwise, all ranks' outputs, each forward into poisoned y: the fused output equals the
  // workload's unfused one (default GEMMs, unsplit), and so does this row's unfused output when
  // its unfused_gemms is not the default (unsplit too; split_within_tolerance checks the split).
  bool fused_equals_unfused = false;
  double fused_over_compute() const { return fused_us / compute_us; }
  // Per GPU: `flop` counts every rank, spread over world / ranks_per_gpu GPUs (one on the
  // loopback fabric), so that the rate compares with one GPU's peak whatever the fabric.
  double fused_tflops() const {
    const int gpus = ranks_per_gpu > 0 && world >= ranks_per_gpu ? world / ranks_per_gpu : 1;
    return flop / gpus / fused_us * 1e-6;
  }

  // Communication and bounds (core/bench_metrics.h). The ranks of one GPU take turns on it: the
  // loopback fabric's W, the local fabric's W / GPUs, one per GPU otherwise.
  int ranks_per_gpu = 1;
  LinkEmulation link;       // what paced the copies (off: local copies)
  double remote_bytes = 0;  // Comet's dispatch + combine rows between different ranks, all ranks
  // The cost model's bound (ranks taking turns: the share of LayerCost::serial_lower_bound_us of one
  // GPU's ranks, serial_lower_bound_us * ranks_per_gpu / W, an estimate when the ranks span
  // several GPUs: it charges copies between ranks of one GPU to the link; else lower_bound_us)
  // for this GPU's rates, the emulated link rate when on; bound_gpu names the rates used.
  double lower_bound_us = 0;
  std::string bound_by, bound_gpu;
  double bound_link_gbps = 0;
  double hidden_fraction() const;
  double comm_link_gbps() const;   // per link direction over the comm-only time
  double fused_link_gbps() const;  // per link direction over the fused forward
  double fused_over_bound() const;

  // Baselines; sequential_us == 0 when they did not run (baseline_note says why).
  std::string baseline_gemm;              // the faster cuBLAS variant, used by both
  double sequential_us = 0, chunked_us = 0;
  int chunked_chunks = 0;                 // C of chunked_us
  double baseline_rel_l2 = 0;             // worst over every baseline run checked, vs unfused
  bool baselines_match = false;           // every one within the bf16 tolerance
  int64_t baseline_remote_bytes = 0;      // dispatch + combine of the sequential run, remote only
  std::string baseline_note;
  // LayerBenchOptions::trace_path: the JSON written (the SVG beside it), its events and the
  // communication records dropped by a full buffer.
  std::string trace_path;
  int64_t trace_events = 0, trace_dropped = 0;
  // With a trace: the timed rank's communication time per layer and the part GEMM tiles hid on
  // the timeline (core::timeline_overlap).
  core::TimelineOverlap timeline[2];
  bool baselines_run() const { return sequential_us > 0; }
  // Every check of the row passed: fused == unfused, the split output (when any GEMM split), the
  // baselines (when they ran). `comet bench layer` exits 1 otherwise.
  bool verified() const {
    return fused_equals_unfused && split_within_tolerance && (!baselines_run() || baselines_match);
  }
  double speedup_over_sequential() const { return sequential_us / fused_us; }
  double speedup_over_chunked() const { return chunked_us / fused_us; }

  // The path MoeLayer's default (ForwardPath::kTuned) takes on this workload with the run's
  // tuning table (LayerBenchOptions::tuning; unfused without an entry), and that path's time in
  // this row: the default forward's time only on rows with default options (n_comm, group,
  // stages 0; unfused GEMMs `fused`), otherwise the row's own settings of that path.
  bool tuned_fused = false;
  std::string path_source;
  double tuned_us() const { return tuned_fused ? fused_us : unfused_us; }
};

using LayerProgress = std::function<void(int done, int total, const std::string& what)>;

// Appends one row per variant to `rows` as each finishes: a workload that throws (out of memory,
// a layout the layer refuses, a timeout) leaves every earlier row for the caller to report.
void run_layer_bench(const LayerBenchOptions& options, const LayerProgress& progress, std::vector<LayerBenchRow>& rows);
void print_layer_table(const std::vector<LayerBenchRow>& rows, std::ostream& os);
// The trace file of a run's row `row_index`: `path`, or where an earlier row of the run wrote
// that file already (two requested values that resolve alike, as n_comm 0 and the count it
// resolves to, or a value listed twice), `path` with "-row<index>" before ".json". `used` holds
// the run's paths so far and gets the one returned.
std::string unique_trace_path(const std::string& path, size_t row_index, std::set<std::string>& used);
std::string layer_rows_json(const std::vector<LayerBenchRow>& rows);

}  // namespace comet::bench
