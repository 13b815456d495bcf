// comet/problem.h: a complete MoE layer problem (weights, every rank's tokens and routing),
// generated deterministically from a seed, as the CLI, tests and benchmarks use it.
//
// Layouts (row-major, fp32 values already rounded to the config's dtype, so every backend
// and the oracle see the same numbers):
//   w_gate [E][H][F]  gate projection (gated activations only; empty otherwise)
//   w_up   [E][H][F]  up projection (W0 of plain activations)
//   w_down [E][F][H]  down projection
//   x[r]   [T_r][H]   tokens of rank r
#pragma once

#include <cstdint>
#include <vector>

#include "comet/config.h"
#include "comet/routing.h"

namespace comet {

struct ExpertWeights {
  std::vector<float> w_gate;
  std::vector<float> w_up;
  std::vector<float> w_down;
  // Throws comet::Error if the sizes do not match the model or a weight is NaN or infinite.
  void check(const ModelShape& model) const;
};

struct MoeProblem {
  LayerConfig config;
  ExpertWeights weights;
  std::vector<std::vector<float>> x;  // [W][T_r * H]
  std::vector<Routing> routing;       // [W]
  int num_tokens(int rank) const { return routing[rank].num_tokens; }
};

// Weights ~ N(0, 1/fan_in), tokens ~ N(0, 1), both rounded to config.dtype; routing from
// `routing` with tokens_per_rank[r] tokens on rank r (each <= T_max).
MoeProblem make_problem(const LayerConfig& config, const std::vector<int>& tokens_per_rank,
                        const RoutingSpec& routing, uint64_t seed);

}  // namespace comet
