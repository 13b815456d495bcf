// The barrier kernel between ranks (cuda/rank_barrier.h).
#include "cuda/check.h"
#include "cuda/dependent_launch.h"
#include "cuda/rank_barrier.h"
#include "cuda/signal.cuh"

namespace comet::cuda {

namespace {

__global__ void rank_barrier_kernel(const __grid_constant__ RankBarrierArgs a) {
  begin_dependent_kernel();
  if (threadIdx.x != 0) return;
  const uint64_t generation = *a.generation + 1;
  *a.generation = generation;
  // Cumulative with the stream-ordered work before this kernel: release at system scope.
  __threadfence_system();
  for (int i = 0; i < a.world; ++i) {
    const int p = (a.rank + i) % a.world;
    red_release_sys(reinterpret_cast<uint64_t*>(static_cast<char*>(a.peers[p]) + a.counter_offset), 1);
  }
  const auto* mine = reinterpret_cast<const uint64_t*>(static_cast<const char*>(a.peers[a.rank]) + a.counter_offset);
  const WaitSite site{a.rank, -1, WaitRole::kBarrier, a.which};
  wait_at_least<true>(mine, generation * uint64_t(a.world), a.timeout_ns, a.error, site);
  __threadfence_system();
}

}  // namespace

void rank_barrier(const RankBarrierArgs& a, CUstream_st* stream) {
  COMET_CHECK(a.peers && a.generation && a.error, "rank_barrier: null peer table, generation or error record");
  COMET_CHECK(a.world >= 1 && a.rank >= 0 && a.rank < a.world,
              "rank_barrier: rank " << a.rank << " outside [0, " << a.world << ")");
  launch_kernel(rank_barrier_kernel, dim3(1), dim3(32), 0, stream, LaunchAttributes(), a);
}

}  // namespace comet::cuda
