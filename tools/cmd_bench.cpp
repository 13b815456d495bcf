// tools/cmd_bench.cpp: `comet bench ...`, the benchmark harness on the command line.
//
//   comet bench gemm                                   (every preset, T in {2048,4096,8192})
//   comet bench gemm --models mixtral-8x7b --tokens 4096 --json
//
// Prints a config header, a progress line per workload on stderr, then the table (or JSON).
// Exit code 1 when any verification against cuBLAS's output failed, so a benchmark never
// hides a wrong result.
#include <iostream>

#include "commands.h"
#include "comet/config.h"

#ifdef COMET_HAVE_CUDA
#include "bench/gemm_bench.h"
#include "cuda/device_info.h"
#endif

namespace comet::tools {

CLI::App* add_bench_command(CLI::App& app, BenchOptions& o, CLI::App** gemm) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks on the GPU (same-run baselines)");
  bench->require_subcommand(1);
  CLI::App* g = bench->add_subcommand("gemm", "grouped expert GEMMs (GEMM0+SwiGLU, GEMM1) vs cuBLAS");
  g->add_option("--models", o.models, "presets, comma separated (default: all)")->delimiter(',');
  g->add_option("--tokens", o.tokens, "tokens per rank, comma separated")->delimiter(',');
  g->add_option("--ep", o.ep, "expert-parallel ranks (shapes of rank 0)")->check(CLI::PositiveNumber);
  g->add_option("--iters", o.iters, "timed iterations per variant (median reported)")->check(CLI::Range(1, 100000));
  g->add_option("--warmup-ms", o.warmup_ms, "warm-up before timing each workload")->check(CLI::NonNegativeNumber);
  g->add_option("--seed", o.seed, "routing seed");
  g->add_flag("--json", o.json, "JSON instead of the table");
  *gemm = g;
  return bench;
}

int bench_gemm_command(const BenchOptions& o) {
  for (const auto& m : o.models) {  // unknown names fail before the GPU starts
    try {
      ModelPresets::get(m);
    } catch (const Error& e) {
      throw UsageError(std::string("--models: ") + e.what());
    }
  }
  for (int t : o.tokens)
    if (t < 1) throw UsageError("--tokens: every count must be >= 1");
#ifndef COMET_HAVE_CUDA
  throw UsageError("comet bench needs the CUDA backend; this build has none (nvcc was not found)");
#else
  const cuda::DeviceInfo info = cuda::query_device_info();
  if (info.device_count == 0)
    throw UsageError("comet bench needs a GPU; none is visible" + (info.error.empty() ? "" : " (" + info.error + ")"));
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
  const auto rows = bench::run_gemm_bench(bo, [](int done, int total, const std::string& what) {
    std::cerr << "[" << done << "/" << total << "] " << what << "\n";
  });
  if (o.json) std::cout << bench::gemm_rows_json(rows) << "\n";
  else bench::print_gemm_table(rows, std::cout);
  for (const auto& r : rows)
    if (!r.verified) return kExitVerifyFailed;
  return 0;
#endif
}

}  // namespace comet::tools
