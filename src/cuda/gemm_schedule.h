// cuda/gemm_schedule.h: the tile list of a grouped GEMM schedule (grouped_gemm.h,
// build_gemm_tiles) as functions the device builder runs and host tests call, so the list the
// kernels get is the list the CPU suite checks.
//
// The list is made of units of `cluster` consecutive entries (the tiles one cluster of blocks
// runs together; cluster 1: one tile per unit). It has two parts:
// - grid units: each expert's M tiles, `cluster` at a time, times every column block, in the
//   raster order of `order` (tile_raster.h); a unit's tiles share expert and column block;
// - tail units (clusters of two only): for each expert with an odd M tile count, its last M
//   tile's column blocks in pairs (n, n + 1); with an odd number of column blocks the last pair
//   is (n, padding), the padding tile pointing at its partner's rows (grouped_gemm.h).
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/grouped_gemm.h"
#include "cuda/host_device.h"
#include "cuda/tile_raster.h"

namespace comet::cuda {

// Prefix sums over the E experts (arrays of E + 1): padded row offsets `row_psum`, grid units
// along M `unit_psum`, tail units `tail_psum`. Returns the number of units.
COMET_HOST_DEVICE inline int64_t gemm_schedule_prefixes(const int32_t* rows_per_expert, int num_experts,
                                                        int num_n_blocks, int cluster, int32_t* row_psum,
                                                        int32_t* unit_psum, int32_t* tail_psum) {
  const int tail_units = cluster == 1 ? 0 : (num_n_blocks + 1) / 2;  // per expert with an odd M tile count
  row_psum[0] = unit_psum[0] = tail_psum[0] = 0;
  for (int e = 0; e < num_experts; ++e) {
    const int m_tiles = (rows_per_expert[e] + kGemmBlockM - 1) / kGemmBlockM;
    row_psum[e + 1] = row_psum[e] + m_tiles * kGemmBlockM;
    unit_psum[e + 1] = unit_psum[e] + m_tiles / cluster;
    tail_psum[e + 1] = tail_psum[e] + (m_tiles % cluster != 0 ? tail_units : 0);
  }
  return int64_t(unit_psum[num_experts]) * num_n_blocks + tail_psum[num_experts];
}

// Index e of the range holding v, for prefix sums psum[0..n] with psum[0] = 0 <= v < psum[n]:
// the largest e with psum[e] <= v (empty ranges before it are skipped).
COMET_HOST_DEVICE inline int find_range(const int32_t* psum, int n, int64_t v) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (psum[mid] <= v) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The `cluster` entries of unit u (u below gemm_schedule_prefixes' count) into unit[0..cluster).
COMET_HOST_DEVICE inline void gemm_schedule_unit(int64_t u, const int32_t* row_psum, const int32_t* unit_psum,
                                                 const int32_t* tail_psum, int num_experts, int num_n_blocks,
                                                 int cluster, TileOrder order, GemmTile* unit) {
  const int units_m = unit_psum[num_experts];
  const int64_t grid_units = int64_t(units_m) * num_n_blocks;
  if (u < grid_units) {
    // A row-major group keeps kRasterGroupM M tiles whatever the cluster.
    const int group = order == TileOrder::kRowMajor ? (kRasterGroupM + cluster - 1) / cluster : default_raster_group(order);
    int mu, n;
    raster_tile(order, group, u, units_m, num_n_blocks, mu, n);
    const int e = find_range(unit_psum, num_experts, mu);
    const int first_row = row_psum[e] + (mu - unit_psum[e]) * cluster * kGemmBlockM;
    for (int r = 0; r < cluster; ++r) {
      const int m_row = first_row + r * kGemmBlockM;
      unit[r] = GemmTile{m_row, n, e, m_row / kGemmBlockM};
    }
    return;
  }
  const int64_t v = u - grid_units;
  const int e = find_range(tail_psum, num_experts, v);
  const int m_row = row_psum[e + 1] - kGemmBlockM, n = 2 * int(v - tail_psum[e]);
  unit[0] = GemmTile{m_row, n, e, m_row / kGemmBlockM};
  unit[1] = n + 1 < num_n_blocks ? GemmTile{m_row, n + 1, e, m_row / kGemmBlockM}
                                 : GemmTile{~m_row, n, e, m_row / kGemmBlockM};
}

// The whole list on the host (tests; the device builds it with build_gemm_tiles).
inline std::vector<GemmTile> gemm_schedule_host(const std::vector<int>& rows_per_expert, int num_n_blocks,
                                                int cluster, TileOrder order) {
  const int E = int(rows_per_expert.size());
  const std::vector<int32_t> rows(rows_per_expert.begin(), rows_per_expert.end());
  std::vector<int32_t> row_psum(E + 1), unit_psum(E + 1), tail_psum(E + 1);
  const int64_t units = gemm_schedule_prefixes(rows.data(), E, num_n_blocks, cluster, row_psum.data(),
                                               unit_psum.data(), tail_psum.data());
  std::vector<GemmTile> tiles(size_t(units * cluster));
  for (int64_t u = 0; u < units; ++u)
    gemm_schedule_unit(u, row_psum.data(), unit_psum.data(), tail_psum.data(), E, num_n_blocks, cluster, order,
                       tiles.data() + u * cluster);
  return tiles;
}

}  // namespace comet::cuda
