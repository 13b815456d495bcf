// One kernel configuration per translation unit: fused layer1 (GEMM1 + pre-reduce and push).
#include "cuda/sm90_fused_layer.cuh"

namespace comet::cuda {
void run_fused_layer1(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream) {
  // Without done flags only for MoeLayer::Part::kFusedGemms (the communication blocks idle).
  COMET_CHECK(gemm.epilogue == GemmEpilogue::kIdentity && (gemm.done_flags != nullptr || comm.stall),
              "fused layer1 runs GEMM1 with column-block signals");
  using Gemm = sm90::GroupedGemmKernel<GemmEpilogue::kIdentity, kGemmBlockM, 256, kGemmTileK>;
  sm90::launch_fused_layer<Gemm, 1>(gemm, comm, stream);
}
}  // namespace comet::cuda
