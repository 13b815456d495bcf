// One kernel configuration per translation unit: fused layer1 on ping-pong 128x128 tiles with the
// combine in the producer warpgroup's idle warps (prototype).
#include <cstdlib>

#include "cuda/sm90_fused_layer.cuh"

namespace comet::cuda {
bool layer1_helper_combine() {
  static const bool on = [] {
    const char* v = std::getenv("COMET_LAYER1_HELPERS");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

void run_fused_layer1_helpers(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream) {
  COMET_CHECK(gemm.epilogue == GemmEpilogue::kIdentity && (gemm.done_flags != nullptr || comm.stall),
              "fused layer1 runs GEMM1 with column-block signals");
  using Gemm = sm90::GroupedGemmKernel<GemmEpilogue::kIdentity, kGemmBlockM, 128, 64, 1, true, 0, 152>;
  sm90::launch_fused_layer<Gemm, 1>(gemm, comm, stream);
}
}  // namespace comet::cuda
