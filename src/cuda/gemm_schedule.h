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
//   is (n, padding), the padding tile pointing at its partner's rows (grouped_gemm.h). In a
//   column-major list they follow the grid units; in a row-major one they run inside the grid's
//   raster groups (ClusterRowGroups).
// Without clusters, a GemmSplit may then cut the list's last tiles along K (below).
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

// Row-major lists on clusters of two: the tail units of an expert (its odd last M tile's column
// blocks in pairs) run inside the raster group that holds the expert's last grid unit (an expert
// with no grid unit: the group at its place), after each pair of that group's column blocks, so
// that their B column blocks are the ones the group's grid units are reading (L2 hits) rather
// than, at the list's end, B read once per tile. Group g lists its S grid units for column blocks
// 2p and 2p + 1, then its odd experts' tail units for the pair (2p, 2p + 1), for p = 0, 1, ...
// (an odd last column block: S units, then the pairs (n, padding)).
struct ClusterRowGroups {
  const int32_t* unit_psum;
  const int32_t* tail_psum;
  int num_experts, num_n_blocks, group, units_m, count;
  // Grid unit an expert's tail units follow: its last, or (none) the one at its place.
  COMET_HOST_DEVICE int anchor(int e) const {
    if (unit_psum[e + 1] > unit_psum[e]) return unit_psum[e + 1] - 1;
    return unit_psum[e] < units_m ? unit_psum[e] : units_m - 1;
  }
  // The first expert whose tails belong to group g or later (anchors rise with the expert).
  COMET_HOST_DEVICE int first_expert(int g) const {
    if (g <= 0) return 0;
    if (g >= count) return num_experts;
    int lo = 0, hi = num_experts;  // the first e with anchor(e) >= g x group; E when none
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (anchor(mid) >= g * group) hi = mid; else lo = mid + 1;
    }
    return lo;
  }
  // The units before group g: the grid units of groups 0..g-1 (grid_start) and the tail units of
  // the experts before first_expert(g).
  COMET_HOST_DEVICE int64_t grid_start(int g) const { return int64_t(g) * group * num_n_blocks; }
  COMET_HOST_DEVICE int64_t start(int g) const { return grid_start(g) + tail_psum[first_expert(g)]; }
};

// The `cluster` entries of unit u (u below gemm_schedule_prefixes' count) into unit[0..cluster).
// rows_per_expert gives each tile's `rows`; null: every tile counts as whole (no half tiles).
// tile_n: the kernel's column block width (gemm_tile_n), which sets a column-major group.
COMET_HOST_DEVICE inline void gemm_schedule_unit(int64_t u, const int32_t* rows_per_expert, const int32_t* row_psum,
                                                 const int32_t* unit_psum, const int32_t* tail_psum, int num_experts,
                                                 int num_n_blocks, int cluster, TileOrder order, int tile_n,
                                                 GemmTile* unit) {
  const int units_m = unit_psum[num_experts];
  const int64_t grid_units = int64_t(units_m) * num_n_blocks;
  // A row-major group keeps kRasterGroupM M tiles whatever the cluster.
  const int group =
      order == TileOrder::kRowMajor ? (kRasterGroupM + cluster - 1) / cluster : default_raster_group(order, tile_n);
  auto row_end_of = [&](int e) { return rows_per_expert != nullptr ? row_psum[e] + rows_per_expert[e] : INT32_MAX; };
  auto grid_unit = [&](int mu, int n) {
    const int e = find_range(unit_psum, num_experts, mu);
    const int first_row = row_psum[e] + (mu - unit_psum[e]) * cluster * kGemmBlockM;
    const int row_end = row_end_of(e);
    for (int r = 0; r < cluster; ++r) {
      const int m_row = first_row + r * kGemmBlockM;
      unit[r] = make_gemm_tile(m_row, n, e, row_end, m_row / kGemmBlockM);
    }
  };
  auto tail_unit = [&](int64_t v) {  // tail unit v: pair v - tail_psum[e] of expert e's last M tile
    const int e = find_range(tail_psum, num_experts, v);
    const int row_end = row_end_of(e);
    const int m_row = row_psum[e + 1] - kGemmBlockM, n = 2 * int(v - tail_psum[e]);
    unit[0] = make_gemm_tile(m_row, n, e, row_end, m_row / kGemmBlockM);
    unit[1] = make_gemm_tile(m_row, n + 1 < num_n_blocks ? n + 1 : n, e, row_end, m_row / kGemmBlockM);
    if (n + 1 >= num_n_blocks) unit[1].m_row = ~m_row;  // padding: its partner's rows
  };
  if (cluster == 2 && order == TileOrder::kRowMajor && units_m > 0) {
    const ClusterRowGroups groups{unit_psum, tail_psum, num_experts, num_n_blocks, group, units_m,
                                  raster_group_count(group, units_m, true)};
    int lo = 0, hi = groups.count - 1;  // the last group starting at or before u
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (groups.start(mid) <= u) lo = mid; else hi = mid - 1;
    }
    const int g = lo, size = raster_group_size(group, g, units_m, true);
    const int first_tail = tail_psum[groups.first_expert(g)];
    const int pairs = (num_n_blocks + 1) / 2;
    const int odd = (tail_psum[groups.first_expert(g + 1)] - first_tail) / pairs;  // the group's odd experts
    const int64_t w = u - groups.grid_start(g) - first_tail, whole_pair = 2 * size + odd;  // start(g)
    const int full_pairs = num_n_blocks / 2;
    const int p = w < full_pairs * whole_pair ? int(w / whole_pair) : full_pairs;
    const int off = int(w - p * whole_pair), columns = p < full_pairs ? 2 : 1;
    if (off < size * columns) grid_unit(g * group + off % size, 2 * p + off / size);
    else tail_unit(first_tail + int64_t(off - size * columns) * pairs + p);
    return;
  }
  if (u < grid_units) {
    int mu, n;
    raster_tile(order, group, u, units_m, num_n_blocks, mu, n, true);
    grid_unit(mu, n);
    return;
  }
  tail_unit(u - grid_units);
}

// Split of a list of `tiles` whole tiles (GemmSplit). The first `whole` tiles, whole rounds of
// one tile per block, run as listed. The other `rest` tiles (fewer than the G blocks) are each cut
// into `parts` equal k ranges, and the rest x parts pieces are dealt over the blocks in part-major
// order (gemm_split_entry): block b gets pieces b, b + G, ..., so every block gets as many pieces
// as every other, within one. Unsplit, the last round's blocks run one whole tile or none while
// the average is rest / G; split, ceil(rest x parts / G) / parts. `parts` is the count in
// [2, kSplitMaxParts] with the shortest last round, if it shortens it by at least kSplitMinGain of
// a tile, and by at least split.min_gain_fraction of the busiest block's unsplit schedule; else
// 1 (unsplit). Rounds are of blocks, not of slots (a ping-pong block's two warpgroups share its
// tensor cores, so a block runs its tiles one after the other whatever the slot): with 2048
// ping-pong tiles on 132 blocks, the 200 tiles past 7 slot-waves are 132 whole tiles and 68 to
// cut, and the block schedules are the same as with all 200 cut, for a third of the partials.
// A piece runs at least kSplitMinPieceKTiles k-tiles (a piece moves a 64 or 128 KB
// fp32 partial through L2 twice and re-fills the pipeline, which short pieces do not repay: cut
// into 5 pieces of 6-7 k-tiles, qwen3's GEMM0 at K = 2048 ran 44% slower), so tiles of under
// kSplitMinKTiles k-tiles stay whole.
// Why pieces in part-major order and not stream-K's contiguous k ranges per slot: Mixtral's GEMM1
// tiles need L2 reuse (7.3 MB of operands per 128 x 128 tile; a wave reads each A row block
// for 4 column blocks at once). Stream-K slots start mid-tile at different k, so tiles that
// share A are no longer read in step; measured on the H200 that was up to 17% slower than no
// split (docs/results/2026-11-30-split-tiles.md). Here every round runs one part of consecutive
// tiles, in step, as a wave of whole tiles does.
struct GemmSplitPlan {
  int64_t whole;    // entries before the split part (whole tiles, as listed)
  int64_t rest;     // tiles after them, each cut into `parts`
  int parts;        // 1: unsplit
  int64_t entries;  // whole + rounds of G entries holding rest x parts pieces
};
inline constexpr int kSplitMinPieceKTiles = 16;
inline constexpr int kSplitMinKTiles = 2 * kSplitMinPieceKTiles;
inline constexpr double kSplitMinGain = 0.25;
COMET_HOST_DEVICE inline GemmSplitPlan gemm_split_plan(int64_t tiles, const GemmSplit& split) {
  const GemmSplitPlan unsplit{tiles, 0, 1, tiles};
  const int64_t blocks = split.blocks;
  if (blocks <= 0 || split.slots() <= 0 || split.k_tiles < kSplitMinKTiles) return unsplit;
  const int64_t rest = tiles % blocks, whole = tiles - rest;
  // The last round per block, in tiles: the largest piece count of a block over the parts.
  auto last_wave = [&](int parts) { return double((rest * parts + blocks - 1) / blocks) / parts; };
  int best = 1;
  for (int parts = 2; parts <= kSplitMaxParts && parts * kSplitMinPieceKTiles <= split.k_tiles; ++parts)
    if (last_wave(parts) < last_wave(best) - 1e-9) best = parts;
  const double gain = last_wave(1) - last_wave(best), unsplit_length = double(whole / blocks) + last_wave(1);
  if (best == 1 || gain < kSplitMinGain || gain < double(split.min_gain_fraction) * unsplit_length) return unsplit;
  const int64_t pieces = rest * best, rounds = (pieces + blocks - 1) / blocks;
  return {whole, rest, best, whole + rounds * blocks};
}

// Entry e >= plan.whole of a split list: its tile and piece. Piece u = e - whole is part
// u / rest of tile whole + u % rest, k-tiles [part x k_tiles / parts, (part + 1) x k_tiles /
// parts); entries past the last piece are kIdle on a padding tile (a plain kernel given the list
// then runs each piece as its whole tile and idles on the rest: the unsplit output, more work).
// Entry e runs on block e % G (as every entry), so block b's pieces are b, b + G, ...
// The tile's last part is its kFinish: it adds the other parts' partials, slots
// [(tile - whole) x (parts - 1), + parts - 1), in part order, so the output is deterministic for
// a given grid and differs from an unsplit list's only by the fp32 rounding of that sum. Every
// other part is a kPartial into its slot. A finishing piece comes after all its tile's other
// pieces in piece order, so it waits only on pieces of earlier rounds, or of its own round on
// other blocks (on one block, entries run in list order). Partials wait on nothing, so no wait
// can be part of a cycle. `tile_of(i)` gives list tile i (the unsplit list's entry).
template <class TileOf>
COMET_HOST_DEVICE inline void gemm_split_entry(int64_t e, const GemmSplitPlan& plan, const GemmSplit& split,
                                               const TileOf& tile_of, GemmTile& tile, GemmSplitPiece& piece) {
  const int64_t u = e - plan.whole;
  piece = GemmSplitPiece{};
  if (u >= plan.rest * plan.parts) {
    tile = GemmTile{~0, 0, 0, 0, 0};
    piece.role = GemmSplitRole::kIdle;
    return;
  }
  const int part = int(u / plan.rest);
  const int64_t q = u % plan.rest, kt = split.k_tiles;
  tile = tile_of(plan.whole + q);
  piece.k_begin = int32_t(part * kt / plan.parts);
  piece.k_count = int32_t((part + 1) * kt / plan.parts - piece.k_begin);
  const int32_t first_slot = int32_t(q * (plan.parts - 1));
  if (part + 1 < plan.parts) {
    piece.role = GemmSplitRole::kPartial;
    piece.partial = first_slot + part;
  } else {
    piece.role = GemmSplitRole::kFinish;
    piece.partial = first_slot;
    piece.partials = int16_t(plan.parts - 1);
  }
}

// The whole list on the host (tests; the device builds it with build_gemm_tiles) for tiles
// `tile_n` columns wide, split when `split` asks and gemm_split_plan agrees (cluster 1 only);
// `pieces` (optional) gets each entry's piece (kWhole for every entry of an unsplit list).
inline std::vector<GemmTile> gemm_schedule_host(const std::vector<int>& rows_per_expert, int num_n_blocks,
                                                int cluster, TileOrder order, int tile_n, const GemmSplit& split = {},
                                                std::vector<GemmSplitPiece>* pieces = nullptr) {
  const int E = int(rows_per_expert.size());
  const std::vector<int32_t> rows(rows_per_expert.begin(), rows_per_expert.end());
  std::vector<int32_t> row_psum(E + 1), unit_psum(E + 1), tail_psum(E + 1);
  const int64_t units = gemm_schedule_prefixes(rows.data(), E, num_n_blocks, cluster, row_psum.data(),
                                               unit_psum.data(), tail_psum.data());
  std::vector<GemmTile> tiles(size_t(units * cluster));
  for (int64_t u = 0; u < units; ++u)
    gemm_schedule_unit(u, rows.data(), row_psum.data(), unit_psum.data(), tail_psum.data(), E, num_n_blocks, cluster,
                       order, tile_n, tiles.data() + u * cluster);
  const GemmSplitPlan plan = cluster == 1 ? gemm_split_plan(units, split) : GemmSplitPlan{units * cluster, 0, 1, units * cluster};
  if (pieces) pieces->assign(size_t(plan.entries), GemmSplitPiece{});
  if (plan.parts == 1) return tiles;
  std::vector<GemmTile> entries(tiles.begin(), tiles.begin() + plan.whole);
  entries.resize(size_t(plan.entries));
  for (int64_t e = plan.whole; e < plan.entries; ++e) {
    GemmSplitPiece piece;
    gemm_split_entry(e, plan, split, [&](int64_t i) { return tiles[size_t(i)]; }, entries[size_t(e)], piece);
    if (pieces) (*pieces)[size_t(e)] = piece;
  }
  return entries;
}

}  // namespace comet::cuda
