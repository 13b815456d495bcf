// bench/gemm_bench.h: `comet bench gemm`: our grouped GEMM (GEMM0 + SwiGLU, GEMM1) against
// cuBLAS on the per-rank expert shapes of each preset, in one process, verified.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace comet::bench {

struct GemmBenchOptions {
  std::vector<std::string> models;           // empty: every preset
  std::vector<int> tokens{2048, 4096, 8192};  // tokens per rank
  int ep = 8;
  int iters = 30;
  double warmup_ms = 300;
  uint64_t seed = 1;
};

struct GemmBenchRow {
  std::string model, gemm;  // gemm: "gemm0+swiglu" or "gemm1"
  int tokens = 0, experts = 0, rows = 0, n = 0, k = 0;
  double flop = 0;
  std::string kernel;  // the configuration kAuto chose; ours_us is its time
  double ours_us = 0, cublas_loop_us = 0, cublas_grouped_us = 0;
  std::vector<double> config_us;  // each configuration of cuda::kGemmKernels, static tiles
  double claimed_us = 0;  // cooperative with tiles claimed from a counter, as in a layer
  // Split schedules (the last wave cut along K) of the configurations that can split (kSplitKernels), and whether
  // gemm_split_plan split them on this shape (unsplit: the split kernel ran whole tiles only).
  std::vector<double> split_us;
  std::vector<bool> split_used;
  double split_max_rel_diff = 0;  // split outputs vs the cooperative one (rounding of the split sums)
  double max_rel_err = 0;  // ours vs cuBLAS on sampled elements
  bool claimed_matches = false;  // claimed tiles gave the static output bitwise
  std::string configs_differ;    // configurations whose output differs from the cooperative one's
                                 // (split schedules: beyond the rounding of their split sums)
  bool verified = false;         // max_rel_err within bounds, no device error, all outputs equal
  double ours_tflops() const { return flop / ours_us * 1e-6; }
  double cublas_best_us() const { return std::min(cublas_loop_us, cublas_grouped_us); }
  double cublas_tflops() const { return flop / cublas_best_us() * 1e-6; }
  double ratio() const { return cublas_best_us() / ours_us; }
};

using Progress = std::function<void(int done, int total, const std::string& what)>;

// Appends each workload's two rows to `rows` once they are verified: a workload that throws
// (out of memory, a CUDA error) leaves the earlier workloads' rows for the caller to report.
void run_gemm_bench(const GemmBenchOptions& options, const Progress& progress, std::vector<GemmBenchRow>& rows);
void print_gemm_table(const std::vector<GemmBenchRow>& rows, std::ostream& os);
std::string gemm_rows_json(const std::vector<GemmBenchRow>& rows);

}  // namespace comet::bench
