// comet/trace.h: what the overlap looked like. Backends record one event per GEMM tile,
// communication chunk, wait and reduce, with start and end times; tools turn them into a
// Chrome/Perfetto trace and an SVG timeline (io/trace_writers.h).
//
// Times are nanoseconds from the start of the forward (CPU backend: steady_clock; GPU kernels:
// %globaltimer, from the forward's first recorded event). `lane` is the worker (CPU) or thread
// block (GPU) within its rank and layer; lanes [0, comm_lanes_of(layer)) communicate, the others
// compute. On the GPU several warps of one block record at once (every warp of a communication
// block moves its own rows), so `sublane` names the warp: events of one (rank, layer, lane,
// sublane) never overlap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace comet {

enum class TraceKind : int32_t {
  kCommChunk = 0,  // layer0: rows pulled; layer1: partial rows pushed
  kGemmTile = 1,   // one tile (layer0: one M tile x column block; layer1: M tile x column block)
  kWait = 2,       // time a worker spent waiting for a signal
  kReduce = 3,     // owner reduce over ranks
};

const char* trace_kind_name(TraceKind kind);

struct TraceEvent {
  int32_t rank = 0;
  int32_t layer = 0;  // 0, 1, or 2 for the owner reduce
  int32_t lane = 0;
  TraceKind kind = TraceKind::kGemmTile;
  int32_t id = 0;     // tile or chunk index (GPU waits: the M tile or column group waited for)
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  int32_t sublane = 0;  // GPU: the warp that recorded it; CPU: 0
  int32_t items = 1;    // GPU communication chunk: slots (layer0) or combine items (layer1) moved
};

inline TraceEvent make_trace_event(int rank, int layer, int lane, TraceKind kind, int id, int64_t begin_ns,
                                   int64_t end_ns) {
  TraceEvent e;
  e.rank = rank;
  e.layer = layer;
  e.lane = lane;
  e.kind = kind;
  e.id = id;
  e.begin_ns = begin_ns;
  e.end_ns = end_ns;
  return e;
}

struct Trace {
  std::string title;
  int world = 0;
  int comm_lanes = 0;     // lanes [0, comm_lanes) of each rank and layer communicate
  int compute_lanes = 0;
  std::vector<TraceEvent> events;
  // GPU: each layer is its own kernel with its own n_comm, so layer l's first
  // layer_comm_lanes[l] lanes communicate (empty: comm_lanes for every layer); the lanes total
  // comm_lanes + compute_lanes in every layer (the grid).
  std::vector<int> layer_comm_lanes;
  // GPU: layer0 and layer1 of a rank are separate kernels (on one GPU, other ranks' kernels run
  // between them), so the SVG draws each (rank, layer) as a panel of its own from its own start.
  bool layer_panels = false;
  // Events recorded past the device buffers' capacity: counted, not kept.
  int64_t dropped_events = 0;

  int comm_lanes_of(int layer) const {
    return layer >= 0 && layer < int(layer_comm_lanes.size()) ? layer_comm_lanes[size_t(layer)] : comm_lanes;
  }
};

}  // namespace comet
