// `comet tune`: sweeps n_comm0 x n_comm1, the layer0 mode (comet/layer0_mode.h) and the layer1
// combine (comet/layer1_combine.h) of the fused kernels over workloads (W virtual ranks on this
// GPU, or over several GPUs with --fabric local|nccl) and writes the fastest candidate of each
// workload into a tuning table (src/io/tuning_json.h) that MoeLayer looks up (docs/tuning.md),
// with the unfused forward's time beside it: ForwardPath::kTuned runs the faster of the two.
//   comet tune --models mixtral-8x7b --tokens 1024,4096 --out tuning/nvidia-h200.json
//   comet launch -n 2 -- comet tune --fabric nccl --ep 2 --models mixtral-8x7b --out tuning/nvidia-h200.json
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <system_error>

#include "cli_common.h"
#include "commands.h"
#include "progress.h"
#include "comet/config.h"
#include "comet/error.h"
#include "comet/tuning.h"
#include "io/tuning_json.h"
#ifdef COMET_HAVE_CUDA
#include "bench/layer_bench.h"
#include "cuda/device_info.h"
#endif

namespace comet::tools {

CLI::App* add_tune_command(CLI::App& app, TuneOptions& o) {
  CLI::App* t = app.add_subcommand(
      "tune", "sweep n_comm, the layer0 mode and the layer1 combine of the fused kernels, time the unfused forward beside them, write a tuning table (needs a GPU)");
  t->add_option("--models", o.models, "presets, comma separated (default: all)")->delimiter(',');
  t->add_option("--tokens", o.tokens, "tokens per rank, comma separated")->delimiter(',');
  t->add_option("--ep", o.ep, "expert-parallel ranks")->check(CLI::Range(1, kMaxRanks));
  t->add_option("--tp", o.tp, "tensor-parallel ranks")->check(CLI::Range(1, kMaxRanks));
  t->add_option("--n-comm0", o.n_comm0, "layer0 candidates, comma separated")->delimiter(',')->check(CLI::Range(1, kMaxCommBlocks));
  t->add_option("--n-comm1", o.n_comm1, "layer1 candidates, comma separated")->delimiter(',')->check(CLI::Range(1, kMaxCommBlocks));
  add_layer0_mode_options(*t, o.layer0_copies, o.dispatch_orders);
  add_layer1_combine_option(*t, o.layer1_combine);
  t->add_option("--iters", o.iters, "timed iterations per candidate (median)")->check(CLI::Range(1, 100000));
  t->add_flag("--rows", o.rows, "print every candidate's row (the `comet bench layer` table) before the summary");
  t->add_option("--out", o.out, "tuning table to write (entries of an existing file are kept unless replaced)")
      ->required();
  add_fabric_option(*t, o.fabric);
  return t;
}

int tune_command(const TuneOptions& o) {
  // --out is required, so an empty path is a mistake (check_output_path lets it through as "no file").
  if (o.out.empty()) throw UsageError("--out: the path of the tuning table is empty");
  check_output_path(o.out, "--out");
  // With one process per rank every rank measures (the forward needs all of them); rank 0 writes.
  const bool quiet = quiet_rank(o.fabric);
  // The table is written after the sweep: what would make that fail is refused before it, a
  // malformed table whose entries are to be kept included.
  TuningTable table;
  if (!quiet) {
    std::error_code error;  // an error other than not-found: check_output_path refused it
    // Only a file holds a table to keep: a device such as /dev/null is written, not read.
    if (std::filesystem::is_regular_file(o.out, error)) table = load_tuning_option(o.out, "--out");
    check_replaceable_output(o.out, "--out");
  }
  check_bench_inputs(o.models, o.tokens, "comet tune", {{o.ep, o.tp}});
#ifdef COMET_HAVE_CUDA
  const cuda::DeviceInfo info = cuda::query_device_info();
  check_comm_blocks(o.n_comm0, o.n_comm1, info.num_sms, info.name);

  bench::LayerBenchOptions lo;
  lo.models = o.models;
  lo.tokens = o.tokens;
  lo.ep = o.ep;
  lo.tp = o.tp;
  lo.n_comm0 = o.n_comm0;
  lo.n_comm1 = o.n_comm1;
  lo.layer0_copies = layer0_copies_list(o.layer0_copies);
  lo.dispatch_orders = dispatch_orders_list(o.dispatch_orders);
  lo.layer1_combine = layer1_combine_list(o.layer1_combine);
  lo.iters = o.iters;
  lo.warmup_ms = 50;
  lo.baselines = false;
  lo.fabric = o.fabric;
  const int world = o.ep * o.tp;
  if (!quiet)
    std::cerr << "comet tune: " << info.name << " (" << info.num_sms << " SMs), W " << world << " = EP " << o.ep
              << " x TP " << o.tp
              << (o.fabric == "loopback" ? " virtual ranks on one GPU (loopback fabric), "
                  : o.fabric == "local"  ? " ranks spread evenly over the visible GPUs (local fabric), "
                                         : " ranks, one GPU each (" + o.fabric + " fabric), ")
              << o.n_comm0.size() * o.n_comm1.size() << " n_comm pairs x " << o.layer0_copies.size() << " x "
              << o.dispatch_orders.size() << " layer0 modes x " << o.layer1_combine.size()
              << " layer1 combines per workload, median of " << o.iters << "\n";
  ProgressBar bar(std::cerr, !quiet);
  std::vector<bench::LayerBenchRow> rows;
  bench::run_layer_bench(lo, [&bar](int done, int total, const std::string& what) { bar(done, total, what); }, rows);

  std::vector<TuneSample> samples;
  for (const auto& r : rows) {
    if (!r.fused_equals_unfused)
      throw Error("comet tune: the fused output differs from the unfused one for " + r.model + " T=" +
                  std::to_string(r.tokens) + " with n_comm " + std::to_string(r.n_comm0) + "/" +
                  std::to_string(r.n_comm1) + ", layer0 " + describe(r.layer0) + ", layer1 combine " +
                  layer1_combine_name(r.layer1_combine) + "; no table written");
    if (!r.split_within_tolerance)
      throw Error("comet tune: the unfused forward with split GEMMs (layers " + r.split_gemms +
                  ") is not within the bf16 tolerance of the unsplit one for " + r.model + " T=" +
                  std::to_string(r.tokens) + ", or not deterministic; no table written");
    LayerConfig c;
    c.model = ModelPresets::get(r.model);
    c.layout = {r.world, r.ep, r.tp};
    const int gpus = r.world / r.ranks_per_gpu;  // the GPUs the fabric spread the ranks over
    samples.push_back({tuning_key(c, info.name, info.num_sms, r.tokens, gpus), r.n_comm0, r.n_comm1, r.fused_us,
                       r.unfused_us, r.layer0, r.layer1_combine});
  }
  if (quiet) return 0;
  if (o.rows) bench::print_layer_table(rows, std::cout);
  const TuneSummary s = summarize_tuning(samples);
  for (const TuningEntry& e : s.table.entries()) table.add(e);
  io::save_tuning_table(table, o.out);

  std::cout << std::left << std::setw(16) << "model" << std::right << std::setw(7) << "T" << std::setw(10) << "n_comm" << std::setw(13) << "layer0" << std::setw(9) << "combine1"
            << std::setw(12) << "tuned us" << std::setw(12) << "fixed us" << std::setw(12) << "unfused us"
            << std::setw(9) << "path" << "\n"
            << std::fixed << std::setprecision(1);
  for (const TuningEntry& e : s.table.entries()) {
    double fixed = 0;
    for (const auto& x : samples)
      if (x.key.same_workload_class(e.key) && x.key.tokens_per_rank == e.key.tokens_per_rank &&
          x.n_comm0 == s.fixed_n_comm0 && x.n_comm1 == s.fixed_n_comm1 && x.layer0 == s.fixed_layer0 &&
          x.layer1_combine == s.fixed_layer1_combine)
        fixed = x.latency_us;
    std::string model;
    for (const auto& r : rows)
      if (r.tokens == e.key.tokens_per_rank && ModelPresets::get(r.model).hidden == e.key.hidden &&
          ModelPresets::get(r.model).num_experts == e.key.num_experts)
        model = r.model;
    std::cout << std::left << std::setw(16) << model << std::right << std::setw(7) << e.key.tokens_per_rank
              << std::setw(10) << (std::to_string(e.n_comm0) + "/" + std::to_string(e.n_comm1)) << std::setw(13)
              << describe(e.layer0) << std::setw(9) << layer1_combine_name(e.layer1_combine) << std::setw(12)
              << e.latency_us << std::setw(12) << fixed << std::setw(12) << e.unfused_us << std::setw(9)
              << (e.fused_faster() ? "fused" : "unfused") << "\n";
  }
  std::cout << "best single fixed n_comm: " << s.fixed_n_comm0 << "/" << s.fixed_n_comm1 << " with layer0 "
            << describe(s.fixed_layer0) << ", layer1 combine " << layer1_combine_name(s.fixed_layer1_combine)
            << ", summed "
            << s.fixed_total_us << " us; tuned choices summed " << s.tuned_total_us << " us ("
            << std::setprecision(3) << s.fixed_total_us / s.tuned_total_us << "x)\n";
  if (s.path_workloads > 0)
    std::cout << std::setprecision(1) << "forward path (ForwardPath::kTuned) over " << s.path_workloads
              << " workloads: summed " << s.path_total_us << " us; always unfused " << s.unfused_total_us
              << " us, always fused " << s.fused_total_us << " us\n";
  std::cout << "wrote " << s.table.entries().size() << " entries to " << o.out << " (" << table.entries().size()
            << " in the file)\n";
#endif
  return 0;
}

}  // namespace comet::tools
