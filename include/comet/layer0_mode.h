// comet/layer0_mode.h: how the fused layer0 moves token rows (docs/gpu_layer.md). Both choices
// of each write the same A rows, so the output is the same bit for bit; they differ in speed,
// and neither wins on every workload, so `comet tune` records the faster (comet/tuning.h) and
// LayerOptions may fix them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace comet {

// Who moves the rows in the fused layer0.
enum class Layer0Copies {
  kCommBlocks,  // n_comm0 communication blocks (register copies), which then join GEMM0
  // No communication blocks: an idle warp of every GEMM block's producer warpgroup moves rows
  // with bulk asynchronous copies while the block runs GEMM0 (one mainloop stage fewer).
  kGemmBlocks,
};

// The order of the fused layer0's dispatch. The unfused dispatch always runs kRing: its GEMM0
// starts after every row is in place, and kRing reads each token once.
enum class DispatchOrder {
  kRing,  // by received token in ring order (own rows first); a token is read once for all its rows
  // By A row, expert-major: GEMM0's tile order with one stage, so the fused GEMM0 can start on
  // the first rows that land and reads each expert's weights once; a token is read once per row.
  kRows,
};

struct Layer0Mode {
  Layer0Copies copies = Layer0Copies::kCommBlocks;
  DispatchOrder order = DispatchOrder::kRing;
  bool operator==(const Layer0Mode&) const = default;
};

// "blocks" | "gemm" and "ring" | "rows": the names of the CLI, the tables and the tuning JSON.
const char* layer0_copies_name(Layer0Copies copies);
const char* dispatch_order_name(DispatchOrder order);
std::optional<Layer0Copies> parse_layer0_copies(std::string_view name);
std::optional<DispatchOrder> parse_dispatch_order(std::string_view name);
// "blocks/ring"
std::string describe(const Layer0Mode& mode);

}  // namespace comet
