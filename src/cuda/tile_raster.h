// cuda/tile_raster.h: the one definition of the grouped raster orders of grouped_gemm.h
// (TileOrder), shared by the tile-list builder, the device plan kernel and host tests.
#pragma once

#include <cstdint>

#include "cuda/grouped_gemm.h"
#include "cuda/host_device.h"

namespace comet::cuda {

// One grouped walk of a grid: groups of `group` along the grouped dimension (the last group may
// be smaller); inside a group the other dimension outer, the grouped one inner.
// Grids of fewer than 2^31 tiles (every layer's) divide in 32 bits: a 64-bit division is a
// long instruction sequence on the GPU, and the device plan rasters thousands of tiles.
COMET_HOST_DEVICE inline void raster_grouped(int group, int64_t i, int grouped_total, int other_total, int& grouped,
                                             int& other) {
  const int64_t group_tiles = int64_t(group) * other_total;
  int g, within;
  if (i <= INT32_MAX && group_tiles <= INT32_MAX) {
    g = int(i) / int(group_tiles);
    within = int(i) - g * int(group_tiles);
  } else {
    g = int(i / group_tiles);
    within = int(i % group_tiles);
  }
  const int rest = grouped_total - g * group;
  const int size = rest < group ? rest : group;
  other = within / size;
  grouped = g * group + within % size;
}

// Tile i of an (m_total M tiles) x (num_n_blocks column blocks) grid -> (m, n). `group` is the
// height of a row-major group in M tiles, or the width of a column-major group in column blocks.
COMET_HOST_DEVICE inline void raster_tile(TileOrder order, int group, int64_t i, int m_total, int num_n_blocks,
                                          int& m, int& n) {
  if (order == TileOrder::kRowMajor) raster_grouped(group, i, m_total, num_n_blocks, m, n);
  else raster_grouped(group, i, num_n_blocks, m_total, n, m);
}

// The group of each order for tiles `tile_n` columns wide (grouped_gemm.h): kRasterGroupM M
// tiles, or kRasterGroupColumns of column blocks.
COMET_HOST_DEVICE constexpr int default_raster_group(TileOrder order, int tile_n) {
  return order == TileOrder::kRowMajor ? kRasterGroupM
                                       : (tile_n >= kRasterGroupColumns ? 1 : kRasterGroupColumns / tile_n);
}

}  // namespace comet::cuda
