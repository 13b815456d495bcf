// Tests of `comet bench layer`'s report (no GPU): a traced row prints and writes its timeline's
// hidden communication, an untraced one neither; each row says whether the epilogue combined;
// ranks that take turns on a GPU are described and counted as such.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "bench/layer_bench.h"

namespace comet::bench {
namespace {

LayerBenchRow row() {
  LayerBenchRow r;
  r.model = "mixtral-8x7b";
  r.routing = "uniform";
  r.fabric = "nccl";
  r.rank = 1;
  r.tokens = 4096;
  r.world = 2;
  r.ep = 2;
  r.tp = 1;
  r.n_comm0 = 32;
  r.n_comm1 = 2;
  r.fused_us = 100;
  r.unfused_us = 110;
  r.compute_us = 90;
  r.comm_us = 20;
  return r;
}

TEST(LayerReport, TracedRowsReportTheTimelinesHiddenCommunication) {
  LayerBenchRow traced = row();
  traced.trace_path = "x-rank1.json";
  traced.timeline[0] = {150.0, 149.7};
  traced.timeline[1] = {1100.0, 1045.0};
  const LayerBenchRow plain = row();

  std::ostringstream os;
  print_layer_table({traced, plain}, os);
  const std::string table = os.str();
  EXPECT_NE(table.find("timeline of rank 1 (x-rank1.json): layer0 communication 150.0 us, 99.8% of it during GEMM tiles, "
                       "layer1 communication 1100.0 us, 95.0% of it during GEMM tiles"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("timeline of rank", table.find("timeline of rank") + 1), std::string::npos)
      << "only the traced row has a timeline line\n"
      << table;

  const nlohmann::json j = nlohmann::json::parse(layer_rows_json({traced, plain}));
  ASSERT_EQ(j.size(), 2u);
  EXPECT_DOUBLE_EQ(j[0]["trace"]["comm_us"][1].get<double>(), 1100.0);
  EXPECT_DOUBLE_EQ(j[0]["trace"]["hidden_comm_us"][0].get<double>(), 149.7);
  EXPECT_NEAR(j[0]["trace"]["hidden_fraction"][1].get<double>(), 0.95, 1e-12);
  EXPECT_FALSE(j[1].contains("trace"));
}

// A --trace path that is not UTF-8 is written with U+FFFD, not refused after the whole benchmark ran.
TEST(LayerReport, JsonReplacesBytesThatAreNotUtf8) {
  LayerBenchRow traced = row();
  traced.trace_path = "t\xff-rank1.json";
  std::string text;
  ASSERT_NO_THROW(text = layer_rows_json({traced}));
  EXPECT_EQ(nlohmann::json::parse(text)[0]["trace"]["path"], "t\xef\xbf\xbd-rank1.json");
}

// The two rows' text under the table's right-aligned column `header_field` (its last character
// lines up with each value's): as many characters as the field has.
std::pair<std::string, std::string> column_of_two_rows(const LayerBenchRow& a, const LayerBenchRow& b,
                                                       const std::string& header_field) {
  std::ostringstream os;
  print_layer_table({a, b}, os);
  std::istringstream lines(os.str());
  std::string header, first, second;
  std::getline(lines, header);
  std::getline(lines, first);
  std::getline(lines, second);
  const size_t column = header.find(header_field);
  if (column == std::string::npos) return {"no column " + header_field, header};
  return {first.substr(column, header_field.size()), second.substr(column, header_field.size())};
}

// An on/off setting of a row (`field`): the table's column `header` reads on, then off, and the
// JSON's `key` true, then false.
void expect_on_off_column(bool LayerBenchRow::*field, const std::string& header, const std::string& key) {
  LayerBenchRow on = row(), off = row();
  on.*field = true;
  off.*field = false;
  EXPECT_EQ(column_of_two_rows(on, off, header), std::make_pair(std::string(" on"), std::string("off")));
  const nlohmann::json j = nlohmann::json::parse(layer_rows_json({on, off}));
  EXPECT_TRUE(j[0][key].get<bool>());
  EXPECT_FALSE(j[1][key].get<bool>());
}

// A row's LayerOptions::epilogue_combine: column `ec` of the table, key `epilogue_combine` of the JSON.
TEST(LayerReport, RowsSayWhetherTheEpilogueCombined) {
  expect_on_off_column(&LayerBenchRow::epilogue_combine, " ec", "epilogue_combine");
}

// A row's LayerOptions::layer1_combine: column `cb1` of the table, key `layer1_combine` of the JSON.
TEST(LayerReport, RowsSayWhoRanLayer1sCombine) {
  LayerBenchRow blocks = row(), gemm = row();
  gemm.layer1_combine = Layer1Combine::kGemmBlocks;
  EXPECT_EQ(column_of_two_rows(blocks, gemm, "    cb1"), std::make_pair(std::string(" blocks"), std::string("   gemm")));
  const nlohmann::json j = nlohmann::json::parse(layer_rows_json({blocks, gemm}));
  EXPECT_EQ(j[0]["layer1_combine"].get<std::string>(), "blocks");
  EXPECT_EQ(j[1]["layer1_combine"].get<std::string>(), "gemm");
}

// Whether the GEMMs used half tiles (MoeLayer::half_tiles()): column `ht`, key `half_tiles`.
TEST(LayerReport, RowsSayWhetherTheGemmsUsedHalfTiles) {
  expect_on_off_column(&LayerBenchRow::half_tiles, " ht", "half_tiles");
}

// Which unfused GEMMs built split schedules (MoeLayer::split_gemms): column `sk` ("-", or the
// layers), key `split_gemms`; and whether that output agreed with the unsplit one: `split ok`.
TEST(LayerReport, RowsSayWhichGemmsSplitAndWhetherTheyAgreed) {
  LayerBenchRow none = row(), both = row();
  both.split_gemms = "01";
  both.split_within_tolerance = false;
  EXPECT_EQ(column_of_two_rows(none, both, " sk"), std::make_pair(std::string("  -"), std::string(" 01")));
  EXPECT_EQ(column_of_two_rows(none, both, "split ok"), std::make_pair(std::string("-       "), std::string("NO      ")));
  const nlohmann::json j = nlohmann::json::parse(layer_rows_json({none, both}));
  EXPECT_EQ(j[0]["split_gemms"].get<std::string>(), "-");
  EXPECT_EQ(j[1]["split_gemms"].get<std::string>(), "01");
  EXPECT_TRUE(j[0]["split_within_tolerance"].get<bool>());
  EXPECT_FALSE(j[1]["split_within_tolerance"].get<bool>());
}

// A row passes only when every check it ran passed: a split output out of tolerance fails it as
// a fused output unequal to the unfused one does (`comet bench layer` then exits 1).
TEST(LayerReport, RowsVerifyEveryCheckTheyRan) {
  LayerBenchRow r = row();
  r.fused_equals_unfused = true;
  EXPECT_TRUE(r.verified());  // no baselines ran, nothing split
  r.split_gemms = "1";
  r.split_within_tolerance = false;
  EXPECT_FALSE(r.verified()) << "a split output out of tolerance";
  r.split_within_tolerance = true;
  r.sequential_us = 100;  // the baselines ran
  EXPECT_FALSE(r.verified()) << "baselines that did not match";
  r.baselines_match = true;
  EXPECT_TRUE(r.verified());
  r.fused_equals_unfused = false;
  EXPECT_FALSE(r.verified()) << "fused differs from unfused";
}

// The ranks of one GPU take turns (local fabric, W = 8 on two GPUs: four per GPU): the note
// under the table says so, the link rate counts each rank's turn, and JSON carries the count.
TEST(LayerReport, SeveralRanksPerGpuTakeTurns) {
  LayerBenchRow r = row();
  r.fabric = "local";
  r.world = r.ep = 8;
  r.ranks_per_gpu = 4;
  r.remote_bytes = 800e6;  // 100 MB per rank and direction
  r.comm_us = 1000;
  std::ostringstream table;
  print_layer_table({r}, table);
  EXPECT_NE(table.str().find("the 4 ranks of each GPU one after another"), std::string::npos) << table.str();
  EXPECT_DOUBLE_EQ(r.comm_link_gbps(), 400.0);  // 100 MB per rank over a 250 us turn
  const nlohmann::json j = nlohmann::json::parse(layer_rows_json({r}));
  EXPECT_EQ(j[0]["ranks_per_gpu"].get<int>(), 4);
}

// TFLOP/s is per GPU: every rank's FLOP over the GPUs the ranks span (the nccl and local rows
// summed their GPUs: deepseek-v3 on two H200s read 1069, above one H200's peak).
TEST(LayerReport, TflopsArePerGpu) {
  LayerBenchRow r = row();  // nccl, W = 2, one rank per GPU
  r.flop = 2e12;
  r.fused_us = 1e6;
  EXPECT_DOUBLE_EQ(r.fused_tflops(), 1.0);
  r.fabric = "loopback";
  r.ranks_per_gpu = 2;  // both ranks on one GPU
  EXPECT_DOUBLE_EQ(r.fused_tflops(), 2.0);
  r.fabric = "local";
  r.world = r.ep = 8;
  r.ranks_per_gpu = 4;  // two GPUs
  EXPECT_DOUBLE_EQ(r.fused_tflops(), 1.0);
  const nlohmann::json j = nlohmann::json::parse(layer_rows_json({r}));
  EXPECT_DOUBLE_EQ(j[0]["fused_tflops"].get<double>(), 1.0);
}

// Rows whose names resolve alike (--n-comm0 0,32 where 0 resolves to 32) get their own files:
// the second one was written over the first, and both rows named the one left.
TEST(LayerReport, TracePathsOfARunAreUnique) {
  std::set<std::string> used;
  EXPECT_EQ(unique_trace_path("t-mixtral-n32-2.json", 0, used), "t-mixtral-n32-2.json");
  EXPECT_EQ(unique_trace_path("t-mixtral-n64-2.json", 1, used), "t-mixtral-n64-2.json");
  EXPECT_EQ(unique_trace_path("t-mixtral-n32-2.json", 2, used), "t-mixtral-n32-2-row2.json");
  EXPECT_EQ(unique_trace_path("t-mixtral-n32-2.json", 3, used), "t-mixtral-n32-2-row3.json");
  EXPECT_EQ(used.size(), 4u);
}

// The notes under the table are per workload: each one's n_comm sources (once each), default
// path and baselines, and the lower bound's model again where a layout changes it (only the
// first row's were printed, for every row).
TEST(LayerReport, NotesNameEachWorkload) {
  LayerBenchRow a = row(), a2 = row(), b = row();
  a.n_comm_source = "tuning table: entry for 4096 tokens/rank";
  a.path_source = "fused: table A";
  a2.n_comm_source = "--n-comm0/--n-comm1";
  b.tokens = 8192;
  b.n_comm_source = "cost model B";
  b.path_source = "unfused: table B";
  b.baseline_note = "baselines not run: they need 80.1 GiB";
  a.ranks_per_gpu = a2.ranks_per_gpu = 1;
  b.ranks_per_gpu = 2;
  std::ostringstream os;
  print_layer_table({a, a, a2, b}, os);
  const std::string t = os.str();
  const auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = t.find(what); at != std::string::npos; at = t.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("mixtral-8x7b T=4096 EPxTP=2x1 routing uniform: n_comm tuning table: entry for 4096 tokens/rank\n"), 1u) << t;
  EXPECT_EQ(count("mixtral-8x7b T=4096 EPxTP=2x1 routing uniform: n_comm --n-comm0/--n-comm1\n"), 1u) << t;
  EXPECT_EQ(count("mixtral-8x7b T=4096 EPxTP=2x1 routing uniform: default path (ForwardPath::kTuned) fused: table A\n"), 1u) << t;
  EXPECT_EQ(count("mixtral-8x7b T=8192 EPxTP=2x1 routing uniform: n_comm cost model B\n"), 1u) << t;
  EXPECT_EQ(count("mixtral-8x7b T=8192 EPxTP=2x1 routing uniform: default path (ForwardPath::kTuned) unfused: table B\n"), 1u) << t;
  EXPECT_EQ(count("mixtral-8x7b T=8192 EPxTP=2x1 routing uniform: baselines not run: they need 80.1 GiB"), 1u) << t;
  EXPECT_EQ(count("lower bound: cost model with the W ranks in parallel, "), 1u) << t;
  EXPECT_EQ(count("lower bound from mixtral-8x7b T=8192 EPxTP=2x1 routing uniform on: cost model with the W ranks one after another, "), 1u) << t;
}

}  // namespace
}  // namespace comet::bench
