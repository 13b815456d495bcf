// GPU tests of the fused kernels' timeline (LayerOptions::trace, MoeLayer::read_trace; label
// `gpu`), W virtual ranks on one GPU (Loopback fabric): every GEMM tile of both layers exactly
// once (claimed tiles: on any block, but on a communication block only after its copies are
// done); communication records only on communication
// blocks (and, in layer1, on GEMM blocks' consumer warps after their last tile: they join the
// combine), covering every received token (layer0) and every combine item (layer1: tokens with
// two or more rows on the rank, the others' rows go from GEMM1's epilogue) exactly
// once; begin <= end; every kernel's events inside the forward and before the next kernel's;
// the output with tracing on bitwise equal to tracing off; a small buffer drops and counts.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "comet/layer.h"
#include "comet/plan.h"
#include "comet/problem.h"
#include "cuda/comm_rows.cuh"
#include "cuda/device_plan.h"
#include "cuda/device_problem.h"
#include "fabric/fabric.h"
#include "gpu_test_util.h"
#include "io/trace_writers.h"
#include "layer_cases.h"
#include "layer_rig.h"

namespace comet {
namespace {

using test::LayerCase;


std::string event_summary(const TraceEvent& e) {
  return "rank " + std::to_string(e.rank) + " layer" + std::to_string(e.layer) + " block " + std::to_string(e.lane) +
         " warp " + std::to_string(e.sublane) + " " + trace_kind_name(e.kind) + " " + std::to_string(e.id) + " [" +
         std::to_string(e.begin_ns) + ", " + std::to_string(e.end_ns) + "] ns";
}

using Rig = testing::LayerRig;

struct TracedRun {
  Trace trace;
  double forward_ns = 0;  // between CUDA events recorded before and after the forward
};

TracedRun traced_forward(Rig& rig, cudaStream_t stream) {
  cudaEvent_t around[2];
  for (cudaEvent_t& e : around) COMET_CUDA_CHECK(cudaEventCreate(&e));
  COMET_CUDA_CHECK(cudaEventRecord(around[0], stream));
  rig.layer.forward(rig.device.tensors(), stream);
  COMET_CUDA_CHECK(cudaEventRecord(around[1], stream));
  rig.layer.check(stream);
  float ms = 0;
  COMET_CUDA_CHECK(cudaEventElapsedTime(&ms, around[0], around[1]));
  for (cudaEvent_t e : around) cudaEventDestroy(e);
  return {rig.layer.read_trace(stream), ms * 1e6};
}

// The checks of one traced forward against the host plan of the same routing.
void check_trace(const TracedRun& run, const MoeLayer& layer, const MoeProblem& p) {
  const Trace& t = run.trace;
  const LayerConfig& c = layer.config();
  const DispatchPlan plan(c, p.routing);
  const int W = c.layout.world, grid = t.comm_lanes + t.compute_lanes;
  // A layer whose copies or combine run in the GEMM blocks has no communication blocks; there the
  // producer warpgroup's warps 1-3 run layer1's combine beside the block's tiles.
  const bool gemm_combine = layer.layer1_combine().combine == Layer1Combine::kGemmBlocks;
  const int n_comm[2] = {layer.layer0_mode().mode.copies == Layer0Copies::kGemmBlocks ? 0 : layer.n_comm().n_comm0,
                         gemm_combine ? 0 : layer.n_comm().n_comm1};
  ASSERT_EQ(t.world, W);
  ASSERT_TRUE(t.layer_panels);
  ASSERT_EQ(t.comm_lanes_of(0), n_comm[0]);
  ASSERT_EQ(t.comm_lanes_of(1), n_comm[1]);
  EXPECT_EQ(t.dropped_events, 0);
  // Per kernel (rank, layer): tiles seen, items moved, extent, last tile end per block.
  struct Kernel {
    std::map<int, int> tiles;  // id -> times seen
    int64_t items = 0, begin = INT64_MAX, end = 0;
    // (block, recording warp) -> begin of its last tile. Cooperative tiles are recorded by warp
    // 4 for both consumer warpgroups; ping-pong ones (layer1 with the combine in the GEMM blocks)
    // by warp 4 or 8, the first warp of the warpgroup that ran them.
    std::map<std::pair<int, int>, int64_t> last_tile_begin;
    std::map<int, int64_t> last_chunk_end;   // communication block -> end of its last chunk
  };
  std::map<std::pair<int, int>, Kernel> kernels;
  for (const TraceEvent& e : t.events) {
    ASSERT_GE(e.begin_ns, 0);
    ASSERT_LE(e.begin_ns, e.end_ns) << event_summary(e);
    ASSERT_GE(e.lane, 0);
    ASSERT_LT(e.lane, grid);
    ASSERT_TRUE(e.layer == 0 || e.layer == 1);
    // Inside the forward: from the first recorded event to no later than the forward's end.
    EXPECT_LE(double(e.end_ns), run.forward_ns * 1.02 + 20e3) << event_summary(e);
    Kernel& k = kernels[{e.rank, e.layer}];
    k.begin = std::min(k.begin, e.begin_ns);
    k.end = std::max(k.end, e.end_ns);
    const int nc = n_comm[e.layer];
    if (e.kind == TraceKind::kGemmTile) {
      ++k.tiles[e.id];
      // Communication blocks join the GEMM once their copies are done (checked below).
      if (e.layer == 1 && gemm_combine) EXPECT_TRUE(e.sublane == 4 || e.sublane == 8) << event_summary(e);
      else EXPECT_EQ(e.sublane, 4);  // consumer thread 0
      int64_t& last = k.last_tile_begin[{e.lane, e.sublane}];
      last = std::max(last, e.begin_ns);
    }
    if (e.kind == TraceKind::kCommChunk && e.lane < nc)
      k.last_chunk_end[e.lane] = std::max(k.last_chunk_end[e.lane], e.end_ns);
  }
  for (const TraceEvent& e : t.events) {
    const Kernel& k = kernels[{e.rank, e.layer}];
    const bool comm_block = e.lane < n_comm[e.layer];
    if (e.kind == TraceKind::kCommChunk) {
      kernels[{e.rank, e.layer}].items += e.items;
      EXPECT_GE(e.items, 1);
      // A layer0 warp opens a batch of kDispatchTokens items at once (trace_record.cuh).
      EXPECT_LE(e.items, cuda::kTraceChunkItems + (e.layer == 0 ? cuda::kDispatchTokens - 1 : 0));
    }
    if (e.kind == TraceKind::kCommChunk || (e.kind == TraceKind::kWait && e.layer == 1)) {
      if (e.layer == 0) {
        EXPECT_TRUE(comm_block) << "layer0 communication on GEMM block " << e.lane;
      } else if (gemm_combine && e.sublane >= 1 && e.sublane <= 3) {
        // the producer warpgroup's combine warps: beside the tiles
      } else if (!comm_block) {
        // A GEMM block's consumer warps join the combine once the block's tiles are done.
        EXPECT_GE(e.sublane, 4) << "layer1 communication on a GEMM block's producer warp";
        // Its last tile's end is read by thread 0 after the barrier that lets the other warps
        // go, so only the tile's begin (read before that barrier) orders against the join.
        const int tile_warp = gemm_combine && e.sublane >= 8 ? 8 : 4;  // its warpgroup's tiles
        const auto last = k.last_tile_begin.find({e.lane, tile_warp});
        if (last != k.last_tile_begin.end())
          EXPECT_GE(e.begin_ns, last->second) << "joined before its tiles were done: " << event_summary(e);
      }
    }
    if (e.kind == TraceKind::kWait && e.layer == 0) EXPECT_EQ(e.sublane, 0);  // the producer warp
    if ((e.kind == TraceKind::kGemmTile || (e.kind == TraceKind::kWait && e.layer == 0)) && comm_block) {
      // A communication block joins the GEMM once all its warps' copies are done.
      const auto last = k.last_chunk_end.find(e.lane);
      if (last != k.last_chunk_end.end())
        EXPECT_GE(e.begin_ns, last->second) << "joined the GEMM before its copies were done: " << event_summary(e);
    }
    EXPECT_NE(e.kind, TraceKind::kReduce);
  }
  // The events of one warp never overlap (one track each in the Chrome trace); events are
  // sorted by (rank, layer, block, warp, begin).
  for (size_t i = 1; i < t.events.size(); ++i) {
    const TraceEvent &a = t.events[i - 1], &b = t.events[i];
    if (std::tie(a.rank, a.layer, a.lane, a.sublane) == std::tie(b.rank, b.layer, b.lane, b.sublane))
      EXPECT_LE(a.end_ns, b.begin_ns) << event_summary(a) << " overlaps " << event_summary(b);
  }
  for (int r = 0; r < W; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // Received tokens (layer0's items in ring order; in row order its items are the A rows);
    // the combine moves those with two or more rows here (the others' only row went to its
    // owner from GEMM1's epilogue: LayerOptions::epilogue_combine, on).
    int64_t received = 0, combined = 0, a_rows = 0;
    std::vector<int> rows;
    for (int src = 0; src < W; ++src) {
      received += plan.send_count(src, r);
      for (int i = 0; i < plan.send_count(src, r); ++i) {
        rows.clear();
        plan.rows_of_sent_token(src, r, i, rows);
        combined += rows.size() >= 2;
        a_rows += int64_t(rows.size());
      }
    }
    const int64_t items0 = layer.layer0_mode().mode.order == DispatchOrder::kRows ? a_rows : received;
    const int64_t tiles0 = int64_t(build_layer0_schedule(c, plan, r).m_tiles.size()) *
                           build_layer0_schedule(c, plan, r).num_n_blocks;
    // Layer1's column width follows the combine (128 with it in the GEMM blocks); a combine group
    // is 1024 columns either way.
    LayerConfig c1 = c;
    c1.tiles.block_n1 = gemm_combine ? 128 : c.tiles.block_n1;
    // The cooperative layer1's list cuts last M tiles of 65-127 rows in two where the device
    // plan's rule says (half tiles last: no tokens through the combine; claimed on the grid).
    const int cuts = combined == 0 && layer.half_tiles() && !gemm_combine
                         ? cuda::layer1_cut_m_tiles(
                               c.experts_per_rank(), [&](int e) { return plan.expert_rows(r, e); }, c1.num_col_blocks1(), grid)
                         : 0;
    const int64_t tiles1 = build_layer1_schedule(c1, plan, r).num_tiles() + int64_t(cuts) * c1.num_col_blocks1();
    const int group_blocks = cuda::combine_group_blocks(c1.tiles.block_n1);
    const int groups = (c1.num_col_blocks1() + group_blocks - 1) / group_blocks;
    for (int layer = 0; layer < 2; ++layer) {
      const Kernel& k = kernels[{r, layer}];
      const int64_t want = layer == 0 ? tiles0 : tiles1;
      EXPECT_EQ(int64_t(k.tiles.size()), want) << "layer" << layer << " tiles";
      for (const auto& [id, seen] : k.tiles) {
        EXPECT_EQ(seen, 1) << "layer" << layer << " tile " << id;
        EXPECT_LT(id, want);
      }
      EXPECT_EQ(k.items, layer == 0 ? items0 : combined * groups) << "layer" << layer << " items moved";
    }
  }
  // Kernels run one after another on the stream: L0 of ranks 0..W-1, then L1 of ranks 0..W-1.
  for (int i = 0; i + 1 < 2 * W; ++i) {
    const auto a = kernels.find({i % W, i / W}), b = kernels.find({(i + 1) % W, (i + 1) / W});
    if (a == kernels.end() || b == kernels.end() || a->second.tiles.empty() || b->second.tiles.empty()) continue;
    EXPECT_LE(a->second.end, b->second.begin) << "kernel " << i << " overlaps the next";
  }
}

class LayerTraceTest : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerTraceTest, EveryTileOnceCommOnCommBlocksBitwiseEqualToUntraced) {
  COMET_REQUIRE_GPU();
  SCOPED_TRACE(GetParam().describe());
  Rig rig(GetParam());
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The row order's layer0 items are A rows, several per token: its records must fit too.
  // With layer1's combine in the GEMM blocks, its records come from their producer warps too.
  struct Variant {
    int n0, n1;
    DispatchOrder order;
    Layer1Combine combine1;
  };
  for (const Variant v : {Variant{16, 4, DispatchOrder::kRing, Layer1Combine::kCommBlocks},
                          {1, 1, DispatchOrder::kRing, Layer1Combine::kCommBlocks},
                          {16, 4, DispatchOrder::kRows, Layer1Combine::kCommBlocks},
                          {16, 4, DispatchOrder::kRing, Layer1Combine::kGemmBlocks}}) {
    SCOPED_TRACE("n_comm " + std::to_string(v.n0) + "/" + std::to_string(v.n1) + ", " + dispatch_order_name(v.order) +
                 ", combine1 " + layer1_combine_name(v.combine1));
    LayerOptions o;
    o.path = ForwardPath::kFused;
    o.n_comm0 = v.n0;
    o.n_comm1 = v.n1;
    o.layer0_copies = Layer0Copies::kCommBlocks;
    o.dispatch_order = v.order;
    o.layer1_combine = v.combine1;
    o.poison_workspace = true;  // the traced forward must move every row itself
    const auto untraced = rig.forward(o, stream);
    EXPECT_THROW(rig.layer.read_trace(stream), Error);  // the last forward was not traced
    o.trace = true;
    rig.layer.set_options(o);
    for (int call = 0; call < 2; ++call) {  // buffers are reset between traced calls
      SCOPED_TRACE("traced call " + std::to_string(call));
      rig.device.poison_y();
      const TracedRun run = traced_forward(rig, stream);
      EXPECT_EQ(rig.device.download_y(), untraced) << "tracing changed the output";
      check_trace(run, rig.layer, rig.problem);
    }
  }
  cudaStreamDestroy(stream);
}

// Many tiles per GEMM block (deepseek, 1024 tokens per rank), EP with TP, W = 8 with an empty rank.
INSTANTIATE_TEST_SUITE_P(
    Cases, LayerTraceTest,
    ::testing::Values(LayerCase{"deepseek-v3", 16, 4, 1, 1024, {1024, 700, 0, 1024}, {RoutingKind::kZipf, 1.1, 0.05}, 21},
                      LayerCase{"mixtral-8x7b", 16, 4, 2, 256, {256, 17, 200, 256}, {}, 5},
                      LayerCase{"qwen3-30b-a3b", 16, 8, 1, 128, {128, 0, 77, 128, 5, 128, 64, 128},
                                {RoutingKind::kZipf, 1.2, 0.1}, 9}),
    [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(LayerTrace, ASmallBufferDropsAndCountsCommunicationRecords) {
  COMET_REQUIRE_GPU();
  Rig rig(LayerCase{"deepseek-v3", 16, 4, 1, 512, {512, 300, 0, 512}, {}, 3});
  LayerOptions o;
  o.path = ForwardPath::kFused;
  o.n_comm0 = 8;
  o.n_comm1 = 2;
  const auto untraced = rig.forward(o, nullptr);
  o.trace = true;
  o.trace_chunk_capacity = 3;
  EXPECT_EQ(rig.forward(o, nullptr), untraced);
  const Trace t = rig.layer.read_trace(nullptr);
  EXPECT_GT(t.dropped_events, 0);
  std::map<std::pair<int, int>, int> comm_records, tiles;
  for (const TraceEvent& e : t.events) {
    if (e.kind == TraceKind::kGemmTile) ++tiles[{e.rank, e.layer}];
    else if (e.kind == TraceKind::kCommChunk || (e.kind == TraceKind::kWait && e.layer == 1))
      ++comm_records[{e.rank, e.layer}];
  }
  for (const auto& [kernel, n] : comm_records) EXPECT_LE(n, 3) << "rank " << kernel.first << " layer" << kernel.second;
  EXPECT_GT(tiles[std::make_pair(0, 0)], 0);  // tiles are kept: one slot each
  // The writers report the loss.
  const std::string svg = io::timeline_svg(t);
  EXPECT_NE(svg.find("communication records dropped"), std::string::npos);
}

TEST(LayerTrace, NeedsTheFusedKernels) {
  COMET_REQUIRE_GPU();
  const LayerConfig c = LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {}, {}, 1}.config();
  auto fabric = fabric::make_loopback_fabric(2);
  MoeLayer layer(c, *fabric);
  LayerOptions o;
  o.trace = true;
  EXPECT_THROW(layer.set_options(o), Error);
}

}  // namespace
}  // namespace comet
