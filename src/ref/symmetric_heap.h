// ref/symmetric_heap.h: host-memory stand-in for the fabric's symmetric allocation, and the
// signal primitives of the protocol (DESIGN §4) on top of it.
//
// Every rank gets one zeroed allocation of WorkspaceLayout::total_bytes(), so a region has
// the same offset on every rank and a peer's region is `base(peer) + offset` (the CPU analogue
// of the GPU's peer-pointer table). Signals are u64 epoch counters inside the heap, accessed
// through std::atomic_ref: producers add with release, consumers load with acquire.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comet/workspace.h"

namespace comet::ref {

class SymmetricHeap {
 public:
  SymmetricHeap(int world, int64_t bytes_per_rank);

  int world() const { return int(ranks_.size()); }
  std::byte* base(int rank) { return ranks_[rank].get(); }

  template <class T>
  T* region(int rank, const WorkspaceRegion& r) {
    return reinterpret_cast<T*>(base(rank) + r.offset_bytes);
  }

  // Zero the given regions on every rank (used only when no worker runs).
  void zero(const std::vector<const WorkspaceRegion*>& regions);

 private:
  struct FreeAligned {
    void operator()(std::byte* p) const;
  };
  std::vector<std::unique_ptr<std::byte, FreeAligned>> ranks_;
  int64_t bytes_per_rank_;
};

// Release-add to a signal: all writes before it are visible to whoever acquires the result.
inline void signal_add(uint64_t* flag, uint64_t value) {
  std::atomic_ref<uint64_t>(*flag).fetch_add(value, std::memory_order_release);
}
inline uint64_t signal_load(uint64_t* flag) {
  return std::atomic_ref<uint64_t>(*flag).load(std::memory_order_acquire);
}

// Raised inside a worker when another worker of the same forward failed first; it is never
// the error a caller sees.
struct Aborted {};

// What every wait shares in one forward: the timeout and the flag that stops all waits once
// one has failed (so a stuck rank costs one timeout, not one per waiter).
struct WaitPolicy {
  std::chrono::milliseconds timeout{5000};
  std::atomic<bool>* abort = nullptr;
};

// Spin (yielding, then sleeping briefly) until *flag >= target with acquire semantics.
// Returns true if it had to wait at all. After policy.timeout without progress (the flag
// unchanged) throws TimeoutError with
// "<who>: timed out after N ms without progress waiting for <what> >= target, observed V"; `what` is only
// built on failure. Throws Aborted when policy.abort is raised.
bool wait_at_least(uint64_t* flag, uint64_t target, const WaitPolicy& policy,
                   const std::string& who, const std::function<std::string()>& what);

}  // namespace comet::ref
