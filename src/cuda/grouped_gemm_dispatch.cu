// Picks the kernel configuration (one translation unit each) for an epilogue.
#include "cuda/check.h"
#include "cuda/grouped_gemm.h"

namespace comet::cuda {

#define COMET_DECLARE_GEMM_LAUNCH(name) void launch_grouped_gemm_##name(const GroupedGemmArgs& args, cudaStream_t stream);
COMET_DECLARE_GEMM_LAUNCH(swiglu_cooperative)
COMET_DECLARE_GEMM_LAUNCH(identity_cooperative)
COMET_DECLARE_GEMM_LAUNCH(swiglu_cooperative_cluster2x1)
COMET_DECLARE_GEMM_LAUNCH(identity_cooperative_cluster2x1)
COMET_DECLARE_GEMM_LAUNCH(swiglu_pingpong)
COMET_DECLARE_GEMM_LAUNCH(identity_pingpong)
COMET_DECLARE_GEMM_LAUNCH(swiglu_pingpong_cluster2x1)
COMET_DECLARE_GEMM_LAUNCH(identity_pingpong_cluster2x1)
COMET_DECLARE_GEMM_LAUNCH(swiglu_cooperative_split)
COMET_DECLARE_GEMM_LAUNCH(identity_cooperative_split)
COMET_DECLARE_GEMM_LAUNCH(swiglu_pingpong_split)
COMET_DECLARE_GEMM_LAUNCH(identity_pingpong_split)
COMET_DECLARE_GEMM_LAUNCH(activation_pingpong)
#undef COMET_DECLARE_GEMM_LAUNCH

void run_grouped_gemm(const GroupedGemmArgs& args, CUstream_st* stream) {
  GroupedGemmArgs a = args;
  a.kernel = resolve_gemm_kernel(args);
  // The plain activation: ping-pong on a plain schedule only (can_implement refuses the rest).
  if (a.epilogue == GemmEpilogue::kActivation) return launch_grouped_gemm_activation_pingpong(a, stream);
  const bool swiglu = a.epilogue == GemmEpilogue::kSwiGlu;
  if (a.split.blocks > 0) {  // split schedules: their own instantiations (clusters: refused by can_implement)
    if (a.kernel == GemmKernel::kPingpong128x128)
      return swiglu ? launch_grouped_gemm_swiglu_pingpong_split(a, stream) : launch_grouped_gemm_identity_pingpong_split(a, stream);
    if (a.kernel == GemmKernel::kCooperative128x256)
      return swiglu ? launch_grouped_gemm_swiglu_cooperative_split(a, stream)
                    : launch_grouped_gemm_identity_cooperative_split(a, stream);
  }
  switch (a.kernel) {
    case GemmKernel::kCooperative128x256Cluster2x1:
      return swiglu ? launch_grouped_gemm_swiglu_cooperative_cluster2x1(a, stream)
                    : launch_grouped_gemm_identity_cooperative_cluster2x1(a, stream);
    case GemmKernel::kPingpong128x128:
      return swiglu ? launch_grouped_gemm_swiglu_pingpong(a, stream) : launch_grouped_gemm_identity_pingpong(a, stream);
    case GemmKernel::kPingpong128x128Cluster2x1:
      return swiglu ? launch_grouped_gemm_swiglu_pingpong_cluster2x1(a, stream)
                    : launch_grouped_gemm_identity_pingpong_cluster2x1(a, stream);
    case GemmKernel::kCooperative128x256:
    case GemmKernel::kAuto:  // resolved above
      return swiglu ? launch_grouped_gemm_swiglu_cooperative(a, stream) : launch_grouped_gemm_identity_cooperative(a, stream);
  }
}

}  // namespace comet::cuda
