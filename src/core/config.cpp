// Layer configuration: validation with reasons, derived sizes, CPU scaling.
#include "comet/config.h"

#include <algorithm>
#include <sstream>

namespace comet {

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kSwiGlu: return "swiglu";
    case Activation::kGelu: return "gelu";
    case Activation::kRelu: return "relu";
    case Activation::kSilu: return "silu";
  }
  return "?";
}

Activation parse_activation(const std::string& name) {
  if (name == "swiglu") return Activation::kSwiGlu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "relu") return Activation::kRelu;
  if (name == "silu") return Activation::kSilu;
  throw Error("unknown activation '" + name + "' (expected swiglu, gelu, relu or silu)");
}

int64_t ModelShape::weights_per_expert() const {
  const int64_t projections_in = is_gated(activation) ? 2 : 1;
  return (projections_in + 1) * int64_t(hidden) * ffn;
}

int64_t ModelShape::flops_per_row() const { return 2 * weights_per_expert(); }

ModelShape ModelShape::scaled_down(int factor) const {
  COMET_CHECK(factor >= 1, "scale factor must be >= 1, got " << factor);
  if (factor == 1) return *this;
  auto shrink = [factor](int n) { return std::max(8, (n / factor + 7) / 8 * 8); };
  ModelShape s = *this;
  s.hidden = shrink(hidden);
  s.ffn = shrink(ffn);
  s.name = name + "/" + std::to_string(factor);
  return s;
}

CpuScale choose_cpu_scale(const ModelShape& model, int world, int tokens_per_rank,
                          double flop_budget, int64_t weight_value_budget) {
  CpuScale scale;
  auto weight_values = [&](int factor) {
    return int64_t(model.num_experts) * model.scaled_down(factor).weights_per_expert();
  };
  auto work = [&](const CpuScale& s) {
    const ModelShape m = model.scaled_down(s.shape_factor);
    const double tokens = std::max(1, tokens_per_rank / s.token_factor);
    return double(world) * tokens * model.topk * double(m.flops_per_row());
  };
  // With few tokens the FLOP fit while the weights stay huge (mixtral: 352M values), so the
  // weights bound the shape factor too.
  while ((work(scale) > flop_budget || weight_values(scale.shape_factor) > weight_value_budget) &&
         model.hidden / (scale.shape_factor * 2) >= 64) {
    scale.shape_factor *= 2;
  }
  while (work(scale) > flop_budget && tokens_per_rank / scale.token_factor > 1) {
    scale.token_factor *= 2;
  }
  return scale;
}

int64_t LayerConfig::max_rows_per_rank() const {
  // Routing never repeats an expert within a token (Routing::check), so a token sends at most
  // min(topk, E/EP) rows to one rank; each expert segment adds at most block_m - 1 padding rows.
  const int64_t per_token = std::min(model.topk, experts_per_rank());
  const int64_t rows = int64_t(layout.world) * max_tokens_per_rank * per_token +
                       int64_t(experts_per_rank()) * (tiles.block_m - 1);
  return (rows + tiles.block_m - 1) / tiles.block_m * tiles.block_m;
}

int64_t LayerConfig::max_m_tiles_per_rank() const { return max_rows_per_rank() / tiles.block_m; }

Status LayerConfig::validate() const {
  auto fail = [](const std::string& s) { return Status::failure(s); };
  const ModelShape& m = model;
  const ParallelLayout& l = layout;
  if (m.hidden <= 0 || m.ffn <= 0 || m.num_experts <= 0)
    return fail("model '" + m.name + "' needs positive hidden, ffn and num_experts (got H=" +
                std::to_string(m.hidden) + ", F=" + std::to_string(m.ffn) +
                ", E=" + std::to_string(m.num_experts) + ")");
  // Real layers are far below this (deepseek-v3: H 7168; mixtral: F 14336). Beyond it the int32
  // sums H + block_n1 - 1 and F/TP + block_n0 - 1 and the int64 weights of an expert, 3 H F,
  // overflow instead of failing.
  if (m.hidden > kMaxModelDim || m.ffn > kMaxModelDim)
    return fail("model '" + m.name + "' needs hidden and ffn of at most " + std::to_string(kMaxModelDim) +
                " (got H=" + std::to_string(m.hidden) + ", F=" + std::to_string(m.ffn) + ")");
  if (m.num_experts > kMaxExperts)
    return fail("model '" + m.name + "' needs num_experts of at most " + std::to_string(kMaxExperts) +
                " (got E=" + std::to_string(m.num_experts) + ")");
  if (m.padding_experts < 0 || m.padding_experts >= m.num_experts)
    return fail("padding experts must be in [0, E=" + std::to_string(m.num_experts) + "), got " +
                std::to_string(m.padding_experts));
  if (m.topk < 1 || m.topk > m.routed_experts())
    return fail("topk must be in [1, routed experts=" + std::to_string(m.routed_experts()) + "], got " +
                std::to_string(m.topk));
  if (l.ep < 1 || l.tp < 1 || l.world < 1)
    return fail("world, ep and tp must be >= 1 (got W=" + std::to_string(l.world) + ", EP=" +
                std::to_string(l.ep) + ", TP=" + std::to_string(l.tp) + ")");
  // In int64: EP*TP in int wraps (EP = 1431655766, TP = 3 gives 2), and a plan sized for the
  // wrapped world is indexed with the real ranks.
  if (int64_t(l.world) != int64_t(l.ep) * l.tp)
    return fail("world size " + std::to_string(l.world) + " != EP*TP = " + std::to_string(l.ep) +
                "*" + std::to_string(l.tp));
  if (l.world > kMaxWorldSize)
    return fail("world size W=" + std::to_string(l.world) + " is more than the " +
                std::to_string(kMaxWorldSize) + " ranks a layer supports");
  if (m.num_experts % l.ep != 0)
    return fail(std::to_string(m.num_experts) + " experts are not divisible by EP=" + std::to_string(l.ep));
  if (m.ffn % l.tp != 0)
    return fail("ffn size F=" + std::to_string(m.ffn) + " is not divisible by TP=" + std::to_string(l.tp));
  if (max_tokens_per_rank < 0)
    return fail("max_tokens_per_rank must be >= 0, got " + std::to_string(max_tokens_per_rank));
  constexpr int kMaxTile = 1 << 16;
  if (tiles.block_m < 1 || tiles.block_n0 < 1 || tiles.block_n1 < 1 || tiles.block_m > kMaxTile ||
      tiles.block_n0 > kMaxTile || tiles.block_n1 > kMaxTile)
    return fail("tile shapes must be within [1, " + std::to_string(kMaxTile) + "] (block_m=" +
                std::to_string(tiles.block_m) + ", block_n0=" + std::to_string(tiles.block_n0) +
                ", block_n1=" + std::to_string(tiles.block_n1) + ")");
  // Row and tile indices are int32 in the plan and on the device.
  const int64_t tile_count = max_m_tiles_per_rank() * std::max(num_col_blocks1(), 1);
  const int64_t tile_count0 = max_m_tiles_per_rank() * std::max(num_col_blocks0(), 1);
  if (max_rows_per_rank() > (int64_t(1) << 31) - 1 || tile_count > (int64_t(1) << 31) - 1 ||
      tile_count0 > (int64_t(1) << 31) - 1)
    return fail("the buffers of one rank would hold " + std::to_string(max_rows_per_rank()) + " rows, " +
                std::to_string(tile_count0) + " layer0 tiles and " + std::to_string(tile_count) +
                " layer1 tiles; each must be at most 2^31 - 1 (fewer tokens or larger tiles)");
  // The dispatch's send lists (every (source, destination) pair's tokens, one prefix sum over
  // all of them) are int32 too: a token goes to at most min(topk, EP) EP groups, each of whose
  // TP ranks gets it.
  const int64_t send_entries =
      int64_t(l.world) * max_tokens_per_rank * std::min(m.topk, l.ep) * int64_t(l.tp);
  if (send_entries > (int64_t(1) << 31) - 1)
    return fail("the dispatch's send lists would hold up to " + std::to_string(send_entries) +
                " entries (W x T_max x min(topk, EP) x TP); at most 2^31 - 1 (fewer tokens per rank)");
  return Status::success();
}

void LayerConfig::check() const {
  const Status s = validate();
  if (!s) throw Error("invalid layer config: " + s.reason);
}

std::string LayerConfig::describe() const {
  std::ostringstream os;
  os << "model=" << model.name << " H=" << model.hidden << " F=" << model.ffn
     << " E=" << model.num_experts << " topk=" << model.topk
     << " act=" << activation_name(model.activation) << " W=" << layout.world
     << " EP=" << layout.ep << " TP=" << layout.tp << " T_max=" << max_tokens_per_rank
     << " dtype=" << dtype_name(dtype) << " tiles=" << tiles.block_m << "x" << tiles.block_n0
     << "/" << tiles.block_n1;
  return os.str();
}

uint64_t config_fingerprint(const LayerConfig& config) {
  const std::string text = config.describe() + " padding=" + std::to_string(config.model.padding_experts);
  uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace comet
