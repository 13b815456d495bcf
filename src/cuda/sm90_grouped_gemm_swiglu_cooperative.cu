// One kernel configuration per translation unit: swiglu epilogue, cooperative, 128x256x64 tiles.
#include "cuda/sm90_grouped_gemm_launch.cuh"

namespace comet::cuda {
using Kernel_swiglu_cooperative = sm90::GroupedGemmKernel<GemmEpilogue::kSwiGlu, kGemmBlockM, 256, kGemmTileK, 1, false>;
void launch_grouped_gemm_swiglu_cooperative(const GroupedGemmArgs& args, cudaStream_t stream) {
  sm90::launch_grouped_gemm<Kernel_swiglu_cooperative>(args, stream);
}
}  // namespace comet::cuda
