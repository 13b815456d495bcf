// unit/bench_metrics_test.cpp: the derived columns of `comet bench layer`
// (core/bench_metrics.h): hidden-communication fraction, GB/s per link direction, ratio to the
// lower bound.
#include <gtest/gtest.h>

#include "core/bench_metrics.h"

namespace comet::core {
namespace {

TEST(HiddenFraction, IsTheShareOfCommunicationOverlappedWithCompute) {
  // compute 100, comm 40: fused 100 hides all of it, 140 none, 110 three quarters.
  EXPECT_DOUBLE_EQ(hidden_fraction(100, 100, 40), 1.0);
  EXPECT_DOUBLE_EQ(hidden_fraction(140, 100, 40), 0.0);
  EXPECT_DOUBLE_EQ(hidden_fraction(110, 100, 40), 0.75);
  // DESIGN §6's form: 1 - (fused - compute) / comm.
  EXPECT_DOUBLE_EQ(hidden_fraction(123, 100, 40), 1 - (123.0 - 100) / 40);
  // The paper's figure: 86.5% hidden.
  EXPECT_NEAR(hidden_fraction(100 + 0.135 * 50, 100, 50), 0.865, 1e-12);
}

TEST(HiddenFraction, ClampsToZeroAndOne) {
  EXPECT_DOUBLE_EQ(hidden_fraction(90, 100, 40), 1.0);   // faster than compute alone
  EXPECT_DOUBLE_EQ(hidden_fraction(200, 100, 40), 0.0);  // slower than both in sequence
  EXPECT_DOUBLE_EQ(hidden_fraction(100, 100, 0), 0.0);   // nothing to hide
  EXPECT_DOUBLE_EQ(hidden_fraction(100, 100, -1), 0.0);
}

TEST(LinkGbps, IsBytesPerRankOverTheTimeEachRankHeldTheLink) {
  // 8 ranks move 800 MB in all: 100 MB per rank and direction. Taking turns on one GPU over
  // 1000 us, each rank has 125 us: 800 GB/s. On their own GPUs, all 1000 us: 100 GB/s. Four
  // per GPU (two GPUs): 250 us each, 400 GB/s.
  EXPECT_DOUBLE_EQ(link_gbps_per_direction(800e6, 8, 1000, 8), 800.0);
  EXPECT_DOUBLE_EQ(link_gbps_per_direction(800e6, 8, 1000, 1), 100.0);
  EXPECT_DOUBLE_EQ(link_gbps_per_direction(800e6, 8, 1000, 4), 400.0);
  // One rank: no difference.
  EXPECT_DOUBLE_EQ(link_gbps_per_direction(1e9, 1, 1e6, 1), 1.0);
  // A paced run at exactly B: remote_bytes / B of time gives B back.
  const double bytes = 3.7e8, gbps = 450, us = bytes / (gbps * 1e3);
  EXPECT_NEAR(link_gbps_per_direction(bytes, 8, us, 8), gbps, 1e-9);
  EXPECT_DOUBLE_EQ(link_gbps_per_direction(1e6, 8, 0, 8), 0.0);
  EXPECT_DOUBLE_EQ(link_gbps_per_direction(0, 8, 10, 8), 0.0);
  EXPECT_DOUBLE_EQ(link_gbps_per_direction(1e6, 8, 10, 0), 0.0);  // no GPU holds a rank: no rate
}

TEST(BoundRatio, IsTimeOverBound) {
  EXPECT_DOUBLE_EQ(bound_ratio(150, 100), 1.5);
  EXPECT_DOUBLE_EQ(bound_ratio(100, 100), 1.0);
  EXPECT_DOUBLE_EQ(bound_ratio(100, 0), 0.0);
}

TEST(TimelineOverlap, IsCommunicationTimeCoveredByGemmTilesOfTheSameRankAndLayer) {
  Trace t;
  auto add = [&](int rank, int layer, TraceKind kind, int64_t begin_us, int64_t end_us) {
    t.events.push_back(make_trace_event(rank, layer, 0, kind, 0, begin_us * 1000, end_us * 1000));
  };
  // Rank 0, layer 0: copies 0-10 and 5-20 (20 us once merged), tiles 10-15 and 12-30 (10 us of
  // the copies covered). Layer 1: copies 100-110 inside a tile 90-120 (all 10 us covered).
  add(0, 0, TraceKind::kCommChunk, 0, 10);
  add(0, 0, TraceKind::kCommChunk, 5, 20);
  add(0, 0, TraceKind::kGemmTile, 10, 15);
  add(0, 0, TraceKind::kGemmTile, 12, 30);
  add(0, 1, TraceKind::kGemmTile, 90, 120);
  add(0, 1, TraceKind::kCommChunk, 100, 110);
  // Waits, another rank's tiles and the owner reduce (layer 2) never count.
  add(0, 0, TraceKind::kWait, 0, 10);
  add(1, 0, TraceKind::kGemmTile, 0, 10);
  add(0, 2, TraceKind::kReduce, 0, 200);
  const TimelineOverlap l0 = timeline_overlap(t, 0, 0), l1 = timeline_overlap(t, 0, 1), both = timeline_overlap(t, 0);
  EXPECT_DOUBLE_EQ(l0.comm_us, 20);
  EXPECT_DOUBLE_EQ(l0.hidden_us, 10);
  EXPECT_DOUBLE_EQ(l0.fraction(), 0.5);
  EXPECT_DOUBLE_EQ(l1.fraction(), 1.0);
  EXPECT_DOUBLE_EQ(both.comm_us, 30);
  EXPECT_DOUBLE_EQ(both.hidden_us, 20);
  // Rank 1 moved nothing: nothing to hide.
  EXPECT_DOUBLE_EQ(timeline_overlap(t, 1).comm_us, 0);
  EXPECT_DOUBLE_EQ(timeline_overlap(t, 1).fraction(), 0);
}

}  // namespace
}  // namespace comet::core
