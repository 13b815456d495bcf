// tests/gpu/layer_cases.h: the layer cases shared by the GPU layer suites (MoeLayer, baselines):
// every preset scaled down 16x, W in {1,2,4,8} with EP, TP and EP+TP layouts, the three routing
// generators in turn (Zipf with 10% masked slots), uneven token counts and an empty rank 1.
#pragma once

#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comet/config.h"
#include "comet/routing.h"

namespace comet::test {

struct LayerCase {
  std::string model;
  int shape_factor, world, tp, t_max;
  std::vector<int> tokens;
  RoutingSpec spec;
  uint64_t seed;
  LayerConfig config() const {
    LayerConfig c;
    c.model = ModelPresets::get(model).scaled_down(shape_factor);
    c.layout = {world, world / tp, tp};
    c.max_tokens_per_rank = t_max;
    c.tiles = {128, 128, 256};
    return c;
  }
  std::string describe() const {
    std::ostringstream os;
    os << model << "/" << shape_factor << " W=" << world << " TP=" << tp << " T_max=" << t_max
       << " routing=" << spec.describe() << " seed=" << seed << " tokens=[";
    for (size_t i = 0; i < tokens.size(); ++i) os << (i ? "," : "") << tokens[i];
    return os.str() + "]";
  }
};

// gtest prints a case with every parameter.
inline void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.describe(); }

inline std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> out;
  uint64_t seed = 1;
  const RoutingSpec specs[] = {{RoutingKind::kUniform, 0, 0}, {RoutingKind::kZipf, 1.2, 0.1},
                               {RoutingKind::kImbalance, 0.05, 0}};
  for (const std::string model : {"mixtral-8x7b", "qwen2-moe-2.7b", "phi-3.5-moe", "qwen3-30b-a3b", "deepseek-v3"})
    for (auto [world, tp] : {std::pair{1, 1}, {2, 1}, {4, 2}, {8, 1}, {8, 2}, {8, 8}}) {
      const ModelShape m = ModelPresets::get(model).scaled_down(16);
      if (m.num_experts % (world / tp) != 0 || (m.ffn / tp) % 8 != 0) continue;
      LayerCase c{model, 16, world, tp, 96, {}, specs[seed % 3], seed};
      for (int r = 0; r < world; ++r) c.tokens.push_back(r == 1 ? 0 : 96 - 13 * r % 90);
      ++seed;
      out.push_back(c);
    }
  return out;
}

}  // namespace comet::test
