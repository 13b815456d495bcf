// unit/gemm_schedule_test.cpp: the grouped GEMM tile list (cuda/gemm_schedule.h, the functions the
// device builder runs) on the host: every (M tile, column block) exactly once; clusters of two in
// pairs that share their expert and either their column block or their M tile (an odd expert's
// last); padding only for odd experts with an odd number of column blocks, once each; without
// clusters, the plain grouped raster over M tiles.
#include <gtest/gtest.h>

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

void check_schedule(const std::vector<int>& rows, int nb, int cluster, TileOrder order) {
  SCOPED_TRACE("cluster " + std::to_string(cluster) + (order == TileOrder::kRowMajor ? " row-major" : " column-major") +
               " column blocks " + std::to_string(nb) + " experts " + std::to_string(rows.size()));
  const std::vector<GemmTile> list = gemm_schedule_host(rows, nb, cluster, order);
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
      raster_tile(order, default_raster_group(order), int64_t(t), m_tiles, nb, m, n);
      ASSERT_EQ(list[t].m_row, m * kGemmBlockM) << "entry " << t;
      ASSERT_EQ(list[t].n_block, n) << "entry " << t;
    }
  }
}

// The two raster orders on small grids, written out: row-major groups of M tiles with the column
// block outer inside a group, column-major groups of column blocks with the M tile outer; the
// last group smaller.
TEST(GemmSchedule, RasterOrdersWrittenOut) {
  auto walk = [](TileOrder order, int group, int m_total, int nb) {
    std::vector<std::pair<int, int>> out;
    for (int64_t i = 0; i < int64_t(m_total) * nb; ++i) {
      int m, n;
      raster_tile(order, group, i, m_total, nb, m, n);
      out.emplace_back(m, n);
    }
    return out;
  };
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(walk(TileOrder::kRowMajor, 2, 3, 2), (P{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {2, 1}}));
  EXPECT_EQ(walk(TileOrder::kColumnBlockMajor, 2, 2, 3), (P{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {1, 2}}));
  EXPECT_EQ(walk(TileOrder::kRowMajor, 4, 2, 2), (P{{0, 0}, {1, 0}, {0, 1}, {1, 1}}));  // one smaller group
}

TEST(GemmSchedule, SkewedExperts) {
  // M tiles per expert 0, 1, 6, 0, 1, 2, 1, 0, 16, 4: three experts with an odd count.
  const std::vector<int> rows = {0, 1, 700, 0, 128, 129, 3, 0, 2000, 385};
  for (int cluster : {1, 2})
    for (TileOrder order : {TileOrder::kRowMajor, TileOrder::kColumnBlockMajor})
      for (int nb = 1; nb <= 6; ++nb) check_schedule(rows, nb, cluster, order);
}

TEST(GemmSchedule, RandomExperts) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int E = 1 + int(rng() % 40), nb = 1 + int(rng() % 12);
    std::vector<int> rows(E);
    for (int& r : rows) r = rng() % 4 == 0 ? 0 : int(rng() % 3000);
    for (int cluster : {1, 2})
      for (TileOrder order : {TileOrder::kRowMajor, TileOrder::kColumnBlockMajor}) check_schedule(rows, nb, cluster, order);
  }
}

TEST(GemmSchedule, EmptyAndSingleTileExperts) {
  for (int cluster : {1, 2}) {
    EXPECT_TRUE(gemm_schedule_host({0, 0, 0}, 4, cluster, TileOrder::kRowMajor).empty());
    // Only one-tile experts: no grid units, every tile from the tail (clusters) or the grid.
    check_schedule({5, 128, 1}, 3, cluster, TileOrder::kRowMajor);
  }
}

// Mixtral's GEMM0 at 2048 tokens per rank on one expert (4115 rows, 33 M tiles, 224 column
// blocks of ping-pong tiles): with the tail pairs, exactly 33 x 224 tiles, no padding.
TEST(GemmSchedule, OddExpertNeedsNoPaddingWithEvenColumnBlocks) {
  const std::vector<GemmTile> list = gemm_schedule_host({4115}, 224, 2, TileOrder::kRowMajor);
  EXPECT_EQ(list.size(), size_t(33 * 224));
  for (const GemmTile& t : list) EXPECT_FALSE(gemm_tile_is_padding(t));
}

}  // namespace
}  // namespace comet::cuda
