// cuda/tile_raster.h: the one definition of the grouped raster orders of grouped_gemm.h
// (TileOrder), shared by the tile-list builder, the device plan kernel and host tests.
#pragma once

#include "cuda/grouped_gemm.h"
#include "cuda/host_device.h"

namespace comet::cuda {

// Tile i of an (m_total M tiles) x (num_n_blocks column blocks) grid -> (m, n). `group` is the
// height of a row-major group in M tiles, or the width of a column-major group in column blocks.
COMET_HOST_DEVICE inline void raster_tile(TileOrder order, int group, int64_t i, int m_total, int num_n_blocks,
                                            int& m, int& n) {
  if (order == TileOrder::kRowMajor) {
    // Groups of `group` M tiles (the last may be smaller), column blocks outer.
    const int64_t group_tiles = int64_t(group) * num_n_blocks;
    const int g = int(i / group_tiles), within = int(i % group_tiles);
    const int rest = m_total - g * group;
    const int group_m = rest < group ? rest : group;
    n = within / group_m;
    m = g * group + within % group_m;
  } else {
    const int64_t group_tiles = int64_t(group) * m_total;
    const int g = int(i / group_tiles), within = int(i % group_tiles);
    const int rest = num_n_blocks - g * group;
    const int group_n = rest < group ? rest : group;
    m = within / group_n;
    n = g * group + within % group_n;
  }
}

// The default group of each order (grouped_gemm.h).
COMET_HOST_DEVICE constexpr int default_raster_group(TileOrder order) {
  return order == TileOrder::kRowMajor ? kRasterGroupM : kRasterGroupN;
}

}  // namespace comet::cuda
