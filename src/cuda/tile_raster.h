// cuda/tile_raster.h: the one definition of the grouped raster orders of grouped_gemm.h
// (TileOrder), shared by the tile-list builder, the device plan kernel and host tests.
#pragma once

#include <cstdint>

#include "cuda/grouped_gemm.h"
#include "cuda/host_device.h"

namespace comet::cuda {

// The groups of a grouped walk (raster_grouped) of `total` along the grouped dimension: their
// count, and group g's size (every group but the last has `group`). The last group is smaller, or,
// with `join_short_rest`, a rest of at most half a group joins the group before it (a group of
// group + rest): a group of one M tile shares no B column block between its tiles, so each of
// them reads its own (Mixtral's GEMM0 at 2048 tokens per rank, 33 M tiles in groups of 16: the
// 33rd M tile's 224 tiles read all 235 MB of W0 once each, in the list's last rounds).
// Measured in docs/results/2026-12-02-short-raster-groups.md: with the cluster tails of
// gemm_schedule.h, up to 3.9% off the clustered GEMM0.
COMET_HOST_DEVICE inline int raster_group_count(int group, int total, bool join_short_rest) {
  const int full = total / group, rest = total - full * group;
  if (rest == 0) return full;
  return join_short_rest && full >= 1 && 2 * rest <= group ? full : full + 1;
}
COMET_HOST_DEVICE inline int raster_group_size(int group, int g, int total, bool join_short_rest) {
  return g + 1 < raster_group_count(group, total, join_short_rest) ? group : total - g * group;
}

// One grouped walk of a grid: groups of `group` along the grouped dimension (raster_group_count);
// inside a group the other dimension outer, the grouped one inner.
// Grids of fewer than 2^31 tiles (every layer's) divide in 32 bits: a 64-bit division is a
// long instruction sequence on the GPU, and the device plan rasters thousands of tiles.
COMET_HOST_DEVICE inline void raster_grouped(int group, int64_t i, int grouped_total, int other_total, int& grouped,
                                             int& other, bool join_short_rest = false) {
  const int64_t group_tiles = int64_t(group) * other_total;
  int g, within;
  if (i <= INT32_MAX && group_tiles <= INT32_MAX) {
    g = int(i) / int(group_tiles);
    within = int(i) - g * int(group_tiles);
  } else {
    g = int(i / group_tiles);
    within = int(i % group_tiles);
  }
  int size;
  if (join_short_rest) {
    const int count = raster_group_count(group, grouped_total, true);
    if (g >= count) {  // a joined rest, past the last whole group: counted from that group's start
      within += int(group_tiles);
      g = count - 1;
    }
    size = raster_group_size(group, g, grouped_total, true);
  } else {
    const int rest = grouped_total - g * group;
    size = rest < group ? rest : group;
  }
  other = within / size;
  grouped = g * group + within % size;
}

// Tile i of an (m_total M tiles) x (num_n_blocks column blocks) grid -> (m, n). `group` is the
// height of a row-major group in M tiles, or the width of a column-major group in column blocks.
// `join_short_rest` (row-major only): the standalone lists (gemm_schedule.h) join a short rest to
// the last group; the fused plan's layer0 keeps its groups of 4 and a smaller last one (joined,
// Mixtral's fused forward at 1024 tokens per rank was slower in 4 of 5 pairs, by up to 2.2%).
// Column-major groups never join: layer1's are also its combine groups.
COMET_HOST_DEVICE inline void raster_tile(TileOrder order, int group, int64_t i, int m_total, int num_n_blocks,
                                          int& m, int& n, bool join_short_rest = false) {
  if (order == TileOrder::kRowMajor) raster_grouped(group, i, m_total, num_n_blocks, m, n, join_short_rest);
  else raster_grouped(group, i, num_n_blocks, m_total, n, m);
}

// The group of each order for tiles `tile_n` columns wide (grouped_gemm.h): kRasterGroupM M
// tiles, or kRasterGroupColumns of column blocks.
COMET_HOST_DEVICE constexpr int default_raster_group(TileOrder order, int tile_n) {
  return order == TileOrder::kRowMajor ? kRasterGroupM
                                       : (tile_n >= kRasterGroupColumns ? 1 : kRasterGroupColumns / tile_n);
}

}  // namespace comet::cuda
