// One kernel configuration per translation unit: fused layer0 (pull dispatch + GEMM0 with SwiGLU)
// with communication blocks; sm90_fused_layer0_gemm_copies.cu has the other one.
#include "cuda/sm90_fused_layer.cuh"

namespace comet::cuda {
void run_fused_layer0(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream) {
  // Without wait flags only for MoeLayer::Part::kFusedGemms (the copies idle).
  COMET_CHECK(gemm.epilogue == GemmEpilogue::kSwiGlu && (gemm.wait_flags != nullptr || comm.stall),
              "fused layer0 runs GEMM0 with SwiGLU and per-tile waits");
  if (comm.gemm_block_copies) {
    run_fused_layer0_gemm_copies(gemm, comm, stream);
    return;
  }
  using Gemm = sm90::GroupedGemmKernel<GemmEpilogue::kSwiGlu, kGemmBlockM, 256, kGemmTileK>;
  sm90::launch_fused_layer<Gemm, 0>(gemm, comm, stream);
}
}  // namespace comet::cuda
