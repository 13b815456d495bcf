// unit/layer_choices_test.cpp: what MoeLayer resolves from options, a tuning table and its GPU
// (comet/layer_choices.h): options over the table over the defaults, the fallbacks when a table
// entry asks for what cannot run here, and set_options' checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "comet/layer_choices.h"
#include "support/preset_config.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::contains;

LayerConfig qwen3_ep8() { return test::preset_config("qwen3-30b-a3b", 8, 1, 4096); }

LayerTarget h200() {
  LayerTarget t;
  t.gpu = "NVIDIA H200";
  t.num_sms = 132;
  return t;
}

// One entry for qwen3 at 4096 tokens on one H200: fused faster, copies and combine in the GEMM
// blocks, rows order, n_comm 24/3.
TuningTable table_for(const LayerConfig& c, int n_comm0 = 24, int n_comm1 = 3, bool fused_faster = true) {
  TuningEntry e{tuning_key(c, "NVIDIA H200", 132, 4096), n_comm0, n_comm1, 100.0};
  e.unfused_us = fused_faster ? 120.0 : 80.0;
  e.layer0 = {Layer0Copies::kGemmBlocks, DispatchOrder::kRows};
  e.layer1_combine = Layer1Combine::kGemmBlocks;
  TuningTable t;
  t.add(e);
  return t;
}

TEST(LayerChoices, WithoutATableTheDefaultsAndTheCostModel) {
  const LayerChoices c = resolve_layer_choices(qwen3_ep8(), {}, {}, h200());
  EXPECT_FALSE(c.path.fused);
  EXPECT_EQ(c.layer0.mode.copies, Layer0Copies::kCommBlocks);
  EXPECT_EQ(c.layer0.mode.order, DispatchOrder::kRing);
  EXPECT_EQ(c.layer1.combine, Layer1Combine::kCommBlocks);
  EXPECT_GE(c.n_comm.n_comm0, 32);  // the cost model's measured floors (comet/tuning.h)
  EXPECT_EQ(c.n_comm.n_comm1, 2);
  EXPECT_TRUE(contains(c.n_comm.source, "cost model"));
}

TEST(LayerChoices, TheNearestEntryDecidesWhatOptionsLeaveOpen) {
  const LayerConfig config = qwen3_ep8();
  const LayerChoices c = resolve_layer_choices(config, {}, table_for(config), h200());
  EXPECT_TRUE(c.path.fused);
  EXPECT_EQ(c.n_comm.n_comm0, 24);
  EXPECT_EQ(c.n_comm.n_comm1, 3);
  EXPECT_EQ(c.layer0.mode.copies, Layer0Copies::kGemmBlocks);
  EXPECT_EQ(c.layer0.mode.order, DispatchOrder::kRows);
  EXPECT_EQ(c.layer1.combine, Layer1Combine::kGemmBlocks);
  for (const std::string* source : {&c.path.source, &c.n_comm.source, &c.layer0.source, &c.layer1.source})
    EXPECT_TRUE(contains(*source, "4096 tokens/rank"));
  // An entry that measured the unfused pipeline faster keeps the tuned path unfused.
  EXPECT_FALSE(resolve_layer_choices(config, {}, table_for(config, 24, 3, false), h200()).path.fused);
  // The entry of another GPU never applies.
  LayerTarget h100 = h200();
  h100.gpu = "NVIDIA H100";
  EXPECT_FALSE(resolve_layer_choices(config, {}, table_for(config), h100).path.fused);
}

TEST(LayerChoices, OptionsWinPartByPart) {
  const LayerConfig config = qwen3_ep8();
  LayerOptions o;
  o.path = ForwardPath::kUnfused;
  o.n_comm0 = 40;  // n_comm1 from the table
  o.dispatch_order = DispatchOrder::kRing;  // copies from the table
  o.layer1_combine = Layer1Combine::kCommBlocks;
  const LayerChoices c = resolve_layer_choices(config, o, table_for(config), h200());
  EXPECT_FALSE(c.path.fused);
  EXPECT_EQ(c.path.source, "options");
  EXPECT_EQ(c.n_comm.n_comm0, 40);
  EXPECT_EQ(c.n_comm.n_comm1, 3);
  EXPECT_EQ(c.layer0.mode.copies, Layer0Copies::kGemmBlocks);
  EXPECT_EQ(c.layer0.mode.order, DispatchOrder::kRing);
  EXPECT_EQ(c.layer1.combine, Layer1Combine::kCommBlocks);
  EXPECT_EQ(c.layer1.source, "options");
  // Everything set: the table is not read.
  o.n_comm1 = 5;
  o.layer0_copies = Layer0Copies::kCommBlocks;
  o.path = ForwardPath::kFused;
  const LayerChoices all = resolve_layer_choices(config, o, table_for(config), h200());
  EXPECT_TRUE(all.path.fused);
  EXPECT_EQ(all.n_comm.n_comm0, 40);
  EXPECT_EQ(all.n_comm.n_comm1, 5);
  EXPECT_EQ(all.n_comm.source, "options");
  EXPECT_EQ(all.layer0.source, "options");
  EXPECT_EQ(all.layer0.mode.copies, Layer0Copies::kCommBlocks);
}

// Under link emulation neither GEMM-block mode can be paced: a table's choice of them falls back
// to communication blocks, and the source says why.
TEST(LayerChoices, LinkEmulationTakesNoGemmBlockModeFromTheTable) {
  const LayerConfig config = qwen3_ep8();
  LayerOptions o;
  o.link.gbps = 160;
  const LayerChoices c = resolve_layer_choices(config, o, table_for(config), h200());
  EXPECT_EQ(c.layer0.mode.copies, Layer0Copies::kCommBlocks);
  EXPECT_EQ(c.layer0.mode.order, DispatchOrder::kRows);  // the order is the table's still
  EXPECT_TRUE(contains(c.layer0.source, "cannot be paced to an emulated link"));
  EXPECT_EQ(c.layer1.combine, Layer1Combine::kCommBlocks);
  EXPECT_TRUE(contains(c.layer1.source, "cannot be paced to an emulated link"));
}

TEST(LayerChoices, RowsTooLargeForTheCopyRingTakeCommunicationBlocks) {
  const LayerConfig config = qwen3_ep8();
  LayerTarget t = h200();
  t.copy_ring_refusal = "a token row of hidden 2048 does not fit their ring";
  const LayerChoices c = resolve_layer_choices(config, {}, table_for(config), t);
  EXPECT_EQ(c.layer0.mode.copies, Layer0Copies::kCommBlocks);
  EXPECT_TRUE(contains(c.layer0.source, "does not fit their ring"));
  EXPECT_EQ(c.layer1.combine, Layer1Combine::kGemmBlocks);  // the combine needs no ring
}

// A table made on a GPU with more SMs under this GPU's name: n_comm comes from the cost model.
TEST(LayerChoices, AnEntryAskingForMoreBlocksThanTheGpuHasIsNotTaken) {
  const LayerConfig config = qwen3_ep8();
  LayerTarget small = h200();
  small.num_sms = 20;
  TuningTable table;
  TuningEntry e{tuning_key(config, "NVIDIA H200", 20, 4096), 24, 3, 100.0};
  table.add(e);
  const LayerChoices c = resolve_layer_choices(config, {}, table, small);
  EXPECT_LT(c.n_comm.n_comm0, 20);
  EXPECT_LT(c.n_comm.n_comm1, 20);
  EXPECT_TRUE(contains(c.n_comm.source, "asked for more blocks than this GPU has"));
}

TEST(LayerChoices, PlainActivationsRunUnfused) {
  LayerConfig config = qwen3_ep8();
  config.model.activation = Activation::kGelu;
  const LayerChoices c = resolve_layer_choices(config, {}, table_for(qwen3_ep8()), h200());
  EXPECT_FALSE(c.path.fused);
  EXPECT_TRUE(contains(c.path.source, "gelu"));
}

// set_options' checks: each bad value is named, good options pass.
TEST(LayerChoices, OptionChecksNameTheBadValue) {
  const LayerConfig config = qwen3_ep8();
  const LayerTarget t = h200();
  EXPECT_TRUE(check_layer_options(config, {}, t).ok);
  auto refused = [&](const LayerOptions& o, const std::string& part, const LayerTarget& target) {
    const Status s = check_layer_options(config, o, target);
    if (s.ok) return ::testing::AssertionFailure() << "accepted, expected a refusal naming \"" << part << "\"";
    return contains(s.reason, part);
  };
  auto with = [](auto edit) {
    LayerOptions o;
    edit(o);
    return o;
  };
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.n_comm0 = 132; }), "must be in [0, 131]", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.n_comm1 = -1; }), "n_comm1 -1", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.timeout_s = 0; }), "timeout_s", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.timeout_s = std::numeric_limits<double>::infinity(); }),
                      "timeout_s", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.layer0_group_m = -2; }), "layer0_group_m", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.layer0_stages = -1; }), "layer0_stages", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.stall_rank = 8; }), "stall_rank 8", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.fail_before_launch = -2; }), "fail_before_launch", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.trace = true; }), "ForwardPath::kFused", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) {
                        o.path = ForwardPath::kFused;
                        o.trace = true;
                        o.trace_chunk_capacity = -1;
                      }),
                      "trace_chunk_capacity", t));
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.link.gbps = -1; }), "link emulation: the rate", t));
  LayerConfig gelu = config;
  gelu.model.activation = Activation::kGelu;
  const Status fused_gelu = check_layer_options(gelu, with([](LayerOptions& o) { o.path = ForwardPath::kFused; }), t);
  EXPECT_FALSE(fused_gelu.ok);
  EXPECT_TRUE(contains(fused_gelu.reason, "fuse SwiGLU"));
  // Link emulation: only with every rank on one GPU, and never with a GEMM-block mode.
  LayerTarget nccl = t;
  nccl.real_links = true;
  nccl.fabric = "nccl";
  const LayerOptions paced = with([](LayerOptions& o) { o.link.gbps = 160; });
  EXPECT_TRUE(check_layer_options(config, paced, t).ok);
  EXPECT_TRUE(refused(paced, "not the nccl fabric's real links", nccl));
  LayerOptions paced_copies = paced;
  paced_copies.layer0_copies = Layer0Copies::kGemmBlocks;
  EXPECT_TRUE(refused(paced_copies, "use Layer0Copies::kCommBlocks", t));
  LayerOptions paced_combine = paced;
  paced_combine.layer1_combine = Layer1Combine::kGemmBlocks;
  EXPECT_TRUE(refused(paced_combine, "use Layer1Combine::kCommBlocks", t));
  // Copies in the GEMM blocks whose rows do not fit the ring.
  LayerTarget no_ring = t;
  no_ring.copy_ring_refusal = "a token row of hidden 24576 does not fit their ring";
  EXPECT_TRUE(refused(with([](LayerOptions& o) { o.layer0_copies = Layer0Copies::kGemmBlocks; }), "hidden 24576",
                      no_ring));
  EXPECT_TRUE(check_layer_options(config, with([](LayerOptions& o) { o.layer0_copies = Layer0Copies::kGemmBlocks; }),
                                  t)
                  .ok);
}

}  // namespace
}  // namespace comet
