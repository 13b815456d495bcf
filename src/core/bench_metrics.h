// core/bench_metrics.h: the derived columns of `comet bench layer` (docs/cli.md), computed from
// measured medians on the host. Pure functions, unit-tested (tests/unit/bench_metrics_test.cpp).
#pragma once

#include "comet/trace.h"

namespace comet::core {

// Fraction of the communication time that overlapped compute (DESIGN §6; the paper's "86.5% of
// communication hidden"): (compute + comm - fused) / comm = 1 - (fused - compute) / comm,
// clamped to [0, 1]. compute_us and comm_us are the two parts timed alone; whatever a forward
// does besides them (plan, publish, owner reduce) counts as communication not hidden, so the
// fraction errs low. 0 when comm_us <= 0 (nothing to hide).
double hidden_fraction(double fused_us, double compute_us, double comm_us);

// Average rate of one link direction, GB/s: every byte of remote_bytes leaves one rank and
// enters another, so each rank's outgoing (and incoming) direction carries remote_bytes / W on
// average. The ranks of one GPU take turns on it, each holding it for time_us / ranks_per_gpu:
// on one GPU (Loopback, ranks_per_gpu = W) the rate is remote_bytes / time_us; ranks on GPUs of
// their own (ranks_per_gpu = 1) all run for time_us. 0 when time_us <= 0 or ranks_per_gpu < 1.
double link_gbps_per_direction(double remote_bytes, int world, double time_us, int ranks_per_gpu);

// time_us / bound_us: 1 is at the lower bound, larger is slower. 0 when bound_us <= 0.
double bound_ratio(double time_us, double bound_us);

// The timeline's view of hidden communication, from a trace of the fused kernels: of the time
// during which some block of `rank` moved data in `layer` (the union of its kCommChunk events),
// the part during which some block of the same rank and layer ran a GEMM tile (the union of its
// kGemmTile events). Layer -1 adds up both layers. Unlike hidden_fraction it does not charge
// the forward's other steps (plan, publish, owner reduce) to the communication.
struct TimelineOverlap {
  double comm_us = 0;    // length of the union of the communication events
  double hidden_us = 0;  // the part of it covered by GEMM tiles
  double fraction() const { return comm_us > 0 ? hidden_us / comm_us : 0; }
};
TimelineOverlap timeline_overlap(const Trace& trace, int rank, int layer = -1);

}  // namespace comet::core
