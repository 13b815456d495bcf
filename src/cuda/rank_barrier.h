// cuda/rank_barrier.h: a barrier between ranks on different GPUs or in different processes,
// enqueued on a stream like a kernel (no host synchronization; capturable in a CUDA graph).
//
// Used by MoeLayer when its ranks do not share one stream (docs/gpu_layer.md, "Ranks on
// several GPUs"): on one GPU stream order is the barrier and this is never launched.
//
// Protocol: every rank owns one u64 counter in its symmetric heap (workspace region "barrier")
// and one generation word in its own device memory. Barrier number g of a rank: one thread
// sets its generation to g, release-adds (system scope) 1 to every rank's counter, then
// acquire-waits (system scope, with the layer's timeout) until its own counter reaches g * W.
// Counters only grow, so a fast rank already adding for barrier g + 1 cannot make a slow rank
// miss barrier g. What a rank enqueued before its barrier happens before what any rank enqueues
// after it: stream order on each side, release/acquire at system scope in between.
// The generation lives on the device, so a replayed graph continues the sequence; every rank
// must run the same sequence of barriers, and after a timeout the counters are out of step
// until both words are zeroed on every rank.
#pragma once

#include <cstdint>

#include "cuda/device_error.h"

struct CUstream_st;

namespace comet::cuda {

struct RankBarrierArgs {
  void* const* peers = nullptr;  // device [W]: every rank's heap as seen from this rank's device
  int64_t counter_offset = 0;    // byte offset of the counter in every heap
  uint64_t* generation = nullptr;  // this rank's, device memory
  int rank = 0, world = 1;
  int which = 0;                 // reported as the signal index on a timeout (the forward's barrier 0, 1, ...)
  uint64_t timeout_ns = 0;
  DeviceError* error = nullptr;
};

// Asynchronous on `stream` (one block of one warp).
void rank_barrier(const RankBarrierArgs& args, CUstream_st* stream);

}  // namespace comet::cuda
