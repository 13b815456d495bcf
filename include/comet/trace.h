// comet/trace.h: what the overlap looked like. Backends record one event per GEMM tile,
// communication chunk, wait and reduce, with start and end times; tools turn them into a
// Chrome/Perfetto trace and an SVG timeline (io/trace_writers.h).
//
// Times are nanoseconds from the start of the forward (CPU backend: steady_clock; GPU kernels:
// %globaltimer). `lane` is the worker (CPU) or thread block (GPU) within its rank and layer;
// lanes [0, n_comm) communicate, the others compute.
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
  int32_t id = 0;     // tile or chunk index
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};

struct Trace {
  std::string title;
  int world = 0;
  int comm_lanes = 0;     // lanes [0, comm_lanes) of each rank and layer communicate
  int compute_lanes = 0;
  std::vector<TraceEvent> events;
};

}  // namespace comet
