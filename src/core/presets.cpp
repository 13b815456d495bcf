// Model presets of DESIGN §7 (expert shapes only; attention is not part of an MoE layer).
#include <sstream>

#include "comet/config.h"

namespace comet {

const std::vector<ModelShape>& ModelPresets::all() {
  // name, H, F, E, topk, activation, padding experts. qwen2-moe-2.7b has 60 routed experts,
  // padded to 64 so that EP in {1,2,4,8} divides E; its 4 padding experts are never routed to.
  static const std::vector<ModelShape> presets = {
      {"mixtral-8x7b", 4096, 14336, 8, 2, Activation::kSwiGlu},
      {"qwen2-moe-2.7b", 2048, 1408, 64, 4, Activation::kSwiGlu, 4},
      {"phi-3.5-moe", 4096, 6400, 16, 2, Activation::kSwiGlu},
      {"qwen3-30b-a3b", 2048, 768, 128, 8, Activation::kSwiGlu},
      {"deepseek-v3", 7168, 2048, 256, 8, Activation::kSwiGlu},
  };
  return presets;
}

std::vector<std::string> ModelPresets::names() {
  std::vector<std::string> out;
  for (const auto& p : all()) out.push_back(p.name);
  return out;
}

const ModelShape& ModelPresets::get(const std::string& name) {
  for (const auto& p : all())
    if (p.name == name) return p;
  std::ostringstream os;
  os << "unknown model preset '" << name << "' (known:";
  for (const auto& p : all()) os << " " << p.name;
  os << ")";
  throw Error(os.str());
}

}  // namespace comet
