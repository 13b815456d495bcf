// Derived benchmark columns (core/bench_metrics.h).
#include "core/bench_metrics.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace comet::core {

double hidden_fraction(double fused_us, double compute_us, double comm_us) {
  if (!(comm_us > 0)) return 0;
  return std::clamp((compute_us + comm_us - fused_us) / comm_us, 0.0, 1.0);
}

double link_gbps_per_direction(double remote_bytes, int world, double time_us, int ranks_per_gpu) {
  if (!(time_us > 0) || world < 1 || ranks_per_gpu < 1) return 0;
  const double per_rank_bytes = remote_bytes / world;
  const double per_rank_us = time_us / ranks_per_gpu;
  return per_rank_bytes / (per_rank_us * 1e3);  // bytes per us / 1e3 = GB/s
}

double bound_ratio(double time_us, double bound_us) { return bound_us > 0 ? time_us / bound_us : 0; }

namespace {

using Spans = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) in ns

// Sorted, disjoint cover of the spans.
Spans merged(Spans s) {
  std::sort(s.begin(), s.end());
  Spans out;
  for (const auto& [b, e] : s) {
    if (!out.empty() && b <= out.back().second)
      out.back().second = std::max(out.back().second, e);
    else
      out.emplace_back(b, e);
  }
  return out;
}

int64_t length(const Spans& s) {
  int64_t n = 0;
  for (const auto& [b, e] : s) n += e - b;
  return n;
}

// Length of the intersection of two sorted, disjoint span lists.
int64_t intersection(const Spans& a, const Spans& b) {
  int64_t n = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    n += std::max<int64_t>(0, std::min(a[i].second, b[j].second) - std::max(a[i].first, b[j].first));
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return n;
}

}  // namespace

TimelineOverlap timeline_overlap(const Trace& trace, int rank, int layer) {
  TimelineOverlap out;
  for (int l = 0; l < 2; ++l) {
    if (layer >= 0 && l != layer) continue;
    Spans comm, gemm;
    for (const TraceEvent& e : trace.events) {
      if (e.rank != rank || e.layer != l || e.end_ns <= e.begin_ns) continue;
      if (e.kind == TraceKind::kCommChunk) comm.emplace_back(e.begin_ns, e.end_ns);
      if (e.kind == TraceKind::kGemmTile) gemm.emplace_back(e.begin_ns, e.end_ns);
    }
    const Spans c = merged(std::move(comm));
    out.comm_us += double(length(c)) * 1e-3;
    out.hidden_us += double(intersection(c, merged(std::move(gemm)))) * 1e-3;
  }
  return out;
}

}  // namespace comet::core
