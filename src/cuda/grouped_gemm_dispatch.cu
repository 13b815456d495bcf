// Picks the kernel configuration (one translation unit each) for an epilogue.
#include "cuda/check.h"
#include "cuda/grouped_gemm.h"

namespace comet::cuda {

void launch_grouped_gemm_swiglu_cooperative(const GroupedGemmArgs& args, cudaStream_t stream);
void launch_grouped_gemm_identity_cooperative(const GroupedGemmArgs& args, cudaStream_t stream);
int grouped_gemm_swiglu_cooperative_smem_bytes();
int grouped_gemm_identity_cooperative_smem_bytes();

void run_grouped_gemm(const GroupedGemmArgs& args, CUstream_st* stream) {
  GroupedGemmArgs a = args;
  a.kernel = resolve_gemm_kernel(args);
  if (a.epilogue == GemmEpilogue::kSwiGlu) launch_grouped_gemm_swiglu_cooperative(a, stream);
  else launch_grouped_gemm_identity_cooperative(a, stream);
}

int grouped_gemm_smem_bytes(GemmEpilogue epilogue, GemmKernel kernel) {
  (void)kernel;
  return epilogue == GemmEpilogue::kSwiGlu ? grouped_gemm_swiglu_cooperative_smem_bytes()
                                           : grouped_gemm_identity_cooperative_smem_bytes();
}

}  // namespace comet::cuda
