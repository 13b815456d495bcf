// Tests of `comet bench layer`'s report (no GPU): a traced row prints and writes its timeline's
// hidden communication, an untraced one neither.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

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

}  // namespace
}  // namespace comet::bench
