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
// id. Two ways to run, chosen once per plan:
// - copies (one process drives every rank: Loopback, Local): run() is one copy_between_ranks()
//   launch per issuer. An issuer is a device of the process; the transfers a rank sends are
//   copied by its issuer (set_issuers; default: one issuer for every rank), pushing into the
//   peers' memory (on several GPUs over P2P, with unified addressing). The caller orders the
//   issuers' streams around each run (each issuer's part only reads and writes its own streams).
// - fabric (a process drives only some ranks: Nccl, one rank per process): run() is, per process,
//   one fabric.all_to_all_v() (ncclGroupStart / ncclSend + ncclRecv per peer / ncclGroupEnd)
//   over the same transfers of the process's local ranks; a pair with several transfers in one
//   all-to-all (the dispatch's rows and metadata) takes one such call per transfer, in add
//   order. Every process must add the same transfers in the same order, those of other pairs
//   included (with any addresses: only the local ranks' sides are used), so that the calls and
//   their sizes match across processes.
//
// Assumptions: every pointer and byte count is a multiple of 16 (rows of bf16 with H % 8 == 0,
// metadata padded to 16 bytes); every pointer is valid on the device that runs the copy (its
// own memory, or a peer's with P2P access enabled).
#pragma once

#include <cstdint>
#include <vector>

#include "fabric/fabric.h"
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
  // How run() moves the bytes (see the file header); set before stage(), kept by clear().
  // issuer_of_rank[r] in [0, issuers) runs the copies rank r sends; every rank needs an entry.
  void set_issuers(std::vector<int> issuer_of_rank);
  // fabric.all_to_all_v over the transfers of the fabric's local ranks; the fabric must outlive
  // the plan.
  void use_fabric(fabric::Fabric& fabric);
  int issuers() const { return issuers_; }

  void clear();
  // Starts a new all-to-all and returns its id (0, 1, ... in the order of add()).
  int add();
  // Appends a transfer to all-to-all `id`; zero bytes are dropped. Throws comet::Error for a
  // pointer or size that is not a multiple of 16 bytes.
  void add_transfer(int id, const Transfer& transfer);
  int size() const { return used_; }
  // Bytes stage() writes (copies: the segment lists; fabric: none).
  int64_t staged_bytes() const;
  // Writes every all-to-all's segments to `host`, to be copied (by the caller, before any run())
  // to device[i] on the device of issuer i, for every issuer; each holds staged_bytes() bytes,
  // 16-byte aligned. With a fabric it prepares the calls' size and offset arrays instead.
  void stage(void* host, void* const* device);
  void stage(void* host, void* device) { stage(host, &device); }  // one issuer
  // Runs issuer `issuer`'s part of all-to-all `id` (asynchronous on `stream`, a stream of that
  // issuer's device); requires stage() and the copy. With a fabric: issuer 0, the whole call.
  // `pace` emulates a link on the copy kernels (cuda/link_pace.h); NCCL calls are never paced.
  void run(int id, int issuer, CUstream_st* stream, const LinkPace& pace = {}) const;
  void run(int id, CUstream_st* stream, const LinkPace& pace = {}) const { run(id, 0, stream, pace); }
  // Bytes of all-to-all `id`, every pair's; remote_only leaves out a rank's transfers to itself.
  int64_t bytes(int id, bool remote_only) const;

 private:
  // One fabric.all_to_all_v of a staged all-to-all: per local rank, W peers each of send bytes,
  // send offsets, recv bytes, recv offsets (from the lowest address the rank sends or receives).
  struct FabricCall {
    std::vector<fabric::AllToAllVArgs> args;  // [local rank]
    std::vector<int64_t> sizes;               // [local rank][4][W]
    std::vector<const char*> at;              // [local rank][2][W] send, recv addresses
  };
  void stage_fabric();
  int issuer_of(int rank) const;

  std::vector<int> issuer_of_;  // [W]; empty: issuer 0 for every rank
  int issuers_ = 1;
  fabric::Fabric* fabric_ = nullptr;
  std::vector<std::vector<CopySegment>> lists_;  // [0, used_) in use
  int used_ = 0;
  std::vector<CopyList> staged_;               // [id][issuer]
  std::vector<std::vector<FabricCall>> calls_;  // [id][call]
};

}  // namespace comet::cuda
