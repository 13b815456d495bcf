// GPU tests of the device-side dispatch plan (label `gpu`): for every rank, the plan computed on
// the device from routing read through peer pointers equals comet::DispatchPlan and the layer0
// schedule exactly; bad input is recorded, not written out of bounds.
#include <algorithm>
#include <sstream>

#include "comet/plan.h"
#include "comet/problem.h"
#include "cuda/device_plan.h"
#include "cuda/tile_raster.h"
#include "gpu_test_util.h"

namespace comet::cuda {
namespace {

using testing::DeviceBuffer;

struct PlanCase {
  int world, tp, num_experts, topk, t_max;
  std::vector<int> tokens;
  RoutingSpec spec;
  uint64_t seed;
  int stages = 0;  // of the layer0 order (0: W)
  LayerConfig config() const {
    LayerConfig c;
    c.model = {"plan", 256, 512, num_experts, topk, Activation::kSwiGlu};
    c.layout = {world, world / tp, tp};
    c.max_tokens_per_rank = t_max;
    c.tiles = {kGemmBlockM, 128, 256};
    return c;
  }
  std::string describe() const {
    std::ostringstream os;
    os << "W=" << world << " TP=" << tp << " E=" << num_experts << " topk=" << topk << " T_max=" << t_max
       << " routing=" << spec.describe() << " seed=" << seed << " stages=" << stages << " tokens=[";
    for (size_t i = 0; i < tokens.size(); ++i) os << (i ? "," : "") << tokens[i];
    return os.str() + "]";
  }
};

void PrintTo(const PlanCase& c, std::ostream* os) { *os << c.describe(); }

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> out;
  uint64_t seed = 1;
  const RoutingSpec specs[] = {{RoutingKind::kUniform, 0, 0}, {RoutingKind::kZipf, 1.3, 0.1},
                               {RoutingKind::kImbalance, 0.05, 0}};
  for (int world : {1, 2, 4, 8})
    for (int tp : {1, 2, 8}) {
      if (tp > world) continue;
      for (auto [e, k] : {std::pair{8, 2}, {64, 4}, {256, 8}}) {
        PlanCase c{world, tp, e, k, 300, {}, specs[seed % 3], seed, int(seed / 3 % 3)};  // stages W, 1, 2
        for (int r = 0; r < world; ++r) c.tokens.push_back(r == 1 ? 0 : (r * 97 + 50) % 301);
        ++seed;
        out.push_back(c);
      }
    }
  // Many 256-token chunks per source (the cases above stay in one), topk 16, and every token on
  // one rank.
  out.push_back({4, 1, 64, 16, 2500, {2500, 1777, 0, 1025}, {RoutingKind::kUniform, 0, 0.2}, seed++});
  out.push_back({2, 1, 4, 1, 3000, {3000, 2049}, {RoutingKind::kZipf, 3.0, 0}, seed++});
  // EP x TP with several chunks per source, chunks ending one token in (513, 257) and an empty
  // rank: send positions per EP group and chunk bases across chunks.
  out.push_back({4, 2, 64, 4, 700, {700, 0, 513, 257}, {RoutingKind::kZipf, 1.3, 0.1}, seed++, 2});
  return out;
}

struct DeviceRouting {
  std::vector<DeviceBuffer<int32_t>> counts, ids;
  std::vector<DeviceBuffer<float>> weights;
  DeviceBuffer<const int32_t*> count_table, id_table;
  DeviceBuffer<const float*> weight_table;
};

DeviceRouting upload_routing(const LayerConfig& c, const std::vector<Routing>& routing) {
  DeviceRouting d;
  std::vector<const int32_t*> cp, ip;
  std::vector<const float*> wp;
  for (const Routing& rt : routing) {
    std::vector<int32_t> ids(size_t(c.max_tokens_per_rank) * c.model.topk, -1);
    std::vector<float> w(ids.size(), 0.f);
    std::copy(rt.expert_ids.begin(), rt.expert_ids.end(), ids.begin());
    std::copy(rt.weights.begin(), rt.weights.end(), w.begin());
    d.counts.emplace_back(std::vector<int32_t>{rt.num_tokens});
    d.ids.emplace_back(ids);
    d.weights.emplace_back(w);
    cp.push_back(d.counts.back().get());
    ip.push_back(d.ids.back().get());
    wp.push_back(d.weights.back().get());
  }
  d.count_table = DeviceBuffer<const int32_t*>(cp);
  d.id_table = DeviceBuffer<const int32_t*>(ip);
  d.weight_table = DeviceBuffer<const float*>(wp);
  return d;
}

template <class T>
std::vector<T> download(const T* p, size_t n) {
  std::vector<T> out(n);
  if (n) COMET_CUDA_CHECK(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

class DevicePlanTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(DevicePlanTest, EqualsTheHostPlanOnEveryRank) {
  COMET_REQUIRE_GPU();
  const PlanCase& pc = GetParam();
  SCOPED_TRACE(pc.describe());
  const LayerConfig c = pc.config();
  std::vector<Routing> routing;
  for (int r = 0; r < pc.world; ++r)
    routing.push_back(generate_routing(pc.spec, pc.tokens[r], pc.num_experts, pc.topk, pc.seed, r));
  const DispatchPlan host(c, routing);
  DeviceRouting dr = upload_routing(c, routing);
  const DevicePlanLayout layout(c);
  DeviceBuffer<char> buffer(layout.total_bytes());
  DeviceBuffer<DeviceError> error(1);
  const int W = pc.world, E = c.experts_per_rank(), R = layout.rows_per_token;
  // Every other rank plans with the epilogue combine: heaps at made-up addresses (the plan
  // computes destinations and never dereferences them).
  std::vector<void*> heaps;
  for (int p = 0; p < W; ++p) heaps.push_back(reinterpret_cast<void*>(uintptr_t(p + 1) << 32));
  const int64_t combine_offset = 4096;
  DeviceBuffer<void*> heap_table(heaps);
  int reordered_ranks = 0;  // ranks whose layer1 list put half tiles last
  int cut_ranks = 0;        // ranks whose layer1 list cut an M tile in two
  for (int r = 0; r < W; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    buffer.poison();
    error.zero();
    DevicePlanArgs args;
    args.rank = r;
    args.token_counts = dr.count_table.get();
    args.route_ids = dr.id_table.get();
    args.route_weights = dr.weight_table.get();
    args.plan = layout.view(buffer.get());
    args.error = error.get();
    args.layer0_stages = pc.stages;
    // Layer1's claiming grid, small enough for these few tiles to tip into one more round, so
    // that some ranks' lists cut a last M tile in two (layer1_cut_m_tiles); every third: none.
    args.layer1_grid = r % 3 == 0 ? 0 : 2;
    const bool singles = (r + pc.seed) % 2 == 0;
    SCOPED_TRACE(singles ? "epilogue combine" : "every token through the combine");
    if (singles) {
      args.combine_peers = heap_table.get();
      args.combine_offset = combine_offset;
    }
    build_device_plan(c, args, nullptr);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_EQ(error.download()[0].claimed, 0) << describe(error.download()[0]);
    const DevicePlanView& v = args.plan;

    // Expert segments.
    const auto rows = download(v.expert_rows, E), offsets = download(v.expert_offset, E + 1);
    for (int e = 0; e < E; ++e) {
      EXPECT_EQ(rows[e], host.expert_rows(r, e)) << "expert " << e;
      EXPECT_EQ(offsets[e], host.expert_row_begin(r, e)) << "expert " << e;
    }
    EXPECT_EQ(offsets[E], host.row_extent(r));
    const auto counts = download(v.counts, 4);
    EXPECT_EQ(counts[1], host.rows_on_rank(r));

    // Received tokens, their rows and weights, in ring order.
    const auto psum = download(v.recv_psum, W + 1);
    const auto tokens = download(v.recv_token, size_t(std::max(psum[W], 0)));
    const auto recv_rows = download(v.recv_rows, size_t(std::max(psum[W], 0)) * R);
    const auto recv_w = download(v.recv_weight, size_t(std::max(psum[W], 0)) * R);
    std::vector<int> want_rows;
    for (int pos = 0; pos < W; ++pos) {
      const int src = host.ring_src(r, pos);
      ASSERT_EQ(psum[pos + 1] - psum[pos], host.send_count(src, r)) << "ring position " << pos;
      for (int i = 0; i < host.send_count(src, r); ++i) {
        const int slot = psum[pos] + i;
        const int t = host.send_tokens(src, r)[i];
        ASSERT_EQ(tokens[slot], t) << "ring position " << pos << " item " << i;
        want_rows.clear();
        host.rows_of_sent_token(src, r, i, want_rows);
        for (int j = 0; j < R; ++j) {
          const int want = j < int(want_rows.size()) ? want_rows[j] : -1;
          ASSERT_EQ(recv_rows[size_t(slot) * R + j], want) << "token " << t << " of rank " << src << " row " << j;
          const float want_w = want < 0 ? 0.f : routing[src].weight(t, host.row_source(r, want).slot);
          ASSERT_EQ(recv_w[size_t(slot) * R + j], want_w) << "token " << t << " of rank " << src << " row " << j;
        }
      }
    }

    // Send positions of the own tokens.
    const auto send_pos = download(v.send_pos, size_t(pc.tokens[r]) * W);
    for (int t = 0; t < pc.tokens[r]; ++t)
      for (int d = 0; d < W; ++d)
        ASSERT_EQ(send_pos[size_t(t) * W + d], host.send_pos(r, t, d)) << "token " << t << " dst " << d;

    // M tiles and the layer0 order.
    const Layer0Schedule s0 = build_layer0_schedule(c, host, r, pc.stages);
    ASSERT_EQ(counts[0], int(s0.m_tiles.size()));
    const int nm = counts[0];
    const auto m_row = download(v.m_tile_row, nm), m_rows = download(v.m_tile_rows, nm),
               m_last = download(v.m_tile_last, nm), order = download(v.layer0_order, nm);
    for (int m = 0; m < nm; ++m) {
      EXPECT_EQ(m_row[m], s0.m_tiles[m].row_begin) << "tile " << m;
      EXPECT_EQ(m_rows[m], s0.rows_expected(m)) << "tile " << m;
      EXPECT_EQ(m_last[m], s0.m_tiles[m].last_source_pos) << "tile " << m;
      EXPECT_EQ(order[m], s0.order[m]) << "order " << m;
    }
    // Where each A row of the M tiles comes from (the dispatch in row order): every received
    // token's rows name its ring position and token, every padding row -1.
    const auto row_source = download(v.row_source, size_t(nm) * kGemmBlockM);
    std::vector<int> want_source(row_source.size(), -1);
    for (int pos = 0; pos < W; ++pos)
      for (int i = 0; i < psum[pos + 1] - psum[pos]; ++i)
        for (int j = 0; j < R; ++j) {
          const int row = recv_rows[size_t(psum[pos] + i) * R + j];
          if (row >= 0) want_source.at(size_t(row)) = (pos << kRowSourceTokenBits) | tokens[psum[pos] + i];
        }
    for (size_t row = 0; row < row_source.size(); ++row)
      ASSERT_EQ(row_source[row], want_source[row]) << "A row " << row;
    // The combine list (slots in order: all, or with the epilogue combine those with two or more
    // rows) and where GEMM1's epilogue stores each A row (a single row: its owner's slot).
    std::vector<int> want_list;
    std::vector<RowCombine> want_combine(row_source.size(), RowCombine{nullptr, 0.f, 0});
    for (int pos = 0; pos < W; ++pos)
      for (int i = 0; i < psum[pos + 1] - psum[pos]; ++i) {
        const int slot = psum[pos] + i;
        int n = 0;
        while (n < R && recv_rows[size_t(slot) * R + n] >= 0) ++n;
        if (!singles || n >= 2) {
          want_list.push_back(slot);
          continue;
        }
        const int owner = (r + pos) % W;
        want_combine.at(size_t(recv_rows[size_t(slot) * R])) = RowCombine{
            static_cast<char*>(heaps[owner]) + combine_offset + (int64_t(r) * c.max_tokens_per_rank + i) * c.model.hidden * 2,
            recv_w[size_t(slot) * R], 0};
      }
    ASSERT_EQ(counts[3], int(want_list.size()));
    EXPECT_EQ(download(v.combine_slots, want_list.size()), want_list);
    const auto row_combine = download(v.row_combine, row_source.size());
    for (size_t row = 0; row < row_combine.size(); ++row) {
      ASSERT_EQ(row_combine[row].dst, want_combine[row].dst) << "A row " << row;
      ASSERT_EQ(row_combine[row].weight, want_combine[row].weight) << "A row " << row;
    }
    // GEMM tile lists: every (M tile, column block) once; layer0 groups follow the order.
    const auto n_tiles = download(v.num_tiles, 2);
    ASSERT_EQ(n_tiles[0], nm * int(layout.n_blocks0));
    // Layer1 at DevicePlanArgs::layer1_width's default, 256-column blocks (the layout is sized
    // for the narrowest, 128).
    const int n_blocks1 = gemm_num_n_blocks(GemmEpilogue::kIdentity, c.model.hidden, GemmKernel::kCooperative128x256);
    ASSERT_LE(n_blocks1, int(layout.n_blocks1));
    // Cut M tiles only where the half tiles go last (no combine slots), as the host mirror says.
    const int cuts = counts[3] == 0 ? layer1_cut_m_tiles(E, [&](int e) { return host.expert_rows(r, e); }, n_blocks1,
                                                         args.layer1_grid)
                                    : 0;
    ASSERT_EQ(n_tiles[1], (nm + cuts) * n_blocks1);
    ASSERT_LE(n_tiles[1], layout.max_tiles1);
    cut_ranks += cuts > 0 ? 1 : 0;
    const auto t0 = download(v.tiles0, n_tiles[0]);
    std::vector<int> seen(size_t(nm) * layout.n_blocks0, 0);
    for (const GemmTile& t : t0) {
      ASSERT_GE(t.signal, 0);
      ASSERT_LT(t.signal, nm);
      EXPECT_EQ(t.m_row, m_row[t.signal]);
      EXPECT_GE(t.m_row, host.expert_row_begin(r, t.expert)) << "tile of the wrong expert";
      EXPECT_LT(t.m_row, host.expert_row_begin(r, t.expert) + host.expert_rows(r, t.expert));
      EXPECT_EQ(t.rows, std::min(kGemmBlockM, host.expert_row_begin(r, t.expert) + host.expert_rows(r, t.expert) - t.m_row))
          << "the expert's rows in the tile";
      ++seen[size_t(t.signal) * layout.n_blocks0 + t.n_block];
    }
    for (int x : seen) EXPECT_EQ(x, 1);
    // Layer1: every (M tile, column block) once, or a cut M tile's two halves, rows [0, 64) and
    // [64, rows) of it; with no combine slots, no whole tile after a half one (rows <= 64),
    // since nothing waits for its column blocks; with combine slots, the column groups' raster
    // itself.
    std::vector<int> seen1(size_t(nm) * n_blocks1, 0), rows1(size_t(nm) * n_blocks1, 0);
    int cut_halves = 0;
    bool half_seen = false;
    int half_tiles = 0;
    const int group1 = default_raster_group(TileOrder::kColumnBlockMajor, 256);
    const auto t1 = download(v.tiles1, n_tiles[1]);
    for (size_t i = 0; i < t1.size(); ++i) {
      const GemmTile& t = t1[i];
      if (counts[3] > 0) {
        int want_m = 0, want_n = 0;
        raster_tile(TileOrder::kColumnBlockMajor, group1, int64_t(i), nm, n_blocks1, want_m, want_n);
        ASSERT_EQ(t.signal, want_m) << "layer1 entry " << i;
        ASSERT_EQ(t.n_block, want_n) << "layer1 entry " << i;
      }
      ASSERT_GE(t.signal, 0);
      ASSERT_LT(t.signal, nm);
      ASSERT_GE(t.n_block, 0);
      ASSERT_LT(t.n_block, n_blocks1);
      const int tile_rows = std::min(kGemmBlockM, host.expert_row_begin(r, t.expert) + host.expert_rows(r, t.expert) -
                                                     m_row[t.signal]);
      const bool cut_tile = tile_rows > kGemmBlockM / 2 && t.rows <= kGemmBlockM / 2;
      if (cut_tile) {
        ++cut_halves;
        const bool second = t.m_row != m_row[t.signal];
        EXPECT_EQ(t.m_row, m_row[t.signal] + (second ? kGemmBlockM / 2 : 0)) << "layer1 entry " << i;
        EXPECT_EQ(t.rows, second ? tile_rows - kGemmBlockM / 2 : kGemmBlockM / 2) << "layer1 entry " << i;
      } else {
        EXPECT_EQ(t.m_row, m_row[t.signal]);
        EXPECT_EQ(t.rows, tile_rows) << "the expert's rows in the layer1 tile";
      }
      ++seen1[size_t(t.signal) * n_blocks1 + t.n_block];
      rows1[size_t(t.signal) * n_blocks1 + t.n_block] += t.rows;
      const bool half = t.rows <= kGemmBlockM / 2;
      half_tiles += half ? 1 : 0;
      if (counts[3] == 0) EXPECT_FALSE(half_seen && !half) << "a whole layer1 tile after a half one, M tile " << t.signal;
      half_seen |= half;
    }
    for (int m = 0; m < nm; ++m)
      for (int n = 0; n < n_blocks1; ++n) {
        const size_t at = size_t(m) * n_blocks1 + n;
        EXPECT_EQ(seen1[at], m_rows[m] > kGemmBlockM / 2 && m_rows[m] < kGemmBlockM && cuts > 0 ? 2 : 1)
            << "M tile " << m << " column block " << n;
        EXPECT_EQ(rows1[at], m_rows[m]) << "rows of M tile " << m << " column block " << n;
      }
    EXPECT_EQ(cut_halves, 2 * cuts * n_blocks1);
    if (counts[3] == 0 && half_tiles > 0) ++reordered_ranks;
  }
  // Some rank's list cut a tile (the cases with one expert per rank and no combine slots).
  if (GetParam().world == 8 && GetParam().tp == 1 && GetParam().num_experts == 8)
    EXPECT_GT(cut_ranks, 0) << "no rank's layer1 list cut an M tile";
  // The reordered list must have run somewhere in the suite's cases (one expert per rank).
  if (GetParam().world == 8 && GetParam().tp == 1 && GetParam().num_experts == 8)
    EXPECT_GT(reordered_ranks, 0) << "no rank had a half layer1 tile and no combine slots";
}

INSTANTIATE_TEST_SUITE_P(Cases, DevicePlanTest, ::testing::ValuesIn(plan_cases()),
                         [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(DevicePlan, BadInputIsRecordedNotWritten) {
  COMET_REQUIRE_GPU();
  const PlanCase pc{4, 1, 8, 2, 64, {64, 10, 20, 30}, {}, 3};
  const LayerConfig c = pc.config();
  std::vector<Routing> routing;
  for (int r = 0; r < 4; ++r) routing.push_back(generate_routing(pc.spec, pc.tokens[r], 8, 2, 3, r));
  const DevicePlanLayout layout(c);
  DeviceBuffer<char> buffer(layout.total_bytes());
  DeviceBuffer<DeviceError> error(1);
  auto run = [&](const std::vector<Routing>& rt, int token_count_of_rank2) {
    DeviceRouting dr = upload_routing(c, rt);
    dr.counts[2].upload({token_count_of_rank2});
    error.zero();
    DevicePlanArgs args;
    args.rank = 0;
    args.token_counts = dr.count_table.get();
    args.route_ids = dr.id_table.get();
    args.route_weights = dr.weight_table.get();
    args.plan = layout.view(buffer.get());
    args.error = error.get();
    build_device_plan(c, args, nullptr);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    return error.download()[0];
  };
  DeviceError e = run(routing, 65);  // more than T_max = 64
  ASSERT_EQ(e.claimed, 1);
  EXPECT_EQ(e.role, int(WaitRole::kBadTokenCount));
  EXPECT_EQ(e.signal, 2);
  EXPECT_EQ(e.observed, 65u);
  EXPECT_NE(describe(e).find("bad input from rank 2"), std::string::npos) << describe(e);
  auto bad = routing;
  bad[3].expert_ids[5] = 99;
  e = run(bad, 20);
  ASSERT_EQ(e.claimed, 1);
  EXPECT_EQ(e.role, int(WaitRole::kBadExpertId));
  EXPECT_EQ(e.signal, 3);
  EXPECT_EQ(e.observed, 99u);
  // An expert repeated within a token (rank 1, token 2): the plan is refused, not filled in.
  bad = routing;
  bad[1].expert_ids[2 * 2] = 5;
  bad[1].expert_ids[2 * 2 + 1] = 5;
  e = run(bad, 20);
  ASSERT_EQ(e.claimed, 1);
  EXPECT_EQ(e.role, int(WaitRole::kRepeatedExpert));
  EXPECT_EQ(e.signal, 1);
  EXPECT_EQ(e.observed, 5u);
  const DevicePlanView v = layout.view(buffer.get());
  EXPECT_EQ(download(v.num_tiles, 2), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(download(v.recv_psum, 5), (std::vector<int32_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(download(v.counts, 4)[3], 0) << "a refused plan lists slots for the combine";
  e = run(routing, 20);
  EXPECT_EQ(e.claimed, 0) << describe(e);
}

// A host-side check (runs without a GPU): a plan sized for no tokens is refused by name.
TEST(DevicePlan, RefusesZeroMaxTokens) {
  PlanCase pc{2, 1, 8, 2, 0, {0, 0}, {}, 1};
  try {
    const DevicePlanLayout layout(pc.config());
    FAIL() << "a layout for max_tokens_per_rank = 0 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens_per_rank >= 1"), std::string::npos) << e.what();
  }
}

// The host's words for a record (no GPU needed): input errors signed, a weight as a float,
// a timeout with its signal.
TEST(DeviceError, DescribesInputErrorsAndTimeouts) {
  const DeviceError count{.claimed = 1, .rank = 1, .role = int32_t(WaitRole::kBadTokenCount), .signal = 2,
                          .expected = 64, .observed = uint64_t(int64_t(-3))};
  EXPECT_EQ(describe(count),
            "rank 1: bad input from rank 2: expected token count within [0, T_max] (bound 64), got -3");
  const DeviceError repeat{.claimed = 1, .rank = 1, .role = int32_t(WaitRole::kRepeatedExpert), .signal = 2,
                           .expected = 8, .observed = 5};
  EXPECT_EQ(describe(repeat), "rank 1: bad input from rank 2: expected each expert at most once per token, got "
                              "expert 5 twice in one token's top-k");
  const DeviceError weight{.claimed = 1, .rank = 1, .role = int32_t(WaitRole::kBadWeight), .signal = 2,
                           .observed = 0x7fc00000u};  // a quiet NaN
  EXPECT_EQ(describe(weight), "rank 1: bad input from rank 2: expected a finite routing weight, got nan");
  const DeviceError timeout{.claimed = 1, .rank = 1, .role = int32_t(WaitRole::kGemmTileInput), .block = 37,
                            .signal = 5, .layer = 0, .expected = 128, .observed = 64};
  EXPECT_EQ(describe(timeout), "rank 1 layer0 block 37: timed out waiting for GEMM tile input (rows of an M tile), "
                               "signal 5 >= 128, observed 64");
  const DeviceError barrier{.claimed = 1, .rank = 0, .role = int32_t(WaitRole::kBarrier), .block = 0,
                            .signal = 1, .expected = 4, .observed = 3};
  EXPECT_EQ(describe(barrier), "rank 0 block 0: timed out waiting for " + std::string(wait_role_name(WaitRole::kBarrier)) +
                                   ", signal 1 >= 4, observed 3 (1 arrival(s) of other ranks missing: a peer stopped, "
                                   "failed before this barrier, or runs another sequence of forwards)");
  EXPECT_EQ(describe(DeviceError{}), "no error");
}

}  // namespace
}  // namespace comet::cuda
