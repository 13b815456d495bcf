// Table and JSON output of `comet bench gemm`.
#include <iomanip>
#include <iterator>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/gemm_bench.h"
#include "cuda/grouped_gemm.h"
#include "io/json_text.h"

namespace comet::bench {

// Configuration columns: short names in the order of cuda::kGemmKernels.
constexpr const char* kConfigColumns[] = {"coop", "coop-c2", "pp", "pp-c2"};
// Split schedules (last wave cut along K) of the cooperative and ping-pong configurations (bench/gemm_bench.cu).
constexpr const char* kSplitColumns[] = {"coop-sk", "pp-sk"};
static_assert(std::size(kConfigColumns) == std::size(cuda::kGemmKernels), "one column per configuration");

void print_gemm_table(const std::vector<GemmBenchRow>& rows, std::ostream& os) {
  os << std::left << std::setw(16) << "model" << std::right << std::setw(6) << "T" << std::setw(14) << "gemm"
     << std::setw(5) << "E" << std::setw(7) << "rows" << std::setw(7) << "N" << std::setw(7) << "K"
     << std::setw(10) << "comet us" << std::setw(9) << "TFLOP/s";
  for (const char* c : kConfigColumns) os << std::setw(9) << c;
  for (const char* c : kSplitColumns) os << std::setw(10) << c;
  os << std::setw(9) << "claimed" << std::setw(11) << "cublas us" << std::setw(9) << "TFLOP/s" << std::setw(8) << "ratio"
     << std::setw(10) << "max err" << "  check\n";
  os << std::fixed;
  for (const auto& r : rows) {
    os << std::left << std::setw(16) << r.model << std::right << std::setw(6) << r.tokens << std::setw(14) << r.gemm
       << std::setw(5) << r.experts << std::setw(7) << r.rows << std::setw(7) << r.n << std::setw(7) << r.k
       << std::setprecision(1) << std::setw(10) << r.ours_us << std::setprecision(0) << std::setw(9)
       << r.ours_tflops() << std::setprecision(1);
    for (double us : r.config_us) os << std::setw(9) << us;
    for (size_t i = 0; i < r.split_us.size(); ++i)  // '=': not split on this shape (whole tiles only)
      os << std::setw(9) << r.split_us[i] << (r.split_used[i] ? " " : "=");
    os << std::setw(9) << r.claimed_us << std::setw(11) << r.cublas_best_us() << std::setprecision(0)
       << std::setw(9) << r.cublas_tflops() << std::setprecision(3) << std::setw(8) << r.ratio()
       << std::scientific << std::setprecision(1) << std::setw(10) << r.max_rel_err << std::fixed << "  "
       << (r.verified                   ? "ok"
           : !r.claimed_matches         ? "FAIL (claimed tiles differ)"
           : !r.configs_differ.empty()  ? "FAIL (" + r.configs_differ + " differ)"
                                        : "FAIL")
       << "  " << r.kernel << (r.cublas_loop_us <= r.cublas_grouped_us ? "" : "  (cublas grouped)") << "\n";
  }
}

std::string gemm_rows_json(const std::vector<GemmBenchRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows)
    j.push_back({{"model", r.model}, {"tokens_per_rank", r.tokens}, {"gemm", r.gemm}, {"experts", r.experts},
                 {"rows", r.rows}, {"n", r.n}, {"k", r.k}, {"flop", r.flop}, {"kernel", r.kernel},
                 {"comet_us", r.ours_us}, {"comet_config_us", r.config_us}, {"comet_claimed_us", r.claimed_us},
                 {"comet_tflops", r.ours_tflops()}, {"cublas_loop_us", r.cublas_loop_us},
                 {"cublas_grouped_us", r.cublas_grouped_us}, {"cublas_best_tflops", r.cublas_tflops()},
                 {"speedup_vs_cublas", r.ratio()}, {"max_rel_err", r.max_rel_err},
                 {"claimed_matches_static", r.claimed_matches}, {"configs_differing", r.configs_differ},
                 {"comet_split_us", r.split_us}, {"split_used", r.split_used},
                 {"split_max_rel_diff", r.split_max_rel_diff},
                 {"verified", r.verified}});
  return io::json_text(j, 2);  // a device name is not always UTF-8
}

}  // namespace comet::bench
