// Seeded generation of complete MoE problems.
#include "comet/problem.h"

#include <cmath>

namespace comet {

void ExpertWeights::check(const ModelShape& m) const {
  const size_t per = size_t(m.num_experts) * m.hidden * m.ffn;
  COMET_CHECK(w_up.size() == per, "w_up holds " << w_up.size() << " values, expected E*H*F = " << per);
  COMET_CHECK(w_down.size() == per, "w_down holds " << w_down.size() << " values, expected E*F*H = " << per);
  COMET_CHECK(w_gate.size() == (is_gated(m.activation) ? per : 0),
              "w_gate holds " << w_gate.size() << " values, expected "
                              << (is_gated(m.activation) ? per : 0) << " for activation "
                              << activation_name(m.activation));
  // A NaN or infinite weight would make the output NaN without a word: named here.
  const auto finite = [&](const std::vector<float>& w, const char* name, size_t rows, size_t cols) {
    for (size_t i = 0; i < w.size(); ++i)
      COMET_CHECK(std::isfinite(w[i]), name << " of expert " << i / (rows * cols) << " [" << (i / cols) % rows << "]["
                                            << i % cols << "] is " << w[i] << " (not finite)");
  };
  finite(w_gate, "w_gate", m.hidden, m.ffn);
  finite(w_up, "w_up", m.hidden, m.ffn);
  finite(w_down, "w_down", m.ffn, m.hidden);
}

namespace {
std::vector<float> normal_values(size_t n, double stddev, DType dtype, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = round_to(dtype, float(rng.normal() * stddev));
  return v;
}
}  // namespace

MoeProblem make_problem(const LayerConfig& config, const std::vector<int>& tokens_per_rank,
                        const RoutingSpec& routing, uint64_t seed) {
  config.check();
  const ModelShape& m = config.model;
  const int W = config.layout.world;
  COMET_CHECK(int(tokens_per_rank.size()) == W,
              "tokens given for " << tokens_per_rank.size() << " ranks, but the world has " << W);
  MoeProblem p;
  p.config = config;
  const size_t per = size_t(m.num_experts) * m.hidden * m.ffn;
  // Fan-in scaling keeps every intermediate O(1), so relative errors are meaningful.
  const double in_std = 1.0 / std::sqrt(double(m.hidden));
  const double out_std = 1.0 / std::sqrt(double(m.ffn));
  if (is_gated(m.activation)) p.weights.w_gate = normal_values(per, in_std, config.dtype, derive_seed(seed, 1));
  p.weights.w_up = normal_values(per, in_std, config.dtype, derive_seed(seed, 2));
  p.weights.w_down = normal_values(per, out_std, config.dtype, derive_seed(seed, 3));
  for (int r = 0; r < W; ++r) {
    const int t = tokens_per_rank[r];
    COMET_CHECK(t >= 0 && t <= config.max_tokens_per_rank,
                "rank " << r << " has " << t << " tokens, outside [0, T_max = "
                        << config.max_tokens_per_rank << "]");
    p.x.push_back(normal_values(size_t(t) * m.hidden, 1.0, config.dtype, derive_seed(seed, 100 + r)));
    p.routing.push_back(generate_routing(routing, t, m.routed_experts(), m.topk, seed, r));
  }
  return p;
}

}  // namespace comet
