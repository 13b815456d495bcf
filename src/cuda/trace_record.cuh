// cuda/trace_record.cuh: how the fused kernels write their timeline (core/kernel_trace.h,
// LayerOptions::trace).
//
// Who records:  a GEMM tile   consumer thread 0 of the block (begin when the consumers start
//                             the tile, end after every consumer thread stored it)
//               a tile wait   the GEMM producer's elected thread, around its acquire-wait
//                             (layer0: the tile's rows)
//               a comm chunk  lane 0 of a communication warp, per kTraceChunkItems items of
//                             that warp (layer0: received slots, i.e. tokens pulled; layer1:
//                             combine items, i.e. (column group, token) partial rows pushed),
//                             cut early before a wait and at the end; a layer0 warp opens its
//                             kDispatchTokens items together, so its chunks may hold up to
//                             kDispatchTokens - 1 more (a padding row of the row order is no item)
//               a comm wait   lane 0 of a layer1 warp, around its wait for a column group
// Cost when off: each site tests a pointer of the kernel parameters (null) and does nothing else,
// no timer reads, no stores, no registers kept. When on: one thread per record, a few stores, and
// for chunk records one atomicAdd on the kernel's counter, issued when the chunk opens so that
// its latency hides behind the chunk's copies.
#pragma once

#include <cstdint>

#include "core/kernel_trace.h"
#include "cuda/fused_layer.h"
#include "cuda/signal.cuh"

namespace comet::cuda {

inline constexpr int kTraceChunkItems = 8;  // items per communication chunk record
inline constexpr int kTraceWarpsPerBlock = 12;  // warps of a fused kernel's block (384 threads)

// Chunk records one kernel can claim, from the plan's bounds: `max_items` the most items of one
// kernel (layer0: received tokens, W * T_max, or with DispatchOrder::kRows A rows, M tiles x
// 128; layer1: received tokens, each once per column group), `groups` layer1 column groups,
// `warps` warps that may record (the whole grid). A warp's items only grow (static stride in
// layer0, claims from one counter in layer1), so it changes column group at most `groups` times;
// each change cuts a chunk and records a wait.
__host__ __device__ inline int64_t trace_chunk_capacity(int layer, int64_t max_items, int groups, int64_t warps) {
  const int64_t items = layer == 0 ? max_items : max_items * groups;
  const int64_t per_warp = layer == 0 ? 1 : 2 * int64_t(groups) + 1;
  return (items + kTraceChunkItems - 1) / kTraceChunkItems + warps * per_warp;
}

// The fields of a record but begin_ns (a GEMM tile's, stored when the tile started).
__device__ __forceinline__ void close_trace_event(KernelTraceEvent* slot, uint64_t end_ns, int id, int items,
                                                  TraceKind kind, int layer, int rank) {
  slot->end_ns = end_ns;
  slot->id = id;
  slot->items = items;
  slot->rank = int16_t(rank);
  slot->block = int16_t(blockIdx.x);
  slot->warp = uint8_t(threadIdx.x / 32);
  slot->kind = uint8_t(kind);
  slot->layer = uint8_t(layer);
}

__device__ __forceinline__ void store_trace_event(KernelTraceEvent* slot, uint64_t begin_ns, uint64_t end_ns,
                                                  int id, int items, TraceKind kind, int layer, int rank) {
  slot->begin_ns = begin_ns;
  close_trace_event(slot, end_ns, id, items, kind, layer, rank);
}

// The communication chunks and waits of one warp; every method is a no-op for lanes other than
// 0 and when the sink is off.
class ChunkRecorder {
 public:
  __device__ ChunkRecorder(const TraceSink& sink, int layer, int rank)
      : sink_(sink), on_(sink.chunks != nullptr && threadIdx.x % 32 == 0), layer_(layer), rank_(rank) {}
  // The timer when recording, else 0 (no timer read when off).
  __device__ uint64_t clock() const { return on_ ? globaltimer_ns() : 0; }
  // Item `item` starts: opens a chunk if none is open.
  __device__ void begin_item(int item) {
    if (!on_) return;
    if (items_ == 0) {
      first_ = item;
      begin_ns_ = globaltimer_ns();
      slot_ = atomicAdd(sink_.count, 1u);  // used at flush(): its latency overlaps the copies
    }
    ++items_;
  }
  __device__ void end_item() {
    if (on_ && items_ >= kTraceChunkItems) flush();
  }
  // Closes the open chunk (before a wait, at the end).
  __device__ void flush() {
    if (!on_ || items_ == 0) return;
    if (slot_ < sink_.capacity)
      store_trace_event(sink_.chunks + slot_, begin_ns_, globaltimer_ns(), first_, items_, TraceKind::kCommChunk,
                        layer_, rank_);
    items_ = 0;
  }
  // This warp waited from begin_ns (clock()) until now for `id`; a wait of no time is not kept.
  __device__ void wait(uint64_t begin_ns, int id) {
    if (!on_) return;
    const uint64_t end_ns = globaltimer_ns();
    if (end_ns == begin_ns) return;
    const unsigned slot = atomicAdd(sink_.count, 1u);
    if (slot < sink_.capacity)
      store_trace_event(sink_.chunks + slot, begin_ns, end_ns, id, 1, TraceKind::kWait, layer_, rank_);
  }

 private:
  const TraceSink& sink_;
  bool on_;
  int layer_, rank_;
  int items_ = 0, first_ = 0;
  unsigned slot_ = 0;
  uint64_t begin_ns_ = 0;
};

}  // namespace comet::cuda
