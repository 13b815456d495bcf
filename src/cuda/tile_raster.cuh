// cuda/tile_raster.cuh: the one definition of the grouped raster orders of grouped_gemm.h
// (TileOrder), shared by the tile-list builder and the device plan kernel.
#pragma once

#include "cuda/grouped_gemm.h"

namespace comet::cuda {

// Tile i of an (m_total M tiles) x (num_n_blocks column blocks) grid -> (m, n).
__host__ __device__ inline void raster_tile(TileOrder order, int64_t i, int m_total, int num_n_blocks, int& m,
                                            int& n) {
  if (order == TileOrder::kRowMajor) {
    // Groups of kRasterGroupM M tiles (the last may be smaller), column blocks outer.
    const int64_t group_tiles = int64_t(kRasterGroupM) * num_n_blocks;
    const int group = int(i / group_tiles), within = int(i % group_tiles);
    const int rest = m_total - group * kRasterGroupM;
    const int group_m = rest < kRasterGroupM ? rest : kRasterGroupM;
    n = within / group_m;
    m = group * kRasterGroupM + within % group_m;
  } else {
    const int64_t group_tiles = int64_t(kRasterGroupN) * m_total;
    const int group = int(i / group_tiles), within = int(i % group_tiles);
    const int rest = num_n_blocks - group * kRasterGroupN;
    const int group_n = rest < kRasterGroupN ? rest : kRasterGroupN;
    m = within / group_n;
    n = group * kRasterGroupN + within % group_n;
  }
}

}  // namespace comet::cuda
