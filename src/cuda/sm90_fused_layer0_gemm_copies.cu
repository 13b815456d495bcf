// One kernel configuration per translation unit: fused layer0 whose GEMM blocks move the rows
// themselves (Layer0Copies::kGemmBlocks, cuda/dispatch_bulk.cuh): the same GEMM tile, with
// kDispatchRingBytes of shared memory set aside for the copy ring (one mainloop stage fewer).
#include "cuda/sm90_fused_layer.cuh"

namespace comet::cuda {
bool bulk_dispatch_fits(int hidden) { return hidden > 0 && bulk_dispatch_slots(kDispatchRingBytes, hidden) >= 1; }

void run_fused_layer0_gemm_copies(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream) {
  using Gemm = sm90::GroupedGemmKernel<GemmEpilogue::kSwiGlu, kGemmBlockM, 256, kGemmTileK, 1, false, kDispatchRingBytes>;
  sm90::launch_fused_layer<Gemm, 0>(gemm, comm, stream);
}
}  // namespace comet::cuda
