// The fused kernels' trace records as a comet::Trace.
#include "core/kernel_trace.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "comet/error.h"

namespace comet {

namespace {

TraceEvent to_event(const KernelTraceEvent& r, const KernelTraceShape& shape, int rank, int layer) {
  COMET_CHECK(r.kind <= uint8_t(TraceKind::kReduce) && r.block >= 0 && r.block < shape.num_blocks &&
                  r.rank == rank && r.layer == layer && r.begin_ns <= r.end_ns,
              "trace: a record of rank " << rank << " layer" << layer << " is out of range (kind " << int(r.kind)
                                         << ", block " << r.block << ", rank " << r.rank << ", layer "
                                         << int(r.layer) << ")");
  TraceEvent e;
  e.rank = rank;
  e.layer = layer;
  e.lane = r.block;
  e.sublane = r.warp;
  e.kind = TraceKind(r.kind);
  e.id = r.id;
  e.items = r.items;
  e.begin_ns = int64_t(r.begin_ns);  // rebased below
  e.end_ns = int64_t(r.end_ns);
  return e;
}

}  // namespace

Trace make_kernel_trace(const KernelTraceShape& shape, const std::vector<KernelTraceRecords>& kernels) {
  Trace t;
  t.world = shape.world;
  t.comm_lanes = shape.n_comm[0];
  t.compute_lanes = shape.num_blocks - shape.n_comm[0];
  t.layer_comm_lanes = {shape.n_comm[0], shape.n_comm[1]};
  t.layer_panels = true;
  for (const KernelTraceRecords& k : kernels) {
    for (size_t i = 0; i < k.tiles.size(); ++i) {
      COMET_CHECK(k.tiles[i].end_ns != 0, "trace: GEMM tile " << i << " of rank " << k.rank << " layer" << k.layer
                                                                << " was not recorded (did the forward fail?)");
      COMET_CHECK(k.tiles[i].id == int32_t(i), "trace: tile slot " << i << " holds tile " << k.tiles[i].id);
      t.events.push_back(to_event(k.tiles[i], shape, k.rank, k.layer));
    }
    for (const std::vector<KernelTraceEvent>* records : {&k.waits, &k.chunks})
      for (const KernelTraceEvent& r : *records) {
        if (r.end_ns == 0 || (r.kind == uint8_t(TraceKind::kWait) && r.end_ns == r.begin_ns)) continue;
        t.events.push_back(to_event(r, shape, k.rank, k.layer));
      }
    t.dropped_events += std::max<int64_t>(0, k.chunk_count - int64_t(k.chunks.size()));
  }
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const TraceEvent& e : t.events) origin = std::min(origin, e.begin_ns);
  for (TraceEvent& e : t.events) {
    e.begin_ns -= origin;
    e.end_ns -= origin;
  }
  std::sort(t.events.begin(), t.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return std::tie(a.rank, a.layer, a.lane, a.sublane, a.begin_ns) <
           std::tie(b.rank, b.layer, b.lane, b.sublane, b.begin_ns);
  });
  return t;
}

}  // namespace comet
