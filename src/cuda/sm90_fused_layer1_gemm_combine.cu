// One kernel configuration per translation unit: fused layer1 with the combine in the GEMM
// blocks (Layer1Combine::kGemmBlocks): ping-pong 128x128 tiles, whose consumers hold half the
// cooperative 128x256's accumulators, so 152 registers per producer-warpgroup thread are left
// for the combine in its warps 1-3 (consumers 176; the combine's loop needs about 120). That
// fills the block's 168 x 384 registers at launch; 160 would leave the consumers 168.
#include "cuda/sm90_fused_layer.cuh"

namespace comet::cuda {
void run_fused_layer1_gemm_combine(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream) {
  COMET_CHECK(gemm.epilogue == GemmEpilogue::kIdentity && (gemm.done_flags != nullptr || comm.stall),
              "fused layer1 runs GEMM1 with column-block signals");
  COMET_CHECK(resolve_gemm_kernel(gemm) == GemmKernel::kPingpong128x128,
              "fused layer1 with the combine in the GEMM blocks runs " << gemm_kernel_name(GemmKernel::kPingpong128x128)
                                                                     << " tiles, not " << gemm_kernel_name(resolve_gemm_kernel(gemm)));
  using Gemm = sm90::GroupedGemmKernel<GemmEpilogue::kIdentity, kGemmBlockM, 128, kGemmTileK, 1, true, 0, 152>;
  sm90::launch_fused_layer<Gemm, 1>(gemm, comm, stream);
}
}  // namespace comet::cuda
