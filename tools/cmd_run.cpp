// tools/cmd_run.cpp: `comet run`, the project's main job: one MoE layer forward across W ranks,
// verified against the fp64 oracle, with the dispatch statistics and the lower bound of the
// same workload at full size.
//
//   comet run --model mixtral-8x7b --ep 8
//   comet run --model deepseek-v3 --ep 4 --tp 2 --tokens 64 --routing zipf:1.2 --json
//   comet run --model qwen2-moe-2.7b --ep 4 --tokens 64 --save layer.safetensors
//
// The CPU backend runs the real protocol (ranks as threads), so the large presets are scaled
// down first (comet::choose_cpu_scale: H and F, then tokens); the report says by how much.
// The lower bound is always that of the requested, unscaled workload on a real GPU.
// Exit codes: 0 verified, 1 verification failed, 2 bad input, 3 runtime failure.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "comet/cost_model.h"
#include "comet/plan.h"
#include "comet/problem.h"
#include "core/process_env.h"
#include "ref/oracle.h"
#include "io/json_text.h"
#include "io/trace_writers.h"
#include "ref/ref_backend.h"
#ifdef COMET_HAVE_CUDA
#include "comet/layer.h"
#include "gpu_run.h"
#endif
#include "report.h"
#include "safetensors.h"

namespace comet::tools {
namespace {

// Tiles of the CPU run: small enough that scaled-down shapes still have several tiles per
// expert to reorder and several column blocks to signal.
constexpr TileConfig kCpuTiles{32, 64, 64};

struct RunResult {
  Workload full;                   // as requested
  CpuScale scale;
  LayerConfig config;              // what actually ran (scaled)
  std::vector<int> tokens_per_rank;  // what actually ran (scaled)
  std::vector<std::vector<float>> y;
  std::vector<std::vector<double>> want;
  ref::Comparison comparison;
  double tolerance = 0;
  bool pass = false;
  double forward_us = 0;
  double oracle_us = 0;
  ref::ForwardStats stats;
  LayerCost full_cost;
  std::string gpu;
  std::string backend = "cpu";  // what ran: "cpu" or "cuda"
  std::string device;           // the GPU that ran it (cuda)
  std::string fabric;           // cuda: loopback, local or nccl
  int devices = 1;              // cuda: GPUs this process used
  int first_rank = 0;           // y[i] and want[i] are rank first_rank + i (nccl: this process's rank)
  LinkEmulation link;           // cuda: what paced the inter-rank copies
  int64_t saved_tensors = 0;
  std::string trace_path;           // --trace, with -rank<r> in a process of a --fabric nccl run
  int64_t trace_events = 0;
  std::vector<int> trace_lanes;     // cuda: n_comm of layer0 and layer1, then the grid
  int64_t saved_bytes = 0;
};

double elapsed_us(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - since).count();
}

// Values of the run's storage dtype (floats that are already rounded to it) as the raw type.
void add_storage(SafetensorsWriter& st, const std::string& name, DType dtype,
                 std::vector<int64_t> shape, const std::vector<float>& values) {
  if (dtype == DType::kF32) {
    st.add_f32(name, std::move(shape), values);
    return;
  }
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    bits[i] = dtype == DType::kBF16 ? float_to_bf16_bits(values[i]) : float_to_f16_bits(values[i]);
  st.add_u16(name, dtype == DType::kBF16 ? StDType::kBF16 : StDType::kF16, std::move(shape), bits);
}

void save_run(const std::string& path, const MoeProblem& problem, RunResult& r) {
  const LayerConfig& c = r.config;
  const ModelShape& m = c.model;
  const int64_t E = m.num_experts, H = m.hidden, F = m.ffn, K = m.topk;
  SafetensorsWriter st;
  if (is_gated(m.activation)) add_storage(st, "weights.w_gate", c.dtype, {E, H, F}, problem.weights.w_gate);
  add_storage(st, "weights.w_up", c.dtype, {E, H, F}, problem.weights.w_up);
  add_storage(st, "weights.w_down", c.dtype, {E, F, H}, problem.weights.w_down);
  for (int rank = 0; rank < c.layout.world; ++rank) {
    const std::string p = "rank" + std::to_string(rank) + ".";
    const int64_t T = problem.num_tokens(rank);
    const Routing& routing = problem.routing[size_t(rank)];
    add_storage(st, p + "x", c.dtype, {T, H}, problem.x[size_t(rank)]);
    st.add_i32(p + "expert_ids", {T, K}, routing.expert_ids);
    st.add_f32(p + "expert_weights", {T, K}, routing.weights);
    add_storage(st, p + "y", c.dtype, {T, H}, r.y[size_t(rank)]);
    st.add_f64(p + "y_oracle", {T, H}, r.want[size_t(rank)]);
  }
  const auto& full = r.full.config;
  st.set_metadata("format", "comet-moe-layer");
  st.set_metadata("format_version", "1");
  st.set_metadata("model", m.name);
  st.set_metadata("hidden", std::to_string(m.hidden));
  st.set_metadata("ffn", std::to_string(m.ffn));
  st.set_metadata("num_experts", std::to_string(m.num_experts));
  st.set_metadata("topk", std::to_string(m.topk));
  st.set_metadata("activation", activation_name(m.activation));
  st.set_metadata("world", std::to_string(c.layout.world));
  st.set_metadata("ep", std::to_string(c.layout.ep));
  st.set_metadata("tp", std::to_string(c.layout.tp));
  st.set_metadata("dtype", dtype_name(c.dtype));
  st.set_metadata("seed", std::to_string(r.full.seed));
  st.set_metadata("routing", r.full.routing.describe());
  st.set_metadata("mask_fraction", strf("%g", r.full.routing.mask_fraction));
  st.set_metadata("tokens_per_rank", tokens_text(r.tokens_per_rank));
  st.set_metadata("full_model", full.model.name);
  st.set_metadata("full_hidden", std::to_string(full.model.hidden));
  st.set_metadata("full_ffn", std::to_string(full.model.ffn));
  st.set_metadata("full_tokens_per_rank", tokens_text(r.full.tokens_per_rank));
  st.set_metadata("cpu_shape_factor", std::to_string(r.scale.shape_factor));
  st.set_metadata("cpu_token_factor", std::to_string(r.scale.token_factor));
  st.set_metadata("rel_l2", strf("%.6e", r.comparison.rel_l2));
  st.set_metadata("verify", r.pass ? "PASS" : "FAIL");
  st.write(path);
  r.saved_bytes = 8 + int64_t(st.header().size()) + st.data_bytes();
  r.saved_tensors = (is_gated(m.activation) ? 3 : 2) + 5 * int64_t(c.layout.world);
}

void print_text(const RunOptions& o, const RunResult& r, const DispatchPlan& plan) {
  std::ostream& os = std::cout;
  const LayerConfig& full = r.full.config;
  const LayerConfig& c = r.config;
  os << "comet run: " << config_header(full, r.full.tokens_per_rank, r.full.routing, r.full.seed)
     << "\n";
  if (r.backend == "cuda") {
    const char* kernels = !o.trace.empty() ? "fused Comet kernels, traced" : o.fused ? "fused Comet kernels" : "unfused pipeline";
    if (r.fabric == "loopback")
      os << strf("backend: cuda (%d virtual ranks on one %s, loopback fabric, %s, %s)\n", c.layout.world, r.device.c_str(),
                 kernels, r.link.describe().c_str());
    else if (r.fabric == "local")
      os << strf("backend: cuda (%d ranks on %d %s GPUs in one process, local fabric, %s)\n", c.layout.world,
                 r.devices, r.device.c_str(), kernels);
    else
      os << strf("backend: cuda (rank %d of %d in this process, one %s per process, nccl fabric, %s; verified: "
                 "this rank)\n",
                 r.first_rank, c.layout.world, r.device.c_str(), kernels);
  } else {
    os << strf("backend: cpu (%d rank%s as threads, %d comm + %d compute workers each, wait "
               "timeout %d ms)\n",
               c.layout.world, c.layout.world == 1 ? "" : "s", o.comm_workers, o.compute_workers, o.timeout_ms);
  }
  if (r.scale.shape_factor > 1) {
    os << strf("%s: %s scaled down %dx (H %d -> %d, F %d -> %d)",
               r.backend == "cuda" ? "scaled for the fp64 oracle" : "cpu backend", full.model.name.c_str(),
               r.scale.shape_factor, full.model.hidden, c.model.hidden, full.model.ffn, c.model.ffn);
  } else {
    os << strf("%s backend: %s at full size (H %d, F %d)", r.backend.c_str(), full.model.name.c_str(),
               c.model.hidden, c.model.ffn);
  }
  if (r.scale.token_factor > 1) {
    os << strf(", tokens per rank %s -> %s\n", tokens_text(r.full.tokens_per_rank).c_str(),
               tokens_text(r.tokens_per_rank).c_str());
  } else {
    os << strf(", tokens per rank %s\n", tokens_text(r.tokens_per_rank).c_str());
  }
  print_rows_per_expert(os, c, plan, 16);
  print_rows_per_rank(os, plan);
  const int world = c.layout.world;
  if (world <= 16) {
    print_byte_matrix(os, "bytes per link in this run, src -> dst", world,
                      [&](int s, int d) { return s == d ? 0.0 : link_bytes(c, plan, s, d); });
  } else {
    std::vector<int64_t> bytes;
    for (int s = 0; s < world; ++s)
      for (int d = 0; d < world; ++d)
        if (s != d) bytes.push_back(int64_t(link_bytes(c, plan, s, d)));
    const IntSummary s = summarize(bytes);
    os << "bytes per link in this run, src -> dst: min " << format_bytes(double(s.min)) << ", mean "
       << format_bytes(s.mean()) << ", max " << format_bytes(double(s.max)) << " over "
       << s.count << " links\n";
  }
  if (r.backend == "cuda") {
    os << strf("forward: %s on the GPU (one call, CUDA events, device plan included; not a "
               "benchmark); oracle %s\n",
               format_us(r.forward_us).c_str(), format_us(r.oracle_us).c_str());
  } else {
    os << strf("forward: %s wall (rows landed %lld, tiles that waited %lld, partial rows sent "
               "%lld); oracle %s\n",
               format_us(r.forward_us).c_str(), static_cast<long long>(r.stats.rows_landed),
               static_cast<long long>(r.stats.tiles_waited),
               static_cast<long long>(r.stats.partial_rows_sent), format_us(r.oracle_us).c_str());
  }
  // The pass rule is on rel_l2 and the worst row (ref/oracle.h); max_abs is for information.
  const std::string worst_row = r.comparison.worst_row_rank < 0
                                    ? std::string("no non-zero row")
                                    : strf("rank %d token %lld", r.comparison.worst_row_rank,
                                           static_cast<long long>(r.comparison.worst_row_token));
  os << strf("verify: rel_l2 %.1e (tolerance %.1e) worst row %.1e (bound %.1e, %s) max_abs %.1e "
             "%s (%lld elements vs the fp64 oracle",
             r.comparison.rel_l2, r.tolerance, r.comparison.worst_row_error, ref::kRowErrorPerTolerance * r.tolerance,
             worst_row.c_str(), r.comparison.max_abs, r.pass ? "PASS" : "FAIL",
             static_cast<long long>(r.comparison.elements));
  if (r.comparison.non_finite) os << strf(", %lld NaN/Inf", static_cast<long long>(r.comparison.non_finite));
  if (r.comparison.scaled_by_terms) os << "; errors relative to the terms' norm: the reference cancels below it";
  os << ")\n";
  const LayerCost& lc = r.full_cost;
  os << strf("lower bound, full size on %s (%s, tokens/rank %s, EP %d x TP %d): t_compute %.1f "
             "us, t_comm %.1f us, t_weights %.1f us -> %.1f us, bound by %s\n",
             r.gpu.c_str(), full.model.name.c_str(), tokens_text(r.full.tokens_per_rank).c_str(),
             full.layout.ep, full.layout.tp, lc.t_compute_us, lc.t_comm_us, lc.t_weights_us,
             lc.lower_bound_us, lc.bound_by.c_str());
  if (!o.trace.empty() && r.backend == "cuda")
    os << "trace: " << r.trace_path << " and its .svg (" << r.trace_events << " events; lanes: " << r.trace_lanes[2]
       << " thread blocks per kernel, " << r.trace_lanes[0] << " (layer0) and " << r.trace_lanes[1]
       << " (layer1) communicate)\n";
  else if (!o.trace.empty())
    os << "trace: " << r.trace_path << " and its .svg (" << r.trace_events << " events; lanes: " << o.comm_workers
       << " comm + " << o.compute_workers << " compute workers per rank and layer)\n";
  if (!o.save.empty())
    os << "saved: " << o.save << " (" << r.saved_tensors << " tensors, "
       << format_bytes(double(r.saved_bytes)) << ")\n";
}

void print_json(const RunOptions& o, const RunResult& r, const DispatchPlan& plan) {
  const LayerConfig& c = r.config;
  nlohmann::json j;
  j["command"] = "run";
  j["config"] = config_json(r.full.config, r.full.tokens_per_rank, r.full.routing, r.full.seed);
  j["backend"] = r.backend;
  if (r.backend == "cuda") {
    j["device"] = r.device;
    j["fabric"] = r.fabric;
    j["fused"] = o.fused;
    j["link"] = r.link.describe();
    j["verified_ranks"] = {r.first_rank, r.first_rank + int(r.y.size())};  // [first, end)
  }
  j["cpu_scale"] = {{"shape_factor", r.scale.shape_factor},
                    {"token_factor", r.scale.token_factor},
                    {"budget_gflop", o.cpu_budget_gflop > 0 ? o.cpu_budget_gflop : kCpuFlopBudget / 1e9}};
  j["run_config"] = config_json(c, r.tokens_per_rank, r.full.routing, r.full.seed);
  j["workers"] = {{"comm", o.comm_workers}, {"compute", o.compute_workers},
                  {"chunk_tokens", o.chunk_tokens}, {"timeout_ms", o.timeout_ms}};
  j["rows_per_expert"] = rows_per_expert_json(plan);
  j["rows_per_rank"] = rows_per_rank_json(plan);
  nlohmann::json links = nlohmann::json::array();
  for (int s = 0; s < c.layout.world; ++s) {
    std::vector<double> row;
    for (int d = 0; d < c.layout.world; ++d) row.push_back(s == d ? 0.0 : link_bytes(c, plan, s, d));
    links.push_back(row);
  }
  j["link_bytes"] = links;
  j["forward_us"] = r.forward_us;
  j["oracle_us"] = r.oracle_us;
  j["stats"] = {{"rows_landed", r.stats.rows_landed},
                {"tiles_waited", r.stats.tiles_waited},
                {"partial_rows_sent", r.stats.partial_rows_sent}};
  j["verify"] = {{"rel_l2", r.comparison.rel_l2},
                 {"max_abs", r.comparison.max_abs},
                 {"worst_row_error", r.comparison.worst_row_error},
                 {"worst_row_rank", r.comparison.worst_row_rank},
                 {"worst_row_token", r.comparison.worst_row_token},
                 {"worst_row_bound", ref::kRowErrorPerTolerance * r.tolerance},
                 {"non_finite", r.comparison.non_finite},
                 {"elements", r.comparison.elements},
                 {"scaled_by_terms", r.comparison.scaled_by_terms},
                 {"tolerance", r.tolerance},
                 {"pass", r.pass}};
  const LayerCost& lc = r.full_cost;
  j["lower_bound"] = {{"gpu", r.gpu},
                      {"model", r.full.config.model.name},
                      {"tokens_per_rank", r.full.tokens_per_rank},
                      {"flops_max_rank", lc.flops_max_rank},
                      {"link_bytes_max_rank", lc.link_bytes_max_rank},
                      {"weight_bytes_per_rank", lc.weight_bytes_per_rank},
                      {"t_compute_us", lc.t_compute_us},
                      {"t_comm_us", lc.t_comm_us},
                      {"t_weights_us", lc.t_weights_us},
                      {"lower_bound_us", lc.lower_bound_us},
                      {"bound_by", lc.bound_by}};
  if (!o.trace.empty()) j["trace"] = {{"path", r.trace_path}, {"events", r.trace_events}};
  if (!o.save.empty()) {
    j["saved"] = {{"path", o.save}, {"tensors", r.saved_tensors}, {"bytes", r.saved_bytes}};
  } else {
    j["saved"] = nullptr;
  }
  // The paths are bytes as the user typed them, not always UTF-8: replaced (U+FFFD), not refused
  // after the run.
  std::cout << io::json_text(j, 2) << "\n";
}

}  // namespace

CLI::App* add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "run", "one MoE layer forward across W ranks, verified against the fp64 oracle");
  add_workload_options(*cmd, o.workload, kCpuTiles);
  cmd->add_option("--backend", o.backend, "auto, cpu or cuda")->capture_default_str()->group("Backend");
  cmd->add_option("--fabric", o.fabric,
                  "cuda: loopback (W virtual ranks on one GPU), local (the ranks over the visible GPUs, one process) or nccl "
                  "(one process per rank, under `comet launch`)")
      ->capture_default_str()
      ->group("Backend");
  cmd->add_flag("--fused", o.fused, "cuda: run the fused Comet kernels instead of the unfused pipeline")
      ->group("Backend");
  o.cpu_only = {cmd->add_option("--comm-workers", o.comm_workers, "cpu: communication workers per rank")
                    ->capture_default_str()
                    ->group("Backend"),
                cmd->add_option("--compute-workers", o.compute_workers, "cpu: GEMM workers per rank")
                    ->capture_default_str()
                    ->group("Backend"),
                cmd->add_option("--chunk-tokens", o.chunk_tokens, "cpu: tokens per communication chunk")
                    ->capture_default_str()
                    ->group("Backend")};
  cmd->add_option("--stages0", o.layer0_stages,
                  "stages of the layer0 tile order: cpu, 0 = one per ring position; cuda --fused, 0 = one per 4 "
                  "sources (docs/gpu_layer.md)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str()
      ->group("Backend");
  cmd->add_option("--timeout-ms", o.timeout_ms, "timeout of every signal wait")
      ->capture_default_str()
      ->group("Backend");
  cmd->add_option("--emulate-link", o.emulate_link,
                  "cuda: GBPS[,LATENCY_US], pace every inter-rank copy to this link (docs/link_emulation.md)")
      ->check(non_empty("a link (GBPS[,LATENCY_US])"))
      ->group("Backend");
  cmd->add_option("--cpu-budget-gflop", o.cpu_budget_gflop,
                  "cpu: scale the workload down until one forward is at most this much work "
                  "(default: the library's budget)")
      ->group("Backend");
  cmd->add_option("--gpu", o.gpu, "GPU of the full-size lower bound")->capture_default_str()->group("Output");
  cmd->add_option("--trace", o.trace,
                  "record a timeline: FILE.json (Chrome/Perfetto) and FILE.svg (cuda: of the fused kernels)")
      ->check(file_path())
      ->group("Output");
  cmd->add_option("--save", o.save, "write inputs, routing, weights and outputs to FILE (one safetensors file)")
      ->check(file_path())
      ->group("Output");
  cmd->add_flag("--json", o.json, "print one JSON object instead of the text report")->group("Output");
  return cmd;
}

int run_command(const RunOptions& o) {
  RunResult r;
  r.full = build_workload(o.workload, kCpuTiles);

  // Backend and run options. auto: cuda when this build has it and a GPU is visible.
  if (o.backend != "auto" && o.backend != "cpu" && o.backend != "cuda")
    throw UsageError("--backend must be auto, cpu or cuda, not \"" + o.backend + "\"");
#ifdef COMET_HAVE_CUDA
  std::string no_gpu;
  const bool have_gpu = o.backend != "cpu" && gpu_available(&no_gpu);
  if (o.backend == "cuda" && !have_gpu)
    throw UsageError("--backend cuda: " + no_gpu + "; --backend cpu (or auto) runs without a GPU");
  r.backend = have_gpu ? "cuda" : "cpu";
#else
  if (o.backend == "cuda")
    throw UsageError("the CUDA backend is not built into this binary (nvcc was not found at build time); use --backend cpu");
#endif
  if (o.fabric != "loopback" && o.fabric != "local" && o.fabric != "nccl")
    throw UsageError("--fabric must be loopback, local or nccl, not \"" + o.fabric + "\"");
  if ((o.fabric != "loopback" || o.fused) && r.backend != "cuda")
    throw UsageError(std::string(o.fused ? "--fused" : "--fabric " + o.fabric) +
                     " runs on the CUDA backend only; use --backend cuda on a machine with a GPU");
  // The CUDA backend has its own tiles, chunks and blocks: options it would ignore are refused.
  if (r.backend == "cuda") {
    std::vector<CLI::Option*> ignored = o.cpu_only;
    ignored.insert(ignored.end(), o.workload.tile_opts.begin(), o.workload.tile_opts.end());
    for (const CLI::Option* opt : ignored)
      if (opt && opt->count())
        throw UsageError(opt->get_name() + " applies to the cpu backend; this run uses cuda (" +
                         (o.backend == "cuda" ? "leave it out" : "--backend cpu, or leave it out") + ")");
  }
  if (o.comm_workers < 1 || o.comm_workers > 64)
    throw UsageError("--comm-workers must be within [1, 64], not " + std::to_string(o.comm_workers));
  if (o.compute_workers < 1 || o.compute_workers > 64)
    throw UsageError("--compute-workers must be within [1, 64], not " +
                     std::to_string(o.compute_workers));
  // Every rank's workers are threads of this process: thousands of them on a few cores starve
  // each other into the protocol's timeouts, which would read as a protocol failure.
  const int64_t worker_threads = int64_t(r.full.config.layout.world) * (o.comm_workers + o.compute_workers);
  if (r.backend == "cpu" && worker_threads > kMaxWorkerThreads)
    throw UsageError("W " + std::to_string(r.full.config.layout.world) + " x (" + std::to_string(o.comm_workers) +
                     " + " + std::to_string(o.compute_workers) + " workers) = " + std::to_string(worker_threads) +
                     " threads, more than the " + std::to_string(kMaxWorkerThreads) +
                     " the cpu backend runs (fewer --comm-workers or --compute-workers)");
  if (o.chunk_tokens < 1)
    throw UsageError("--chunk-tokens must be positive, not " + std::to_string(o.chunk_tokens));
  if (o.timeout_ms < 1 || o.timeout_ms > 1'000'000'000)
    throw UsageError("--timeout-ms must be within [1, 1000000000], not " + std::to_string(o.timeout_ms));
  r.link = parse_emulate_link_option(o.emulate_link);
  if (r.link.on() && o.fabric != "loopback")
    throw UsageError("--emulate-link stands for a node of GPUs on one GPU (loopback fabric); with --fabric " + o.fabric +
                     " the links are real");
  // Finite and bounded: an infinite budget never scales the layer down (a full-size run on the
  // CPU); 1e6 GFLOP is hours of CPU work already.
  if (!(o.cpu_budget_gflop >= 0 && o.cpu_budget_gflop <= kMaxCpuBudgetGflop))
    throw UsageError("--cpu-budget-gflop must be within [0, " + strf("%g", kMaxCpuBudgetGflop) +
                     "] (0: the default budget, " + strf("%g", kCpuFlopBudget / 1e9) + "), not " +
                     strf("%g", o.cpu_budget_gflop));
  {
    std::string names;
    bool known = false;
    for (const auto& g : gpu_specs()) {
      names += (names.empty() ? "" : ", ") + g.name;
      known = known || g.name == o.gpu;
    }
    if (!known) throw UsageError("--gpu: unknown GPU \"" + o.gpu + "\" (known: " + names + ")");
    r.gpu = o.gpu;
  }
  // Under `comet launch` (or torchrun) only the nccl fabric splits the ranks over the processes;
  // anything else would run the whole world in every process and print it N times.
  std::optional<ProcessEnv> launched;
  try {
    if (o.fabric != "nccl") launched = read_process_env();
  } catch (const NoBootstrapError&) {  // RANK and WORLD_SIZE without a way to meet: not a launch to refuse
  } catch (const Error& e) {
    // A malformed or inconsistent value (RANK=abc, WORLD_SIZE=100, RANK=5 with WORLD_SIZE=2)
    // leaves unknown whether this process is one rank of several: refused rather than guessed.
    throw UsageError("the launch environment: " + user_message(e.what()));
  }
  if (launched && launched->world > 1)
    throw UsageError("this process is rank " + std::to_string(launched->rank) + " of " +
                     std::to_string(launched->world) + " (" + launched->source +
                     "); only --backend cuda --fabric nccl runs one rank per process, and " +
                     (r.backend == "cpu" ? std::string("the cpu backend") : "the " + o.fabric + " fabric") +
                     " would run every rank in each of them (run it without comet launch)");
  // With one process per rank every process writes its own rank's timeline, as `bench layer`
  // does; one file for all of them would keep only the last writer's rank.
  r.trace_path = o.trace;
  if (!o.trace.empty() && o.fabric == "nccl")
    if (const std::optional<ProcessEnv> env = read_process_env())
      r.trace_path = io::trace_path_with_suffix(o.trace, io::trace_rank_suffix(env->rank));
  // Fail before the run, not after it: a missing directory is a typo, not a runtime failure.
  check_trace_path(o.trace, r.trace_path);
  const std::string& save = o.save;
  if (!save.empty() && o.fabric == "nccl")
    throw UsageError("--save writes every rank's output; with --fabric nccl a process holds only its own rank's");
  check_output_path(save, "--save");
  // The file is written beside it and renamed over it (replace_file): refused now where that
  // temporary cannot be created, not after the run.
  if (!save.empty()) check_replaceable_output(save, "--save");
  // One file written twice would keep only the last writer's content.
  if (!save.empty() && !o.trace.empty())
    for (const std::string& written : {r.trace_path, io::trace_svg_path(r.trace_path)})
      if (same_file(save, written))
        throw UsageError("--save " + save + " is also the file --trace " + o.trace + " writes (" + written +
                         "); give them different paths");

  // Scale for the CPU backend: same E, topk, layout and routing; smaller H, F and tokens.
  const LayerConfig& full = r.full.config;
  r.scale = o.cpu_budget_gflop > 0
                ? choose_cpu_scale(full.model, full.layout.world, full.max_tokens_per_rank,
                                   o.cpu_budget_gflop * 1e9)
                : choose_cpu_scale(full.model, full.layout.world, full.max_tokens_per_rank);
  for (int t : r.full.tokens_per_rank)
    r.tokens_per_rank.push_back(t == 0 ? 0 : std::max(1, t / r.scale.token_factor));
  auto scaled = [&](int factor) {
    LayerConfig c = full;
    c.model = full.model.scaled_down(factor);
    c.max_tokens_per_rank = *std::max_element(r.tokens_per_rank.begin(), r.tokens_per_rank.end());
    return c;
  };
  // Why the backend cannot run a config ("" when it can). Rounding H and F to multiples of 8 can
  // break F % TP, and the GPU needs 16-byte rows: such factors are halved until the shape fits.
  auto unfit = [&](const LayerConfig& c, bool gpu) -> std::string {
    if (const Status s = c.validate(); !s) return s.reason;
#ifdef COMET_HAVE_CUDA
    if (gpu) {
      if (c.dtype != DType::kBF16) return std::string("the CUDA backend runs bf16 only, not ") + dtype_name(c.dtype);
      if (const Status s = MoeLayer::can_implement(c); !s) return s.reason;
    }
#else
    (void)gpu;
#endif
    return "";
  };
  auto fit_factor = [&](bool gpu, std::string& why) {
    for (int f = r.scale.shape_factor;; f /= 2) {
      why = unfit(scaled(f), gpu);
      if (why.empty() || f == 1) return why.empty() ? f : 0;
    }
  };
  std::string why;
  int factor = 0;
  if (r.backend == "cuda") {
    factor = fit_factor(true, why);
    if (factor == 0 && o.backend == "cuda") throw UsageError("--backend cuda cannot run this workload: " + user_message(why));
    if (factor == 0) r.backend = "cpu";  // auto: the CPU backend runs what the GPU cannot
  }
  if (r.backend == "cpu") {
    factor = fit_factor(false, why);
    if (factor == 0)
      throw UsageError("the workload scaled down for the CPU backend cannot run: " + user_message(why));
  }
  r.scale.shape_factor = factor;
  r.config = scaled(factor);
  // The fp64 oracle holds every expert's weights: bound them even when H cannot shrink further.
  constexpr double kMaxWeightValues = 256.0 * (1 << 20);
  const double weight_values = double(r.config.model.num_experts) * double(r.config.model.weights_per_expert());
  if (weight_values > kMaxWeightValues)
    throw UsageError("the model's experts hold " + std::to_string(int64_t(weight_values)) +
                     " weights even scaled down " + std::to_string(factor) + "x, more than the " +
                     std::to_string(int64_t(kMaxWeightValues)) + " the oracle run allows");

  if (r.link.on() && r.backend != "cuda")
    throw UsageError("--emulate-link paces the CUDA backend's copies; this run uses the cpu backend (--backend cuda)");

  // The problem, the forward pass and the oracle.
  MoeProblem problem = make_problem(r.config, r.tokens_per_rank, r.full.routing, r.full.seed);
  ref::RefOptions ro;
  ro.comm_workers = o.comm_workers;
  ro.compute_workers = o.compute_workers;
  ro.comm_chunk_tokens = o.chunk_tokens;
  ro.layer0_stages = o.layer0_stages;
  ro.timeout = std::chrono::milliseconds(o.timeout_ms);
  ro.trace = !o.trace.empty();
  auto t0 = std::chrono::steady_clock::now();
#ifdef COMET_HAVE_CUDA
  if (r.backend == "cuda") {
    GpuRun g = run_on_gpu(r.config, problem,
                          {o.fabric, o.fused, ro.trace, r.link, o.layer0_stages, o.timeout_ms / 1e3});  // MoeLayer takes its own tile shapes
    r.y = std::move(g.y);
    r.forward_us = g.forward_us;
    r.device = g.device;
    r.fabric = g.fabric;
    r.devices = g.devices;
    r.first_rank = g.first_rank;
    r.full.config.tiles = r.config.tiles = g.tiles;  // reported as run, not the CPU backend's
    if (ro.trace) {
      g.trace.title = "comet run: " + config_header(full, r.full.tokens_per_rank, r.full.routing, r.full.seed) +
                      " (fused kernels on " + g.device + ", scaled for the oracle)";
      r.trace_events = int64_t(g.trace.events.size());
      r.trace_lanes = g.trace.layer_comm_lanes;
      r.trace_lanes.push_back(g.trace.comm_lanes + g.trace.compute_lanes);
      io::write_trace_files(g.trace, r.trace_path);
    }
  }
#endif
  if (r.backend == "cpu") {
    ref::RefBackend backend(r.config, ro);
    backend.set_weights(problem.weights);
    try {
      r.y = backend.forward(problem.x, problem.routing);
    } catch (const TimeoutError& e) {
      // Every rank's workers are threads of this process: on a loaded or small machine a thread
      // that never gets a core reads as a stalled signal. Say so, and what to change.
      const int64_t threads = int64_t(r.config.layout.world) * (o.comm_workers + o.compute_workers);
      throw TimeoutError(std::string(e.what()) + " (the cpu backend ran " + std::to_string(threads) +
                         " worker threads on " + std::to_string(std::max(1u, std::thread::hardware_concurrency())) +
                         " cores: a thread that gets no core looks like a stalled signal; raise --timeout-ms, now " +
                         std::to_string(o.timeout_ms) + ", or run fewer --comm-workers / --compute-workers)");
    }
    r.forward_us = elapsed_us(t0);
    r.stats = backend.last_stats();
    if (ro.trace) {
      Trace trace = backend.last_trace();
      trace.title = "comet run: " + config_header(full, r.full.tokens_per_rank, r.full.routing, r.full.seed) +
                    " (CPU backend, scaled)";
      r.trace_events = int64_t(trace.events.size());
      io::write_trace_files(trace, r.trace_path);
    }
  }
  t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<double>> term_squares;  // the scale where the reference cancels (ref/oracle.h)
  r.want = ref::oracle_forward(problem, &term_squares);
  r.oracle_us = elapsed_us(t0);
  // A process of a multi-process run verifies the ranks it drove.
  COMET_CHECK(r.first_rank >= 0 && size_t(r.first_rank) + r.y.size() <= r.want.size(),
              "the backend returned ranks " << r.first_rank << " to " << r.first_rank + int64_t(r.y.size()) - 1
                                            << " of output, the oracle has " << r.want.size());
  r.want = std::vector<std::vector<double>>(r.want.begin() + r.first_rank, r.want.begin() + r.first_rank + r.y.size());
  term_squares = std::vector<std::vector<double>>(term_squares.begin() + r.first_rank,
                                                  term_squares.begin() + r.first_rank + r.y.size());
  COMET_CHECK(r.y.size() == r.want.size(), "the backend returned " << r.y.size()
                                                                   << " ranks of output, expected "
                                                                   << r.want.size());
  for (size_t rank = 0; rank < r.y.size(); ++rank)
    COMET_CHECK(r.y[rank].size() == r.want[rank].size(),
                "rank " << rank << " output has " << r.y[rank].size() << " values, expected "
                        << r.want[rank].size());
  r.comparison = ref::compare_outputs(r.y, r.want, r.config.model.hidden, &term_squares);
  r.tolerance = ref::tolerance_for(r.config.dtype);
  r.pass = r.comparison.within(r.tolerance);

  const DispatchPlan plan(r.config, problem.routing);

  // Lower bound of the same workload at full size, on a GPU's tiles.
  LayerConfig full_gpu = full;
  full_gpu.tiles = TileConfig{};
  const DispatchPlan plan_full(full_gpu, generate_all_routing(r.full));
  r.full_cost = layer_cost(full_gpu, plan_full, gpu_spec(o.gpu));

  if (!save.empty()) save_run(save, problem, r);
  if (o.json) {
    print_json(o, r, plan);
  } else {
    print_text(o, r, plan);
  }
  return r.pass ? kExitOk : kExitVerifyFailed;
}

}  // namespace comet::tools
