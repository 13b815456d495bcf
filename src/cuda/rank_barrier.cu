// The barrier kernel between ranks (cuda/rank_barrier.h).
#include "cuda/check.h"
#include "cuda/dependent_launch.h"
#include "cuda/rank_barrier.h"
#include "cuda/signal.cuh"

namespace comet::cuda {

namespace {

__global__ void rank_barrier_kernel(const __grid_constant__ RankBarrierArgs a) {
  begin_dependent_kernel();
  if (int(threadIdx.x) >= a.count) return;
  const RankBarrierRank& me = a.ranks[threadIdx.x];
  const uint64_t generation = *me.generation + 1;
  *me.generation = generation;
  // Cumulative with the stream-ordered work before this kernel: release at system scope.
  __threadfence_system();
  for (int i = 0; i < a.world; ++i) {
    const int p = (me.rank + i) % a.world;
    red_release_sys(reinterpret_cast<uint64_t*>(static_cast<char*>(me.peers[p]) + a.counter_offset), 1);
  }
  // The other threads' ranks arrive whether or not this one waits (independent thread scheduling).
  const auto* mine = reinterpret_cast<const uint64_t*>(static_cast<const char*>(me.peers[me.rank]) + a.counter_offset);
  const WaitSite site{me.rank, -1, WaitRole::kBarrier, a.which};
  wait_at_least<true>(mine, generation * uint64_t(a.world), a.timeout_ns, me.error, site);
  __threadfence_system();
}

}  // namespace

void rank_barrier(const RankBarrierArgs& a, CUstream_st* stream) {
  COMET_CHECK(a.count >= 1 && a.count <= kMaxBarrierRanks,
              "rank_barrier: " << a.count << " ranks in one launch, outside [1, " << kMaxBarrierRanks << "]");
  COMET_CHECK(a.world >= 1, "rank_barrier: world " << a.world);
  for (int i = 0; i < a.count; ++i) {
    const RankBarrierRank& r = a.ranks[i];
    COMET_CHECK(r.peers && r.generation && r.error, "rank_barrier: null peer table, generation or error record");
    COMET_CHECK(r.rank >= 0 && r.rank < a.world, "rank_barrier: rank " << r.rank << " outside [0, " << a.world << ")");
  }
  const int threads = (a.count + 31) / 32 * 32;
  launch_kernel(rank_barrier_kernel, dim3(1), dim3(threads), 0, stream, LaunchAttributes(), a);
}

}  // namespace comet::cuda
