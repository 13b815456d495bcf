// One kernel configuration per translation unit: identity epilogue, cooperative, 128x256x64 tiles.
#include "cuda/sm90_grouped_gemm_launch.cuh"

namespace comet::cuda {
using Kernel_identity_cooperative = sm90::GroupedGemmKernel<GemmEpilogue::kIdentity, kGemmBlockM, 256, kGemmTileK, 1, false>;
void launch_grouped_gemm_identity_cooperative(const GroupedGemmArgs& args, cudaStream_t stream) {
  sm90::launch_grouped_gemm<Kernel_identity_cooperative>(args, stream);
}
}  // namespace comet::cuda
