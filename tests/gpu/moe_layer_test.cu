// GPU tests of MoeLayer (label `gpu`): W virtual ranks on one GPU (Loopback fabric), every
// preset scaled down, EP, TP and EP+TP, every routing generator, uneven and empty ranks,
// against the fp64 CPU oracle; repeated calls bitwise equal; bad input reported by check().
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "comet/dtype.h"
#include "comet/layer.h"
#include "comet/plan.h"
#include "comet/problem.h"
#include "captured_forward.h"
#include "checkpoint_weights.h"
#include "cuda/device_info.h"
#include "cuda/device_plan.h"
#include "cuda/device_problem.h"
#include "fabric/fabric.h"
#include "gpu_test_util.h"
#include "layer_cases.h"
#include "layer_checks.h"
#include "layer_rig.h"
#include "ref/oracle.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::LayerCase;
using testing::LayerRig;
using testing::model_layer_config;
using test::layer_cases;

class MoeLayerTest : public ::testing::TestWithParam<LayerCase> {};

TEST_P(MoeLayerTest, MatchesTheOracleAndRepeatsBitwise) {
  COMET_REQUIRE_GPU();
  const LayerCase& lc = GetParam();
  SCOPED_TRACE(lc.describe());
  LayerRig rig(lc);
  const auto got = rig.forward(LayerOptions{});
  EXPECT_TRUE(testing::near_oracle(got, ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
  EXPECT_EQ(rig.forward(LayerOptions{}), got) << "a second call differs";
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeLayerTest, ::testing::ValuesIn(layer_cases()),
                         [](const auto& info) { return "case" + std::to_string(info.index); });

// LayerOptions::unfused_gemms = kAuto on a fresh layer, so that every intermediate row comes
// from those GEMMs (a later forward would find the earlier one's rows in place): the oracle's
// output, then the default GEMMs' bit for bit, then the kAuto compute-only part leaves the next
// forward unchanged. Cases with experts of odd M tile counts (cluster pairs of column blocks) and
// TP = 2.
TEST(MoeLayer, AutoUnfusedGemmsMatchTheOracleAndTheDefaultBitwise) {
  COMET_REQUIRE_GPU();
  for (const LayerCase& lc : {LayerCase{"qwen3-30b-a3b", 16, 4, 2, 128, {128, 40, 0, 97}, {RoutingKind::kZipf, 1.1, 0.1}, 5},
                              LayerCase{"deepseek-v3", 16, 4, 1, 300, {300, 211, 0, 37}, {RoutingKind::kZipf, 1.5, 0.2}, 8}}) {
    SCOPED_TRACE(lc.describe());
    LayerRig rig(lc);
    LayerOptions o;
    o.unfused_gemms = UnfusedGemms::kAuto;
    const auto got = rig.forward(o);
    EXPECT_TRUE(testing::near_oracle(got, ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
    EXPECT_EQ(rig.forward(LayerOptions{}), got) << "the kAuto unfused GEMMs differ from the default ones";
    rig.layer.set_options(o);
    rig.layer.run_part(MoeLayer::Part::kGemms, nullptr);
    rig.layer.check(nullptr);
    EXPECT_EQ(rig.forward(o), got) << "after the kAuto compute-only part";
  }
}

// LayerOptions::half_tiles changes which warpgroups compute, never what is stored: on and off,
// fused and unfused, the outputs are bitwise equal and match the oracle. The case's experts
// (about 150 rows each) end in M tiles of at most 64 rows, where half tiles skip.
TEST(MoeLayer, HalfTilesOnAndOffGiveTheSameOutput) {
  COMET_REQUIRE_GPU();
  const LayerCase lc{"mixtral-8x7b", 16, 2, 1, 320, {300, 290}, {}, 11};
  LayerRig rig(lc);
  const DispatchPlan plan(rig.config, rig.problem.routing);
  int skipped = 0;
  for (int r = 0; r < 2; ++r)
    for (int e = 0; e < plan.experts_per_rank(); ++e) skipped += plan.expert_rows(r, e) % 128 > 0 && plan.expert_rows(r, e) % 128 <= 64;
  ASSERT_GT(skipped, 0) << "no expert ends in a tile of at most 64 rows: the case tests nothing";
  LayerOptions o;
  o.path = ForwardPath::kFused;
  o.half_tiles = true;
  const auto want = rig.forward(o);
  EXPECT_TRUE(testing::near_oracle(want, ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
  o.half_tiles = false;
  EXPECT_EQ(rig.forward(o), want) << "fused, half tiles off";
  o.path = ForwardPath::kUnfused;
  EXPECT_EQ(rig.forward(o), want) << "unfused, half tiles off";
  o.half_tiles = true;
  EXPECT_EQ(rig.forward(o), want) << "unfused, half tiles on";
}

// Layer1's lists cut a last M tile of 65-127 rows in two half tiles where the claimed schedule
// ends sooner so (cuda/device_plan.h layer1_cut_m_tiles). One expert per rank, H = 4096 (16
// column blocks of 256) and about 1100 rows per rank: 9 M tiles, 144 whole tiles on 132 SMs,
// against 128 whole and 32 half ones with the cut. The fused and unfused forwards on the plan's
// cut lists match the oracle and equal, bit for bit, the uncut ones: with half tiles off (no
// cut), and kAuto's ping-pong GEMMs on lists of their own.
TEST(MoeLayer, CutLastMTilesMatchTheOracleAndTheUncutOutputBitwise) {
  COMET_REQUIRE_GPU();
  const LayerConfig c = model_layer_config({"cut", 4096, 256, 8, 2, Activation::kSwiGlu}, 8, 1, 600);
  LayerRig rig(c, std::vector<int>(8, 550), {RoutingKind::kUniform, 0, 0}, 5);
  const DispatchPlan plan(rig.config, rig.problem.routing);
  const int sms = cuda::query_device_info().num_sms;
  int cut_ranks = 0;
  for (int r = 0; r < 8; ++r)
    cut_ranks += cuda::layer1_cut_m_tiles(c.experts_per_rank(), [&](int e) { return plan.expert_rows(r, e); },
                                          c.num_col_blocks1(), sms) > 0;
  ASSERT_GT(cut_ranks, 0) << "no rank's layer1 list is cut on " << sms << " SMs: the case tests nothing";
  LayerOptions o;
  o.path = ForwardPath::kFused;
  o.layer1_combine = Layer1Combine::kCommBlocks;  // the cooperative GEMM1, whose lists are cut
  o.split_gemms = false;                          // every forward with the same sums
  const auto want = rig.forward(o);
  EXPECT_TRUE(testing::near_oracle(want, ref::oracle_forward(rig.problem), c.model.hidden));
  o.path = ForwardPath::kUnfused;
  EXPECT_EQ(rig.forward(o), want) << "unfused, on the plan's cut lists";
  o.unfused_gemms = UnfusedGemms::kAuto;
  EXPECT_EQ(rig.forward(o), want) << "unfused, kAuto's own lists";
  o.unfused_gemms = UnfusedGemms::kFusedSchedule;
  o.half_tiles = false;
  EXPECT_EQ(rig.forward(o), want) << "unfused, half tiles off (no cut)";
  o.path = ForwardPath::kFused;
  EXPECT_EQ(rig.forward(o), want) << "fused, half tiles off (no cut)";
}

// The split tests' layer: H = F = 2048 (32 k-tiles at K = H or F, enough for two pieces), 8
// experts, top 2, EP 2.
LayerConfig split_test_config(int max_tokens_per_rank) {
  ModelShape model;
  model.hidden = 2048;
  model.ffn = 2048;
  model.num_experts = 8;
  model.topk = 2;
  return model_layer_config(model, 2, 1, max_tokens_per_rank);
}

// A decode-sized batch (LayerOptions::split_gemms): H = F = 2048, 8 experts, EP 2, at most 64
// tokens per rank: about 32 rows per expert, so GEMM0 has 4 experts x 1 M tile x 16 column blocks
// = 64 tiles, and GEMM1, a short batch's on ping-pong 128 x 128 tiles, 4 x 1 x 16 = 64 for 264
// slots; by default both build split schedules (K = 2048: 32 k-tiles, two pieces). The split
// output matches the oracle, repeats bit for bit, is within bf16 rounding of the unsplit output
// (which the fused kernels, cooperative GEMM1 included, equal bit for bit), survives graph
// capture with new token counts, a rank with none, and the compute-only part.
TEST(MoeLayer, SplitGemmsOfADecodeBatchMatchTheOracleAndTheUnsplitOutput) {
  COMET_REQUIRE_GPU();
  const LayerConfig c = split_test_config(64);
  const RoutingSpec spec{RoutingKind::kZipf, 1.1, 0.1};
  LayerRig rig(c, {64, 41}, spec, 23);
  ASSERT_TRUE(rig.layer.split_gemms(0));
  ASSERT_TRUE(rig.layer.split_gemms(1));
  const auto oracle = ref::oracle_forward(rig.problem);
  LayerOptions unsplit;
  unsplit.path = ForwardPath::kUnfused;
  unsplit.split_gemms = false;
  const auto want = rig.forward(unsplit);
  EXPECT_FALSE(rig.layer.split_gemms(0) || rig.layer.split_gemms(1)) << "split_gemms = false";
  EXPECT_TRUE(testing::near_oracle(want, oracle, c.model.hidden));
  LayerOptions fused = unsplit;
  fused.path = ForwardPath::kFused;
  EXPECT_EQ(rig.forward(fused), want) << "the fused kernels (never split) against the unsplit unfused pipeline";

  LayerOptions split;
  split.path = ForwardPath::kUnfused;
  const auto got = rig.forward(split);
  EXPECT_TRUE(testing::near_oracle(got, oracle, c.model.hidden));
  std::vector<std::vector<double>> want_values;
  for (const auto& rank : want) want_values.emplace_back(rank.begin(), rank.end());
  EXPECT_TRUE(testing::near_oracle(got, want_values, c.model.hidden)) << "split against unsplit";
  // The split tiles' fp32 sums round differently somewhere among these 105 x 2048 outputs: an
  // output bitwise equal to the unsplit one would mean that nothing split.
  EXPECT_NE(got, want) << "the split forward equals the unsplit one bit for bit: did anything split?";
  EXPECT_EQ(rig.forward(split), got) << "a second split forward differs";
  split.split_gemms = true;  // every GEMM that can split, at any gain of a quarter tile
  EXPECT_EQ(rig.forward(split), got) << "split_gemms = true splits these GEMMs the same way";
  split.split_gemms.reset();
  rig.layer.run_part(MoeLayer::Part::kGemms, nullptr);
  rig.layer.check(nullptr);
  EXPECT_EQ(rig.forward(split), got) << "after the split compute-only part";

  // Captured once, replayed with other token counts (one rank empty), each against the oracle.
  testing::CapturedForward graph(rig.layer, rig.device.tensors());
  for (const std::vector<int>& tokens : {std::vector<int>{0, 64}, std::vector<int>{17, 5}}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens[0]) + ", " + std::to_string(tokens[1]));
    MoeProblem p = make_problem(c, tokens, spec, 24 + tokens[1]);
    p.weights = rig.problem.weights;
    rig.device.assign_inputs(cuda::DeviceProblem(c, p));
    rig.device.poison_y();
    graph.replay();
    EXPECT_TRUE(testing::near_oracle(rig.device.download_y(), ref::oracle_forward(p), c.model.hidden));
  }
}

TEST(MoeLayer, NewRoutingAndTokenCountsWithoutReallocation) {
  COMET_REQUIRE_GPU();
  LayerCase lc{"deepseek-v3", 16, 4, 2, 128, {128, 0, 77, 5}, {RoutingKind::kZipf, 1.5, 0.2}, 42};
  const LayerConfig c = lc.config();
  auto fabric = fabric::make_loopback_fabric(4);
  MoeLayer layer(c, *fabric);
  // Both paths (on one GPU without a tuning table the default is the unfused one), each call
  // on a poisoned workspace: the fused kernels too must follow the new counts, not the last.
  for (int call = 0; call < 6; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    LayerOptions o;
    o.path = call % 2 == 0 ? ForwardPath::kUnfused : ForwardPath::kFused;
    o.poison_workspace = true;
    layer.set_options(o);
    const std::vector<int> tokens = call / 2 == 1 ? std::vector<int>{3, 128, 0, 64} : lc.tokens;
    const MoeProblem p = make_problem(c, tokens, lc.spec, lc.seed + call);
    if (call == 0) layer.set_weights(p.weights);
    MoeProblem same_weights = p;
    if (call > 0) same_weights.weights = make_problem(c, lc.tokens, lc.spec, lc.seed).weights;
    cuda::DeviceProblem d(c, same_weights);
    layer.forward(d.tensors(), nullptr);
    layer.check(nullptr);
    EXPECT_TRUE(testing::near_oracle(d.download_y(), ref::oracle_forward(same_weights), same_weights.config.model.hidden));
  }
}

// The whole forward captured once in a CUDA graph, then replayed with routing and token counts
// rewritten in place (same device buffers): no host synchronization is baked into the graph.
TEST(MoeLayer, GraphReplayWithNewRoutingAndTokenCounts) {
  COMET_REQUIRE_GPU();
  const LayerCase lc{"qwen3-30b-a3b", 16, 4, 2, 128, {128, 40, 0, 97}, {RoutingKind::kZipf, 1.1, 0.1}, 5};
  LayerRig rig(lc);
  const LayerConfig& c = rig.config;
  cuda::DeviceProblem& d = rig.device;
  // Each path captured (the default on one GPU is the unfused one), with the workspace poisoned
  // by each replay: every row must come from the replay's own routing and counts.
  for (ForwardPath path : {ForwardPath::kUnfused, ForwardPath::kFused}) {
  SCOPED_TRACE(path == ForwardPath::kFused ? "fused" : "unfused");
  LayerOptions o;
  o.path = path;
  o.poison_workspace = true;
  rig.layer.set_options(o);
  testing::CapturedForward graph(rig.layer, d.tensors());
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const std::vector<int> tokens = replay == 1 ? std::vector<int>{0, 128, 5, 64} : std::vector<int>{77, 3, 128, 128};
    MoeProblem p = make_problem(c, tokens, lc.spec, lc.seed + 10 + replay);
    p.weights = rig.problem.weights;
    d.assign_inputs(cuda::DeviceProblem(c, p));  // new inputs, copied into the captured buffers
    d.poison_y();  // every row checked below must come from this replay
    graph.replay();
    EXPECT_TRUE(testing::near_oracle(d.download_y(), ref::oracle_forward(p), p.config.model.hidden));
  }
  }
}

TEST(MoeLayer, BadInputIsReportedAndTheLayerStaysUsable) {
  COMET_REQUIRE_GPU();
  LayerRig rig(LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {64, 30}, {}, 7});
  const LayerConfig& c = rig.config;
  const MoeProblem& p = rig.problem;
  MoeLayer& layer = rig.layer;
  cuda::DeviceProblem& d = rig.device;
  d.set_token_count(1, 65);  // more than T_max
  d.poison_y();              // all T_max rows of rank 1 now (its count exceeds T_max)
  layer.forward(d.tensors(), nullptr);
  try {
    layer.check(nullptr);
    ADD_FAILURE() << "a token count above T_max was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad input from rank 1"), std::string::npos) << e.what();
  }
  // The plan refused rank 1's count and wrote it no send positions: its owner reduce reads none
  // and leaves y as it was (poisoned above). y1 is a copy: a range-for over download_y()[1]
  // would read the temporary's freed memory.
  {
    const auto y1 = d.download_y()[1];
    size_t bad = 0, first = y1.size(), nonzero = 0;
    for (size_t i = 0; i < y1.size(); ++i) {
      if (std::isnan(y1[i])) continue;
      ++bad;
      if (first == y1.size()) first = i;
      if (y1[i] != 0.f) ++nonzero;
    }
    EXPECT_EQ(bad, 0u) << "rank 1's y was written: " << bad << " of " << y1.size() << " values, first at " << first
                       << " (row " << first / c.model.hidden << "), nonzero " << nonzero;
  }
  d.set_token_count(1, 30);
  layer.forward(d.tensors(), nullptr);
  layer.check(nullptr);
  EXPECT_TRUE(testing::near_oracle(d.download_y(), ref::oracle_forward(p), p.config.model.hidden));
  // A NaN routing weight (rank 1, token 5, its first unmasked slot), and a negative count
  // reported signed.
  MoeProblem nan_weight = p;
  Routing& r1 = nan_weight.routing[1];
  int slot = 0;
  while (r1.expert(5, slot) < 0) ++slot;
  r1.weights[size_t(5) * r1.topk + slot] = std::nanf("");
  d.assign_inputs(cuda::DeviceProblem(c, nan_weight));
  layer.forward(d.tensors(), nullptr);
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.check(nullptr); },
                                       {"bad input from rank 1", "finite routing weight", "nan"}));
  d.assign_inputs(cuda::DeviceProblem(c, p));
  d.set_token_count(0, -3);
  layer.forward(d.tensors(), nullptr);
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.check(nullptr); }, {"bad input from rank 0", "got -3"}));
  d.set_token_count(0, 64);
  layer.forward(d.tensors(), nullptr);
  layer.check(nullptr);
  EXPECT_TRUE(testing::near_oracle(d.download_y(), ref::oracle_forward(p), p.config.model.hidden));
  // Bad input does not stop the waits of the forwards enqueued after it (only a timeout does):
  // a good forward between the bad one and check() runs in step, on both paths.
  for (ForwardPath path : {ForwardPath::kUnfused, ForwardPath::kFused}) {
    SCOPED_TRACE(path == ForwardPath::kFused ? "fused" : "unfused");
    LayerOptions o;
    o.path = path;
    layer.set_options(o);
    d.set_token_count(1, 65);
    layer.forward(d.tensors(), nullptr);
    d.set_token_count(1, 30);
    d.poison_y();
    layer.forward(d.tensors(), nullptr);
    EXPECT_TRUE(test::throws_with<Error>([&] { layer.check(nullptr); }, {"bad input from rank 1"}));
    EXPECT_TRUE(testing::near_oracle(d.download_y(), ref::oracle_forward(p), p.config.model.hidden));
  }
}

// A problem whose sizes do not match the config (another topk, hidden size or token count than
// its arrays hold) is refused by name before anything is uploaded; before, its arrays were
// copied into buffers sized by the config, past their end.
TEST(DeviceProblem, AProblemOfAnotherShapeIsRefusedByName) {
  const test::LayerCase lc{"mixtral-8x7b", 16, 2, 1, 64, {64, 30}, {}, 7};
  const LayerConfig c = lc.config();
  const MoeProblem good = make_problem(c, lc.tokens, lc.spec, lc.seed);
  const auto refused = [&](const MoeProblem& p, std::initializer_list<std::string> parts) {
    return test::throws_with<Error>([&] { cuda::DeviceProblem d(c, p); }, parts);
  };
  LayerConfig wider = c;
  wider.model.topk = 4;
  EXPECT_TRUE(refused(make_problem(wider, lc.tokens, lc.spec, lc.seed), {"rank 0's routing has topk 4, the config 2"}));
  MoeProblem p = good;
  p.routing[1].num_tokens = 31;  // arrays of 30 tokens
  EXPECT_TRUE(refused(p, {"rank 1's routing has 60 expert ids and 60 weights, 31 tokens x topk 2 are 62"}));
  p = good;
  p.routing[1].num_tokens = -1;
  EXPECT_TRUE(refused(p, {"rank 1 has -1 tokens, T_max is 64"}));
  p = good;
  p.x[0].resize(p.x[0].size() + 16);
  EXPECT_TRUE(refused(p, {"rank 0's x has " + std::to_string(p.x[0].size()) + " values, 64 tokens x hidden " +
                                 std::to_string(c.model.hidden)}));
}

// Misuse the host can see is refused by name before anything is enqueued, and the layer runs
// normally afterwards: tensors that are null, host memory or misaligned (16-byte rows, 4-byte
// routing and counts), an unbounded timeout, a second layer reallocating the fabric's heap, a
// current device other than the ranks' GPU.
TEST(MoeLayer, MisusedTensorsOptionsAndFabricAreRefusedByName) {
  COMET_REQUIRE_GPU();
  LayerRig rig(LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {64, 30}, {}, 7});
  MoeLayer& layer = rig.layer;
  const std::vector<RankTensors> good = rig.device.tensors();
  auto refused = [&](std::vector<RankTensors> in, std::initializer_list<std::string> parts) {
    return test::throws_with<Error>([&] { layer.forward(in, nullptr); }, parts);
  };
  std::vector<RankTensors> bad = good;
  bad[1].weights = nullptr;
  EXPECT_TRUE(refused(bad, {"rank 1's weights is a null pointer"}));
  bad = good;
  bad[1].y = static_cast<char*>(good[1].y) + 2;  // one bf16 element in
  EXPECT_TRUE(refused(bad, {"rank 1's y is not 16-byte aligned"}));
  bad = good;
  bad[1].num_tokens = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(good[1].num_tokens) + 2);
  EXPECT_TRUE(refused(bad, {"rank 1's num_tokens is not 4-byte aligned"}));
  std::vector<uint16_t> host_y(size_t(rig.config.max_tokens_per_rank) * rig.config.model.hidden);
  bad = good;
  bad[0].y = host_y.data();
  EXPECT_TRUE(refused(bad, {"rank 0's y", "host memory"}));
  LayerOptions forever;
  forever.timeout_s = INFINITY;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_options(forever); }, {"timeout_s", "inf"}));
  forever.timeout_s = 1e-12;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_options(forever); }, {"timeout_s"}));
  if (cuda::query_device_info().device_count > 1) {  // the current device is not the ranks' GPU
    COMET_CUDA_CHECK(cudaSetDevice(1));
    EXPECT_TRUE(refused(good, {"the current device is GPU 1", "the ranks run on GPU 0"}));
    COMET_CUDA_CHECK(cudaSetDevice(0));
  }
  // None of it enqueued anything: the same layer still runs and matches the oracle.
  EXPECT_TRUE(testing::near_oracle(rig.forward(LayerOptions{}), ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
  {
    MoeLayer second(rig.config, *rig.fabric);  // reallocates the heap under `layer`
    EXPECT_TRUE(refused(good, {"reallocated", "one fabric per layer"}));
    EXPECT_TRUE(test::throws_with<Error>([&] { layer.run_part(MoeLayer::Part::kGemms, nullptr); }, {"reallocated"}));
  }
}

// A forward that timed out, checked only after a second layer on its fabric reallocated the
// heap: check() still reports the timeout, but its reset writes nothing into the heap, which
// the second layer's counters now occupy at the same offsets (zeroed under it, its next fused
// forward would wait for counts that never come). The second layer's forwards stay unchanged
// and the first layer still refuses to run.
TEST(FusedLayer, TimeoutCheckedAfterTheHeapWasReallocatedLeavesTheNewLayersCountersAlone) {
  COMET_REQUIRE_GPU();
  LayerRig rig(LayerCase{"mixtral-8x7b", 16, 4, 1, 64, {64, 64, 64, 64}, {}, 11});
  LayerOptions o;
  o.path = ForwardPath::kFused;
  o.timeout_s = 1.0;
  LayerOptions stalled = o;
  stalled.timeout_s = 0.2;
  stalled.stall_rank = 2;
  rig.layer.set_options(stalled);
  rig.layer.forward(rig.device.tensors(), nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());  // its waits have timed out; nothing checked yet
  MoeLayer second(rig.config, *rig.fabric);   // reallocates the heap under rig.layer
  second.set_weights(rig.problem.weights);
  second.set_options(o);
  auto forward_second = [&] {
    rig.device.poison_y();
    second.forward(rig.device.tensors(), nullptr);
    second.check(nullptr);
    return rig.device.download_y();
  };
  const auto want = forward_second();
  EXPECT_TRUE(testing::near_oracle(want, ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
  EXPECT_TRUE(test::throws_with<TimeoutError>([&] { rig.layer.check(nullptr); }, {"rank 2", "layer0", "signal"}));
  EXPECT_EQ(forward_second(), want) << "the first layer's check reset counters in the second layer's heap";
  EXPECT_EQ(forward_second(), want);
  EXPECT_TRUE(test::throws_with<Error>([&] { rig.layer.forward(rig.device.tensors(), nullptr); }, {"reallocated"}));
}

// Takes all but about `leave` bytes of the current GPU's free memory until destroyed.
class GpuMemoryHog {
 public:
  explicit GpuMemoryHog(size_t leave) {
    constexpr size_t kGranule = size_t(2) << 20;
    for (;;) {
      size_t free = 0, total = 0;
      COMET_CUDA_CHECK(cudaMemGetInfo(&free, &total));
      if (free <= leave + kGranule) break;
      size_t want = free - leave;
      void* p = nullptr;
      while (want >= kGranule && cudaMalloc(&p, want) != cudaSuccess) {
        (void)cudaGetLastError();  // an allocation that failed is not a sticky error
        want /= 2;
      }
      if (want < kGranule) break;
      blocks_.push_back(p);
    }
  }
  ~GpuMemoryHog() {
    for (void* p : blocks_) cudaFree(p);
  }
  GpuMemoryHog(const GpuMemoryHog&) = delete;
  GpuMemoryHog& operator=(const GpuMemoryHog&) = delete;

 private:
  std::vector<void*> blocks_;
};

// Options whose split workspace cannot be allocated (the GPU's memory taken) are refused by
// name and leave the layer as it was: no split, the previous output bit for bit. With the
// memory back the same options are taken. H = F = 2048 (32 k-tiles, two pieces), 8 experts,
// EP 2, T_max 768: 4 x 3 M tiles per rank, GEMM0 192 cooperative tiles (1.45 waves) and GEMM1
// 96 (one wave 73% full), so neither splits by default and split_gemms = true splits at least
// one.
TEST(MoeLayer, OptionsWhoseSplitWorkspaceCannotBeAllocatedLeaveTheLayerAsItWas) {
  COMET_REQUIRE_GPU();
  const LayerConfig c = split_test_config(768);
  LayerRig rig(c, {768, 500}, RoutingSpec{}, 31);
  ASSERT_FALSE(rig.layer.split_gemms(0) || rig.layer.split_gemms(1)) << "a split by default at these sizes";
  LayerOptions unfused;
  unfused.path = ForwardPath::kUnfused;
  const auto want = rig.forward(unfused);
  LayerOptions split = unfused;
  split.split_gemms = true;
  {
    GpuMemoryHog hog(size_t(4) << 20);
    EXPECT_TRUE(test::throws_with<Error>([&] { rig.layer.set_options(split); }, {"could not allocate the split GEMMs'"}));
  }
  EXPECT_FALSE(rig.layer.split_gemms(0) || rig.layer.split_gemms(1)) << "the refused options were kept";
  rig.device.poison_y();
  rig.layer.forward(rig.device.tensors(), nullptr);  // the options from before the refused change
  rig.layer.check(nullptr);
  EXPECT_EQ(rig.device.download_y(), want);
  rig.layer.set_options(split);
  EXPECT_TRUE(rig.layer.split_gemms(0) || rig.layer.split_gemms(1)) << "split_gemms = true split neither GEMM";
  std::vector<std::vector<double>> want_values;
  for (const auto& rank : want) want_values.emplace_back(rank.begin(), rank.end());
  EXPECT_TRUE(testing::near_oracle(rig.forward(split), want_values, c.model.hidden)) << "split against unsplit";
}

// set_rank_weights from checkpoint-layout bf16 weights (rank 0's from host memory, the others'
// from device memory) gives the layer the weights set_weights gives it: the outputs are bitwise
// equal. F/TP of 48 (qwen3 / 16) is a partial block of the gate/up interleave (64 rows), 448
// (mixtral / 16, TP 2) seven whole ones; a plain activation has no gate. Misuse is refused.
TEST(MoeLayer, CheckpointWeightsPerRankEqualTheFullWeights) {
  COMET_REQUIRE_GPU();
  for (const auto& [lc, activation] :
       {std::pair{LayerCase{"qwen3-30b-a3b", 16, 4, 1, 64, {64, 30, 0, 64}, {RoutingKind::kZipf, 1.2, 0.1}, 5},
                  Activation::kSwiGlu},
        std::pair{LayerCase{"mixtral-8x7b", 16, 4, 2, 64, {64, 64, 17, 40}, {}, 6}, Activation::kSwiGlu},
        std::pair{LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {50, 64}, {}, 7}, Activation::kGelu}}) {
    LayerConfig c = lc.config();
    c.model.activation = activation;
    SCOPED_TRACE(lc.describe() + " " + activation_name(activation));
    testing::LayerRig full(c, lc.tokens, lc.spec, lc.seed);  // set_weights(problem.weights)
    const auto want = full.forward(LayerOptions{});
    auto fabric = fabric::make_loopback_fabric(c.layout.world);
    MoeLayer layer(c, *fabric);
    std::vector<RankTensors> inputs = full.device.tensors();
    EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(inputs, nullptr); },
                                         {"set_rank_weights() for every local rank"}));
    std::vector<testing::CheckpointWeights> host;
    std::vector<std::array<testing::DeviceBuffer<uint16_t>, 3>> device;
    for (int r = 0; r < c.layout.world; ++r) {
      host.push_back(testing::checkpoint_weights(c, full.problem.weights, r));
      device.push_back({testing::DeviceBuffer<uint16_t>(host[r].gate), testing::DeviceBuffer<uint16_t>(host[r].up),
                        testing::DeviceBuffer<uint16_t>(host[r].down)});
    }
    for (int r = 0; r < c.layout.world; ++r) {
      const bool from_host = r == 0;
      RankExpertWeights w;
      w.gate = host[r].gate.empty() ? nullptr : from_host ? (const void*)host[r].gate.data() : device[r][0].get();
      w.up = from_host ? (const void*)host[r].up.data() : device[r][1].get();
      w.down = from_host ? (const void*)host[r].down.data() : device[r][2].get();
      if (r == 1) {  // misuse first: a missing projection, a gate a plain activation has not
        RankExpertWeights no_up = w;
        no_up.up = nullptr;
        EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_rank_weights(r, no_up); }, {"up and down"}));
        RankExpertWeights odd_gate = w;
        odd_gate.gate = w.gate ? nullptr : w.up;
        EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_rank_weights(r, odd_gate); }, {"gate projection"}));
      }
      layer.set_rank_weights(r, w);
    }
    EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_rank_weights(c.layout.world, {}); },
                                         {"MoeLayer::set_rank_weights",
                                          "rank " + std::to_string(c.layout.world) + " is not driven"}));
    full.device.poison_y();
    layer.forward(inputs, nullptr);
    layer.check(nullptr);
    EXPECT_EQ(full.device.download_y(), want) << "checkpoint weights differ from the full ones";
    // A setter that fails writes nothing it was refused for: weights refused up front leave the
    // installed ones in place (a failure half way would leave the rank unset instead).
    EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_rank_weights(1, {}); }, {"up and down"}));
    full.device.poison_y();
    layer.forward(inputs, nullptr);
    layer.check(nullptr);
    EXPECT_EQ(full.device.download_y(), want) << "a refused set_rank_weights changed the weights";
  }
}

// The fused Comet kernels against the unfused pipeline: the same GEMM kernel, tile lists and
// reduction order, so the outputs must be bitwise equal, for any n_comm, over several calls
// (epoch counters advance, never reset).
class FusedLayerTest : public ::testing::TestWithParam<LayerCase> {};

// The fused kernels with each (n_comm0, n_comm1), and once more with layer0's copies in the GEMM
// blocks (Layer0Copies::kGemmBlocks, the last pair's n_comm1), then fused and unfused without the
// epilogue combine (LayerOptions::epilogue_combine: every token through the combine), and with
// layer1's combine in the GEMM blocks (Layer1Combine::kGemmBlocks), `calls` forwards each on
// poisoned outputs and a poisoned workspace (LayerOptions::poison_workspace: every row the
// forward passes between kernels must be written by that forward, not left from the one
// before on the same inputs): y must equal `unfused` bitwise every time.
void expect_fused_equals_unfused(MoeLayer& layer, cuda::DeviceProblem& d,
                                 const std::vector<std::vector<float>>& unfused,
                                 std::initializer_list<std::pair<int, int>> n_comms, int calls,
                                 cudaStream_t stream) {
  std::vector<LayerOptions> runs;
  for (auto [n0, n1] : n_comms) {
    LayerOptions o;
    o.path = ForwardPath::kFused;
    o.n_comm0 = n0;
    o.n_comm1 = n1;
    runs.push_back(o);
  }
  const LayerOptions last = runs.back();
  for (Layer0Copies copies : {Layer0Copies::kCommBlocks, Layer0Copies::kGemmBlocks})
    for (DispatchOrder order : {DispatchOrder::kRing, DispatchOrder::kRows}) {
      if (copies == Layer0Copies::kCommBlocks && order == DispatchOrder::kRing) continue;  // runs above
      runs.push_back(last);
      runs.back().layer0_copies = copies;
      runs.back().dispatch_order = order;
    }
  runs.push_back(last);  // the unfused dispatch kernel in row order
  runs.back().path = ForwardPath::kUnfused;
  runs.back().dispatch_order = DispatchOrder::kRows;
  for (ForwardPath path : {ForwardPath::kFused, ForwardPath::kUnfused}) {  // every token through the combine
    runs.push_back(last);
    runs.back().path = path;
    runs.back().epilogue_combine = false;
  }
  // Layer1's combine in the GEMM blocks (ping-pong GEMM1 on 128-column blocks), fused and
  // unfused, with and without the epilogue combine.
  for (ForwardPath path : {ForwardPath::kFused, ForwardPath::kUnfused})
    for (bool epilogue : {true, false}) {
      runs.push_back(last);
      runs.back().path = path;
      runs.back().epilogue_combine = epilogue;
      runs.back().layer1_combine = Layer1Combine::kGemmBlocks;
    }
  for (LayerOptions& o : runs) o.poison_workspace = true;
  for (const LayerOptions& o : runs) {
    SCOPED_TRACE(std::string(o.path == ForwardPath::kUnfused ? "unfused" : "fused") + " n_comm " +
                 std::to_string(o.n_comm0) + "/" + std::to_string(o.n_comm1) +
                 (o.layer0_copies == Layer0Copies::kGemmBlocks ? ", layer0 copies in the GEMM blocks" : "") +
                 (o.dispatch_order == DispatchOrder::kRows ? ", dispatch in row order" : "") +
                 (o.epilogue_combine ? "" : ", no epilogue combine") +
                 (o.layer1_combine == Layer1Combine::kGemmBlocks ? ", layer1 combine in the GEMM blocks" : ""));
    layer.set_options(o);
    for (int call = 0; call < calls; ++call) {
      d.poison_y();
      layer.forward(d.tensors(), stream);
      layer.check(stream);
      EXPECT_EQ(d.download_y(), unfused) << "fused differs from unfused, call " << call;
    }
  }
}

TEST_P(FusedLayerTest, BitwiseEqualToUnfusedForAnyNComm) {
  COMET_REQUIRE_GPU();
  const LayerCase& lc = GetParam();
  SCOPED_TRACE(lc.describe());
  const LayerConfig c = lc.config();
  auto fabric = fabric::make_loopback_fabric(c.layout.world);
  MoeLayer layer(c, *fabric);
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    // Token counts change between calls (rotated across ranks): tiles come and go, so epoch
    // counters of absent tiles must stay consistent.
    std::vector<int> tokens = lc.tokens;
    std::rotate(tokens.begin(), tokens.begin() + call % int(tokens.size()), tokens.end());
    const MoeProblem p = make_problem(c, tokens, lc.spec, lc.seed + call);
    if (call == 0) layer.set_weights(p.weights);
    MoeProblem q = p;
    q.weights = make_problem(c, lc.tokens, lc.spec, lc.seed).weights;
    cuda::DeviceProblem d(c, q);
    layer.set_options(LayerOptions{});
    layer.forward(d.tensors(), nullptr);
    layer.check(nullptr);
    const auto unfused = d.download_y();
    EXPECT_TRUE(testing::near_oracle(unfused, ref::oracle_forward(q), q.config.model.hidden));
    expect_fused_equals_unfused(layer, d, unfused, {{1, 1}, {16, 16}, {64, 8}}, 1, nullptr);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, FusedLayerTest, ::testing::ValuesIn(layer_cases()),
                         [](const auto& info) { return "case" + std::to_string(info.index); });

// Enough tiles that every GEMM block runs several (pipelined) and waits between them; H = 448 is
// not a multiple of the 256-column layer1 block; n_comm 1 (one comm block does everything) and 64.
TEST(FusedLayer, ManyTilesPerBlockBitwiseEqualToUnfused) {
  COMET_REQUIRE_GPU();
  const LayerCase lc{"deepseek-v3", 16, 4, 1, 1024, {1024, 700, 0, 1024}, {RoutingKind::kZipf, 1.1, 0.05}, 21};
  SCOPED_TRACE(lc.describe());
  LayerRig rig(lc);
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto unfused = rig.forward(LayerOptions{}, stream);
  EXPECT_TRUE(testing::near_oracle(unfused, ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
  expect_fused_equals_unfused(rig.layer, rig.device, unfused, {{1, 1}, {64, 64}}, 2, stream);
  cudaStreamDestroy(stream);
}

// topk 16 with 16 experts per rank: a token can have up to 16 rows on a rank, several rounds of
// kCombineRows rows in flight in the combine. Unfused vs the oracle, fused bitwise equal to
// unfused.
TEST(FusedLayer, TopkSixteenBitwiseEqualToUnfused) {
  COMET_REQUIRE_GPU();
  const LayerConfig c = model_layer_config({"topk16", 256, 512, 32, 16, Activation::kSwiGlu}, 2, 1, 300);
  LayerRig rig(c, {300, 123}, {RoutingKind::kZipf, 1.5, 0.05}, 31);
  rig.layer.forward(rig.device.tensors(), nullptr);
  rig.layer.check(nullptr);
  const auto unfused = rig.device.download_y();
  EXPECT_TRUE(ref::compare_outputs(unfused, ref::oracle_forward(rig.problem), c.model.hidden)
                  .within(ref::tolerance_for(DType::kBF16)));
  expect_fused_equals_unfused(rig.layer, rig.device, unfused, {{1, 1}, {32, 4}}, 1, nullptr);
}

// A fused forward that fails part way through its enqueue (a launch refused after earlier ones
// were enqueued) leaves the layer usable: the counters its plans advanced are put back, and the
// next forward gives the fused output bit for bit, also on a non-blocking stream of the caller's
// (with a withheld rank there too). W = 4: launches 0-3 are the ranks' layer0, 4-7 their layer1.
// The unfused pipeline has no fused launch to fail.
TEST(FusedLayer, FailedEnqueueLeavesTheLayerUsable) {
  COMET_REQUIRE_GPU();
  LayerRig rig(LayerCase{"mixtral-8x7b", 16, 4, 1, 64, {64, 64, 64, 64}, {}, 11});
  LayerOptions o;
  o.path = ForwardPath::kFused;
  const auto want = rig.forward(o);
  testing::expect_failed_enqueue_recovers(rig.layer, rig.device, o, {0, 2, 4, 7}, want);
  cudaStream_t stream = nullptr;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  testing::expect_failed_enqueue_recovers(rig.layer, rig.device, o, {3, 5}, want, stream);
  testing::expect_withheld_rank_times_out_then_recovers(rig.layer, rig.device, rig.problem, o, 2, stream);
  COMET_CUDA_CHECK(cudaStreamDestroy(stream));
  LayerOptions unfused;
  unfused.path = ForwardPath::kUnfused;
  unfused.fail_before_launch = 0;
  EXPECT_EQ(rig.forward(unfused), want);
}

// With link emulation on too (docs/link_emulation.md): pacing waits are separate from signal
// waits and do not mask a timeout.
TEST(FusedLayer, WithheldRankTimesOutNamingItAndRecovers) {
  COMET_REQUIRE_GPU();
  for (const LinkEmulation link : {LinkEmulation{}, LinkEmulation{20, 5}}) {
    SCOPED_TRACE(link.describe());
    LayerRig rig(LayerCase{"mixtral-8x7b", 16, 4, 1, 64, {64, 64, 64, 64}, {}, 11});
    LayerOptions o;
    o.path = ForwardPath::kFused;
    o.link = link;
    testing::expect_withheld_rank_times_out_then_recovers(rig.layer, rig.device, rig.problem, o, 2);
  }
  for (DispatchOrder order : {DispatchOrder::kRing, DispatchOrder::kRows}) {
    SCOPED_TRACE(std::string("layer0 copies in the GEMM blocks, order ") + (order == DispatchOrder::kRows ? "rows" : "ring"));
    LayerRig rig(LayerCase{"mixtral-8x7b", 16, 4, 1, 64, {64, 64, 64, 64}, {}, 11});
    LayerOptions o;
    o.path = ForwardPath::kFused;
    o.layer0_copies = Layer0Copies::kGemmBlocks;
    o.dispatch_order = order;
    testing::expect_withheld_rank_times_out_then_recovers(rig.layer, rig.device, rig.problem, o, 2);
  }
}

// The benchmark parts run on the last plan: before any, and after the options switch layer1's
// column width (LayerOptions::layer1_combine), they are refused until forward() or
// run_part(kPlan) plans again; the next forward is unchanged.
TEST(MoeLayer, BenchmarkPartsNeedAPlanOfTheCurrentLayer1Width) {
  COMET_REQUIRE_GPU();
  LayerRig rig(LayerCase{"qwen3-30b-a3b", 16, 4, 2, 128, {128, 40, 0, 97}, {RoutingKind::kZipf, 1.1, 0.1}, 9});
  MoeLayer& layer = rig.layer;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.run_part(MoeLayer::Part::kGemms, nullptr); }, {"no plan yet"}));
  LayerOptions blocks;
  blocks.path = ForwardPath::kFused;
  blocks.layer1_combine = Layer1Combine::kCommBlocks;
  const auto want = rig.forward(blocks);
  LayerOptions gemm = blocks;
  gemm.layer1_combine = Layer1Combine::kGemmBlocks;
  layer.set_options(gemm);
  for (MoeLayer::Part part : {MoeLayer::Part::kGemms, MoeLayer::Part::kCommunication, MoeLayer::Part::kFusedGemms})
    EXPECT_TRUE(test::throws_with<Error>([&] { layer.run_part(part, nullptr); },
                                         {"256 columns", "now 128", "layer1_combine"}))
        << "part " << int(part);
  layer.run_part(MoeLayer::Part::kPlan, nullptr);
  layer.run_part(MoeLayer::Part::kGemms, nullptr);
  layer.run_part(MoeLayer::Part::kFusedGemms, nullptr);
  layer.check(nullptr);
  EXPECT_EQ(rig.forward(gemm), want);
}

// The benchmark parts run on the last forward's plans and buffers; none may leave a signal,
// counter or buffer behind that changes the next forward, fused or not.
TEST(MoeLayer, BenchmarkPartsLeaveTheNextForwardUnchanged) {
  COMET_REQUIRE_GPU();
  LayerRig rig(LayerCase{"qwen3-30b-a3b", 16, 4, 2, 128, {128, 40, 0, 97}, {RoutingKind::kZipf, 1.1, 0.1}, 9});
  MoeLayer& layer = rig.layer;
  cuda::DeviceProblem& d = rig.device;
  LayerOptions o;
  o.path = ForwardPath::kFused;
  const auto want = rig.forward(o);
  for (MoeLayer::Part part : {MoeLayer::Part::kGemms, MoeLayer::Part::kCommunication, MoeLayer::Part::kPlan,
                              MoeLayer::Part::kFusedGemms, MoeLayer::Part::kBarrier}) {
    SCOPED_TRACE("part " + std::to_string(int(part)));
    layer.run_part(part, nullptr);
    layer.check(nullptr);
    d.poison_y();
    layer.forward(d.tensors(), nullptr);
    layer.check(nullptr);
    EXPECT_EQ(d.download_y(), want);
  }
}

// ForwardPath::kTuned: unfused without a table or with an entry whose fused forward was slower,
// fused (with the entry's n_comm) where the entry measured it faster; the output is the same bit
// for bit. Which kernels ran is observed through the fault injection: a stalled rank's
// communication blocks exist only in the fused kernels, so only the fused path times out.
TEST(MoeLayer, TunedPathFollowsTheTableEntry) {
  COMET_REQUIRE_GPU();
  LayerRig rig(LayerCase{"qwen3-30b-a3b", 16, 4, 2, 128, {128, 40, 0, 97}, {RoutingKind::kZipf, 1.1, 0.1}, 9});
  MoeLayer& layer = rig.layer;
  LayerOptions tuned;  // path kTuned, the default
  const auto want = rig.forward(tuned);
  EXPECT_FALSE(layer.path().fused);
  EXPECT_NE(layer.path().source.find("no tuning entry"), std::string::npos) << layer.path().source;

  const cuda::DeviceInfo info = cuda::query_device_info();
  const TuningKey key = tuning_key(rig.config, info.name, info.num_sms, rig.config.max_tokens_per_rank);
  TuningTable slower, faster;
  slower.add({key, 16, 2, 300.0, 200.0});
  faster.add({key, 16, 2, 100.0, 200.0});
  LayerOptions stalled = tuned;
  stalled.stall_rank = 1;
  stalled.timeout_s = 0.2;

  layer.set_tuning_table(slower);
  EXPECT_FALSE(layer.path().fused);
  EXPECT_EQ(rig.forward(stalled), want) << "the unfused path has no communication blocks to stall";

  layer.set_tuning_table(faster);
  EXPECT_TRUE(layer.path().fused);
  EXPECT_EQ(layer.path().source.rfind("fused: tuning table entry", 0), 0u) << layer.path().source;
  EXPECT_EQ(layer.n_comm().n_comm0, 16);
  testing::expect_withheld_rank_times_out_then_recovers(layer, rig.device, rig.problem, tuned, 1);
  EXPECT_EQ(rig.forward(tuned), want) << "the tuned fused path differs from the unfused output";

  LayerOptions forced = tuned;  // options override the table
  forced.path = ForwardPath::kUnfused;
  layer.set_options(forced);
  EXPECT_FALSE(layer.path().fused);
  EXPECT_EQ(layer.path().source, "options");
  forced.trace = true;  // tracing records the fused kernels: only with kFused
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_options(forced); }, {"trace", "kFused"}));
}

// The layer0 mode and the layer1 combine: the table entry's when LayerOptions leaves them unset
// (with the fused output unchanged), options over the table, and never copies or the combine in
// the GEMM blocks under link emulation (they cannot be paced), which options asking for them are
// refused.
TEST(MoeLayer, FusedModesFollowTheTableEntryUnlessOptionsFixThem) {
  COMET_REQUIRE_GPU();
  LayerRig rig(LayerCase{"qwen3-30b-a3b", 16, 4, 2, 128, {128, 40, 0, 97}, {RoutingKind::kZipf, 1.1, 0.1}, 9});
  MoeLayer& layer = rig.layer;
  LayerOptions fused;
  fused.path = ForwardPath::kFused;
  const auto want = rig.forward(fused);
  EXPECT_EQ(layer.layer0_mode().mode, Layer0Mode{});
  EXPECT_EQ(layer.layer0_mode().source.rfind("blocks/ring: no tuning entry", 0), 0u) << layer.layer0_mode().source;
  EXPECT_EQ(layer.layer1_combine().combine, Layer1Combine::kCommBlocks);
  EXPECT_EQ(layer.layer1_combine().source.rfind("blocks: no tuning entry", 0), 0u) << layer.layer1_combine().source;

  const cuda::DeviceInfo info = cuda::query_device_info();
  TuningEntry e{tuning_key(rig.config, info.name, info.num_sms, rig.config.max_tokens_per_rank), 16, 2, 100.0, 200.0};
  e.layer0 = {Layer0Copies::kGemmBlocks, DispatchOrder::kRows};
  e.layer1_combine = Layer1Combine::kGemmBlocks;
  TuningTable table;
  table.add(e);
  layer.set_tuning_table(table);
  EXPECT_EQ(layer.layer0_mode().mode, e.layer0);
  EXPECT_EQ(layer.layer0_mode().source.rfind("gemm/rows: tuning table", 0), 0u) << layer.layer0_mode().source;
  EXPECT_EQ(layer.layer1_combine().combine, Layer1Combine::kGemmBlocks);
  EXPECT_EQ(layer.layer1_combine().source.rfind("gemm: tuning table", 0), 0u) << layer.layer1_combine().source;
  EXPECT_EQ(rig.forward(fused), want);

  LayerOptions ring = fused;
  ring.dispatch_order = DispatchOrder::kRing;  // one part fixed, the other from the table
  ring.layer1_combine = Layer1Combine::kCommBlocks;
  layer.set_options(ring);
  EXPECT_EQ(layer.layer0_mode().mode, (Layer0Mode{Layer0Copies::kGemmBlocks, DispatchOrder::kRing}));
  EXPECT_EQ(layer.layer1_combine().combine, Layer1Combine::kCommBlocks);
  EXPECT_EQ(layer.layer1_combine().source, "options");
  EXPECT_EQ(rig.forward(ring), want);

  LayerOptions paced = fused;
  paced.link = LinkEmulation{400, 1};
  layer.set_options(paced);
  EXPECT_EQ(layer.layer0_mode().mode.copies, Layer0Copies::kCommBlocks);
  EXPECT_NE(layer.layer0_mode().source.find("link emulation"), std::string::npos) << layer.layer0_mode().source;
  EXPECT_EQ(layer.layer1_combine().combine, Layer1Combine::kCommBlocks);
  EXPECT_NE(layer.layer1_combine().source.find("link emulation"), std::string::npos) << layer.layer1_combine().source;
  EXPECT_EQ(rig.forward(paced), want);
  paced.layer0_copies = Layer0Copies::kGemmBlocks;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_options(paced); }, {"GEMM blocks", "emulated link"}));
  paced.layer0_copies = Layer0Copies::kCommBlocks;
  paced.layer1_combine = Layer1Combine::kGemmBlocks;  // layer1's combine cannot be paced there either
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_options(paced); }, {"layer1", "GEMM blocks", "emulated link"}));
}

// A token row too large for the GEMM blocks' copy ring (hidden 24576: 48 KB of bf16): options
// asking for those copies are refused with the reason, and a table entry asking for them falls
// back to communication blocks, saying why; the layer still runs and matches the oracle.
TEST(MoeLayer, GemmBlockCopiesOfRowsLargerThanTheRingAreRefused) {
  COMET_REQUIRE_GPU();
  const LayerConfig c = model_layer_config({"wide", 24576, 64, 4, 2, Activation::kSwiGlu}, 2, 1, 8);
  LayerRig rig(c, {8, 5}, {}, 3);
  MoeLayer& layer = rig.layer;
  LayerOptions o;
  o.path = ForwardPath::kFused;
  o.layer0_copies = Layer0Copies::kGemmBlocks;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_options(o); }, {"hidden 24576", "copy ring"}));
  const cuda::DeviceInfo info = cuda::query_device_info();
  TuningEntry e{tuning_key(c, info.name, info.num_sms, c.max_tokens_per_rank), 16, 2, 100.0, 200.0};
  e.layer0 = {Layer0Copies::kGemmBlocks, DispatchOrder::kRows};
  TuningTable table;
  table.add(e);
  layer.set_tuning_table(table);
  o.layer0_copies.reset();
  layer.set_options(o);
  EXPECT_EQ(layer.layer0_mode().mode, (Layer0Mode{Layer0Copies::kCommBlocks, DispatchOrder::kRows}));
  EXPECT_NE(layer.layer0_mode().source.find("does not fit their ring"), std::string::npos) << layer.layer0_mode().source;
  layer.forward(rig.device.tensors(), nullptr);
  layer.check(nullptr);
  EXPECT_TRUE(testing::near_oracle(rig.device.download_y(), ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
}

// Plain activations (GELU, ReLU, SiLU) run on the unfused pipeline, their default path: the
// oracle's output on EP and EP+TP layouts with an empty rank, a second call and the kAuto GEMMs
// bitwise the same; the fused path and the fused kernels' GEMMs are refused by name.
TEST(MoeLayer, PlainActivationsMatchTheOracle) {
  COMET_REQUIRE_GPU();
  for (Activation act : {Activation::kGelu, Activation::kRelu, Activation::kSilu})
    for (const LayerCase& lc : {LayerCase{"mixtral-8x7b", 16, 2, 1, 96, {96, 0}, {RoutingKind::kImbalance, 0.05, 0}, 2},
                                LayerCase{"qwen3-30b-a3b", 16, 4, 2, 128, {128, 40, 0, 97}, {RoutingKind::kZipf, 1.1, 0.1}, 5}}) {
      LayerConfig c = lc.config();
      c.model.activation = act;
      SCOPED_TRACE(lc.describe() + " activation " + activation_name(act));
      LayerRig rig(c, lc.tokens, lc.spec, lc.seed);
      EXPECT_FALSE(rig.layer.path().fused) << rig.layer.path().source;
      const auto got = rig.forward(LayerOptions{});
      EXPECT_TRUE(testing::near_oracle(got, ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
      EXPECT_EQ(rig.forward(LayerOptions{}), got) << "a second call differs";
      LayerOptions auto_gemms;
      auto_gemms.unfused_gemms = UnfusedGemms::kAuto;
      EXPECT_EQ(rig.forward(auto_gemms), got) << "the kAuto unfused GEMMs differ";
      LayerOptions fused;
      fused.path = ForwardPath::kFused;
      EXPECT_TRUE(test::throws_with<Error>([&] { rig.layer.set_options(fused); }, {"fuse SwiGLU"}))
          << "the fused path";
      EXPECT_TRUE(test::throws_with<Error>([&] { rig.layer.run_part(MoeLayer::Part::kFusedGemms, nullptr); },
                                           {"fuse SwiGLU"}))
          << "run_part(kFusedGemms)";
    }
}

TEST(MoeLayer, RefusesConfigurationsItCannotRun) {
  LayerConfig c = LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {}, {}, 1}.config();
  c.model.activation = Activation::kGelu;  // a plain activation runs (unfused)
  EXPECT_TRUE(MoeLayer::can_implement(c).ok) << MoeLayer::can_implement(c).reason;
  c.model.activation = Activation::kSwiGlu;
  c.model.hidden = 100;
  EXPECT_NE(MoeLayer::can_implement(c).reason.find("multiples of 8"), std::string::npos);
  // The device plan's bounds are checked here too, not at the first forward(): 1024 experts
  // per rank at W = 64 need more shared memory than its layout kernel has.
  c = LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {}, {}, 1}.config();
  c.model.num_experts = 1024;
  c.layout = {64, 1, 64};
  c.model.ffn = 64 * 64;
  EXPECT_NE(MoeLayer::can_implement(c).reason.find("shared memory"), std::string::npos)
      << MoeLayer::can_implement(c).reason;
  // Another storage type is refused, not read as bf16.
  for (DType dtype : {DType::kF16, DType::kF32}) {
    c = LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {}, {}, 1}.config();
    c.dtype = dtype;
    EXPECT_NE(MoeLayer::can_implement(c).reason.find(std::string("bf16 only, got ") + dtype_name(dtype)),
              std::string::npos)
        << MoeLayer::can_implement(c).reason;
  }
  COMET_REQUIRE_GPU();
  auto fabric = fabric::make_loopback_fabric(c.layout.world);
  EXPECT_TRUE(test::throws_with<Error>([&] { MoeLayer layer(c, *fabric); }, {"MoeLayer: ", "bf16 only"}));
}

}  // namespace
}  // namespace comet
