// comet/config.h: what an MoE layer is (model shape), how it is spread over ranks (parallel
// layout), and the per-layer run configuration every backend takes.
//
// Vocabulary (DESIGN §2): W ranks = EP * TP; rank = ep_idx * TP + tp_idx. Expert e lives on
// EP index e / (E / EP); on TP index t it holds the slice [t*F/TP, (t+1)*F/TP) of the
// intermediate dimension. Every rank owns num_tokens <= max_tokens_per_rank tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/dtype.h"
#include "comet/error.h"

namespace comet {

// kSwiGlu: FFN(x) = (silu(x Wg) * (x Wu)) Wd. The others: FFN(x) = act(x Wu) Wd (no gate).
enum class Activation { kSwiGlu, kGelu, kRelu, kSilu };

const char* activation_name(Activation act);             // "swiglu", "gelu", "relu", "silu"
Activation parse_activation(const std::string& name);    // throws comet::Error
inline bool is_gated(Activation act) { return act == Activation::kSwiGlu; }

struct ModelShape {
  std::string name = "custom";
  int hidden = 0;        // H
  int ffn = 0;           // F, the intermediate size of one expert
  int num_experts = 0;   // E
  int topk = 0;          // experts per token
  Activation activation = Activation::kSwiGlu;
  // Trailing experts that exist only to make E divisible by EP (qwen2-moe: 60 routed + 4).
  // They hold weights like any expert, but generated routing never selects them.
  int padding_experts = 0;

  int routed_experts() const { return num_experts - padding_experts; }
  // Weights of one expert, in elements: gated has Wg and Wu ([H,F] each) and Wd ([F,H]).
  int64_t weights_per_expert() const;
  // Multiply-adds of one (token, expert) row through the whole FFN, times 2 (FLOP).
  int64_t flops_per_row() const;
  // H and F divided by `factor` (rounded up to a multiple of 8, at least 8), same E and topk;
  // the name gets a "/factor" suffix. factor 1 returns the shape unchanged.
  ModelShape scaled_down(int factor) const;
};

// The smallest power-of-two factors that bring the CPU work of one forward (all ranks, FLOP)
// under `flop_budget` and the weights of all experts under `weight_value_budget` values,
// scaling H and F first (down to H >= 64) and then tokens. Used by the CPU backend for the
// large presets; both factors are printed by `comet run`.
struct CpuScale {
  int shape_factor = 1;   // H and F divided by this
  int token_factor = 1;   // tokens per rank divided by this
};
inline constexpr double kCpuFlopBudget = 2e9;  // choose_cpu_scale's default FLOP per forward
CpuScale choose_cpu_scale(const ModelShape& model, int world, int tokens_per_rank,
                          double flop_budget = kCpuFlopBudget, int64_t weight_value_budget = int64_t(16) << 20);

// The presets of DESIGN §7. names() lists them in table order.
struct ModelPresets {
  static const std::vector<ModelShape>& all();
  static std::vector<std::string> names();
  static const ModelShape& get(const std::string& name);  // throws comet::Error listing names
};

struct ParallelLayout {
  int world = 1;  // W
  int ep = 1;
  int tp = 1;

  int rank_of(int ep_idx, int tp_idx) const { return ep_idx * tp + tp_idx; }
  int ep_index(int rank) const { return rank / tp; }
  int tp_index(int rank) const { return rank % tp; }
};

// Tile shapes that the schedules are cut in. The GPU kernels use 128x128-ish tiles; the CPU
// backend takes smaller ones so that small test shapes still have many tiles to reorder.
struct TileConfig {
  int block_m = 128;  // rows of A per tile (both layers)
  int block_n0 = 128; // layer0 columns of F/TP per tile
  int block_n1 = 128; // layer1 columns of H per tile (one column block = one combine signal)
};

// The largest hidden size H and FFN size F that LayerConfig::validate() accepts.
inline constexpr int kMaxModelDim = 1 << 20;
// The most experts E that validate() accepts: far above real layers (deepseek-v3: 256), and
// the GPU's device plan keeps local expert ids in 16 bits, so it refuses more anyway.
inline constexpr int kMaxExperts = 1 << 16;
// The most ranks W that validate() accepts: the launcher, the process environment, the GPU
// kernels (recv_psum staged in shared memory) and the CLI all stop at 64 ranks too.
inline constexpr int kMaxWorldSize = 64;

struct LayerConfig {
  ModelShape model;
  ParallelLayout layout;
  int max_tokens_per_rank = 0;  // T_max: every buffer is sized for it
  DType dtype = DType::kBF16;   // storage of activations, weights and outputs
  TileConfig tiles;

  int experts_per_rank() const { return model.num_experts / layout.ep; }
  int ffn_per_rank() const { return model.ffn / layout.tp; }
  int expert_owner_ep(int expert) const { return expert / experts_per_rank(); }
  // Rows of a rank's expert-sorted A buffer, a multiple of block_m: every token of every rank
  // may send one row per local expert it selected (at most min(topk, E/EP) distinct ones),
  // plus up to block_m - 1 padding rows after each expert's segment.
  int64_t max_rows_per_rank() const;
  // Column blocks of a rank's layer0 (F/TP wide) and layer1 (H wide) outputs.
  int num_col_blocks0() const { return (ffn_per_rank() + tiles.block_n0 - 1) / tiles.block_n0; }
  int num_col_blocks1() const { return (model.hidden + tiles.block_n1 - 1) / tiles.block_n1; }
  // M tiles of the A buffer: max_rows_per_rank() / block_m.
  int64_t max_m_tiles_per_rank() const;

  // Why this configuration cannot run, or ok. Checks W = EP*TP, E % EP, F % TP, topk range,
  // positive sizes (max_tokens_per_rank may be 0), H and F at most kMaxModelDim, E at most kMaxExperts, W at most kMaxWorldSize,
  // and tile shapes.
  Status validate() const;
  // validate(), throwing comet::Error with the reason.
  void check() const;
  std::string describe() const;  // one line, every field
};

// A 64-bit hash (FNV-1a) of every field of `config`: the same in every process and build, so
// that the ranks of a multi-process run can check that they built the same layer.
uint64_t config_fingerprint(const LayerConfig& config);

}  // namespace comet
