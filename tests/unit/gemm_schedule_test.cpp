// unit/gemm_schedule_test.cpp: the grouped GEMM tile list (cuda/gemm_schedule.h, the functions the
// device builder runs) on the host: every (M tile, column block) exactly once; clusters of two in
// pairs that share their expert and either their column block or their M tile (an odd expert's
// last); padding only for odd experts with an odd number of column blocks, once each; without
// clusters, the plain grouped raster over M tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/gemm_schedule.h"

namespace comet::cuda {
namespace {

std::vector<int> padded_offsets(const std::vector<int>& rows) {
  std::vector<int> offsets(rows.size() + 1, 0);
  for (size_t e = 0; e < rows.size(); ++e)
    offsets[e + 1] = offsets[e] + (rows[e] + kGemmBlockM - 1) / kGemmBlockM * kGemmBlockM;
  return offsets;
}

void check_schedule(const std::vector<int>& rows, int nb, int cluster, TileOrder order, int tile_n) {
  SCOPED_TRACE("cluster " + std::to_string(cluster) + (order == TileOrder::kRowMajor ? " row-major" : " column-major") +
               " column blocks " + std::to_string(nb) + " of " + std::to_string(tile_n) + " experts " +
               std::to_string(rows.size()));
  const std::vector<GemmTile> list = gemm_schedule_host(rows, nb, cluster, order, tile_n);
  const std::vector<int> offsets = padded_offsets(rows);
  const int m_tiles = offsets.back() / kGemmBlockM;
  int odd_experts = 0;
  for (int r : rows) odd_experts += ((r + kGemmBlockM - 1) / kGemmBlockM) % 2;
  ASSERT_EQ(list.size() % cluster, 0u);
  std::vector<int> seen(size_t(m_tiles) * nb, 0);
  int padding = 0;
  for (size_t t = 0; t < list.size(); ++t) {
    const GemmTile& tile = list[t];
    ASSERT_TRUE(tile.expert >= 0 && tile.expert < int(rows.size()) && tile.n_block >= 0 && tile.n_block < nb)
        << "entry " << t;
    if (cluster == 2) {
      const GemmTile& first = list[t - t % 2];
      const GemmTile& second = list[t - t % 2 + 1];
      ASSERT_EQ(first.expert, second.expert) << "entry " << t;
      ASSERT_FALSE(gemm_tile_is_padding(first)) << "a pair starts with a padding tile at entry " << t;
      const bool m_pair = second.n_block == first.n_block && second.m_row == first.m_row + kGemmBlockM;
      const bool n_pair = second.m_row == first.m_row && second.n_block == first.n_block + 1 &&
                          first.m_row + kGemmBlockM == offsets[first.expert + 1];
      const bool padded = gemm_tile_is_padding(second) && gemm_tile_a_row(second) == first.m_row &&
                          second.n_block == first.n_block && first.n_block == nb - 1;
      ASSERT_TRUE(m_pair || n_pair || padded) << "entries " << t - t % 2 << " and " << t - t % 2 + 1;
    }
    // rows: the expert's rows in the tile (a padding tile: its partner's), which the
    // cooperative kernels read to skip a warpgroup whose 64 rows all lie past them.
    const int a_row = gemm_tile_a_row(tile);
    const int expert_end = offsets[tile.expert] + rows[tile.expert];
    ASSERT_EQ(tile.rows, std::min(kGemmBlockM, expert_end - a_row)) << "entry " << t;
    ASSERT_GE(gemm_tile_rows(tile), 1) << "entry " << t;
    if (gemm_tile_is_padding(tile)) {
      ++padding;
      continue;
    }
    ASSERT_GE(tile.m_row, offsets[tile.expert]) << "entry " << t;
    ASSERT_LT(tile.m_row, offsets[tile.expert + 1]) << "entry " << t;
    ASSERT_EQ(tile.m_row % kGemmBlockM, 0);
    ASSERT_EQ(tile.signal, tile.m_row / kGemmBlockM);
    ++seen[size_t(tile.m_row / kGemmBlockM) * nb + tile.n_block];
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "M tile " << i / nb << " column block " << i % nb;
  EXPECT_EQ(padding, cluster == 2 && nb % 2 == 1 ? odd_experts : 0);
  if (cluster == 1) {  // the plain grouped raster over the M tiles, expert-major
    for (size_t t = 0; t < list.size(); ++t) {
      int m, n;
      raster_tile(order, default_raster_group(order, tile_n), int64_t(t), m_tiles, nb, m, n, true);
      ASSERT_EQ(list[t].m_row, m * kGemmBlockM) << "entry " << t;
      ASSERT_EQ(list[t].n_block, n) << "entry " << t;
    }
  }
}

// The two raster orders on small grids, written out: row-major groups of M tiles with the column
// block outer inside a group, column-major groups of column blocks with the M tile outer; the
// last group smaller, except that a row-major rest of at most half a group joins the group
// before it.
TEST(GemmSchedule, RasterOrdersWrittenOut) {
  auto walk = [](TileOrder order, int group, int m_total, int nb) {
    std::vector<std::pair<int, int>> out;
    for (int64_t i = 0; i < int64_t(m_total) * nb; ++i) {
      int m, n;
      raster_tile(order, group, i, m_total, nb, m, n, true);
      out.emplace_back(m, n);
    }
    return out;
  };
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(walk(TileOrder::kRowMajor, 2, 4, 2), (P{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {3, 0}, {2, 1}, {3, 1}}));
  EXPECT_EQ(walk(TileOrder::kRowMajor, 3, 4, 2), (P{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}}));
  EXPECT_EQ(walk(TileOrder::kRowMajor, 2, 3, 2), (P{{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1}, {2, 1}}));  // rest joins
  EXPECT_EQ(walk(TileOrder::kRowMajor, 4, 10, 2),  // 4 + 6
            (P{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 0}, {5, 0}, {6, 0}, {7, 0}, {8, 0}, {9, 0},
               {4, 1}, {5, 1}, {6, 1}, {7, 1}, {8, 1}, {9, 1}}));
  EXPECT_EQ(walk(TileOrder::kRowMajor, 4, 7, 2),  // a rest of 3 is more than half a group: its own group
            (P{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 0}, {5, 0}, {6, 0}, {4, 1}, {5, 1}, {6, 1}}));
  EXPECT_EQ(walk(TileOrder::kRowMajor, 4, 2, 2), (P{{0, 0}, {1, 0}, {0, 1}, {1, 1}}));  // one smaller group
  EXPECT_EQ(walk(TileOrder::kColumnBlockMajor, 2, 2, 3), (P{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {1, 2}}));
}

// Where the rest joins: Mixtral's GEMM0 at 1024 tokens per rank has 17 M tiles on most EP 8
// ranks (2049-2112 rows) and 112 column blocks of 256; in the fused layer0's groups of 4 the 17th
// M tile would run with M tiles 12-16, one B column block per 5 tiles, not alone (the standalone
// lists join; the fused plan does not, tile_raster.h). Every tile once.
TEST(GemmSchedule, ShortRowMajorRestJoinsTheLastGroup) {
  const int m_total = 17, nb = 112;
  std::vector<int> seen(size_t(m_total) * nb, 0);
  for (int64_t i = 0; i < int64_t(m_total) * nb; ++i) {
    int m, n;
    raster_tile(TileOrder::kRowMajor, 4, i, m_total, nb, m, n, true);
    ASSERT_TRUE(m >= 0 && m < m_total && n >= 0 && n < nb) << "tile " << i;
    ++seen[size_t(m) * nb + size_t(n)];
    if (i >= 12 * nb) {  // the last group: M tiles 12..16, column block outer
      EXPECT_EQ(n, int((i - 12 * nb) / 5)) << "tile " << i;
      EXPECT_EQ(m, 12 + int((i - 12 * nb) % 5)) << "tile " << i;
    }
  }
  for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], 1) << "M tile " << k / nb << " column block " << k % nb;
  // Not asked to join (the fused plan's layer0): M tile 16 is a group of its own, after 12..15.
  int m, n;
  raster_tile(TileOrder::kRowMajor, 4, 16 * nb, m_total, nb, m, n);
  EXPECT_EQ(m, 16);
  EXPECT_EQ(n, 0);
  raster_tile(TileOrder::kRowMajor, 4, 16 * nb - 1, m_total, nb, m, n);
  EXPECT_EQ(m, 15);
  EXPECT_EQ(n, nb - 1);
}

// A column-major group spans kRasterGroupColumns (1024) columns at either width: on Mixtral's
// GEMM1 at 4096 tokens per rank (8173 rows, 64 M tiles, 4096 columns), the first wave of 264
// ping-pong tiles and the first of 132 cooperative ones both cover 33 M tiles x 1024 columns.
TEST(GemmSchedule, ColumnGroupsSpanTheSameColumnsAtEitherWidth) {
  EXPECT_EQ(default_raster_group(TileOrder::kColumnBlockMajor, 256), kRasterGroupN);
  EXPECT_EQ(default_raster_group(TileOrder::kColumnBlockMajor, 128), 2 * kRasterGroupN);
  EXPECT_EQ(default_raster_group(TileOrder::kRowMajor, 128), kRasterGroupM);
  for (int tile_n : {128, 256}) {
    SCOPED_TRACE("tile width " + std::to_string(tile_n));
    const std::vector<GemmTile> list = gemm_schedule_host({8173}, 4096 / tile_n, 1, TileOrder::kColumnBlockMajor, tile_n);
    const int wave = 132 * (tile_n == 128 ? 2 : 1);
    int max_m = 0, max_col = 0;
    for (int t = 0; t < wave; ++t) {
      max_m = std::max(max_m, list[t].m_row / kGemmBlockM);
      max_col = std::max(max_col, (list[t].n_block + 1) * tile_n);
    }
    EXPECT_EQ(max_m, 32);  // M tiles 0..32
    EXPECT_EQ(max_col, 1024);
  }
}

TEST(GemmSchedule, SkewedExperts) {
  // M tiles per expert 0, 1, 6, 0, 1, 2, 1, 0, 16, 4: three experts with an odd count.
  const std::vector<int> rows = {0, 1, 700, 0, 128, 129, 3, 0, 2000, 385};
  for (int cluster : {1, 2})
    for (TileOrder order : {TileOrder::kRowMajor, TileOrder::kColumnBlockMajor})
      for (int tile_n : {128, 256})
        for (int nb = 1; nb <= 10; ++nb) check_schedule(rows, nb, cluster, order, tile_n);
}

TEST(GemmSchedule, RandomExperts) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int E = 1 + int(rng() % 40), nb = 1 + int(rng() % 12);
    std::vector<int> rows(E);
    for (int& r : rows) r = rng() % 4 == 0 ? 0 : int(rng() % 3000);
    for (int cluster : {1, 2})
      for (TileOrder order : {TileOrder::kRowMajor, TileOrder::kColumnBlockMajor})
        check_schedule(rows, nb, cluster, order, trial % 2 ? 128 : 256);
  }
}

TEST(GemmSchedule, EmptyAndSingleTileExperts) {
  for (int cluster : {1, 2}) {
    EXPECT_TRUE(gemm_schedule_host({0, 0, 0}, 4, cluster, TileOrder::kRowMajor, 256).empty());
    // Only one-tile experts: no grid units, every tile from the tail (clusters) or the grid.
    check_schedule({5, 128, 1}, 3, cluster, TileOrder::kRowMajor, 256);
  }
}

// Mixtral's GEMM0 at 2048 tokens per rank on one expert (4115 rows, 33 M tiles, 224 column
// blocks of ping-pong tiles): with the tail pairs, exactly 33 x 224 tiles, no padding.
TEST(GemmSchedule, OddExpertNeedsNoPaddingWithEvenColumnBlocks) {
  const std::vector<GemmTile> list = gemm_schedule_host({4115}, 224, 2, TileOrder::kRowMajor, 128);
  EXPECT_EQ(list.size(), size_t(33 * 224));
  for (const GemmTile& t : list) EXPECT_FALSE(gemm_tile_is_padding(t));
}

// Row-major on clusters of two, the odd last M tile's column-block pairs run inside the group of
// its expert's last grid units, right after those units' own pair of column blocks (its B column
// blocks are theirs): Mixtral's GEMM0 at 2048 tokens per rank (4115 rows, 33 M tiles: 16 pairs in
// groups of 8, and M tile 32 alone), and several experts, some of one M tile, some odd in one
// group.
TEST(GemmSchedule, ClusterTailsRunBesideTheirGroup) {
  struct Case {
    std::vector<int> rows;
    int nb;
  };
  for (const Case& c : {Case{{4115}, 224}, Case{{4115}, 7}, Case{{300, 5000}, 6}, Case{{100, 0, 129, 2000}, 5},
                       Case{{300, 500, 4115}, 9}, Case{{129, 1, 257, 0, 385}, 4}}) {
    SCOPED_TRACE("experts " + std::to_string(c.rows.size()) + ", column blocks " + std::to_string(c.nb));
    check_schedule(c.rows, c.nb, 2, TileOrder::kRowMajor, 128);
    const std::vector<GemmTile> list = gemm_schedule_host(c.rows, c.nb, 2, TileOrder::kRowMajor, 128);
    const std::vector<int> offsets = padded_offsets(c.rows);
    for (size_t t = 0; t < list.size(); t += 2) {
      const GemmTile& a = list[t];
      const bool tail = list[t + 1].m_row != a.m_row + kGemmBlockM || gemm_tile_is_padding(list[t + 1]);
      if (!tail) continue;
      // The pair before it: a grid unit of its expert (or, for an expert of one M tile, another
      // tail) at column block n + 1 or n, with no grid unit at a column block past n + 1 between.
      ASSERT_GE(t, 2u) << "entry " << t;
      bool found = false;
      for (size_t s = t; s >= 2 && !found; s -= 2) {
        const GemmTile& b = list[s - 2];
        const bool b_tail = list[s - 1].m_row != b.m_row + kGemmBlockM || gemm_tile_is_padding(list[s - 1]);
        if (b_tail) continue;
        ASSERT_LE(b.n_block, a.n_block + 1) << "entry " << t << " after a grid unit at column block " << b.n_block;
        ASSERT_GE(b.n_block, a.n_block) << "entry " << t << " after a grid unit at column block " << b.n_block;
        found = true;
      }
      const int m_tiles = (offsets[a.expert + 1] - offsets[a.expert]) / kGemmBlockM;
      if (m_tiles > 1) {
        ASSERT_TRUE(found) << "entry " << t;
      }
    }
  }
  // Mixtral at 2048 tokens: group 1 holds units 8..15 (M tiles 16..31); its first pair of column
  // blocks is 16 units, then M tile 32 at (0, 1).
  const std::vector<GemmTile> list = gemm_schedule_host({4115}, 224, 2, TileOrder::kRowMajor, 128);
  const size_t group1 = 2 * 8 * 224;
  EXPECT_EQ(list[group1].m_row, 16 * kGemmBlockM);
  EXPECT_EQ(list[group1 + 2 * 16].m_row, 32 * kGemmBlockM);
  EXPECT_EQ(list[group1 + 2 * 16].n_block, 0);
  EXPECT_EQ(list[group1 + 2 * 16 + 1].n_block, 1);
  EXPECT_EQ(list.back().m_row, 32 * kGemmBlockM);
  EXPECT_EQ(list.back().n_block, 223);
}

// Split lists (gemm_split_plan, gemm_split_entry): the unsplit list's first tiles unchanged;
// every k-step of every later tile run exactly once; a split tile has parts - 1 kPartial pieces,
// each into its own workspace slot, and one kFinish (its last k range) adding exactly those
// slots; a piece that waits (kFinish) comes after the pieces it waits for in piece order, and
// when both fall in one round on one block (ping-pong), the partial's warpgroup runs first;
// every block gets as many pieces as every other, within one.
void check_split(const std::vector<int>& rows, int nb, TileOrder order, const GemmSplit& split) {
  SCOPED_TRACE("blocks " + std::to_string(split.blocks) + " x " + std::to_string(split.tiles_per_block) +
               ", k-tiles " + std::to_string(split.k_tiles) + ", column blocks " + std::to_string(nb));
  const int tile_n = split.tiles_per_block == 2 ? 128 : 256;  // ping-pong or cooperative
  const std::vector<GemmTile> tiles = gemm_schedule_host(rows, nb, 1, order, tile_n);
  std::vector<GemmSplitPiece> pieces;
  const std::vector<GemmTile> list = gemm_schedule_host(rows, nb, 1, order, tile_n, split, &pieces);
  ASSERT_EQ(pieces.size(), list.size());
  const int64_t n = int64_t(tiles.size()), slots = split.slots(), kt = split.k_tiles, blocks = split.blocks;
  const GemmSplitPlan plan = gemm_split_plan(n, split);
  if (plan.parts == 1) {
    ASSERT_EQ(list.size(), tiles.size());
    for (size_t i = 0; i < list.size(); ++i) ASSERT_EQ(pieces[i].role, GemmSplitRole::kWhole) << "entry " << i;
    return;
  }
  ASSERT_EQ(plan.whole % blocks, 0);
  ASSERT_EQ(plan.whole + plan.rest, n);
  ASSERT_LT(plan.rest, blocks);  // only the tiles past whole rounds of one tile per block
  ASSERT_EQ(int64_t(list.size()), plan.entries);
  ASSERT_EQ(plan.entries % blocks, 0);
  ASSERT_LE(plan.entries - plan.whole, int64_t(kSplitMaxParts) * slots);  // max_gemm_tiles' bound
  for (int64_t i = 0; i < plan.whole; ++i) {
    ASSERT_EQ(list[i].m_row, tiles[i].m_row) << "entry " << i;
    ASSERT_EQ(list[i].n_block, tiles[i].n_block) << "entry " << i;
    ASSERT_EQ(pieces[i].role, GemmSplitRole::kWhole) << "entry " << i;
  }
  auto tile_index = [&](const GemmTile& t) {  // tiles are unique by (m_row, n_block)
    for (int64_t i = plan.whole; i < n; ++i)
      if (tiles[i].m_row == t.m_row && tiles[i].n_block == t.n_block && tiles[i].expert == t.expert) return i;
    return int64_t(-1);
  };
  std::vector<int> steps_run(size_t(plan.rest * kt), 0);
  std::vector<int64_t> writer(gemm_split_flags(split), -1), finisher_of_tile(plan.rest, -1);
  std::vector<int64_t> pieces_per_block(blocks, 0);
  for (int64_t e = plan.whole; e < int64_t(list.size()); ++e) {
    const GemmTile& t = list[e];
    const GemmSplitPiece& piece = pieces[e];
    if (piece.role == GemmSplitRole::kIdle) {
      ASSERT_TRUE(gemm_tile_is_padding(t)) << "entry " << e << ": an idle piece on a real tile";
      continue;
    }
    ASSERT_NE(piece.role, GemmSplitRole::kWhole) << "entry " << e;
    ++pieces_per_block[e % blocks];
    const int64_t q = tile_index(t);
    ASSERT_GE(q, 0) << "entry " << e << " runs no tile of the list's split part";
    int begin, count;
    gemm_piece_k_range(piece, int(kt), begin, count);
    ASSERT_GT(count, 0) << "entry " << e;
    ASSERT_LE(begin + count, kt) << "entry " << e;
    for (int k = begin; k < begin + count; ++k) ++steps_run[size_t((q - plan.whole) * kt + k)];
    if (piece.role == GemmSplitRole::kPartial) {
      ASSERT_TRUE(piece.partial >= 0 && piece.partial < int64_t(writer.size())) << "entry " << e;
      ASSERT_EQ(writer[piece.partial], -1) << "workspace slot " << piece.partial << " written twice";
      writer[piece.partial] = e;
    } else {
      ASSERT_EQ(begin + count, kt) << "entry " << e << ": a finishing piece runs its tile's last k range";
      ASSERT_EQ(piece.partials, plan.parts - 1) << "entry " << e;
      ASSERT_EQ(finisher_of_tile[q - plan.whole], -1) << "tile " << q << " finished twice";
      finisher_of_tile[q - plan.whole] = e;
    }
  }
  for (size_t i = 0; i < steps_run.size(); ++i)
    ASSERT_EQ(steps_run[i], 1) << "split tile " << i / kt << " k-step " << i % kt;
  for (int64_t q = 0; q < plan.rest; ++q) {
    const int64_t f = finisher_of_tile[q];
    ASSERT_GE(f, 0) << "tile " << q << " never finished";
    const GemmSplitPiece& fin = pieces[f];
    for (int j = 0; j < fin.partials; ++j) {
      const int64_t w = writer[fin.partial + j];
      ASSERT_GE(w, 0) << "slot " << fin.partial + j << " never written";
      ASSERT_EQ(tile_index(list[w]), tile_index(list[f])) << "slot " << fin.partial + j << " holds another tile";
      // Entries run in list order on each block, so this also puts a partial first when both
      // pieces fall on one block.
      ASSERT_LT(w, f) << "a partial comes after its finishing piece";
    }
  }
  const auto [lo, hi] = std::minmax_element(pieces_per_block.begin(), pieces_per_block.end());
  EXPECT_LE(*hi - *lo, 1);
}

TEST(GemmSchedule, SplitListsRunEveryKStepOnce) {
  std::mt19937 rng(11);
  int split_lists = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int E = 1 + int(rng() % 12), nb = 1 + int(rng() % 20);
    std::vector<int> rows(E);
    for (int& r : rows) r = rng() % 5 == 0 ? 0 : int(rng() % 4000);
    const GemmSplit split{1 + int(rng() % 40), 1 + int(rng() % 2), kSplitMinKTiles + int(rng() % 200)};
    const TileOrder order = trial % 2 ? TileOrder::kRowMajor : TileOrder::kColumnBlockMajor;
    check_split(rows, nb, order, split);
    split_lists += gemm_split_plan(int64_t(gemm_schedule_host(rows, nb, 1, order, 256).size()), split).parts > 1;
  }
  EXPECT_GT(split_lists, 50);  // the random shapes exercise splitting, not only its refusals
}

// Mixtral's GEMM1 on 132 SMs with ping-pong (264 slots), 224 k-tiles: at 4096 tokens per rank
// 2048 tiles are 15 rounds of 132 and 68 more (unsplit, 68 blocks run a 16th); cut in 5, the 340
// pieces give every block 2 or 3 fifths (15.6 tiles for the busiest, as when the 200 tiles past
// 7 slot-waves were all cut). At 8192, 4096 tiles leave 4: 6 parts, 24 pieces.
TEST(GemmSchedule, SplitsMixtralGemm1) {
  const GemmSplit split{132, 2, 224};
  const GemmSplitPlan p4096 = gemm_split_plan(2048, split);
  EXPECT_EQ(p4096.whole, 1980);
  EXPECT_EQ(p4096.rest, 68);
  EXPECT_EQ(p4096.parts, 5);
  EXPECT_EQ(p4096.entries, 1980 + 3 * 132);
  const GemmSplitPlan p8192 = gemm_split_plan(4096, split);
  EXPECT_EQ(p8192.rest, 4);
  EXPECT_EQ(p8192.parts, 6);
  EXPECT_EQ(p8192.entries, 4092 + 132);
  check_split({8192}, 32, TileOrder::kColumnBlockMajor, split);
  check_split({16384}, 32, TileOrder::kColumnBlockMajor, split);
}

// Rounds of blocks, not of slots: the split used to cut every tile past the last whole slot-wave
// (2G tiles for ping-pong). Cutting only those past whole rounds of G must give every block the
// schedule it had (the same parts, the same busiest block in pieces) while cutting no more tiles.
TEST(GemmSchedule, SplitRoundsOfBlocksKeepTheSlotWaveSchedule) {
  auto slot_wave_plan = [](int64_t tiles, const GemmSplit& split) {  // the rule before, as it was
    const int64_t slots = split.slots(), blocks = split.blocks, rest = tiles % slots, whole = tiles - rest;
    auto last_wave = [&](int parts) { return double((rest * parts + blocks - 1) / blocks) / parts; };
    int best = 1;
    for (int parts = 2; parts <= kSplitMaxParts && parts * kSplitMinPieceKTiles <= split.k_tiles; ++parts)
      if (last_wave(parts) < last_wave(best) - 1e-9) best = parts;
    const double gain = last_wave(1) - last_wave(best), length = double(whole / blocks) + last_wave(1);
    if (best == 1 || gain < kSplitMinGain || gain < double(split.min_gain_fraction) * length) best = 1;
    return std::pair<int64_t, int>{best == 1 ? 0 : rest, best};
  };
  int split_cases = 0;
  for (const GemmSplit split : {GemmSplit{132, 2, 224}, GemmSplit{132, 2, 100}, GemmSplit{7, 2, 64}, GemmSplit{5, 1, 96},
                                GemmSplit{132, 2, 224, 0.1f}})
    for (int64_t tiles = 1; tiles <= 3000; ++tiles) {
      const GemmSplitPlan plan = gemm_split_plan(tiles, split);
      const auto [old_rest, old_parts] = slot_wave_plan(tiles, split);
      ASSERT_EQ(plan.parts, old_parts) << tiles << " tiles on " << split.blocks << " x " << split.tiles_per_block;
      if (plan.parts == 1) continue;
      ++split_cases;
      const int64_t G = split.blocks, p = plan.parts;
      const int64_t busiest = plan.whole / G * p + (plan.rest * p + G - 1) / G;  // in pieces of 1/p tile
      const int64_t old_whole = tiles - old_rest;
      ASSERT_EQ(busiest, old_whole / G * p + (old_rest * p + G - 1) / G) << tiles << " tiles";
      ASSERT_EQ(plan.rest, old_rest % G) << tiles << " tiles: only the tiles past whole rounds of blocks are cut";
    }
  EXPECT_GT(split_cases, 1000);
}

TEST(GemmSchedule, SplitOnlyWhereItPays) {
  auto parts = [](int64_t tiles, GemmSplit s) { return gemm_split_plan(tiles, s).parts; };
  EXPECT_EQ(parts(2640, {132, 2, 224}), 1);                   // whole waves
  EXPECT_EQ(parts(2048, {132, 2, kSplitMinKTiles - 1}), 1);   // short K
  EXPECT_EQ(parts(2 * 132 * 7 + 131, {132, 2, 224}), 1);      // 131 of 132 blocks busy: nothing to gain
  EXPECT_EQ(parts(2048, {0, 2, 224}), 1);                     // not asked
  EXPECT_EQ(parts(2048, {132, 0, 224}), 1);                   // no slots
  EXPECT_EQ(parts(100, {132, 2, 224}), 1);                    // under one wave on every block: 1 tile each
  EXPECT_GT(parts(2048, {132, 2, 224}), 1);
  EXPECT_GT(parts(200, {132, 1, 224}), 1);                    // 68 blocks of 132 run a second tile
}

// A relative floor (GemmSplit::min_gain_fraction) on top of the quarter tile: Mixtral's GEMM1 at
// 4096 tokens per rank gains 0.2 of its busiest block's 8 tiles (2.5%), so a 10% floor leaves it
// whole; at 128 tokens (EP 8: 256 rows, 2 M tiles x 16 column blocks of the cooperative 128 x 256
// tiles) its 32 tiles leave 100 of 132 SMs idle, and 4 parts cut its schedule by 75%. Parts are
// at most k-tiles / kSplitMinPieceKTiles.
TEST(GemmSchedule, RelativeGainFloor) {
  GemmSplit pingpong{132, 2, 224};
  EXPECT_EQ(gemm_split_plan(2048, pingpong).parts, 5);
  pingpong.min_gain_fraction = 0.1f;
  EXPECT_EQ(gemm_split_plan(2048, pingpong).parts, 1);
  GemmSplit cooperative{132, 1, 224, 0.1f};
  const GemmSplitPlan decode = gemm_split_plan(32, cooperative);
  EXPECT_EQ(decode.parts, 4);
  EXPECT_EQ(decode.whole, 0);
  EXPECT_EQ(decode.entries, 132);  // 128 pieces and 4 idle entries: one round
  // GEMM0 + SwiGLU there: 2 M tiles x 112 column blocks (64 k-tiles) = 224 tiles, 1.7 waves;
  // 4 parts make the second wave 0.75 of a tile: 12.5% of 2 tiles.
  EXPECT_EQ(gemm_split_plan(224, GemmSplit{132, 1, 64, 0.1f}).parts, 4);
  EXPECT_EQ(gemm_split_plan(224, GemmSplit{132, 1, 64, 0.2f}).parts, 1);
  // MoeLayer's floor (kLayerSplitMinGainFraction 0.5): a single wave under half full.
  const GemmSplit layer{132, 1, 224, 0.5f};
  EXPECT_EQ(gemm_split_plan(32, layer).parts, 4);
  EXPECT_EQ(gemm_split_plan(66, layer).parts, 2);  // half the SMs: two halves fill them
  EXPECT_EQ(gemm_split_plan(80, layer).parts, 1);  // 3 parts: 2 of 3 thirds, a third saved
  EXPECT_EQ(gemm_split_plan(224, layer).parts, 1);
  // Pieces of at least kSplitMinPieceKTiles k-tiles: K = 2048 (32) splits in two at most.
  EXPECT_EQ(gemm_split_plan(32, GemmSplit{132, 1, 32}).parts, 2);
  EXPECT_EQ(gemm_split_plan(32, GemmSplit{132, 1, kSplitMinKTiles - 1}).parts, 1);
}

}  // namespace
}  // namespace comet::cuda
