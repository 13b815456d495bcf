// tools/cmd_bench.cpp: `comet bench ...`, the benchmark harness on the command line.
//
//   comet bench gemm                                   (every preset, T in {2048,4096,8192})
//   comet bench gemm --models mixtral-8x7b --tokens 4096 --json
//
// Prints a config header, a progress line per workload on stderr, then the table (or JSON).
// Exit code 1 when any verification against cuBLAS's output failed, so a benchmark never
// hides a wrong result.
#include <algorithm>
#include <exception>
#include <functional>
#include <limits>
#include <utility>
#include <iostream>

#include "commands.h"
#include "progress.h"
#include "io/trace_writers.h"
#include "comet/config.h"
#include "comet/routing.h"

#ifdef COMET_HAVE_CUDA
#include "bench/gemm_bench.h"
#include "bench/layer_bench.h"
#include "comet/layer.h"
#include "cuda/device_info.h"
#endif

namespace comet::tools {

CLI::App* add_bench_command(CLI::App& app, BenchOptions& o, CLI::App** gemm, BenchLayerOptions& lo, CLI::App** layer) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks on the GPU (same-run baselines)");
  bench->require_subcommand(1);
  CLI::App* g = bench->add_subcommand("gemm", "grouped expert GEMMs (GEMM0+SwiGLU, GEMM1) vs cuBLAS");
  g->add_option("--models", o.models, "presets, comma separated (default: all)")->delimiter(',');
  g->add_option("--tokens", o.tokens, "tokens per rank, comma separated")->delimiter(',');
  // Only shapes: every divisor of a preset's experts is a valid EP, up to one expert per rank.
  int max_experts = 1;
  for (const ModelShape& m : ModelPresets::all()) max_experts = std::max(max_experts, m.num_experts);
  g->add_option("--ep", o.ep, "expert-parallel ranks (shapes of rank 0)")->check(CLI::Range(1, max_experts));
  g->add_option("--iters", o.iters, "timed iterations per variant (median reported)")->check(CLI::Range(1, 100000));
  g->add_option("--warmup-ms", o.warmup_ms, "warm-up before timing each workload")->check(number_range(0, 60000));
  g->add_option("--seed", o.seed, "routing seed")->check(non_negative_integer());
  g->add_flag("--json", o.json, "JSON instead of the table");
  *gemm = g;
  CLI::App* l = bench->add_subcommand(
      "layer", "the MoE layer: fused, unfused, compute-only, comm-only, sequential and chunked baselines");
  l->add_option("--models", lo.models, "presets, comma separated (default: all)")->delimiter(',');
  l->add_option("--tokens", lo.tokens, "tokens per rank, comma separated")->delimiter(',');
  lo.ep_opt = l->add_option("--ep", lo.ep, "expert-parallel ranks")->check(CLI::Range(1, kMaxRanks));
  lo.tp_opt = l->add_option("--tp", lo.tp, "tensor-parallel ranks")->check(CLI::Range(1, kMaxRanks));
  l->add_option("--layouts", lo.layouts, "(EP, TP) layouts swept instead of --ep/--tp, comma separated EPxTP (8x1,4x2,...)")
      ->delimiter(',');
  l->add_option("--routing", lo.routings,
                "routing generators swept, comma separated: uniform, zipf:S, imbalance:STD (default uniform)")
      ->delimiter(',');
  l->add_option("--n-comm0", lo.n_comm0, "layer0 communication blocks, comma separated list swept (0: tuning table or cost model)")
      ->delimiter(',')->check(CLI::Range(0, kMaxCommBlocks));
  l->add_option("--n-comm1", lo.n_comm1, "layer1 communication blocks, comma separated list swept (0: tuning table or cost model)")
      ->delimiter(',')->check(CLI::Range(0, kMaxCommBlocks));
  // 65536 bounds a typo, not the kernels: a group taller than a rank's M tiles is all of them.
  l->add_option("--group-m0", lo.layer0_group_m, "layer0 raster group heights in M tiles, comma separated list swept (0: default)")
      ->delimiter(',')->check(CLI::Range(0, 1 << 16));
  l->add_option("--stages0", lo.layer0_stages,
                "stages of the fused layer0 tile order, comma separated list swept (0: default; docs/gpu_layer.md)")
      ->delimiter(',')->check(CLI::Range(0, 64));
  l->add_option("--iters", lo.iters, "timed iterations per variant (median reported)")->check(CLI::Range(1, 100000));
  l->add_option("--warmup-ms", lo.warmup_ms, "warm-up before timing each workload (loopback and local; nccl warms up for a fixed number of rounds)")->check(number_range(0, 60000));
  l->add_option("--seed", lo.seed, "weights, tokens and routing seed")->check(non_negative_integer());
  l->add_option("--tuning", lo.tuning_file, "tuning table (comet tune) that n_comm 0 looks up")->check(CLI::ExistingFile);
  lo.chunks_opt = l->add_option("--chunks", lo.chunks, "chunk counts of the chunked baseline, comma separated (the fastest is reported)")
      ->delimiter(',')
      ->check(CLI::Range(1, 32));
  l->add_option("--emulate-link", lo.emulate_link,
                "GBPS[,LATENCY_US]: pace every inter-rank copy (Comet's and the baselines') to this link per rank "
                "and direction, e.g. 450,2 (docs/link_emulation.md)")
      ->check(non_empty("a link (GBPS[,LATENCY_US])"));
  l->add_flag("--no-baselines", lo.no_baselines, "leave out the sequential and chunked baselines");
  l->add_option("--unfused-gemms", lo.unfused_gemms,
                "GEMMs of the unfused pipeline and compute-only, comma separated list swept: fused (the fused "
                "kernels' configuration and tile order) or auto (the configuration kAuto chooses; "
                "docs/gpu_layer.md)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fused", "auto"}));
  add_layer0_mode_options(*l, lo.layer0_copies, lo.dispatch_orders);
  add_layer1_combine_option(*l, lo.layer1_combine);
  l->add_option("--epilogue-combine", lo.epilogue_combine,
                "whether GEMM1's epilogue stores tokens with a single row on a rank into their owner's slot "
                "(fused and unfused forwards; docs/gpu_layer.md), comma separated list swept: on, off")
      ->delimiter(',')
      ->check(CLI::IsMember({"on", "off"}));
  l->add_option("--split-gemms", lo.split_gemms,
                "split schedules in the unfused pipeline's GEMMs and compute-only (LayerOptions::split_gemms; "
                "docs/gemm.md), comma separated list swept: auto (the GEMMs that would split at T_max), on, off")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "on", "off"}));
  add_fabric_option(*l, lo.fabric);
  l->add_flag("--json", lo.json, "JSON instead of the table");
  l->add_option("--trace", lo.trace, "after timing, one traced fused forward per row: FILE.json (Perfetto) + FILE.svg")
      ->check(file_path());
  lo.trace_ranks_opt = l->add_option("--trace-ranks", lo.trace_ranks, "ranks drawn in the SVG, comma separated (default 0; the JSON has all)")
      ->delimiter(',')->check(CLI::Range(0, kMaxRanks - 1));
  *layer = l;
  return bench;
}

// Model names and token counts are checked before the GPU starts; then the GPU itself.
void check_bench_inputs(const std::vector<std::string>& models, const std::vector<int>& tokens,
                        const std::string& command, const std::vector<std::pair<int, int>>& layouts,
                        bool ranks_run) {
  std::vector<ModelShape> shapes;
  for (const auto& m : models) {
    try {
      shapes.push_back(ModelPresets::get(m));
    } catch (const Error& e) {
      throw UsageError(std::string("--models: ") + e.what());
    }
  }
  if (models.empty()) shapes = ModelPresets::all();
  for (int t : tokens)
    if (t < 1 || t > kMaxTokensPerRank)
      throw UsageError("--tokens: every count must be within [1, " + std::to_string(kMaxTokensPerRank) + "]");
  // A layout a preset cannot take (E % EP, F % TP, too many ranks) would otherwise stop the
  // sweep when it reaches it, after the rows before it ran.
  const int max_tokens = tokens.empty() ? 1 : *std::max_element(tokens.begin(), tokens.end());
  for (const auto& [ep, tp] : layouts) {
    if (ranks_run && int64_t(ep) * tp > kMaxRanks)
      throw UsageError("EP " + std::to_string(ep) + " x TP " + std::to_string(tp) + " is more than " +
                       std::to_string(kMaxRanks) + " ranks");
    for (const ModelShape& m : shapes) {
      if (!ranks_run) {  // bench gemm: rank 0's expert shapes, whatever the world
        if (m.num_experts % ep != 0)
          throw UsageError(m.name + " at EP " + std::to_string(ep) + " x TP " + std::to_string(tp) + ": " +
                           std::to_string(m.num_experts) + " experts are not divisible by EP=" + std::to_string(ep));
        continue;
      }
      LayerConfig c;
      c.model = m;
      c.layout = {ep * tp, ep, tp};
      c.max_tokens_per_rank = max_tokens;
      Status s = c.validate();
#ifdef COMET_HAVE_CUDA
      // What the GPU layer refuses (H and F/TP multiples of 8, the plan's bounds) as well.
      if (s) s = MoeLayer::can_implement(c);
#endif
      if (!s)
        throw UsageError(m.name + " at EP " + std::to_string(ep) + " x TP " + std::to_string(tp) + ": " + s.reason);
    }
  }
#ifndef COMET_HAVE_CUDA
  throw UsageError(command + " needs the CUDA backend; this build has none (nvcc was not found)");
#else
  const cuda::DeviceInfo info = cuda::query_device_info();
  if (info.device_count == 0)
    throw UsageError(command + " needs a GPU; none is visible" + (info.error.empty() ? "" : " (" + info.error + ")"));
#endif
}

LinkEmulation parse_emulate_link_option(const std::string& value) {
  if (value.empty()) return {};
  try {
    return parse_link_emulation(value);
  } catch (const Error& e) {
    throw UsageError(std::string("--emulate-link: ") + e.what());
  }
}

namespace {

// "EPxTP" entries of --layouts; UsageError naming a malformed one.
std::vector<std::pair<int, int>> parse_layouts(const std::vector<std::string>& texts) {
  std::vector<std::pair<int, int>> out;
  for (const std::string& t : texts) {
    const size_t x = t.find('x');
    int ep = 0, tp = 0;
    size_t used_ep = 0, used_tp = 0;
    try {
      if (x != std::string::npos) {
        ep = std::stoi(t.substr(0, x), &used_ep);
        tp = std::stoi(t.substr(x + 1), &used_tp);
      }
    } catch (const std::exception&) {
      ep = tp = 0;
    }
    if (x == std::string::npos || used_ep != x || used_tp != t.size() - x - 1 || ep < 1 || tp < 1)
      throw UsageError("--layouts: \"" + t + "\" is not EPxTP with positive EP and TP (e.g. 4x2)");
    out.emplace_back(ep, tp);
  }
  return out;
}

#ifdef COMET_HAVE_CUDA
// Runs a sweep and returns what it threw (null when it finished), so that the rows it finished
// can be printed before the error ends the command.
std::exception_ptr run_sweep(const std::function<void()>& sweep) {
  try {
    sweep();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}
#endif

std::vector<RoutingSpec> parse_routings(const std::vector<std::string>& texts) {
  std::vector<RoutingSpec> out;
  for (const std::string& t : texts) out.push_back(parse_routing_option(t));
  if (out.empty()) out.push_back(RoutingSpec{});
  return out;
}

}  // namespace

int bench_layer_command(const BenchLayerOptions& o) {
  // --layouts replaces --ep and --tp: given together, one of them would be ignored.
  if (!o.layouts.empty())
    for (const CLI::Option* opt : {o.ep_opt, o.tp_opt})
      if (opt && opt->count())
        throw UsageError(opt->get_name() + " " + std::to_string(opt == o.ep_opt ? o.ep : o.tp) +
                         " and --layouts both set the layout (--layouts sweeps EPxTP instead of --ep/--tp); give one "
                         "or the other");
  check_trace_path(o.trace);
  // An option that would be ignored is refused: chunk counts without the baselines.
  if (o.chunks_opt && o.chunks_opt->count() && o.no_baselines)
    throw UsageError("--chunks sets the chunked baseline's chunk counts; with --no-baselines it would be ignored");
  const std::vector<std::pair<int, int>> layouts = parse_layouts(o.layouts);
  const std::vector<RoutingSpec> routings = parse_routings(o.routings);
  int64_t min_world = layouts.empty() ? int64_t(o.ep) * o.tp : std::numeric_limits<int64_t>::max();
  for (const auto& [ep, tp] : layouts) min_world = std::min(min_world, int64_t(ep) * tp);
  for (int r : o.trace_ranks)
    if (r >= min_world)
      throw UsageError("--trace-ranks: rank " + std::to_string(r) + " is not one of the W ranks (W = " +
                       std::to_string(min_world) + ")");
  if (o.trace_ranks_opt && o.trace_ranks_opt->count() && o.trace.empty())
    throw UsageError("--trace-ranks picks the ranks of the --trace timeline's SVG; without --trace it would be ignored");
  const LinkEmulation link = parse_emulate_link_option(o.emulate_link);
  if (link.on() && o.fabric != "loopback")
    throw UsageError("--emulate-link stands for a node of GPUs on one GPU (loopback fabric); with --fabric " + o.fabric +
                     " the links are real");
  // Copies in the GEMM blocks cannot be paced: refused here rather than when the sweep reaches them.
  const auto has_gemm = [](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "gemm") != v.end(); };
  if (link.on() && has_gemm(o.layer0_copies))
    throw UsageError("--copies0 gemm: the GEMM blocks' copies cannot be paced to an emulated link (--emulate-link)");
  if (link.on() && has_gemm(o.layer1_combine))
    throw UsageError("--combine1 gemm: the GEMM blocks' combine cannot be paced to an emulated link (--emulate-link)");
  // A malformed table is bad input, refused before the GPU is touched.
  TuningTable tuning;
  if (!o.tuning_file.empty()) tuning = load_tuning_option(o.tuning_file, "--tuning");
  check_bench_inputs(o.models, o.tokens, "comet bench",
                     layouts.empty() ? std::vector<std::pair<int, int>>{{o.ep, o.tp}} : layouts);
#ifdef COMET_HAVE_CUDA
  bench::LayerBenchOptions lo;
  lo.models = o.models;
  lo.tokens = o.tokens;
  lo.ep = o.ep;
  lo.tp = o.tp;
  lo.layouts = layouts;
  lo.routings = routings;
  lo.n_comm0 = o.n_comm0;
  lo.n_comm1 = o.n_comm1;
  lo.layer0_group_m = o.layer0_group_m;
  lo.layer0_stages = o.layer0_stages;
  lo.tuning = tuning;
  lo.iters = o.iters;
  lo.warmup_ms = o.warmup_ms;
  lo.seed = o.seed;
  lo.baselines = !o.no_baselines;
  lo.unfused_gemms.clear();
  for (const std::string& g : o.unfused_gemms)
    lo.unfused_gemms.push_back(g == "auto" ? UnfusedGemms::kAuto : UnfusedGemms::kFusedSchedule);
  lo.layer0_copies = layer0_copies_list(o.layer0_copies);
  lo.dispatch_orders = dispatch_orders_list(o.dispatch_orders);
  lo.epilogue_combine.clear();
  for (const std::string& e : o.epilogue_combine) lo.epilogue_combine.push_back(e == "on");
  lo.layer1_combine = layer1_combine_list(o.layer1_combine);
  lo.split_gemms.clear();
  for (const std::string& s : o.split_gemms)
    lo.split_gemms.push_back(s == "auto" ? std::nullopt : std::optional<bool>(s == "on"));
  lo.chunks = o.chunks;
  lo.fabric = o.fabric;
  lo.link = link;
  // With one process per rank, rank 0 speaks for the run; every rank still fails on a mismatch.
  const bool quiet = quiet_rank(o.fabric);
  lo.trace_path = o.trace;
  lo.trace_ranks = o.trace_ranks;
  const cuda::DeviceInfo info = cuda::query_device_info();
  check_comm_blocks(o.n_comm0, o.n_comm1, info.num_sms, info.name);
  const std::string ranks = o.fabric == "loopback" ? "virtual ranks on one GPU (loopback fabric)"
                            : o.fabric == "local"  ? "ranks spread evenly over the visible GPUs, one process (local fabric)"
                                                   : "ranks, one GPU and process each (nccl fabric; rank 0 timed)";
  if (!quiet)
    std::cerr << "comet bench layer: " << info.name << " (" << info.num_sms << " SMs), "
              << (layouts.empty() ? "W " + std::to_string(o.ep * o.tp) + " = EP " + std::to_string(o.ep) + " x TP " +
                                        std::to_string(o.tp)
                                  : std::to_string(layouts.size()) + " (EP, TP) layouts")
              << " " << ranks
              << ", full-size presets, " << (o.routings.empty() ? "uniform routing" : "routing swept (--routing)") << ", "
              << "median of " << o.iters << " interleaved runs"
              << (o.no_baselines ? "" : ", with the sequential and chunked baselines") << "; " << link.describe() << "\n";
  ProgressBar bar(std::cerr, !quiet);
  std::vector<bench::LayerBenchRow> rows;
  std::string workload;  // the one the sweep is on
  // A workload that fails (out of memory, say) ends the sweep; the rows before it are printed
  // first, then the error (main's `comet: error:` line, exit 3).
  const std::exception_ptr failure = run_sweep([&] {
    bench::run_layer_bench(
        lo,
        [&bar, &link, &workload](int done, int total, const std::string& what) {
          workload = what;
          bar(done, total, what + (link.on() ? "; " + link.describe() : ""));
        },
        rows);
  });
  bar.end_line();
  if (failure && !quiet)
    std::cerr << "comet bench layer: the sweep stopped at " << workload << " (" << rows.size()
              << (rows.size() == 1 ? " row" : " rows") << " finished before it"
              << (rows.empty() ? "" : ", printed below") << ")\n";
  if (!quiet && (!failure || !rows.empty())) {
    if (o.json) std::cout << bench::layer_rows_json(rows) << "\n";
    else bench::print_layer_table(rows, std::cout);
    if (failure) std::cout << std::flush;
  }
  for (const auto& r : rows)
    if (!r.trace_path.empty())
      std::cerr << "trace: " << r.trace_path << " and " << io::trace_svg_path(r.trace_path) << " (" << r.trace_events
                << " events" << (r.trace_dropped > 0 ? ", " + std::to_string(r.trace_dropped) + " dropped" : "") << ")\n";
  if (failure) std::rethrow_exception(failure);
  for (const auto& r : rows)
    if (!r.verified()) return kExitVerifyFailed;
#endif
  return 0;
}

int bench_gemm_command(const BenchOptions& o) {
  // A preset whose experts --ep does not divide would stop the sweep when it reaches it, after
  // the presets before it ran. Only rank 0's shapes are timed, no ranks run: --ep's own range
  // (up to one expert per rank) is the only bound on the ranks.
  check_bench_inputs(o.models, o.tokens, "comet bench", {{o.ep, 1}}, /*ranks_run=*/false);
#ifdef COMET_HAVE_CUDA
  const cuda::DeviceInfo info = cuda::query_device_info();
  bench::GemmBenchOptions bo;
  bo.models = o.models;
  bo.tokens = o.tokens;
  bo.ep = o.ep;
  bo.iters = o.iters;
  bo.warmup_ms = o.warmup_ms;
  bo.seed = o.seed;
  std::cerr << "comet bench gemm: " << info.name << " (" << info.num_sms << " SMs), EP " << o.ep
            << ", uniform routing, bf16, median of " << o.iters << " interleaved runs after "
            << o.warmup_ms << " ms warm-up\n";
  std::vector<bench::GemmBenchRow> rows;
  const std::exception_ptr failure = run_sweep([&] {
    bench::run_gemm_bench(
        bo, [](int done, int total, const std::string& what) { std::cerr << "[" << done << "/" << total << "] " << what << "\n"; },
        rows);
  });
  if (!failure || !rows.empty()) {
    if (o.json) std::cout << bench::gemm_rows_json(rows) << "\n";
    else bench::print_gemm_table(rows, std::cout);
    std::cout << std::flush;
  }
  if (failure) std::rethrow_exception(failure);
  for (const auto& r : rows)
    if (!r.verified) return kExitVerifyFailed;
#endif
  return 0;
}

}  // namespace comet::tools
