// cuda/rank_copy.h: how the baselines move bytes between ranks (docs/baselines.md).
//
// Every byte one rank sends another in a baseline forward goes through copy_between_ranks():
// one kernel over a list of (src, dst, bytes) segments. Link emulation paces it there and
// nowhere else: with a LinkPace on, each block step reserves its remote bytes (src_rank !=
// dst_rank) on one pacer before storing them, and the launch ends one latency after the last
// (cuda/link_pace.h, docs/link_emulation.md). The last block of a launch zeroes the pacer.
//
// AllToAllPlan is the seam between the baselines and the fabric: a forward describes each
// all-to-all-v (or all-gather) as transfers between ranks, stages them once, and runs them by
// id. On the Loopback and Local fabrics (one process drives every rank) run() is one
// copy_between_ranks() launch. On a multi-process NCCL fabric run() becomes, per process, one
// ncclGroupStart / ncclSend + ncclRecv per peer / ncclGroupEnd over the same transfers (the
// buffers are the same; the segment list is then not needed).
//
// Assumptions: every pointer and byte count is a multiple of 16 (rows of bf16 with H % 8 == 0,
// metadata padded to 16 bytes); every pointer is valid on the device that runs the copy
// (one device today: the baselines refuse ranks on several GPUs).
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/link_pace.h"

struct CUstream_st;

namespace comet::cuda {

// One contiguous copy; unit_begin is the exclusive prefix sum of units over the list (the
// kernel finds a unit's segment by binary search on it).
struct CopySegment {
  const void* src;
  void* dst;
  int64_t unit_begin;  // 16-byte units
  int64_t units;
  int32_t src_rank;
  int32_t dst_rank;
};

// A segment list in device memory.
struct CopyList {
  const CopySegment* segments = nullptr;
  int count = 0;
  int64_t total_units = 0;
};

// Asynchronous on `stream`; nothing to do for an empty list. With `pace` on, launches that share
// its pacer must not overlap (one stream).
void copy_between_ranks(const CopyList& list, CUstream_st* stream, const LinkPace& pace = {});

struct Transfer {
  int src_rank = 0;
  int dst_rank = 0;
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t bytes = 0;
};

class AllToAllPlan {
 public:
  void clear();
  // Starts a new all-to-all and returns its id (0, 1, ... in the order of add()).
  int add();
  // Appends a transfer to all-to-all `id`; zero bytes are dropped. Throws comet::Error for a
  // pointer or size that is not a multiple of 16 bytes.
  void add_transfer(int id, const Transfer& transfer);
  int size() const { return used_; }
  // Bytes stage() writes.
  int64_t staged_bytes() const;
  // Writes every all-to-all's segments to `host`, to be copied (by the caller, before any run())
  // to `device`; both hold staged_bytes() bytes, 16-byte aligned.
  void stage(void* host, void* device);
  // Runs all-to-all `id` (asynchronous on `stream`); requires stage() and the copy.
  void run(int id, CUstream_st* stream, const LinkPace& pace = {}) const;
  // Bytes of all-to-all `id`; remote_only leaves out a rank's transfers to itself.
  int64_t bytes(int id, bool remote_only) const;

 private:
  std::vector<std::vector<CopySegment>> lists_;  // [0, used_) in use
  int used_ = 0;
  std::vector<CopyList> staged_;
};

}  // namespace comet::cuda
