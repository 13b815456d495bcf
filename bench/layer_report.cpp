// Table and JSON output of `comet bench layer`.
#include <iomanip>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/layer_bench.h"
#include "core/bench_metrics.h"
#include "io/json_text.h"
#include "io/trace_writers.h"

namespace comet::bench {

namespace {
std::string fixed(double v, int precision, const char* suffix = "") {
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << v << suffix;
  return os.str();
}
}  // namespace

double LayerBenchRow::hidden_fraction() const { return core::hidden_fraction(fused_us, compute_us, comm_us); }
double LayerBenchRow::comm_link_gbps() const {
  return core::link_gbps_per_direction(remote_bytes, world, comm_us, ranks_per_gpu);
}
double LayerBenchRow::fused_link_gbps() const {
  return core::link_gbps_per_direction(remote_bytes, world, fused_us, ranks_per_gpu);
}
double LayerBenchRow::fused_over_bound() const { return core::bound_ratio(fused_us, lower_bound_us); }

void print_layer_table(const std::vector<LayerBenchRow>& rows, std::ostream& os) {
  const auto workload = [&os](const LayerBenchRow& r) {
    const std::string layout = std::to_string(r.world) + "(" + std::to_string(r.ep) + "x" + std::to_string(r.tp) + ")";
    const std::string n_comm = std::to_string(r.n_comm0) + "/" + std::to_string(r.n_comm1);
    os << std::left << std::setw(16) << r.model << std::setw(15) << r.routing << std::right << std::setw(6) << r.tokens
       << std::setw(10) << layout << std::setw(9) << n_comm << std::setw(5)
       << (r.layer0_group_m > 0 ? std::to_string(r.layer0_group_m) : "auto") << std::setw(5)
       << (r.layer0_stages > 0 ? std::to_string(r.layer0_stages) : "auto") << std::setw(7)
       << unfused_gemms_name(r.unfused_gemms) << std::setw(7) << layer0_copies_name(r.layer0.copies)
       << std::setw(5) << dispatch_order_name(r.layer0.order) << std::setw(4) << on_off(r.epilogue_combine)
       << std::setw(7) << layer1_combine_name(r.layer1_combine) << std::setw(4) << on_off(r.half_tiles)
       << std::setw(4) << r.split_gemms;
  };
  const auto workload_header = [&os] {
    os << std::left << std::setw(16) << "model" << std::setw(15) << "routing" << std::right << std::setw(6) << "T"
       << std::setw(10) << "W(EPxTP)"
       << std::setw(9) << "n_comm" << std::setw(5) << "gm0" << std::setw(5) << "st0" << std::setw(7) << "ugemm" << std::setw(7) << "cp0" << std::setw(5) << "or0" << std::setw(4) << "ec" << std::setw(7) << "cb1" << std::setw(4) << "ht" << std::setw(4) << "sk";
  };
  // Times.
  workload_header();
  os << std::setw(11) << "fused us" << std::setw(12) << "unfused us" << std::setw(12) << "compute us" << std::setw(10)
     << "comm us" << std::setw(9) << "plan us" << std::setw(11) << "fgemm us" << std::setw(10) << "fused/cmp" << std::setw(9) << "TFLOP/s" << std::setw(10)
     << "seq us" << std::setw(15) << "chunked us(C)" << std::setw(8) << "vs seq" << std::setw(10) << "vs chunk"
     << "  fused==unfused  split ok  baselines ok  link\n";
  for (const auto& r : rows) {
    const bool chunked = r.baselines_run() && r.chunked_chunks > 0;
    workload(r);
    os << std::setw(11) << fixed(r.fused_us, 1) << std::setw(12) << fixed(r.unfused_us, 1)
       << std::setw(12) << fixed(r.compute_us, 1) << std::setw(10) << fixed(r.comm_us, 1) << std::setw(9) << fixed(r.plan_us, 1) << std::setw(11) << fixed(r.fused_gemms_us, 1) << std::setw(10)
       << fixed(r.fused_over_compute(), 3) << std::setw(9) << fixed(r.fused_tflops(), 0) << std::setw(10)
       << (r.baselines_run() ? fixed(r.sequential_us, 1) : "-") << std::setw(15)
       << (chunked ? fixed(r.chunked_us, 1) + "(" + std::to_string(r.chunked_chunks) + ")" : "-") << std::setw(8)
       << (r.baselines_run() ? fixed(r.speedup_over_sequential(), 2, "x") : "-") << std::setw(10)
       << (chunked ? fixed(r.speedup_over_chunked(), 2, "x") : "-") << "  " << std::left << std::setw(16)
       << (r.fused_equals_unfused ? "yes" : "NO") << std::setw(10)
       << (r.split_gemms == "-" ? "-" : r.split_within_tolerance ? "yes" : "NO") << std::setw(14)
       << (r.baselines_run() ? (r.baselines_match ? "yes" : "NO") : "-") << r.link.short_name() << std::right << "\n";
  }
  if (rows.empty()) return;
  // Communication and bounds (docs/cli.md defines each column).
  os << "\n";
  workload_header();
  os << std::setw(11) << "remote MB" << std::setw(11) << "comm GB/s" << std::setw(10) << "fwd GB/s" << std::setw(8)
     << "hidden" << std::setw(10) << "bound us" << std::setw(10) << "bound by" << std::setw(9) << "x bound" << std::setw(9)
     << "base MB" << "  link\n";
  for (const auto& r : rows) {
    workload(r);
    os << std::setw(11) << fixed(r.remote_bytes / 1e6, 1) << std::setw(11) << fixed(r.comm_link_gbps(), 0)
       << std::setw(10) << fixed(r.fused_link_gbps(), 0) << std::setw(8) << fixed(100 * r.hidden_fraction(), 1, "%")
       << std::setw(10) << fixed(r.lower_bound_us, 1) << std::setw(10) << r.bound_by << std::setw(9)
       << fixed(r.fused_over_bound(), 2, "x") << std::setw(9)
       << (r.baselines_run() ? fixed(r.baseline_remote_bytes / 1e6, 1) : "-") << "  " << r.link.short_name() << "\n";
  }
  // Notes. The fabric once (one per run); the rest per workload (a workload's rows are
  // consecutive): its n_comm sources, default path and baselines, and the lower bound's model
  // wherever it changes (a --layouts sweep on the local fabric changes the ranks per GPU).
  const LayerBenchRow& first = rows.front();
  os << "fabric: " << first.fabric << " (times of rank " << first.rank << "'s stream)\n";
  const auto same_workload = [](const LayerBenchRow& a, const LayerBenchRow& b) {
    return a.model == b.model && a.tokens == b.tokens && a.ep == b.ep && a.tp == b.tp && a.routing == b.routing;
  };
  const auto workload_name = [](const LayerBenchRow& r) {
    return r.model + " T=" + std::to_string(r.tokens) + " EPxTP=" + std::to_string(r.ep) + "x" + std::to_string(r.tp) +
           " routing " + r.routing;
  };
  const auto bound_model = [](const LayerBenchRow& r) {
    const bool turns = r.ranks_per_gpu > 1;
    return std::string("cost model with ") +
           (r.ranks_per_gpu == r.world ? "the W ranks one after another, "
            : turns ? "the " + std::to_string(r.ranks_per_gpu) + " ranks of each GPU one after another, "
                    : std::string("the W ranks in parallel, ")) +
           r.bound_gpu + " (link " + fixed(r.bound_link_gbps, 0) + " GB/s per direction); GB/s are per link direction" +
           (turns ? ", ranks taking turns; " : "; ") + r.link.describe();
  };
  std::string last_bound;
  for (size_t i = 0; i < rows.size(); ++i) {
    const LayerBenchRow& r = rows[i];
    const bool starts = i == 0 || !same_workload(r, rows[i - 1]);
    // Each n_comm source of the workload once.
    bool seen = false;
    for (size_t j = i; j-- > 0 && same_workload(rows[j], r);)
      seen = seen || rows[j].n_comm_source == r.n_comm_source;
    if (!seen) os << workload_name(r) << ": n_comm " << r.n_comm_source << "\n";
    if (!starts) continue;
    os << workload_name(r) << ": default path (ForwardPath::kTuned) " << r.path_source << "\n";
    if (r.baselines_run())
      os << workload_name(r) << ": baselines with " << r.baseline_gemm << " (the faster cuBLAS variant), worst rel_l2 vs unfused "
         << std::scientific << std::setprecision(2) << r.baseline_rel_l2 << std::defaultfloat << ", "
         << fixed(r.baseline_remote_bytes / 1e6, 1) << " MB between ranks per forward; " << r.link.describe() << "\n";
    else if (!r.baseline_note.empty())
      os << workload_name(r) << ": " << r.baseline_note << "; " << r.link.describe() << "\n";
    if (bound_model(r) != last_bound) {
      last_bound = bound_model(r);
      os << "lower bound" << (i == 0 ? "" : " from " + workload_name(r) + " on") << ": " << last_bound << "\n";
    }
  }
  for (const auto& r : rows) {
    if (r.trace_path.empty()) continue;
    os << r.model << " T=" << r.tokens << ": timeline of rank " << r.rank << " (" << r.trace_path << ")";
    for (int l = 0; l < 2; ++l)
      os << (l ? "," : ":") << " layer" << l << " communication " << fixed(r.timeline[l].comm_us, 1) << " us, "
         << fixed(100 * r.timeline[l].fraction(), 1, "%") << " of it during GEMM tiles";
    os << "\n";
  }
}

std::string unique_trace_path(const std::string& path, size_t row_index, std::set<std::string>& used) {
  std::string unique = path;
  if (used.count(unique)) unique = io::trace_path_with_suffix(path, "-row" + std::to_string(row_index));
  used.insert(unique);
  return unique;
}

std::string layer_rows_json(const std::vector<LayerBenchRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json row = {{"model", r.model}, {"routing", r.routing}, {"fabric", r.fabric}, {"timed_rank", r.rank},
                          {"tokens_per_rank", r.tokens}, {"world", r.world}, {"ep", r.ep},
                          {"tp", r.tp}, {"n_comm0", r.n_comm0}, {"n_comm1", r.n_comm1},
                          {"n_comm_source", r.n_comm_source}, {"layer0_group_m", r.layer0_group_m}, {"layer0_stages", r.layer0_stages}, {"unfused_gemms", unfused_gemms_name(r.unfused_gemms)}, {"layer0_copies", layer0_copies_name(r.layer0.copies)}, {"dispatch_order", dispatch_order_name(r.layer0.order)}, {"epilogue_combine", r.epilogue_combine}, {"layer1_combine", layer1_combine_name(r.layer1_combine)}, {"half_tiles", r.half_tiles}, {"split_gemms", r.split_gemms}, {"split_within_tolerance", r.split_within_tolerance}, {"flop", r.flop}, {"fused_us", r.fused_us},
                          {"unfused_us", r.unfused_us}, {"compute_only_us", r.compute_us},
                          {"comm_only_us", r.comm_us}, {"plan_us", r.plan_us}, {"fused_gemms_only_us", r.fused_gemms_us}, {"fused_over_compute", r.fused_over_compute()},
                          {"fused_tflops", r.fused_tflops()}, {"fused_equals_unfused", r.fused_equals_unfused},
                          {"link", r.link.describe()}, {"link_gbps", r.link.gbps}, {"link_latency_us", r.link.latency_us},
                          {"remote_bytes", r.remote_bytes}, {"comm_link_gbps", r.comm_link_gbps()},
                          {"fused_link_gbps", r.fused_link_gbps()}, {"hidden_fraction", r.hidden_fraction()},
                          {"lower_bound_us", r.lower_bound_us}, {"lower_bound_by", r.bound_by},
                          {"ranks_per_gpu", r.ranks_per_gpu},
                          {"lower_bound_rates", r.bound_gpu}, {"lower_bound_link_gbps", r.bound_link_gbps},
                          {"fused_over_lower_bound", r.fused_over_bound()},
                          {"tuned_path", r.tuned_fused ? "fused" : "unfused"}, {"tuned_us", r.tuned_us()},
                          {"path_source", r.path_source}};
    if (r.baselines_run()) {
      row["baseline_gemm"] = r.baseline_gemm;
      row["sequential_us"] = r.sequential_us;
      row["speedup_over_sequential"] = r.speedup_over_sequential();
      row["tuned_speedup_over_sequential"] = r.sequential_us / r.tuned_us();
      if (r.chunked_chunks > 0) {
        row["chunked_us"] = r.chunked_us;
        row["chunked_chunks"] = r.chunked_chunks;
        row["speedup_over_chunked"] = r.speedup_over_chunked();
        row["tuned_speedup_over_chunked"] = r.chunked_us / r.tuned_us();
      }
      row["baselines_match"] = r.baselines_match;
      row["baseline_rel_l2"] = r.baseline_rel_l2;
      row["baseline_remote_bytes"] = r.baseline_remote_bytes;
    } else if (!r.baseline_note.empty()) {
      row["baseline_note"] = r.baseline_note;
    }
    if (!r.trace_path.empty())
      row["trace"] = {{"path", r.trace_path},
                      {"events", r.trace_events},
                      {"dropped_events", r.trace_dropped},
                      {"comm_us", {r.timeline[0].comm_us, r.timeline[1].comm_us}},
                      {"hidden_comm_us", {r.timeline[0].hidden_us, r.timeline[1].hidden_us}},
                      {"hidden_fraction", {r.timeline[0].fraction(), r.timeline[1].fraction()}}};
    j.push_back(row);
  }
  return io::json_text(j, 2);  // a --trace path is bytes as the user typed them, not always UTF-8
}

}  // namespace comet::bench
