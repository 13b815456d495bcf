// cuda/signal.cuh: device side of the signal protocol (DESIGN §4, docs/protocol.md).
//
// Signals are u64 epoch counters in global memory. Producers publish with a release
// reduction after their data stores; consumers spin with acquire loads until the counter
// reaches a target, with a %globaltimer timeout. Scope is .gpu for one device; peers on other
// GPUs (Local/Nccl fabrics) use the .sys variants.
//
// NOTES: a consumer that reads the published data through TMA (the async proxy) must also
// issue fence.proxy.async after its acquire, since the data was written through the generic
// proxy. wait_at_least() does that for callers that ask.
#pragma once

#include <cstdint>

#include "cuda/device_error.h"

namespace comet::cuda {

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t ld_acquire_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void red_release_gpu(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void red_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

struct WaitSite {
  int32_t rank;
  int32_t layer;
  WaitRole role;
  int32_t signal;
};

// Record the first timeout of a launch; later callers only learn that one happened.
__device__ __forceinline__ void record_timeout(DeviceError* error, const WaitSite& site,
                                               uint64_t expected, uint64_t observed) {
  if (atomicCAS(&error->claimed, 0, 1) != 0) return;
  error->rank = site.rank;
  error->role = int32_t(site.role);
  error->block = int32_t(blockIdx.x);
  error->signal = site.signal;
  error->layer = site.layer;
  error->expected = expected;
  error->observed = observed;
  __threadfence_system();
}

// One thread spins until *flag >= target (acquire). Returns false when the flag has not moved
// for timeout_ns (docs/protocol.md: a wait fails only on no progress, as on the CPU backend) or
// when another waiter already timed out (the caller then proceeds without the data; the host
// reports).
template <bool kSystemScope = false>
__device__ bool wait_at_least(const uint64_t* flag, uint64_t target, uint64_t timeout_ns,
                              DeviceError* error, const WaitSite& site) {
  auto load = [&] { return kSystemScope ? ld_acquire_sys(flag) : ld_acquire_gpu(flag); };
  uint64_t seen = load();
  if (seen >= target) return true;
  // Movement is told by the low word alone (one register fewer across the loop: the producer
  // warps that wait here run on few registers); it cannot wrap 2^32 between two polls.
  uint32_t last = uint32_t(seen);
  uint64_t moved_at = globaltimer_ns();
  while (true) {
    seen = load();
    if (seen >= target) return true;
    if (*reinterpret_cast<volatile int32_t*>(&error->claimed) != 0) return false;
    const uint64_t now = globaltimer_ns();
    if (uint32_t(seen) != last) {
      last = uint32_t(seen);
      moved_at = now;
    } else if (now - moved_at > timeout_ns) {
      record_timeout(error, site, target, seen);
      return false;
    }
    __nanosleep(64);
  }
}

}  // namespace comet::cuda
