// core/kernel_trace.h: the records the fused GPU kernels write when tracing is on
// (LayerOptions::trace), and their conversion into a comet::Trace (comet/trace.h). Host code
// without CUDA, so the conversion is tested on the CPU; the kernels include this header for the
// record layout (cuda/trace_record.cuh writes it).
//
// One kernel (one rank, one layer) writes three arrays:
//   tiles  [tile capacity]   slot t: GEMM tile t of the kernel's schedule, written by one
//                            consumer thread of the block that ran it (begin: the consumer
//                            starts the tile; end: every consumer thread stored it)
//   waits  [tile capacity]   slot t: the GEMM producer's wait for tile t's rows (layer0 only)
//   chunks [chunk capacity]  communication chunks and communication waits, in the order their
//                            warps claimed slots from a counter; claims past the capacity are
//                            counted and not written (count - capacity events dropped)
// Slots of tiles and waits are zeroed before each traced forward: end_ns == 0 is "not written".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/trace.h"

namespace comet {

struct alignas(16) KernelTraceEvent {
  uint64_t begin_ns;  // %globaltimer
  uint64_t end_ns;    // 0: never written
  int32_t id;         // tile: index in the schedule; chunk: its first slot or combine item;
                      // wait: the M tile (layer0) or column group (layer1) waited for
  int32_t items;      // chunk: slots or combine items it covers; otherwise 1
  int16_t rank;
  int16_t block;      // blockIdx.x in the kernel's grid
  uint8_t warp;       // warp of the block that recorded it
  uint8_t kind;       // TraceKind
  uint8_t layer;
  uint8_t reserved;
};
static_assert(sizeof(KernelTraceEvent) == 32, "one record is two 16-byte stores");

// What the host copied back from one kernel.
struct KernelTraceRecords {
  int rank = 0;
  int layer = 0;
  std::vector<KernelTraceEvent> tiles;   // the kernel's num_tiles slots
  std::vector<KernelTraceEvent> waits;   // the same slots (layer0), or empty
  std::vector<KernelTraceEvent> chunks;  // the first min(chunk_count, capacity) records
  int64_t chunk_count = 0;               // slots claimed; above chunks.size(): dropped
};

struct KernelTraceShape {
  int world = 0;
  int num_blocks = 0;         // the grid of both kernels (one block per SM)
  int n_comm[2] = {0, 0};     // communication blocks of layer0 and layer1
};

// Every record as a TraceEvent (lane = block, sublane = warp), times from the earliest begin.
// Waits that took no time (the signal was already set at the first look) are left out. Throws comet::Error when a tile slot was never written (the
// kernel did not finish: check() reports why) or a record is out of range.
Trace make_kernel_trace(const KernelTraceShape& shape, const std::vector<KernelTraceRecords>& kernels);

}  // namespace comet
