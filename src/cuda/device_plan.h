// cuda/device_plan.h: the dispatch plan of one rank, computed on the device from every rank's
// routing (read through peer pointers), so a forward needs no host synchronization.
//
// It is the device twin of comet::DispatchPlan + build_layer0_schedule (include/comet/plan.h)
// for block_m = kGemmBlockM and must agree with them exactly (tests/gpu/device_plan_test.cu):
// the same dedup send lists, the same expert-sorted row of every (token, slot), the same M
// tiles and layer0 order. Ring positions: pos p of rank r is source (r + p) mod W.
//
// Buffers (DevicePlanLayout, all int32 unless noted; Tm = T_max, K = min(topk, E/EP) rows a
// token can send to one rank, MT = max M tiles = max_rows / 128, NB0/NB1 = column blocks, NB1
// at the narrowest layer1 width, 128):
//   expert_rows    [E/EP]         rows of each local expert
//   expert_offset  [E/EP + 1]     padded segment starts (multiples of 128)
//   recv_count     [W]            tokens received from the source at ring position p
//   recv_psum      [W + 1]        prefix sums of recv_count (ring order)
//   recv_token     [W * Tm]       token index on its source, at recv_psum[p] + position
//   recv_rows      [W * Tm * K]   A rows the token feeds, slot order, -1 padded
//   recv_weight    f32 [W*Tm*K]   routing weight of each of those rows (the owner's slot)
//   send_pos       [Tm * W]       position of own token t in the send list to rank d, or -1
//   m_tile_row     [MT]           first row of M tile i (expert-major order)
//   m_tile_rows    [MT]           rows of M tile i (the layer0 signal's expected count)
//   m_tile_last    [MT]           largest ring position among its rows
//   layer0_order   [MT]           M tiles in run order (by last ring position, stable)
//   counts         [4]            {number of M tiles, rows_on_rank, plan accepted (1) or refused (0),
//                                 combine slots}
//   tiles0         GemmTile [MT * NB0]   layer0 GEMM schedule (grouped raster over layer0_order)
//   tiles1         GemmTile [(MT + E/EP) * NB1]  layer1 GEMM schedule (column-block groups; half
//                                 tiles last when counts[3] is 0, and then an expert's last M
//                                 tile of 65-127 rows may be cut in two: layer1_cut_m_tiles)
//   num_tiles      [2]            {tiles0 length, tiles1 length}
//   chunk_row_base [W * C * E/EP] first A row of chunk c of ring position p for each expert
//                                 (C = ceil(Tm / 256) token chunks per source; plan scratch)
//   chunk_slot_base [W * C]       first received slot of chunk c of ring position p (scratch)
//   chunk_send_base [C * W]       own tokens before chunk c sent to EP group g (scratch)
//   chunk_flags    [W * C]        1: chunk c of ring position p repeats an expert in a token
//                                 (scratch; the chunk bases above hold counts until the layout
//                                 kernel turns them into bases)
//   row_source     [max_rows]     where A row i comes from: (ring position << 24) | token index
//                                 on that source, -1 for the padding rows of an expert's last
//                                 M tile (rows past the last M tile are not written); the
//                                 dispatch in A-row order reads it (DispatchOrder::kRows)
//   row_combine    RowCombine [max_rows]  per A row: where GEMM1's epilogue stores it, weighted,
//                                 when it is its token's only row on this rank (the owner's
//                                 combine_recv row); null (through the combine) otherwise, for
//                                 padding rows, and for every row without combine_peers
//   combine_slots  [W * Tm]       received slots the combine moves, in slot order: those with
//                                 two or more rows (every slot without combine_peers);
//                                 counts[3] of them
//   chunk_list_base [W * C]       first combine_slots entry of chunk c of ring position p (scratch)
#pragma once

#include <cstdint>
#include <vector>

#include "comet/config.h"
#include "cuda/grouped_gemm.h"
#include "cuda/host_device.h"

struct CUstream_st;

namespace comet::cuda {

// Pointers into one rank's plan buffers (POD, passed to kernels by value).
struct DevicePlanView {
  int32_t* expert_rows;
  int32_t* expert_offset;
  int32_t* recv_count;
  int32_t* recv_psum;
  int32_t* recv_token;
  int32_t* recv_rows;
  float* recv_weight;
  int32_t* send_pos;
  int32_t* m_tile_row;
  int32_t* m_tile_rows;
  int32_t* m_tile_last;
  int32_t* layer0_order;
  int32_t* counts;
  GemmTile* tiles0;
  GemmTile* tiles1;
  int32_t* num_tiles;
  int32_t* chunk_row_base;
  int32_t* chunk_slot_base;
  int32_t* chunk_send_base;
  int32_t* chunk_flags;
  int32_t* row_source;
  RowCombine* row_combine;
  int32_t* combine_slots;
  int32_t* chunk_list_base;
};

// row_source's packing: a ring position (< kMaxWorld = 64) above a token index below 2^24. The
// plan packs, the dispatch in row order (both copy paths) unpacks; one definition for all.
inline constexpr int kRowSourceTokenBits = 24;
COMET_HOST_DEVICE inline int32_t pack_row_source(int pos, int token) { return (pos << kRowSourceTokenBits) | token; }
COMET_HOST_DEVICE inline int row_source_pos(int32_t source) { return source >> kRowSourceTokenBits; }
COMET_HOST_DEVICE inline int row_source_token(int32_t source) { return source & ((1 << kRowSourceTokenBits) - 1); }

// Layer1's half tiles when they go last (no combine slots, so nothing waits for a column block,
// and the cooperative kernel's 256-column blocks, whose second warpgroup skips a tile of at
// most 64 rows): the blocks claim the whole tiles first and fill the last round with the half
// ones. An expert's last M tile of 65-127 rows is a whole tile there, and when it tips the
// whole tiles into one more round (a Mixtral rank with 2126 rows at 1024 tokens: 17 x 16 = 272
// tiles on 132 SMs, a third round for 8 of them), cutting it into two half tiles, rows
// [0, 64) and [64, rows) of the M tile, lets that round end half way. The cut costs a second
// load of the column block's B and of 64 A rows, so it is made only where the claimed
// schedule, counted in half-tile times, ends sooner with it.
//
// The end of a claimed schedule of `whole` tiles (2 half-tile times each) followed by `halves`
// half tiles (1 each) on `grid` blocks, in half-tile times: each block takes the next entry when
// it is free, so the whole tiles give `rem` blocks one more than the others, and the half tiles
// first bring the others level, then go round all blocks.
// (32-bit: a tile list's length is an int, and 64-bit divisions cost the plan kernel registers.)
COMET_HOST_DEVICE inline int claimed_end_in_half_tiles(int whole, int halves, int grid) {
  const int rounds = whole / grid, rem = whole % grid;
  if (rem == 0) return 2 * rounds + (halves + grid - 1) / grid;
  const int level = 2 * (grid - rem);  // half tiles that fit before the busiest blocks end
  if (halves <= level) return 2 * rounds + 2;
  return 2 * rounds + 2 + (halves - level + grid - 1) / grid;
}

// How many experts' last M tiles layer1's list cuts in two (all that qualify, or none): those of
// 65-127 rows, when the claimed schedule on `grid` blocks ends sooner with them cut. rows_of(e):
// rows of local expert e; n_blocks: layer1's column blocks. The device plan and the tests that
// mirror it both ask here.
template <class RowsOf>
COMET_HOST_DEVICE int layer1_cut_m_tiles(int experts, const RowsOf& rows_of, int n_blocks, int grid) {
  if (grid <= 0) return 0;
  int m_tiles = 0, halves = 0, cuttable = 0;
  for (int e = 0; e < experts; ++e) {
    const int rows = rows_of(e);
    if (rows <= 0) continue;
    const int last = rows - (rows - 1) / kGemmBlockM * kGemmBlockM;  // 1-128
    m_tiles += (rows + kGemmBlockM - 1) / kGemmBlockM;
    halves += last <= kGemmBlockM / 2 ? 1 : 0;
    cuttable += last > kGemmBlockM / 2 && last < kGemmBlockM ? 1 : 0;
  }
  if (cuttable == 0) return 0;
  const int uncut = claimed_end_in_half_tiles((m_tiles - halves) * n_blocks, halves * n_blocks, grid);
  const int cut =
      claimed_end_in_half_tiles((m_tiles - halves - cuttable) * n_blocks, (halves + 2 * cuttable) * n_blocks, grid);
  return cut < uncut ? cuttable : 0;
}

// Sizes of the plan buffers of one rank for `config` (block_m must be kGemmBlockM).
struct DevicePlanLayout {
  explicit DevicePlanLayout(const LayerConfig& config);
  int rows_per_token;  // K above
  int64_t max_rows, max_m_tiles, n_blocks0, n_blocks1;
  int64_t max_tiles1;  // tiles1's capacity: every M tile, and each expert's last one cut in two
  int64_t total_bytes() const { return total_bytes_; }
  // Carves the view out of `base` (total_bytes() of device memory, 256-byte aligned).
  DevicePlanView view(void* base) const;

 private:
  std::vector<int64_t> offsets_;  // byte offset of each buffer, in DevicePlanView order
  int64_t total_bytes_ = 0;
};

// What the plan kernel reads: every rank's routing, through a device array of W pointers per
// region (the fabric's peer table), and where it writes.
struct DevicePlanArgs {
  int rank = 0;
  const int32_t* const* token_counts = nullptr;  // [W] -> one int each
  const int32_t* const* route_ids = nullptr;     // [W] -> [Tm][topk]
  const float* const* route_weights = nullptr;   // [W] -> [Tm][topk]
  DevicePlanView plan{};
  // Height of the layer0 raster groups in M tiles (TileOrder::kRowMajor). Smaller groups let a
  // fused layer0 start its first wave on fewer arrived rows; larger ones reuse B more in L2.
  int layer0_group_m = kRasterGroupM;
  // Stages of the layer0 order (Layer0Schedule, include/comet/plan.h); 0: W. Fewer stages read
  // each expert's weights fewer times; more let tiles start on fewer arrived sources.
  int layer0_stages = 0;
  // Whether the tile lists carry each expert's rows in its last M tile (half tiles, comet/plan.h
  // default_half_tiles); false: every tile whole.
  bool half_tiles = true;
  // Columns of layer1's column blocks: GEMM1's tile width (256 cooperative, 128 ping-pong). The
  // tile list (in combine groups of combine_group_blocks(width)) and the column signals follow.
  int layer1_width = 256;
  // Blocks that claim layer1's tiles (the SM count): with 256-column blocks, half tiles and no
  // combine slots, the list cuts the last M tiles that layer1_cut_m_tiles picks for this grid;
  // 0: none is cut.
  int layer1_grid = 0;
  // Records bad input (token count above T_max, expert id out of range, an expert repeated
  // within a token, rows beyond the buffers: the plan is refused, with no tiles, receiving and
  // sending nothing; a NaN or infinite routing weight: recorded, the plan runs as usual).
  DeviceError* error = nullptr;
  // Epoch signals of the fused kernels (optional; all four or none). Counters are never reset:
  // the plan kernel, which runs before the layer kernels of the same call in stream order,
  // turns the bases (what earlier calls delivered) into this call's targets and advances them.
  //   tile_target[m] = tile_base[m] + rows of M tile m     (layer0: rows landed per tile)
  //   col_target[j]  = col_base[j]  + number of M tiles, plus the cut ones (layer1: tiles stored
  //                                                       per column block)
  uint64_t* tile_base = nullptr;    // [MT], persistent
  uint64_t* tile_target = nullptr;  // [MT]
  uint64_t* col_base = nullptr;     // [NB1], persistent
  uint64_t* col_target = nullptr;   // [NB1]
  unsigned* combine_claims = nullptr;  // optional: zeroed for this call's fused layer1
  // Optional: every rank's heap as this rank's device addresses it (the fabric's peer table,
  // [W]) and the byte offset of region combine_recv in each. Set, the plan gives each token
  // that has a single row on this rank to GEMM1's epilogue (row_combine) and lists only the
  // others for the combine (LayerOptions::epilogue_combine); null, every token goes through
  // the combine.
  void* const* combine_peers = nullptr;
  int64_t combine_offset = 0;
};

// Launches the plan kernels of one rank (asynchronous on `stream`): one block per (source, token
// chunk) counts the chunk's rows per expert; one block lays out segments and M tiles from those
// counts; then one block per (source, chunk) places that chunk's tokens and rows, the own chunks
// their send positions, and all of them the GEMM tile lists (device_plan.cu).
void build_device_plan(const LayerConfig& config, const DevicePlanArgs& args, CUstream_st* stream);
// Whether the plan's kernels can run `config` (block_m = kGemmBlockM), and why not: the bounds
// DevicePlanLayout and build_device_plans check (shared memory for W and E/EP, 32-bit indices,
// T_max), without allocating or launching.
Status device_plan_can_implement(const LayerConfig& config);
// The plans of `count` ranks of one device, several per launch (the ranks' plans are
// independent: each only reads the published routing).
void build_device_plans(const LayerConfig& config, const DevicePlanArgs* args, int count, CUstream_st* stream);

}  // namespace comet::cuda
