// Picks the kernel configuration for an epilogue.
#include "cuda/check.h"
#include "cuda/grouped_gemm.h"

namespace comet::cuda {

void launch_grouped_gemm_swiglu(const GroupedGemmArgs& args, cudaStream_t stream);
void launch_grouped_gemm_identity(const GroupedGemmArgs& args, cudaStream_t stream);
int grouped_gemm_swiglu_smem_bytes();
int grouped_gemm_identity_smem_bytes();

void run_grouped_gemm(const GroupedGemmArgs& args, CUstream_st* stream) {
  if (args.epilogue == GemmEpilogue::kSwiGlu) launch_grouped_gemm_swiglu(args, stream);
  else launch_grouped_gemm_identity(args, stream);
}

int grouped_gemm_smem_bytes(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::kSwiGlu ? grouped_gemm_swiglu_smem_bytes() : grouped_gemm_identity_smem_bytes();
}

}  // namespace comet::cuda
