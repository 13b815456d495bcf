// ref/trace_test.cpp: the CPU backend's timeline (RefOptions::trace) and its writers: one
// event per GEMM tile and communication chunk, valid times and lanes, nothing when off; the
// Chrome trace is JSON with every event, the SVG draws, merges or culls every event.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/trace_writers.h"
#include "ref_cases.h"
#include "support/file_size_limit.h"

namespace comet {
namespace {

TEST(Trace, OneEventPerTileAndChunkWithValidTimesAndLanes) {
  test::RefCase c;
  c.model = {"trace", 32, 48, 8, 2, Activation::kSwiGlu};
  c.world = 4, c.tp = 2, c.ep = 2;
  c.t_max = 40;
  c.tokens = {40, 7, 0, 33};
  c.tiles = {8, 16, 16};
  c.seed = 3;
  c.options.comm_chunk_tokens = 4;
  const MoeProblem p = c.problem();
  ref::RefOptions o = c.options;
  o.trace = true;
  ref::RefBackend backend(c.config(), o);
  backend.set_weights(p.weights);
  backend.forward(p.x, p.routing);
  const Trace& t = backend.last_trace();
  ASSERT_EQ(t.world, 4);
  EXPECT_EQ(t.comm_lanes, o.comm_workers);
  EXPECT_EQ(t.compute_lanes, o.compute_workers);

  // Expected counts from the same plan and schedules the backend ran.
  const LayerConfig cfg = c.config();
  const DispatchPlan plan(cfg, p.routing);
  int64_t gemm0 = 0, gemm1 = 0, chunks0 = 0, chunks1 = 0;
  for (int r = 0; r < 4; ++r) {
    const Layer0Schedule s0 = build_layer0_schedule(cfg, plan, r);
    gemm0 += int64_t(s0.m_tiles.size()) * s0.num_n_blocks;
    gemm1 += build_layer1_schedule(cfg, plan, r).num_tiles();
    chunks0 += int64_t(build_layer0_comm_chunks(plan, r, o.comm_chunk_tokens).size());
    chunks1 += int64_t(build_layer1_comm_chunks(plan, r, o.comm_chunk_tokens).size()) * cfg.num_col_blocks1();
  }
  int64_t got[3][4] = {};
  for (const TraceEvent& e : t.events) {
    ASSERT_GE(e.begin_ns, 0);
    ASSERT_LE(e.begin_ns, e.end_ns);
    ASSERT_GE(e.rank, 0);
    ASSERT_LT(e.rank, 4);
    ASSERT_GE(e.layer, 0);
    ASSERT_LE(e.layer, 2);
    if (e.kind == TraceKind::kCommChunk) {
      EXPECT_LT(e.lane, t.comm_lanes);
    }
    if (e.kind == TraceKind::kGemmTile) {
      EXPECT_GE(e.lane, t.comm_lanes);
    }
    ++got[e.layer][int(e.kind)];
  }
  EXPECT_EQ(got[0][int(TraceKind::kGemmTile)], gemm0);
  EXPECT_EQ(got[1][int(TraceKind::kGemmTile)], gemm1);
  EXPECT_EQ(got[0][int(TraceKind::kCommChunk)], chunks0);
  EXPECT_EQ(got[1][int(TraceKind::kCommChunk)], chunks1);
  EXPECT_EQ(got[2][int(TraceKind::kReduce)], 4);

  // Writers: every event in the JSON, every event drawn in the SVG.
  const nlohmann::json j = nlohmann::json::parse(io::chrome_trace_json(t));
  int64_t complete = 0, layer_markers = 0;
  for (const auto& ev : j["traceEvents"])
    if (ev["ph"] == "X") (ev["cat"] == "layer" ? layer_markers : complete) += 1;
  EXPECT_EQ(complete, int64_t(t.events.size()));
  EXPECT_EQ(layer_markers, 4 * 3);  // layer0, layer1 and the owner reduce of each rank
  io::TimelineStats stats;
  const std::string svg = io::timeline_svg(t, {}, &stats);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  size_t rects = 0;
  for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) ++rects;
  EXPECT_EQ(int64_t(rects), stats.bars + 1 + 4 + 4);  // + background, legend, one lane box per rank
  EXPECT_EQ(stats.bars + stats.merged + stats.culled, int64_t(t.events.size()));  // every event accounted for

  // No trace: no events.
  o.trace = false;
  backend.set_options(o);
  backend.forward(p.x, p.routing);
  EXPECT_TRUE(backend.last_trace().events.empty());
}

TEST(Trace, WriteTraceFilesWritesJsonAndSvg) {
  Trace t;
  t.title = "t";
  t.world = t.comm_lanes = t.compute_lanes = 1;
  t.events = {make_trace_event(0, 0, 0, TraceKind::kCommChunk, 0, 0, 10),
              make_trace_event(0, 0, 1, TraceKind::kGemmTile, 0, 5, 20)};
  const std::string base = ::testing::TempDir() + "comet_trace_test";
  io::write_trace_files(t, base + ".json");
  std::ifstream json(base + ".json"), svg(base + ".svg");
  ASSERT_TRUE(json.good());
  ASSERT_TRUE(svg.good());
  std::stringstream ss;
  ss << svg.rdbuf();
  EXPECT_NE(ss.str().find("</svg>"), std::string::npos);
  EXPECT_THROW(io::write_trace_files(t, "/nonexistent/dir/t.json"), Error);
}

// A title that is not UTF-8 (a --trace path or device name in it) is written with U+FFFD, not
// refused after the traced run.
TEST(Trace, ChromeTraceJsonReplacesBytesThatAreNotUtf8) {
  Trace t;
  t.title = "run \xff";
  t.world = t.comm_lanes = t.compute_lanes = 1;
  t.events = {make_trace_event(0, 0, 0, TraceKind::kCommChunk, 0, 0, 10)};
  std::string text;
  ASSERT_NO_THROW(text = io::chrome_trace_json(t));
  EXPECT_EQ(nlohmann::json::parse(text)["otherData"]["title"], "run \xef\xbf\xbd");
}

// The per-row and per-process names of `bench layer` and `run --fabric nccl`: the suffix goes
// before ".json", and each process of a multi-process run gets a file of its own.
TEST(Trace, TracePathWithSuffixNamesEachRanksFile) {
  EXPECT_EQ(io::trace_path_with_suffix("dir/t.json", io::trace_rank_suffix(3)), "dir/t-rank3.json");
  EXPECT_EQ(io::trace_path_with_suffix("t", io::trace_rank_suffix(0)), "t-rank0.json");
  EXPECT_EQ(io::trace_path_with_suffix("t.json", ""), "t.json");
  EXPECT_EQ(io::trace_path_with_suffix(".json", "-rank1"), ".json-rank1.json");
  EXPECT_NE(io::trace_path_with_suffix("t.json", io::trace_rank_suffix(0)),
            io::trace_path_with_suffix("t.json", io::trace_rank_suffix(1)));
  EXPECT_EQ(io::trace_svg_path(io::trace_path_with_suffix("t.json", "-rank1")), "t-rank1.svg");
}

// A trace that cannot be written completely (here a file size limit, as a full disk) is reported,
// even when it is small enough to sit in the stream's buffer until the file is closed, and the
// previous trace files stay whole.
TEST(Trace, WriteTraceFilesReportsAFailedWriteAndKeepsTheOldFiles) {
  Trace t;
  t.title = "t";
  t.world = t.comm_lanes = t.compute_lanes = 1;
  t.events = {make_trace_event(0, 0, 0, TraceKind::kCommChunk, 0, 0, 10)};
  const std::string path = ::testing::TempDir() + "comet_trace_limit_test.json";
  io::write_trace_files(t, path);
  const auto read = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string old_json = read(path), old_svg = read(io::trace_svg_path(path));
  ASSERT_GT(old_json.size(), 16u);
  t.title = "a longer title than the old trace's";
  std::string message;
  const bool threw = [&] {
    const test::FileSizeLimit limit(16);
    try {
      io::write_trace_files(t, path);
    } catch (const Error& e) {
      message = e.what();
      return true;
    }
    return false;
  }();
  EXPECT_TRUE(threw);
  EXPECT_NE(message.find("trace " + path + ": write failed"), std::string::npos) << message;
  EXPECT_EQ(read(path), old_json);
  EXPECT_EQ(read(io::trace_svg_path(path)), old_svg);
  EXPECT_FALSE(std::ifstream(path + ".tmp").good()) << "the temporary file is left behind";
  std::remove(path.c_str());
  std::remove(io::trace_svg_path(path).c_str());
}

}  // namespace
}  // namespace comet
