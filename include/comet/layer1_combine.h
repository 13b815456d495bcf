// comet/layer1_combine.h: who runs the fused layer1's combine (docs/gpu_layer.md "Layer1
// combine"). Both choices sum the same rows in the same order, so the output is the same bit for
// bit; they differ in speed, and neither wins on every workload, so `comet tune` records the
// faster (comet/tuning.h) and LayerOptions may fix it.
#pragma once

#include <optional>
#include <string_view>

namespace comet {

enum class Layer1Combine {
  // n_comm1 communication blocks beside GEMM1 on the cooperative 128x256 configuration; the
  // GEMM blocks join once their tiles are done.
  kCommBlocks,
  // Warps 1-3 of every block's producer warpgroup, beside GEMM1 on ping-pong 128x128 tiles, with
  // registers moved to them from the consumers (152 per thread, consumers 176); no communication
  // blocks (n_comm1 unused). Layer1's column blocks are then 128 columns wide in the whole
  // forward: the unfused pipeline and compute-only run GEMM1 on ping-pong as well.
  kGemmBlocks,
};

// "blocks" | "gemm": the names of the CLI (`--combine1`), the tables and the tuning JSON.
const char* layer1_combine_name(Layer1Combine combine);
std::optional<Layer1Combine> parse_layer1_combine(std::string_view name);

}  // namespace comet
