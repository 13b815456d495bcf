// Derived benchmark columns (core/bench_metrics.h).
#include "core/bench_metrics.h"

#include <algorithm>

namespace comet::core {

double hidden_fraction(double fused_us, double compute_us, double comm_us) {
  if (!(comm_us > 0)) return 0;
  return std::clamp((compute_us + comm_us - fused_us) / comm_us, 0.0, 1.0);
}

double link_gbps_per_direction(double remote_bytes, int world, double time_us, bool ranks_take_turns) {
  if (!(time_us > 0) || world < 1) return 0;
  const double per_rank_bytes = remote_bytes / world;
  const double per_rank_us = ranks_take_turns ? time_us / world : time_us;
  return per_rank_bytes / (per_rank_us * 1e3);  // bytes per us / 1e3 = GB/s
}

double bound_ratio(double time_us, double bound_us) { return bound_us > 0 ? time_us / bound_us : 0; }

}  // namespace comet::core
