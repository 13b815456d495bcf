// One kernel configuration per translation unit: identity epilogue, ping-pong, 128x128x64 tiles.
#include "cuda/sm90_grouped_gemm_launch.cuh"

namespace comet::cuda {
using Kernel_identity_pingpong = sm90::GroupedGemmKernel<GemmEpilogue::kIdentity, kGemmBlockM, 128, kGemmTileK, 1, true>;
void launch_grouped_gemm_identity_pingpong(const GroupedGemmArgs& args, cudaStream_t stream) {
  sm90::launch_grouped_gemm<Kernel_identity_pingpong>(args, stream);
}
}  // namespace comet::cuda
