// cuda/bulk_copy.cuh: Hopper bulk asynchronous copies (cp.async.bulk, the TMA unit's
// non-tensor mode) between global and shared memory, and the mbarrier that completes a load;
// also the per-thread 16-byte asynchronous copy (cp.async, completed by a wait, not an mbarrier).
//
// Why: a bulk copy moves a whole row without passing it through registers, so a warp with the
// GEMM producer's 40 registers can keep as many bytes in flight as its shared-memory ring holds
// (cuda/dispatch_bulk.cuh). Sizes and addresses are multiples of 16 bytes.
//
// NOTES (memory ordering): a load's bytes are visible to the threads that observe its mbarrier
// phase complete; a store issued from those bytes reads them through the same (async) proxy. A
// store is complete, and its bytes visible to the issuing thread, after wait_bulk_writes();
// generic-proxy readers elsewhere then need that thread's fence.proxy.async plus a release.
#pragma once

#include <cstdint>

namespace comet::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// An mbarrier expecting one arrival per phase (the issuing thread's arrive_expect_bytes).
__device__ __forceinline__ void mbarrier_init_one(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(bar)) : "memory");
}
// Makes initialized mbarriers visible to the async proxy (the bulk loads complete on them).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// True once the phase with parity `parity` has completed (one bounded hardware wait).
__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// global -> shared, completing `bytes` transactions on `bar`.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}
// shared -> global, in the issuing thread's current bulk group.
__device__ __forceinline__ void bulk_store(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem), "r"(smem_address(smem)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Every bulk store this thread committed has written global memory.
__device__ __forceinline__ void wait_bulk_writes() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Every bulk store this thread committed has read its shared memory (which may then be reused);
// their writes may still be in flight.
__device__ __forceinline__ void wait_bulk_reads() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// 16 bytes global -> shared per thread (cp.async.cg: through L2, not L1); the bytes are this
// thread's after copy_async_wait_all(), the block's after a barrier that follows it.
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_address(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

}  // namespace comet::cuda
