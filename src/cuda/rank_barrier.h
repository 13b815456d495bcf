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
// Several ranks of one GPU that share a stream (the Local fabric with fewer GPUs than ranks)
// pass through one launch, a thread per rank: a launch per rank would wait for the next one,
// queued behind it on the same stream.
// The generation lives on the device, so a replayed graph continues the sequence; every rank
// must run the same sequence of barriers, and after a timeout the counters are out of step
// until both words are zeroed on every rank.
#pragma once

#include <cstdint>

#include "cuda/device_error.h"

struct CUstream_st;

namespace comet::cuda {

// Ranks one launch passes through (the most a fabric puts on one GPU).
inline constexpr int kMaxBarrierRanks = 64;

struct RankBarrierRank {
  void* const* peers = nullptr;    // device [W]: every rank's heap as seen from this rank's device
  uint64_t* generation = nullptr;  // this rank's, device memory
  DeviceError* error = nullptr;    // this rank's
  int rank = 0;
};

struct RankBarrierArgs {
  RankBarrierRank ranks[kMaxBarrierRanks];  // entries [0, count): ranks on the launch's GPU
  int count = 1;
  int64_t counter_offset = 0;  // byte offset of the counter in every heap
  int world = 1;
  int which = 0;               // reported as the signal index on a timeout (the forward's barrier 0, 1, ...)
  uint64_t timeout_ns = 0;
};

// Asynchronous on `stream` (one block, a thread per rank).
void rank_barrier(const RankBarrierArgs& args, CUstream_st* stream);

}  // namespace comet::cuda
