// One kernel configuration per translation unit: identity epilogue, ping-pong, 128x128x64 tiles,
// clusters of two blocks along M sharing B through TMA multicast.
#include "cuda/sm90_grouped_gemm_launch.cuh"

namespace comet::cuda {
using Kernel_identity_pingpong_cluster2x1 = sm90::GroupedGemmKernel<GemmEpilogue::kIdentity, kGemmBlockM, 128, kGemmTileK, 2, true>;
void launch_grouped_gemm_identity_pingpong_cluster2x1(const GroupedGemmArgs& args, cudaStream_t stream) {
  sm90::launch_grouped_gemm<Kernel_identity_pingpong_cluster2x1>(args, stream);
}
}  // namespace comet::cuda
