// Host symmetric heap and the timed signal wait.
#include "ref/symmetric_heap.h"

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "comet/error.h"

namespace comet::ref {

void SymmetricHeap::FreeAligned::operator()(std::byte* p) const { std::free(p); }

SymmetricHeap::SymmetricHeap(int world, int64_t bytes_per_rank) : bytes_per_rank_(bytes_per_rank) {
  COMET_CHECK(world >= 1 && bytes_per_rank >= 0,
              "bad symmetric heap request: world " << world << ", " << bytes_per_rank << " bytes");
  const size_t bytes = size_t((bytes_per_rank + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign);
  for (int r = 0; r < world; ++r) {
    auto* p = static_cast<std::byte*>(std::aligned_alloc(kWorkspaceAlign, bytes ? bytes : kWorkspaceAlign));
    COMET_CHECK(p != nullptr, "cannot allocate " << bytes << " bytes of symmetric heap for rank " << r);
    std::memset(p, 0, bytes);
    ranks_.emplace_back(p);
  }
}

void SymmetricHeap::zero(const std::vector<const WorkspaceRegion*>& regions) {
  for (int r = 0; r < world(); ++r)
    for (const WorkspaceRegion* region : regions) std::memset(base(r) + region->offset_bytes, 0, region->bytes);
}

bool wait_at_least(uint64_t* flag, uint64_t target, const WaitPolicy& policy, const std::string& who,
                   const std::function<std::string()>& what) {
  uint64_t last = signal_load(flag);
  if (last >= target) return false;
  // The clock restarts whenever the signal moves: a wait fails only after `timeout` without
  // progress, so a long forward whose producers keep working (a large workload on few cores)
  // never times out, and a stuck one still does.
  auto since = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    const uint64_t seen = signal_load(flag);
    if (seen >= target) return true;
    if (policy.abort && policy.abort->load(std::memory_order_relaxed)) throw Aborted{};
    const auto now = std::chrono::steady_clock::now();
    if (seen != last) {
      last = seen;
      since = now;
    } else if (now - since > policy.timeout) {
      std::ostringstream os;
      os << who << ": timed out after " << policy.timeout.count() << " ms without progress waiting for " << what()
         << " >= " << target << ", observed " << seen;
      throw TimeoutError(os.str());
    }
    // Far more threads than cores: yield first, then sleep so that producers get the CPU.
    if (spin < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace comet::ref
