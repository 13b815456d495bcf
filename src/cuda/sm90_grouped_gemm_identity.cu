// One kernel configuration per translation unit: identity epilogue, 128x256x64 tiles.
#include "cuda/sm90_grouped_gemm_launch.cuh"

namespace comet::cuda {
using IdentityKernel = sm90::GroupedGemmKernel<GemmEpilogue::kIdentity, kGemmBlockM, 2 * kSwiGluHalf, 64>;
void launch_grouped_gemm_identity(const GroupedGemmArgs& args, cudaStream_t stream) {
  sm90::launch_grouped_gemm<IdentityKernel>(args, stream);
}
int grouped_gemm_identity_smem_bytes() { return IdentityKernel::kSmemBytes; }
}  // namespace comet::cuda
