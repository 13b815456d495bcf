// cuda/activation.cuh: the expert activations on the device, with the definitions of the CPU
// paths (core/activation.h): exact (erf) GELU, SiLU as x / (1 + e^-x), SwiGLU as silu(gate) * up.
// Used by the baselines' activation kernel and the grouped GEMM's plain-activation epilogue.
#pragma once

#include "comet/config.h"

namespace comet::cuda {

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// The intermediate value of one column: gated activations combine gate and up; plain ones use
// only `up` (the W0 projection).
__device__ __forceinline__ float apply_activation(Activation act, float gate, float up) {
  switch (act) {
    case Activation::kSwiGlu: return silu(gate) * up;
    case Activation::kGelu: return 0.5f * up * (1.f + erff(up * 0.70710678118654752f));
    case Activation::kRelu: return up > 0.f ? up : 0.f;
    case Activation::kSilu: return silu(up);
  }
  return up;
}

}  // namespace comet::cuda
