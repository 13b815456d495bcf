// One kernel configuration per translation unit: SwiGLU epilogue, 128x256x64 tiles.
#include "cuda/sm90_grouped_gemm_launch.cuh"

namespace comet::cuda {
using SwiGluKernel = sm90::GroupedGemmKernel<GemmEpilogue::kSwiGlu, kGemmBlockM, 2 * kSwiGluHalf, 64>;
void launch_grouped_gemm_swiglu(const GroupedGemmArgs& args, cudaStream_t stream) {
  sm90::launch_grouped_gemm<SwiGluKernel>(args, stream);
}
int grouped_gemm_swiglu_smem_bytes() { return SwiGluKernel::kSmemBytes; }
}  // namespace comet::cuda
