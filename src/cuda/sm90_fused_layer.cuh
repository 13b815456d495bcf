// cuda/sm90_fused_layer.cuh: the fused Comet kernels (cuda/fused_layer.h), one template for
// both layers; each translation unit instantiates one.
//
// The communication blocks run cuda/comm_rows.cuh (its NOTES give the memory ordering); the
// GEMM blocks run GroupedGemmKernel::run_block with the layer's waits or signals.
#pragma once

#include <cuda_bf16.h>

#include <array>
#include <atomic>

#include "cuda/check.h"
#include "cuda/comm_rows.cuh"
#include "cuda/dependent_launch.h"
#include "cuda/dispatch_bulk.cuh"
#include "cuda/fused_layer.h"
#include "cuda/sm90_grouped_gemm_launch.cuh"  // kMaxDevices

namespace comet::cuda::sm90 {

template <class Gemm, int kLayer>
__global__ void __launch_bounds__(Gemm::kThreads, 1)
    fused_layer_kernel(const __grid_constant__ typename Gemm::Params g, const __grid_constant__ FusedCommArgs f) {
  begin_dependent_kernel();
  extern __shared__ __align__(128) char smem[];
  // Layer0 with Layer0Copies::kGemmBlocks: no communication blocks; a warp of every block's
  // producer warpgroup moves rows (cuda/dispatch_bulk.cuh) while the block runs GEMM0 tiles.
  if constexpr (kLayer == 0 && Gemm::kHelperSmemBytes > 0) {
    const auto dispatch = [&f](char* helper_smem) {
      if (!f.stall) dispatch_rows_bulk(f, helper_smem, Gemm::kHelperSmemBytes, int(blockIdx.x), int(gridDim.x));
    };
    Gemm::template run_block<false>(g, 0, 1, smem, typename Gemm::NoWork{}, dispatch);
    return;
  }
  // Layer1 with helper registers: no communication blocks; the producer warpgroup's warps 1-3
  // of every block claim combine items while the block runs GEMM1 tiles, and the consumers join
  // once their tiles are done.
  if constexpr (kLayer == 1 && Gemm::kHelperRegs > 0) {
    // The same loop for both: the consumers' join, and the helper (which needs no shared memory).
    const auto combine = [&f] {
      if (!f.stall) combine_rows(f, f.plan.recv_psum, 0, 1);
    };
    Gemm::template run_block<false>(g, 0, 1, smem, combine, [&combine](char*) { combine(); });
    return;
  }
  if (int(blockIdx.x) < f.n_comm) {
    if (f.stall) return;
    int32_t* psum = reinterpret_cast<int32_t*>(smem);
    load_recv_psum(f, psum);
    const int warps = int(blockDim.x) / 32, warp = int(blockIdx.x) * warps + int(threadIdx.x) / 32;
    if constexpr (kLayer == 0) dispatch_rows(f, psum, warp, f.n_comm * warps);
    else combine_rows(f, psum, warp, f.n_comm * warps);
    // Copies done: with claimed tiles, the block runs GEMM tiles until none are left (it
    // produces no signal anyone still waits for, so joining late cannot deadlock). Layer1's
    // combine ends with GEMM1 when it has items; with none (every token's only row stored by
    // GEMM1's epilogue, e.g. one expert per rank) its blocks run GEMM1 from the start.
    if (g.tile_claims != nullptr) {
      __syncthreads();  // shared memory (psum) becomes the GEMM's
      Gemm::template run_block<false>(g, 0, 1, smem);
    }
    return;
  }
  // layer1: the consumer warps of a GEMM block whose tiles are done claim combine items, so the
  // last column group is not left to the n_comm blocks alone. recv_psum is read from global
  // memory: shared memory is the GEMM's.
  const auto join_combine = [&f] {
    if constexpr (kLayer == 1)
      if (f.combine_claims != nullptr && !f.stall) combine_rows(f, f.plan.recv_psum, 0, 1);
  };
  Gemm::template run_block<false>(g, int(blockIdx.x) - f.n_comm, int(gridDim.x) - f.n_comm, smem, join_combine);
}

// Cooperative launch on one block per SM: every block must be resident, since GEMM blocks wait
// for comm blocks (and the reverse in layer1).
template <class Gemm, int kLayer>
void launch_fused_layer(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, cudaStream_t stream) {
  static_assert(Gemm::kThreads / 32 <= kTraceWarpsPerBlock, "trace buffers are sized for kTraceWarpsPerBlock");
  const Status ok = can_implement(gemm);
  COMET_CHECK(ok.ok, "fused layer" << kLayer << ": " << ok.reason);
  COMET_CHECK(comm.rows_per_token >= 1 && comm.rows_per_token <= kMaxRowsPerToken,
              "fused layer" << kLayer << ": " << comm.rows_per_token << " rows per token, at most " << kMaxRowsPerToken);
  COMET_CHECK(comm.col_width > 0 && comm.col_width % 8 == 0,
              "fused layer" << kLayer << ": column blocks of " << comm.col_width << " columns are not whole 16-byte chunks");
  auto* kernel = fused_layer_kernel<Gemm, kLayer>;
  int device = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  // Per device, once: the shared-memory opt-in and the residency check (not on every launch).
  static std::array<std::atomic<int>, kMaxDevices> sms_of_device{};
  COMET_CHECK(device < kMaxDevices, "fused layer" << kLayer << ": device " << device << " beyond " << kMaxDevices);
  int num_sms = sms_of_device[device].load(std::memory_order_relaxed);
  if (num_sms == 0) {
    int per_sm = 0;
    COMET_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    COMET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Gemm::kSmemBytes));
    COMET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Gemm::kThreads, Gemm::kSmemBytes));
    COMET_CHECK(per_sm >= 1, "fused layer" << kLayer << ": a block does not fit on an SM");
    sms_of_device[device].store(num_sms, std::memory_order_relaxed);
  }
  constexpr bool kGemmBlockCopies = (kLayer == 0 && Gemm::kHelperSmemBytes > 0) || (kLayer == 1 && Gemm::kHelperRegs > 0);
  if constexpr (kGemmBlockCopies) {
    COMET_CHECK(gemm.tile_claims != nullptr, "fused layer" << kLayer << " with copies in the GEMM blocks needs claimed tiles");
    if constexpr (kLayer == 0)
      COMET_CHECK(bulk_dispatch_slots(Gemm::kHelperSmemBytes, comm.hidden) >= 1,
                  "fused layer0: a row of " << comm.hidden << " bf16 does not fit the GEMM blocks' copy ring");
    else
      COMET_CHECK(comm.combine_claims != nullptr || comm.stall, "fused layer1 with the combine in the GEMM blocks needs claimed items");
  } else {
    COMET_CHECK(comm.n_comm >= 1 && comm.n_comm < num_sms,
                "fused layer" << kLayer << ": n_comm " << comm.n_comm << " must be in [1, " << num_sms - 1 << "]");
  }
  // The communication blocks claim tiles too once their copies are done (not when stalled).
  const int claim_blocks = kGemmBlockCopies || !comm.stall ? num_sms : num_sms - comm.n_comm;
  const typename Gemm::Params params = Gemm::make_params(gemm, claim_blocks);
  launch_kernel(kernel, dim3(num_sms), dim3(Gemm::kThreads), Gemm::kSmemBytes, stream, LaunchAttributes(false).cooperative(),
                params, comm);
}

}  // namespace comet::cuda::sm90
