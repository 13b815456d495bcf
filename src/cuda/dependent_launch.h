// cuda/dependent_launch.h: the layer's kernels launched with programmatic dependent launch
// (Hopper; PTX griddepcontrol), so that the runtime may launch a kernel while the previous kernel
// of the stream finishes, not only after it.
//
// In plain stream order each launch waits for the previous kernel's completion; the forward runs
// 9 kernels per rank on several GPUs and more per GPU with virtual ranks, many of them short
// (the plan's three, publish, the unfused pipeline's copies and tile lists). With
// cudaLaunchAttributeProgrammaticStreamSerialization the runtime may launch the next kernel once
// every block of the running one has executed `griddepcontrol.launch_dependents` (or exited);
// each block of the next kernel then waits in `griddepcontrol.wait` until the previous kernel has
// completed and its memory operations are visible. What a kernel may read and write is therefore
// what stream order gives it; only the launch overlaps (docs/gpu_layer.md "Launches" has what it
// measured).
//
// The contract: a kernel launched through launch_kernel() calls begin_dependent_kernel() before
// its first global memory access, in every thread that touches memory. Each kernel waits for its
// predecessor before it can complete, so the wait covers every earlier kernel of the stream. A
// kernel launched any other way (cuBLAS, NCCL, a test's own) is ordered as usual: the attribute
// relaxes only the dependency of the kernel that carries it. In a kernel launched without it the
// wait returns at once, while `launch_dependents` still lets the next kernel, if it carries the
// attribute, launch early (after a fused kernel, the owner reduce's blocks then wait on the SMs
// the fused blocks leave). CUDA graphs capture the attribute as a programmatic edge.
//
// COMET_DEPENDENT_LAUNCH=0 in the environment launches everything in plain stream order (for
// comparison and debugging; the results are the same bit for bit).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <iterator>
#include <string_view>
#include <utility>

#include "cuda/check.h"

namespace comet::cuda {

// Whether launch_kernel() sets the attribute: on unless COMET_DEPENDENT_LAUNCH=0 (read once).
// Any value but 0 or 1 throws, as COMET_HALF_TILES does: "off" or "false" must not mean on.
inline bool dependent_launches() {
  static const bool on = [] {
    const char* v = std::getenv("COMET_DEPENDENT_LAUNCH");
    if (v == nullptr) return true;
    const std::string_view s(v);
    COMET_CHECK(s == "0" || s == "1", "COMET_DEPENDENT_LAUNCH must be 0 or 1, got '" << s << "'");
    return s == "1";
  }();
  return on;
}

// Launch attributes of one launch: the dependent-launch one (when on and `dependent`) plus the
// caller's.
struct LaunchAttributes {
  cudaLaunchAttribute list[3]{};
  unsigned count = 0;

  explicit LaunchAttributes(bool dependent = true) {
    if (dependent && dependent_launches()) {
      cudaLaunchAttribute& a = next();
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
  }
  // Every block resident at once (the runtime refuses the launch otherwise): for grids whose
  // blocks wait on each other. Such grids are launched in plain stream order (`dependent`
  // false): measured, the dependent launch gained nothing for them (the fused kernels, docs/
  // gpu_layer.md "Launches"), and their blocks must all be resident anyway.
  LaunchAttributes& cooperative() {
    cudaLaunchAttribute& a = next();
    a.id = cudaLaunchAttributeCooperative;
    a.val.cooperative = 1;
    return *this;
  }
  LaunchAttributes& cluster(unsigned blocks) {
    cudaLaunchAttribute& a = next();
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = blocks;
    a.val.clusterDim.y = a.val.clusterDim.z = 1;
    return *this;
  }

 private:
  cudaLaunchAttribute& next() {
    COMET_CHECK(count < std::size(list), "LaunchAttributes: more than " << std::size(list) << " attributes");
    return list[count++];
  }
};

// A launch's result: on failure the runtime's last error is cleared too, so that a later
// COMET_CUDA_CHECK_LAUNCH() does not report this launch's failure as its own.
inline void check_kernel_launch(cudaError_t launched) {
  if (launched != cudaSuccess) (void)cudaGetLastError();
  COMET_CUDA_CHECK(launched);
}

// A launch configuration pointing at `attributes` (which must outlive its use).
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                        LaunchAttributes& attributes) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes.list;
  config.numAttrs = attributes.count;
  return config;
}

#ifdef __CUDACC__
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   LaunchAttributes attributes, Args&&... args) {
  const cudaLaunchConfig_t config = launch_config(grid, block, smem, stream, attributes);
  check_kernel_launch(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// First statement of every kernel launched through launch_kernel(): wait until the previous
// kernel of the stream has completed (its writes visible), then let the next one launch. Letting
// it launch this early cannot starve this kernel: the next kernel launches only once every block
// of this one has started, and its blocks take SMs (where they fit beside this kernel's, or as
// this kernel's leave) only to wait in turn.
__device__ __forceinline__ void begin_dependent_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#endif

}  // namespace comet::cuda
