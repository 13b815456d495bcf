// core/activation.h: the expert activations, one definition for every CPU path (the fp64
// oracle instantiates them with double, the CPU backend with float).
#pragma once

#include <cmath>

#include "comet/config.h"

namespace comet::core {

template <class F>
F silu(F x) {
  return x / (F(1) + std::exp(-x));
}

// Exact (erf) GELU, not the tanh approximation.
template <class F>
F gelu(F x) {
  return F(0.5) * x * (F(1) + std::erf(x / std::sqrt(F(2))));
}

// The intermediate value of one column: gated activations combine gate and up projections;
// plain ones use only `up` (the W0 projection).
template <class F>
F apply_activation(Activation act, F gate, F up) {
  switch (act) {
    case Activation::kSwiGlu: return silu(gate) * up;
    case Activation::kGelu: return gelu(up);
    case Activation::kRelu: return up > F(0) ? up : F(0);
    case Activation::kSilu: return silu(up);
  }
  return up;
}

}  // namespace comet::core
