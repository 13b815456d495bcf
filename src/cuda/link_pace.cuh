// cuda/link_pace.cuh: device side of link emulation (cuda/link_pace.h has the model and the
// buffer; docs/link_emulation.md the reasoning).
//
//   pull (a rank reads a peer's row, layer0 dispatch):   t = link_pull(pace, bytes);
//        copy ...; link_wait(pace, t); then signal       (bandwidth and latency per pull)
//   push (a rank writes into a peer, layer1 combine):    t = link_push(pace, bytes); copy ...;
//        link_wait(pace, t); at the end of the warp's work link_wait(pace, last + latency)
//        (posted writes: the sender waits for the link to take the bytes, the data lands one
//        latency later)
//
// Cost: off (pace.pacer == nullptr) every call is one uniform branch. On, a reservation is one
// lane's load of origin_ns (a CAS only for the first one), an atomicMax and an atomicAdd on
// busy_ps: no loop, no retry, so contention only queues atomics in L2.
//
// NOTES (why a wait cannot hang): a deadline is computed once, at reservation, from the pacer's
// clock, which only grows by the bytes reserved (finite: this phase's copies) and by the
// present time; the wait then spins on %globaltimer (monotonic) with __nanosleep until that
// fixed time, reading no other thread's progress. It is also cut at pace.max_wait_ns (the
// layer's timeout), so not even a corrupt pacer can stretch it. Signal waits (cuda/signal.cuh)
// are separate and keep their timeouts: a withheld rank still times out.
#pragma once

#include <cstdint>

#include "cuda/link_pace.h"
#include "cuda/signal.cuh"

namespace comet::cuda {

// One thread reserves `bytes` on the link: returns the %globaltimer time at which the link has
// carried them (0 when off or bytes == 0).
__device__ inline uint64_t link_reserve(const LinkPace& pace, uint64_t bytes) {
  if (pace.pacer == nullptr || bytes == 0) return 0;
  auto* origin_p = reinterpret_cast<unsigned long long*>(&pace.pacer->origin_ns);
  auto* busy_p = reinterpret_cast<unsigned long long*>(&pace.pacer->busy_ps);
  const uint64_t now = globaltimer_ns();
  // Step 1: the link's origin, set by the first reservation after the pacer was zeroed.
  uint64_t origin = *reinterpret_cast<volatile unsigned long long*>(origin_p);
  if (origin == 0) {
    origin = atomicCAS(origin_p, 0ull, (unsigned long long)now);
    if (origin == 0) origin = now;
  }
  // Step 2: an idle link starts at `now` (no credit for idle time), then the bytes queue behind
  // everything reserved before them.
  const uint64_t now_ps = now > origin ? (now - origin) * 1000 : 0;
  atomicMax(busy_p, (unsigned long long)now_ps);
  const uint64_t cost_ps = uint64_t(double(bytes) * pace.ps_per_byte + 0.5);
  const uint64_t done_ps = atomicAdd(busy_p, (unsigned long long)cost_ps) + cost_ps;
  return origin + (done_ps + 999) / 1000;
}

// Spins (with __nanosleep) until %globaltimer >= until_ns, at most pace.max_wait_ns; no-op for 0.
__device__ inline void link_wait(const LinkPace& pace, uint64_t until_ns) {
  if (until_ns == 0) return;
  uint64_t now = globaltimer_ns();
  const uint64_t start = now;
  while (now < until_ns && now - start < pace.max_wait_ns) {
    const uint64_t left = until_ns - now;
    __nanosleep(unsigned(left < 256 ? left : 256));
    now = globaltimer_ns();
  }
}

// Warp-wide (warp-uniform arguments, every lane calls): lane 0 reserves, every lane gets the time.
__device__ inline uint64_t link_push(const LinkPace& pace, uint64_t bytes) {
  if (pace.pacer == nullptr || bytes == 0) return 0;
  uint64_t t = 0;
  if (threadIdx.x % 32 == 0) t = link_reserve(pace, bytes);
  return __shfl_sync(~0u, t, 0);
}

// A pull: the data is there one latency after the link carried it.
__device__ inline uint64_t link_pull(const LinkPace& pace, uint64_t bytes) {
  const uint64_t t = link_push(pace, bytes);
  return t == 0 ? 0 : t + pace.latency_ns;
}

// The end of a warp's pushes: waits until the last of them has landed (last = the latest
// link_push time, 0 if none).
__device__ inline void link_drain(const LinkPace& pace, uint64_t last) {
  if (last != 0) link_wait(pace, last + pace.latency_ns);
}

// Zeroes a pacer (one thread); null: nothing.
__device__ inline void link_zero(LinkPacer* pacer) {
  if (pacer == nullptr) return;
  pacer->origin_ns = 0;
  pacer->busy_ps = 0;
  pacer->blocks_done = 0;
}

}  // namespace comet::cuda
