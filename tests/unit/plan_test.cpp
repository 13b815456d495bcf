// unit/plan_test.cpp: the dispatch plan (row placement, dedup'ed send lists, ring order), the
// layer0/layer1 tile schedules, the comm chunks and the signal model (include/comet/plan.h).
//
// For every case of plan_cases() the invariants are checked against a direct computation
// from the routing, and the producers are simulated: the layer0 comm chunks land rows into M
// tiles whose totals must equal rows_expected; the layer1 chunks of all ranks must deliver
// exactly combine_arrivals_expected to every owner.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "comet/plan.h"
#include "support/preset_config.h"
#include "support/test_support.h"
#include "unit/plan_cases.h"

namespace comet {
namespace {

using test::PlanCase;
using test::throws_with;

class PlanTest : public ::testing::TestWithParam<PlanCase> {};

// Every unmasked (token, slot) lands in exactly one row on each TP rank of its expert's EP
// group; slot_row and row_source are inverse; experts occupy contiguous ranges.
void check_rows(const PlanCase& c, const LayerConfig& cfg, const std::vector<Routing>& routing,
                const DispatchPlan& plan) {
  const int w = c.world, epr = cfg.experts_per_rank();
  ASSERT_EQ(plan.world(), w);
  ASSERT_EQ(plan.experts_per_rank(), epr);
  ASSERT_EQ(plan.topk(), c.topk);
  for (int r = 0; r < w; ++r) ASSERT_EQ(plan.num_tokens(r), c.tokens[r]);
  for (int dst = 0; dst < w; ++dst) {
    EXPECT_EQ(plan.ring_pos(dst, dst), 0);
    for (int src = 0; src < w; ++src) EXPECT_EQ(plan.ring_src(dst, plan.ring_pos(dst, src)), src);
  }

  int64_t unmasked = 0;
  std::vector<std::vector<int>> hits(w);
  // Expert segments start on tile boundaries: each is its rows rounded up to block_m.
  const int align = cfg.tiles.block_m;
  ASSERT_EQ(plan.row_align(), align);
  for (int dst = 0; dst < w; ++dst) {
    ASSERT_GE(plan.rows_on_rank(dst), 0);
    hits[dst].assign(plan.row_extent(dst), 0);
    EXPECT_EQ(plan.expert_row_begin(dst, 0), 0);
    int extent = 0, rows = 0;
    for (int e = 0; e < epr; ++e) {
      EXPECT_EQ(plan.expert_row_begin(dst, e), extent) << "dst " << dst << " expert " << e;
      EXPECT_EQ(plan.expert_row_begin(dst, e) % align, 0) << "dst " << dst << " expert " << e;
      EXPECT_GE(plan.expert_rows(dst, e), 0);
      rows += plan.expert_rows(dst, e);
      extent += (plan.expert_rows(dst, e) + align - 1) / align * align;
    }
    EXPECT_EQ(rows, plan.rows_on_rank(dst)) << "dst " << dst;
    EXPECT_EQ(extent, plan.row_extent(dst)) << "dst " << dst;
  }
  for (int src = 0; src < w; ++src) {
    for (int t = 0; t < c.tokens[src]; ++t) {
      for (int k = 0; k < c.topk; ++k) {
        const int id = routing[src].expert(t, k);
        unmasked += id >= 0;
        for (int dst = 0; dst < w; ++dst) {
          const int row = plan.slot_row(src, t, k, dst);
          const bool holds = id >= 0 && id / epr == cfg.layout.ep_index(dst);
          if (!holds) {
            ASSERT_EQ(row, -1) << "src " << src << " token " << t << " slot " << k << " expert "
                               << id << " dst " << dst;
            continue;
          }
          ASSERT_GE(row, 0) << "src " << src << " token " << t << " slot " << k << " dst " << dst;
          ASSERT_LT(row, plan.row_extent(dst));
          const int el = id % epr;
          EXPECT_GE(row, plan.expert_row_begin(dst, el));
          EXPECT_LT(row, plan.expert_row_begin(dst, el) + plan.expert_rows(dst, el));
          const RowSource& rs = plan.row_source(dst, row);
          EXPECT_EQ(std::tie(rs.src_rank, rs.token, rs.slot), std::tie(src, t, k))
              << "row_source(" << dst << ", " << row << ") is not the inverse of slot_row";
          hits[dst][row]++;
        }
      }
    }
  }
  // Every row of an expert's segment is hit once; padding rows never, and name no source.
  for (int dst = 0; dst < w; ++dst) {
    for (int e = 0; e < epr; ++e) {
      const int begin = plan.expert_row_begin(dst, e), end = begin + plan.expert_rows(dst, e);
      const int padded_end = e + 1 < epr ? plan.expert_row_begin(dst, e + 1) : plan.row_extent(dst);
      for (int row = begin; row < end; ++row) ASSERT_EQ(hits[dst][row], 1) << "dst " << dst << " row " << row;
      for (int row = end; row < padded_end; ++row) {
        ASSERT_EQ(hits[dst][row], 0) << "dst " << dst << " padding row " << row;
        ASSERT_EQ(plan.row_source(dst, row).src_rank, -1) << "dst " << dst << " padding row " << row;
      }
    }
  }
  int64_t total = 0;
  for (int dst = 0; dst < w; ++dst) total += plan.rows_on_rank(dst);
  EXPECT_EQ(total, unmasked * c.tp);
  EXPECT_EQ(plan.total_rows(), total);
  // The A buffer is sized by max_rows_per_rank() (workspace.h), padding included.
  for (int dst = 0; dst < w; ++dst) {
    EXPECT_LE(plan.row_extent(dst), cfg.max_rows_per_rank()) << "rank " << dst << ": A overflows";
  }
}

// Inside an expert: rows ordered by ring position of the source, then by token; counts agree.
void check_order_and_counts(const PlanCase& c, const LayerConfig& cfg, const DispatchPlan& plan) {
  const int w = c.world, epr = cfg.experts_per_rank();
  for (int dst = 0; dst < w; ++dst) {
    for (int e = 0; e < epr; ++e) {
      std::vector<int> tally(w, 0);
      const int begin = plan.expert_row_begin(dst, e), end = begin + plan.expert_rows(dst, e);
      for (int row = begin; row < end; ++row) {
        const RowSource& rs = plan.row_source(dst, row);
        tally[rs.src_rank]++;
        if (row == begin) continue;
        const RowSource& prev = plan.row_source(dst, row - 1);
        const auto key = std::pair{plan.ring_pos(dst, rs.src_rank), rs.token};
        const auto prev_key = std::pair{plan.ring_pos(dst, prev.src_rank), prev.token};
        EXPECT_LE(prev_key, key) << "dst " << dst << " expert " << e << " rows " << row - 1
                                 << "," << row << " not in (ring position, token) order";
      }
      for (int src = 0; src < w; ++src) {
        EXPECT_EQ(plan.count(src, dst, e), tally[src]) << "src " << src << " dst " << dst << " e " << e;
      }
    }
  }
}

// Send lists: each token at most once, ascending, exactly the tokens with a slot on dst's EP
// group; send_pos is the inverse; rows_of_sent_token appends the rows that token feeds.
void check_send_lists(const PlanCase& c, const LayerConfig& cfg, const std::vector<Routing>& routing,
                      const DispatchPlan& plan) {
  const int w = c.world, epr = cfg.experts_per_rank();
  for (int src = 0; src < w; ++src) {
    for (int dst = 0; dst < w; ++dst) {
      SCOPED_TRACE("send list " + std::to_string(src) + " -> " + std::to_string(dst));
      std::vector<int> want;
      for (int t = 0; t < c.tokens[src]; ++t) {
        for (int k = 0; k < c.topk; ++k) {
          const int id = routing[src].expert(t, k);
          if (id >= 0 && id / epr == cfg.layout.ep_index(dst)) {
            want.push_back(t);
            break;
          }
        }
      }
      ASSERT_EQ(plan.send_count(src, dst), int(want.size()));
      const std::vector<int> got(plan.send_tokens(src, dst), plan.send_tokens(src, dst) + want.size());
      EXPECT_EQ(got, want);
      EXPECT_LE(plan.send_count(src, dst), cfg.max_tokens_per_rank);
      for (int t = 0, pos = 0; t < c.tokens[src]; ++t) {
        const bool sent = pos < int(want.size()) && want[pos] == t;
        EXPECT_EQ(plan.send_pos(src, t, dst), sent ? pos : -1) << "token " << t;
        if (sent) ++pos;
      }
      for (int pos = 0; pos < int(want.size()); ++pos) {
        const int t = want[pos];
        std::vector<int> expected_rows;
        for (int k = 0; k < c.topk; ++k) {
          const int row = plan.slot_row(src, t, k, dst);
          if (row >= 0) expected_rows.push_back(row);
        }
        std::vector<int> rows = {-7};  // must be appended to, not cleared
        plan.rows_of_sent_token(src, dst, pos, rows);
        ASSERT_GE(rows.size(), 2u) << "pos " << pos;
        EXPECT_EQ(rows[0], -7) << "rows_of_sent_token cleared its output";
        rows.erase(rows.begin());
        EXPECT_LE(int(rows.size()), c.topk);
        std::sort(rows.begin(), rows.end());
        std::sort(expected_rows.begin(), expected_rows.end());
        EXPECT_EQ(rows, expected_rows) << "pos " << pos << " token " << t;
      }
    }
  }
}

bool same_tile(const MTile& a, const MTile& b) {
  return a.expert_local == b.expert_local && a.row_begin == b.row_begin && a.row_end == b.row_end &&
         a.first_source_pos == b.first_source_pos && a.last_source_pos == b.last_source_pos;
}

// Tiles, both schedules and both chunk lists of every rank, with the producer simulation.
void check_schedules(const PlanCase& c, const LayerConfig& cfg, const DispatchPlan& plan) {
  const int w = c.world, epr = cfg.experts_per_rank();
  const int bm = cfg.tiles.block_m;
  // combine arrivals pushed to each (owner, peer), counted once per column block.
  std::vector<int64_t> pushed(size_t(w) * w, 0);
  const int nb = cfg.num_col_blocks1();

  for (int dst = 0; dst < w; ++dst) {
    SCOPED_TRACE("rank " + std::to_string(dst));
    const std::vector<MTile> tiles = build_m_tiles(plan, dst, bm);
    EXPECT_LE(int64_t(tiles.size()), cfg.max_m_tiles_per_rank());
    // Expert-major, contiguous cover of every row, at most one partial tile per expert.
    std::vector<int> tile_of_row(plan.row_extent(dst), -1);
    size_t ti = 0;
    for (int e = 0; e < epr; ++e) {
      int next = plan.expert_row_begin(dst, e);
      const int end = next + plan.expert_rows(dst, e);
      int n_tiles = 0;
      for (; ti < tiles.size() && tiles[ti].expert_local == e; ++ti, ++n_tiles) {
        const MTile& t = tiles[ti];
        EXPECT_EQ(t.row_begin, next) << "tile " << ti;
        EXPECT_GE(t.rows(), 1) << "tile " << ti;
        EXPECT_LE(t.rows(), bm) << "tile " << ti;
        int lo = w, hi = -1;
        for (int row = t.row_begin; row < std::min(t.row_end, end); ++row) {
          const int pos = plan.ring_pos(dst, plan.row_source(dst, row).src_rank);
          lo = std::min(lo, pos);
          hi = std::max(hi, pos);
          tile_of_row[row] = int(ti);
        }
        EXPECT_EQ(t.first_source_pos, lo) << "tile " << ti;
        EXPECT_EQ(t.last_source_pos, hi) << "tile " << ti;
        next = t.row_end;
      }
      EXPECT_EQ(next, end) << "expert " << e << " rows not covered by its tiles";
      EXPECT_LE(n_tiles, plan.expert_rows(dst, e) / bm + 1) << "expert " << e;
    }
    ASSERT_EQ(ti, tiles.size()) << "tiles not expert-major, or of an unknown expert";
    for (int row = 0; row < plan.row_extent(dst); ++row)
      if (plan.row_source(dst, row).src_rank >= 0) {
        ASSERT_GE(tile_of_row[row], 0) << "row " << row;
      }

    // Layer0 schedule.
    const Layer0Schedule s0 = build_layer0_schedule(cfg, plan, dst);
    EXPECT_EQ(s0.rank, dst);
    EXPECT_EQ(s0.num_n_blocks, (cfg.ffn_per_rank() + cfg.tiles.block_n0 - 1) / cfg.tiles.block_n0);
    ASSERT_EQ(s0.m_tiles.size(), tiles.size());
    for (size_t i = 0; i < tiles.size(); ++i) EXPECT_TRUE(same_tile(s0.m_tiles[i], tiles[i])) << i;
    ASSERT_EQ(s0.order.size(), tiles.size());
    std::vector<int> sorted_order = s0.order;
    std::sort(sorted_order.begin(), sorted_order.end());
    for (size_t i = 0; i < sorted_order.size(); ++i) {
      ASSERT_EQ(sorted_order[i], int(i)) << "order is not a permutation of the tiles";
    }
    for (size_t i = 1; i < s0.order.size(); ++i) {
      EXPECT_LE(s0.m_tiles[s0.order[i - 1]].last_source_pos, s0.m_tiles[s0.order[i]].last_source_pos)
          << "run order position " << i;
    }
    // Fewer stages: stage by stage (stage = last ring position * stages / W), tiles ascending
    // inside even stages and descending inside odd ones; one stage is expert-major.
    EXPECT_EQ(s0.stages, w);
    for (int stages : {1, 2, 3, w + 5}) {
      SCOPED_TRACE("stages " + std::to_string(stages));
      const Layer0Schedule s = build_layer0_schedule(cfg, plan, dst, stages);
      ASSERT_EQ(s.stages, std::min(stages, w));
      ASSERT_EQ(s.order.size(), tiles.size());
      std::vector<int> seen(tiles.size(), 0);
      for (int m : s.order) ++seen[size_t(m)];
      for (int x : seen) ASSERT_EQ(x, 1) << "order is not a permutation of the tiles";
      for (size_t i = 0; i < s.order.size(); ++i) {
        const int m = s.order[i];
        EXPECT_EQ(s.stage_of(m), s.m_tiles[m].last_source_pos * s.stages / w);
        if (i == 0) continue;
        const int prev = s.order[i - 1];
        ASSERT_LE(s.stage_of(prev), s.stage_of(m)) << "run order position " << i;
        if (s.stage_of(prev) == s.stage_of(m)) {
          if (s.stage_of(m) % 2 == 0) EXPECT_LT(prev, m) << "even stage not ascending at " << i;
          else EXPECT_GT(prev, m) << "odd stage not descending at " << i;
        }
      }
      if (stages == 1) {
        for (size_t i = 0; i < s.order.size(); ++i) EXPECT_EQ(s.order[i], int(i)) << "one stage: expert-major";
      }
    }

    // Layer0 producers: walk the pull chunks, land rows per tile.
    const std::vector<CommChunk> chunks0 = build_layer0_comm_chunks(plan, dst, c.chunk_tokens);
    std::vector<int64_t> landed(tiles.size(), 0);
    std::vector<int> row_landed(plan.row_extent(dst), 0);
    std::vector<std::vector<int>> covered(w);
    for (int p = 0; p < w; ++p) covered[p].assign(plan.send_count(p, dst), 0);
    int last_pos = 0;
    std::vector<int> rows;
    for (size_t i = 0; i < chunks0.size(); ++i) {
      const CommChunk& ch = chunks0[i];
      ASSERT_GE(ch.peer, 0);
      ASSERT_LT(ch.peer, w);
      const int ring = plan.ring_pos(dst, ch.peer);
      EXPECT_GE(ring, last_pos) << "layer0 chunk " << i << " out of ring order";
      last_pos = ring;
      ASSERT_GE(ch.pos_begin, 0) << "chunk " << i;
      ASSERT_LE(ch.pos_begin, ch.pos_end) << "chunk " << i;
      ASSERT_LE(ch.pos_end, plan.send_count(ch.peer, dst)) << "chunk " << i;
      EXPECT_LE(ch.pos_end - ch.pos_begin, c.chunk_tokens) << "chunk " << i;
      for (int pos = ch.pos_begin; pos < ch.pos_end; ++pos) {
        covered[ch.peer][pos]++;
        rows.clear();
        plan.rows_of_sent_token(ch.peer, dst, pos, rows);
        for (int row : rows) {
          ASSERT_GE(row, 0);
          ASSERT_LT(row, plan.row_extent(dst));
          landed[tile_of_row[row]]++;
          row_landed[row]++;
        }
      }
    }
    for (int p = 0; p < w; ++p) {
      for (int pos = 0; pos < plan.send_count(p, dst); ++pos) {
        ASSERT_EQ(covered[p][pos], 1) << "layer0: position " << pos << " of send list " << p << "->" << dst;
      }
    }
    for (size_t t = 0; t < tiles.size(); ++t) {
      EXPECT_EQ(landed[t], s0.rows_expected(int(t))) << "layer0 tile " << t;
    }
    for (int row = 0; row < plan.row_extent(dst); ++row)
      ASSERT_EQ(row_landed[row], plan.row_source(dst, row).src_rank >= 0 ? 1 : 0) << "row " << row;

    // Layer1 schedule: the same tiles, column-block-major.
    const Layer1Schedule s1 = build_layer1_schedule(cfg, plan, dst);
    EXPECT_EQ(s1.rank, dst);
    EXPECT_EQ(s1.num_col_blocks, nb);
    ASSERT_EQ(s1.m_tiles.size(), tiles.size());
    for (size_t i = 0; i < tiles.size(); ++i) EXPECT_TRUE(same_tile(s1.m_tiles[i], tiles[i])) << i;
    EXPECT_EQ(s1.tiles_per_col_block(), int(tiles.size()));
    EXPECT_EQ(s1.num_tiles(), nb * int(tiles.size()));

    // Layer1 producers: this rank (an expert holder) pushes one partial row per token of the
    // owner's send list owner->dst, once per column block.
    const std::vector<CommChunk> chunks1 = build_layer1_comm_chunks(plan, dst, c.chunk_tokens);
    std::vector<std::vector<int>> covered1(w);
    for (int o = 0; o < w; ++o) covered1[o].assign(plan.send_count(o, dst), 0);
    last_pos = 0;
    for (size_t i = 0; i < chunks1.size(); ++i) {
      const CommChunk& ch = chunks1[i];
      ASSERT_GE(ch.peer, 0);
      ASSERT_LT(ch.peer, w);
      const int ring = plan.ring_pos(dst, ch.peer);
      EXPECT_GE(ring, last_pos) << "layer1 chunk " << i << " out of ring order";
      last_pos = ring;
      ASSERT_GE(ch.pos_begin, 0) << "chunk " << i;
      ASSERT_LE(ch.pos_begin, ch.pos_end) << "chunk " << i;
      ASSERT_LE(ch.pos_end, plan.send_count(ch.peer, dst))
          << "layer1 chunk " << i << " beyond the send list " << ch.peer << "->" << dst;
      EXPECT_LE(ch.pos_end - ch.pos_begin, c.chunk_tokens) << "chunk " << i;
      for (int pos = ch.pos_begin; pos < ch.pos_end; ++pos) covered1[ch.peer][pos]++;
      pushed[size_t(ch.peer) * w + dst] += int64_t(ch.pos_end - ch.pos_begin) * nb;
    }
    for (int o = 0; o < w; ++o) {
      for (int pos = 0; pos < plan.send_count(o, dst); ++pos) {
        ASSERT_EQ(covered1[o][pos], 1) << "layer1: position " << pos << " of send list " << o << "->" << dst;
      }
    }
  }
  for (int owner = 0; owner < w; ++owner) {
    for (int peer = 0; peer < w; ++peer) {
      const int64_t want = combine_arrivals_expected(plan, owner, peer, nb);
      EXPECT_EQ(pushed[size_t(owner) * w + peer], want) << "owner " << owner << " peer " << peer;
      EXPECT_EQ(want, int64_t(plan.send_count(owner, peer)) * nb) << "owner " << owner << " peer " << peer;
    }
  }
}

TEST_P(PlanTest, Invariants) {
  const PlanCase& c = GetParam();
  SCOPED_TRACE(c.describe());
  const LayerConfig cfg = c.config();
  ASSERT_TRUE(cfg.validate().ok) << cfg.validate().reason;
  const std::vector<Routing> routing = c.routing();
  const DispatchPlan plan(cfg, routing);
  check_rows(c, cfg, routing, plan);
  if (HasFatalFailure()) return;
  check_order_and_counts(c, cfg, plan);
  check_send_lists(c, cfg, routing, plan);
  if (HasFatalFailure()) return;
  check_schedules(c, cfg, plan);
  if (HasFatalFailure()) return;

  // A second plan from the same input is identical.
  const DispatchPlan& a = plan;
  const DispatchPlan b(cfg, routing);
  for (int dst = 0; dst < c.world; ++dst) {
    ASSERT_EQ(a.row_extent(dst), b.row_extent(dst));
    for (int row = 0; row < a.row_extent(dst); ++row) {
      const RowSource &x = a.row_source(dst, row), &y = b.row_source(dst, row);
      ASSERT_EQ(std::tie(x.src_rank, x.token, x.slot), std::tie(y.src_rank, y.token, y.slot));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PlanTest, ::testing::ValuesIn(test::plan_cases()),
                         [](const ::testing::TestParamInfo<PlanCase>& info) {
                           return std::to_string(info.index) + "_" +
                                  test::param_name(info.param.short_name());
                         });

// ---- bad routing ---------------------------------------------------------------------------

LayerConfig bad_config() {
  LayerConfig c;
  c.model = {"bad", 32, 64, 8, 2, Activation::kSwiGlu};
  c.layout = {4, 2, 2};
  c.max_tokens_per_rank = 8;
  c.tiles = {8, 16, 16};
  return c;
}

std::vector<Routing> good_routing(const LayerConfig& c) {
  std::vector<Routing> out;
  for (int r = 0; r < c.layout.world; ++r) {
    out.push_back(generate_routing(RoutingSpec{}, 6, c.model.num_experts, c.model.topk, 5, r));
  }
  return out;
}

TEST(Layer0Stages, DefaultIsOneStagePerFourSources) {
  EXPECT_EQ(default_layer0_stages(1), 1);
  EXPECT_EQ(default_layer0_stages(2), 1);
  EXPECT_EQ(default_layer0_stages(4), 1);
  EXPECT_EQ(default_layer0_stages(5), 2);
  EXPECT_EQ(default_layer0_stages(8), 2);
  EXPECT_EQ(default_layer0_stages(64), 16);
  EXPECT_THROW(default_layer0_stages(0), Error);
}

// Half tiles where experts are long at T_max: mixtral (2048 rows per expert at 1024 tokens, W 8),
// qwen3 (512), qwen2 (546); not deepseek-v3 at 1024 tokens (256), which they made slower.
TEST(HalfTiles, DefaultFollowsTheExpectedRowsPerExpert) {
  auto config = [](const std::string& model, int tokens) { return test::preset_config(model, 8, 1, tokens); };
  EXPECT_TRUE(default_half_tiles(config("mixtral-8x7b", 1024)));
  EXPECT_TRUE(default_half_tiles(config("qwen3-30b-a3b", 1024)));
  EXPECT_TRUE(default_half_tiles(config("qwen2-moe-2.7b", 1024)));
  EXPECT_TRUE(default_half_tiles(config("phi-3.5-moe", 1024)));
  EXPECT_FALSE(default_half_tiles(config("deepseek-v3", 1024)));
  EXPECT_FALSE(default_half_tiles(config("deepseek-v3", 2047)));  // 511.75 rows per expert
  EXPECT_TRUE(default_half_tiles(config("deepseek-v3", 2048)));
  EXPECT_TRUE(default_half_tiles(config("deepseek-v3", 4096)));
}

TEST(PlanBadRouting, GoodRoutingBuilds) {
  const LayerConfig c = bad_config();
  EXPECT_NO_THROW(DispatchPlan(c, good_routing(c)));
}

TEST(PlanBadRouting, ExpertIdOutOfRangeNamesTheRank) {
  const LayerConfig c = bad_config();
  for (int bad : {8, 100, -2}) {
    auto routing = good_routing(c);
    routing[1].expert_ids[3] = bad;
    EXPECT_TRUE(throws_with<Error>([&] { DispatchPlan(c, routing); }, {"rank 1", std::to_string(bad)}))
        << "id " << bad;
  }
}

TEST(PlanBadRouting, TooManyTokensNamesTheRank) {
  const LayerConfig c = bad_config();
  auto routing = good_routing(c);
  routing[1] = generate_routing(RoutingSpec{}, 9, 8, 2, 5, 1);  // T_max is 8
  EXPECT_TRUE(throws_with<Error>([&] { DispatchPlan(c, routing); }, {"rank 1", "9"}));
}

TEST(PlanBadRouting, WrongRankCount) {
  const LayerConfig c = bad_config();
  auto routing = good_routing(c);
  routing.pop_back();  // 3 routings for 4 ranks
  EXPECT_TRUE(throws_with<Error>([&] { DispatchPlan(c, routing); }, {"3", "4"}));
  routing = good_routing(c);
  routing.push_back(routing.back());
  EXPECT_TRUE(throws_with<Error>([&] { DispatchPlan(c, routing); }, {"5", "4"}));
  EXPECT_TRUE(throws_with<Error>([&] { DispatchPlan(c, {}); }));
}

TEST(PlanBadRouting, TopkMismatchOrSizeMismatchThrows) {
  const LayerConfig c = bad_config();
  auto routing = good_routing(c);
  routing[2] = generate_routing(RoutingSpec{}, 6, 8, 1, 5, 2);  // topk 1, config says 2
  EXPECT_TRUE(throws_with<Error>([&] { DispatchPlan(c, routing); }));
  routing = good_routing(c);
  routing[2].expert_ids.pop_back();
  EXPECT_TRUE(throws_with<Error>([&] { DispatchPlan(c, routing); }));
}

TEST(ScheduleBadArguments, RanksOutsideTheWorldAndAnotherLayersConfigAreRefused) {
  const LayerConfig c = bad_config();
  const DispatchPlan plan(c, good_routing(c));
  const int W = c.layout.world;
  EXPECT_TRUE(throws_with<Error>([&] { build_layer0_schedule(c, plan, W); }, {"rank " + std::to_string(W), "outside"}));
  EXPECT_TRUE(throws_with<Error>([&] { build_layer1_schedule(c, plan, -1); }, {"rank -1", "outside"}));
  EXPECT_TRUE(throws_with<Error>([&] { build_layer0_comm_chunks(plan, W, 4); }, {"outside"}));
  EXPECT_TRUE(throws_with<Error>([&] { combine_arrivals_expected(plan, 0, W, 1); }, {"peer", "outside"}));
  LayerConfig other = c;
  other.model.topk = 1;
  EXPECT_TRUE(throws_with<Error>([&] { build_layer0_schedule(other, plan, 0); }, {"not the plan's", "topk=1"}));
  other = c;
  other.tiles.block_m = c.tiles.block_m * 2;  // tiles would span two experts' segments
  EXPECT_TRUE(throws_with<Error>([&] { build_layer1_schedule(other, plan, 0); }, {"not a multiple of block_m"}));
  EXPECT_NO_THROW(build_layer0_schedule(c, plan, W - 1));
}

}  // namespace
}  // namespace comet
