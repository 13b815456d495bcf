// Table and JSON output of `comet bench layer`.
#include <iomanip>
#include <ostream>

#include <nlohmann/json.hpp>

#include "bench/layer_bench.h"

namespace comet::bench {

void print_layer_table(const std::vector<LayerBenchRow>& rows, std::ostream& os) {
  os << std::left << std::setw(16) << "model" << std::right << std::setw(6) << "T" << std::setw(10) << "W(EPxTP)"
     << std::setw(9) << "n_comm" << std::setw(5) << "gm0" << std::setw(11) << "fused us" << std::setw(12) << "unfused us" << std::setw(12)
     << "compute us" << std::setw(10) << "comm us" << std::setw(9) << "plan us" << std::setw(10) << "fused/cmp" << std::setw(9) << "TFLOP/s"
     << "  fused==unfused\n";
  os << std::fixed;
  for (const auto& r : rows) {
    const std::string layout = std::to_string(r.world) + "(" + std::to_string(r.ep) + "x" + std::to_string(r.tp) + ")";
    const std::string n_comm = std::to_string(r.n_comm0) + "/" + std::to_string(r.n_comm1);
    os << std::left << std::setw(16) << r.model << std::right << std::setw(6) << r.tokens << std::setw(10) << layout
       << std::setw(9) << n_comm << std::setw(5) << (r.layer0_group_m > 0 ? std::to_string(r.layer0_group_m) : "auto")
       << std::setprecision(1) << std::setw(11) << r.fused_us << std::setw(12)
       << r.unfused_us << std::setw(12) << r.compute_us << std::setw(10) << r.comm_us << std::setw(9) << r.plan_us << std::setprecision(3)
       << std::setw(10) << r.fused_over_compute() << std::setprecision(0) << std::setw(9) << r.fused_tflops() << "  "
       << (r.fused_equals_unfused ? "yes" : "NO") << "\n";
  }
  if (!rows.empty()) os << "n_comm: " << rows.front().n_comm_source << "\n";
}

std::string layer_rows_json(const std::vector<LayerBenchRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows)
    j.push_back({{"model", r.model}, {"tokens_per_rank", r.tokens}, {"world", r.world}, {"ep", r.ep}, {"tp", r.tp},
                 {"n_comm0", r.n_comm0}, {"n_comm1", r.n_comm1}, {"n_comm_source", r.n_comm_source},
                 {"layer0_group_m", r.layer0_group_m},
                 {"flop", r.flop}, {"fused_us", r.fused_us}, {"unfused_us", r.unfused_us},
                 {"compute_only_us", r.compute_us}, {"comm_only_us", r.comm_us}, {"plan_us", r.plan_us},
                 {"fused_over_compute", r.fused_over_compute()}, {"fused_tflops", r.fused_tflops()},
                 {"fused_equals_unfused", r.fused_equals_unfused}});
  return j.dump(2);
}

}  // namespace comet::bench
