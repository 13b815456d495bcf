// unit/kernel_trace_test.cpp: the fused kernels' trace records (core/kernel_trace.h) as a
// comet::Trace, and GPU traces through the writers (io/trace_writers.h): one event per record,
// zero-length waits left out, times from the first event, overflow counted; in the Chrome JSON
// one track per (layer, block, warp) with no overlapping slices, layer markers, colours per
// kind; in the SVG one panel per (rank, layer) kernel, one lane per block, colours per kind,
// merging and culling that keep the file small, rank selection.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/kernel_trace.h"
#include "io/trace_writers.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::throws_with;

KernelTraceEvent record(int rank, int layer, int block, int warp, TraceKind kind, int id, uint64_t begin,
                        uint64_t end, int items = 1) {
  KernelTraceEvent e{};
  e.begin_ns = begin;
  e.end_ns = end;
  e.id = id;
  e.items = items;
  e.rank = int16_t(rank);
  e.block = int16_t(block);
  e.warp = uint8_t(warp);
  e.kind = uint8_t(kind);
  e.layer = uint8_t(layer);
  return e;
}

constexpr uint64_t kT0 = 1'000'000'000'000ull;  // a %globaltimer reading
constexpr int kBlocks = 8;
constexpr KernelTraceShape kShape{2, kBlocks, {3, 1}};

// What two ranks' fused kernels would write: GEMM tiles with the static stride over the GEMM
// blocks, back to back, 10 us each; layer0 producer waits (every other one took no time); comm
// chunks of 8 items by every warp of the comm blocks, overlapping; layer1 comm waits; rank 1's
// layer1 lost 5 chunk records to a full buffer.
struct Fixture {
  std::vector<KernelTraceRecords> kernels;
  int tiles[2] = {20, 12};
  int64_t waits_kept = 0, chunks = 0;
  Fixture() {
    for (int r = 0; r < 2; ++r)
      for (int layer = 0; layer < 2; ++layer) {
        KernelTraceRecords k;
        k.rank = r;
        k.layer = layer;
        const uint64_t start = kT0 + uint64_t(r * 2 + layer) * 1'000'000;  // kernels one after another
        const int comm = kShape.n_comm[layer], gemm_blocks = kBlocks - comm;
        for (int t = 0; t < tiles[layer]; ++t) {
          const int block = comm + t % gemm_blocks;
          const uint64_t b = start + uint64_t(t / gemm_blocks) * 10'000;
          k.tiles.push_back(record(r, layer, block, 4, TraceKind::kGemmTile, t, b, b + 10'000));
          if (layer == 0) {
            const bool waited = t % 2 == 0;
            k.waits.push_back(record(r, 0, block, 0, TraceKind::kWait, t / 2, b, waited ? b + 3'000 : b));
            waits_kept += waited;
          }
        }
        for (int block = 0; block < comm; ++block)
          for (int warp = 0; warp < 12; ++warp) {
            const uint64_t b = start + uint64_t(warp) * 100;
            k.chunks.push_back(record(r, layer, block, warp, TraceKind::kCommChunk, warp * 8, b, b + 2'000, 8));
            ++chunks;
          }
        if (layer == 1) {
          k.chunks.push_back(record(r, 1, 0, 3, TraceKind::kWait, 1, start + 5'000, start + 9'000));
          k.chunks.push_back(record(r, 1, 0, 4, TraceKind::kWait, 1, start + 5'000, start + 5'000));  // no time
          ++waits_kept;
        }
        k.chunk_count = int64_t(k.chunks.size()) + (r == 1 && layer == 1 ? 5 : 0);
        kernels.push_back(k);
      }
  }
  int64_t kept() const { return 2 * (tiles[0] + tiles[1]) + waits_kept + chunks; }
};

int64_t count(const Trace& t, TraceKind kind, int layer = -1) {
  int64_t n = 0;
  for (const TraceEvent& e : t.events) n += e.kind == kind && (layer < 0 || e.layer == layer);
  return n;
}

TEST(KernelTrace, EveryRecordBecomesOneEventFromTheFirstBegin) {
  const Fixture f;
  const Trace t = make_kernel_trace(kShape, f.kernels);
  EXPECT_EQ(t.world, 2);
  EXPECT_TRUE(t.layer_panels);
  EXPECT_EQ(t.comm_lanes_of(0), 3);
  EXPECT_EQ(t.comm_lanes_of(1), 1);
  EXPECT_EQ(t.comm_lanes + t.compute_lanes, kBlocks);
  EXPECT_EQ(int64_t(t.events.size()), f.kept());
  EXPECT_EQ(count(t, TraceKind::kGemmTile, 0), 2 * f.tiles[0]);
  EXPECT_EQ(count(t, TraceKind::kGemmTile, 1), 2 * f.tiles[1]);
  EXPECT_EQ(count(t, TraceKind::kWait), f.waits_kept);  // waits that took no time are left out
  EXPECT_EQ(count(t, TraceKind::kCommChunk), f.chunks);
  EXPECT_EQ(t.dropped_events, 5);
  int64_t first = INT64_MAX;
  std::set<std::tuple<int, int, int>> tiles;
  for (const TraceEvent& e : t.events) {
    first = std::min(first, e.begin_ns);
    EXPECT_LE(e.begin_ns, e.end_ns);
    if (e.kind == TraceKind::kGemmTile) {
      EXPECT_TRUE(tiles.insert({e.rank, e.layer, e.id}).second) << "tile " << e.id << " twice";
      EXPECT_GE(e.lane, t.comm_lanes_of(e.layer));
      EXPECT_EQ(e.sublane, 4);
    }
    if (e.kind == TraceKind::kCommChunk) {
      EXPECT_LT(e.lane, t.comm_lanes_of(e.layer));
      EXPECT_EQ(e.items, 8);
    }
  }
  EXPECT_EQ(first, 0);
  EXPECT_EQ(t.events.front().begin_ns, 0);  // sorted by rank, layer, lane, warp, begin
  EXPECT_EQ(t.events.back().rank, 1);
}

TEST(KernelTrace, RefusesUnwrittenTilesAndRecordsOutOfRange) {
  Fixture f;
  f.kernels[1].tiles[7].end_ns = 0;  // the kernel never stored tile 7
  EXPECT_TRUE(throws_with<Error>([&] { make_kernel_trace(kShape, f.kernels); }, {"tile 7", "rank 0 layer1"}));
  Fixture g;
  g.kernels[2].chunks[0].block = kBlocks;
  EXPECT_TRUE(throws_with<Error>([&] { make_kernel_trace(kShape, g.kernels); }, {"out of range", "block 8"}));
  Fixture h;
  h.kernels[3].tiles[0].kind = 9;
  EXPECT_TRUE(throws_with<Error>([&] { make_kernel_trace(kShape, h.kernels); }, {"kind 9"}));
}

// Chrome JSON of a GPU trace.
TEST(KernelTrace, ChromeJsonHasOneTrackPerBlockAndWarpLayerMarkersAndColours) {
  const Fixture f;
  Trace t = make_kernel_trace(kShape, f.kernels);
  t.title = "test <trace>";
  const nlohmann::json j = nlohmann::json::parse(io::chrome_trace_json(t));
  EXPECT_EQ(j["otherData"]["dropped_events"], 5);
  EXPECT_EQ(j["otherData"]["title"], "test <trace>");
  std::map<std::string, int64_t> per_cat;
  std::map<std::pair<int, int64_t>, std::vector<std::pair<double, double>>> tracks;
  std::map<std::pair<int, int64_t>, std::string> names;
  std::set<std::string> cnames[4];
  std::set<std::pair<int, int>> markers;
  for (const auto& ev : j["traceEvents"]) {
    const std::pair<int, int64_t> track{ev["pid"].get<int>(), ev.value("tid", int64_t(-1))};
    if (ev["ph"] == "M" && ev["name"] == "thread_name") names[track] = ev["args"]["name"];
    if (ev["ph"] != "X") continue;
    const std::string cat = ev["cat"];
    ++per_cat[cat];
    if (cat == "layer") {
      markers.insert({ev["pid"].get<int>(), ev["args"]["layer"].get<int>()});
      continue;
    }
    for (TraceKind k : {TraceKind::kCommChunk, TraceKind::kGemmTile, TraceKind::kWait, TraceKind::kReduce})
      if (cat == trace_kind_name(k)) cnames[int(k)].insert(ev["cname"].get<std::string>());
    tracks[track].push_back({ev["ts"].get<double>(), ev["ts"].get<double>() + ev["dur"].get<double>()});
  }
  EXPECT_EQ(per_cat["gemm"], 2 * (f.tiles[0] + f.tiles[1]));
  EXPECT_EQ(per_cat["comm"], f.chunks);
  EXPECT_EQ(per_cat["wait"], f.waits_kept);
  EXPECT_EQ(markers, (std::set<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
  // One colour per kind, different for communication and computation.
  ASSERT_EQ(cnames[int(TraceKind::kCommChunk)].size(), 1u);
  ASSERT_EQ(cnames[int(TraceKind::kGemmTile)].size(), 1u);
  EXPECT_NE(*cnames[int(TraceKind::kCommChunk)].begin(), *cnames[int(TraceKind::kGemmTile)].begin());
  // Slices of one track never overlap (Perfetto needs them nested): comm warps of a block and
  // a block's producer waits each have their own track.
  for (auto& [track, spans] : tracks) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_GE(spans[i].first, spans[i - 1].second) << names[track];
    ASSERT_TRUE(names.count(track)) << "unnamed track " << track.second;
  }
  // Rank 0 layer0: 3 comm blocks x 12 warps, 5 GEMM blocks x (consumer + producer) tracks.
  int comm_tracks = 0, gemm_tracks = 0;
  for (const auto& [track, name] : names) {
    if (track.first != 0 || track.second / 1000000 != 0) continue;
    comm_tracks += name.rfind("L0 comm block", 0) == 0;
    gemm_tracks += name.rfind("L0 gemm block", 0) == 0;
  }
  EXPECT_EQ(comm_tracks, 3 * 12);
  EXPECT_EQ(gemm_tracks, 5 * 2);
  EXPECT_EQ(names[std::make_pair(0, int64_t(0))], "layer0");
  EXPECT_EQ(names[std::make_pair(1, int64_t(1000000))], "layer1");
}

// Bars per kind group in the SVG: <g class="kind" fill="colour"> ... </g>.
std::map<std::string, std::set<std::string>> group_fills(const std::string& svg) {
  std::map<std::string, std::set<std::string>> fills;
  const std::regex group("<g class=\"([a-z]+)\" fill=\"(#[0-9a-f]{6})\">");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), group); it != std::sregex_iterator(); ++it)
    fills[(*it)[1]].insert((*it)[2]);
  return fills;
}

size_t occurrences(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(KernelTrace, SvgDrawsOnePanelPerKernelWithColoursPerKind) {
  const Fixture f;
  Trace t = make_kernel_trace(kShape, f.kernels);
  t.title = "a <title> & more";
  io::TimelineStats stats;
  const std::string svg = io::timeline_svg(t, {}, &stats);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("a &lt;title&gt; &amp; more"), std::string::npos);
  for (const char* panel : {">rank 0 layer0<", ">rank 0 layer1<", ">rank 1 layer0<", ">rank 1 layer1<"})
    EXPECT_EQ(occurrences(svg, panel), 1u) << panel;
  EXPECT_EQ(occurrences(svg, "fill=\"#eaf0f8\""), 2u);  // layer0 panel tint
  EXPECT_EQ(occurrences(svg, "fill=\"#f8efe6\""), 2u);  // layer1 panel tint
  const auto fills = group_fills(svg);
  ASSERT_EQ(fills.size(), 3u);  // comm, gemm, wait (no reduce on the GPU)
  EXPECT_EQ(fills.at("comm"), std::set<std::string>{"#1f77b4"});
  EXPECT_EQ(fills.at("gemm"), std::set<std::string>{"#ff7f0e"});
  EXPECT_EQ(fills.at("wait"), std::set<std::string>{"#8c8c8c"});
  // Every event drawn, merged into a bar or culled; the 12 overlapping warps of a comm block
  // are one bar; back-to-back tiles stay separate bars.
  EXPECT_EQ(stats.bars + stats.merged + stats.culled, int64_t(t.events.size()));
  EXPECT_EQ(stats.culled, 0);
  const int64_t comm_blocks = 2 * (3 + 1);
  const int64_t tile_bars = 2 * (f.tiles[0] + f.tiles[1]);
  EXPECT_EQ(stats.bars, comm_blocks + tile_bars + f.waits_kept);
  EXPECT_NE(svg.find("5 communication records dropped"), std::string::npos);
}

TEST(KernelTrace, SvgDrawsOnlyTheChosenRanks) {
  const Fixture f;
  const Trace t = make_kernel_trace(kShape, f.kernels);
  io::TimelineStats stats;
  io::TimelineOptions o;
  o.ranks = {1};
  const std::string svg = io::timeline_svg(t, o, &stats);
  EXPECT_EQ(svg.find(">rank 0 "), std::string::npos);
  EXPECT_NE(svg.find(">rank 1 layer1<"), std::string::npos);
  int64_t rank1 = 0;
  for (const TraceEvent& e : t.events) rank1 += e.rank == 1;
  EXPECT_EQ(stats.bars + stats.merged + stats.culled, rank1);
}

// 400k events of 1 ns each on one kernel: runs narrower than a pixel merge, isolated slivers
// are culled, and the file stays far under 2 MB.
TEST(KernelTrace, SvgMergesAndCullsEventsNarrowerThanAPixel) {
  KernelTraceRecords k;
  const int tiles = 200'000;
  for (int t = 0; t < tiles; ++t) {
    const int block = 1 + t % 7;
    const uint64_t b = kT0 + uint64_t(t / 7) * 2;  // dense: 1 ns tiles 2 ns apart per block
    k.tiles.push_back(record(0, 0, block, 4, TraceKind::kGemmTile, t, b, b + 1));
  }
  for (int i = 0; i < 200; ++i) {  // isolated 1 ns chunks, far apart
    const uint64_t b = kT0 + uint64_t(i) * 300;
    k.chunks.push_back(record(0, 0, 0, 0, TraceKind::kCommChunk, i, b, b + 1));
  }
  k.chunk_count = int64_t(k.chunks.size());
  const KernelTraceShape shape{1, kBlocks, {1, 1}};
  const Trace t = make_kernel_trace(shape, {k});
  io::TimelineStats stats;
  const std::string svg = io::timeline_svg(t, {}, &stats);
  EXPECT_EQ(stats.bars + stats.merged + stats.culled, int64_t(t.events.size()));
  EXPECT_EQ(stats.bars, 7);            // one bar per GEMM block
  EXPECT_EQ(stats.culled, 200);        // every isolated chunk
  EXPECT_LT(svg.size(), size_t(100'000));
  EXPECT_NE(svg.find("200 events in bars narrower than half a pixel not drawn"), std::string::npos);
}

// The CPU backend's layout (one section per rank) with the same merging.
TEST(KernelTrace, CpuLayoutKeepsOneSectionPerRankAndTheLayerMarker) {
  Trace t;
  t.world = 2;
  t.comm_lanes = t.compute_lanes = 1;
  auto add = [&](int rank, int layer, int lane, TraceKind kind, int64_t begin, int64_t end) {
    t.events.push_back(make_trace_event(rank, layer, lane, kind, 0, begin, end));
  };
  for (int r = 0; r < 2; ++r) {
    add(r, 0, 0, TraceKind::kCommChunk, 0, 100);
    add(r, 0, 1, TraceKind::kGemmTile, 50, 400);
    add(r, 1, 1, TraceKind::kGemmTile, 500, 900);
    add(r, 2, 0, TraceKind::kReduce, 900, 1000);
  }
  io::TimelineStats stats;
  const std::string svg = io::timeline_svg(t, {}, &stats);
  EXPECT_EQ(stats.bars, 8);
  EXPECT_EQ(occurrences(svg, "stroke-dasharray"), 2u);  // layer1 starts, per rank
  EXPECT_EQ(group_fills(svg).size(), 3u);
}

}  // namespace
}  // namespace comet
