// MoeLayer on the Local fabric (one process, ranks over several GPUs, peer access): labels `gpu`
// and `multi_gpu`; every test skips with a visible message when fewer than 2 GPUs are visible.
// Each test runs W = the visible GPUs (one rank per GPU), twice that, 4 and 8, as far as W divides
// 8 (several ranks per GPU where fewer GPUs are visible: two H200s run W = 4 and 8 as 2 and 4
// ranks per GPU).
// The reference is the same layer with every rank on GPU 0 (Loopback): the same kernels, plans
// and reduction orders, so the outputs must be bitwise equal; and the fp64 oracle.
#include <algorithm>
#include <string>

#include "comet/layer.h"
#include "comet/problem.h"
#include "captured_forward.h"
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

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define COMET_REQUIRE_GPUS(n)                                                                         \
  do {                                                                                                \
    if (visible_gpus() < (n))                                                                         \
      GTEST_SKIP() << (n) << " GPUs needed, " << visible_gpus() << " visible (multi_gpu test skipped)"; \
  } while (0)

// The worlds each test runs (see the file header): those of {visible, 2 x visible, 4, 8} that
// divide 8, since local_cases() puts mixtral's 8 experts at EP = W.
std::vector<int> local_worlds() {
  const int gpus = std::min(visible_gpus(), 8);
  std::vector<int> worlds;
  for (int w : {gpus, 2 * gpus, 4, 8})
    if (w >= 2 && 8 % w == 0 && std::find(worlds.begin(), worlds.end(), w) == worlds.end()) worlds.push_back(w);
  return worlds;
}

std::string describe(const fabric::Fabric& f) {
  return "W " + std::to_string(f.world()) + " over " + std::to_string(f.gpus()) + " GPUs";
}

// EP, TP and EP+TP where the world allows.
std::vector<LayerCase> local_cases(int world) {
  std::vector<LayerCase> out;
  std::vector<int> tokens;
  for (int r = 0; r < world; ++r) tokens.push_back(r == 1 ? 0 : 96 - 17 * r % 80);
  out.push_back({"mixtral-8x7b", 16, world, 1, 96, tokens, {RoutingKind::kUniform, 0, 0}, 3});
  out.push_back({"mixtral-8x7b", 16, world, world, 96, tokens, {RoutingKind::kZipf, 1.2, 0.1}, 4});  // F/16/W % 8 == 0
  if (world % 2 == 0) out.push_back({"deepseek-v3", 16, world, 2, 96, tokens, {RoutingKind::kImbalance, 0.05, 0}, 5});
  return out;
}

std::vector<std::vector<float>> run(const LayerConfig& c, const MoeProblem& p, fabric::Fabric& f,
                                    const LayerOptions& o) {
  MoeLayer layer(c, f);
  layer.set_weights(p.weights);
  layer.set_options(o);
  cuda::DeviceProblem d(c, p, &f);
  layer.forward(d.tensors(), nullptr);
  layer.check(nullptr);
  const auto first = d.download_y();
  d.poison_y();
  // A benchmark's barrier between forwards (Part::kBarrier; across GPUs a barrier kernel, on one
  // GPU nothing) continues the barrier sequence: the next forward's barriers still meet.
  layer.run_part(MoeLayer::Part::kBarrier, nullptr);
  layer.forward(d.tensors(), nullptr);
  layer.check(nullptr);
  EXPECT_EQ(d.download_y(), first) << "a second call differs";
  return first;
}

// The fabric spreads the ranks evenly, the ranks of a GPU next to each other.
TEST(MoeLayerLocal, FabricPlacesRanksEvenlyOverTheGpus) {
  COMET_REQUIRE_GPUS(2);
  for (int W : local_worlds()) {
    auto local = fabric::make_local_fabric(W);
    SCOPED_TRACE(describe(*local));
    const int gpus = fabric::local_fabric_gpus(W, visible_gpus());
    EXPECT_EQ(local->gpus(), gpus);
    EXPECT_GE(gpus, 2);
    EXPECT_EQ(W % gpus, 0);
    for (int r = 0; r < W; ++r) EXPECT_EQ(local->device_of(r), r / (W / gpus)) << "rank " << r;
  }
}

TEST(MoeLayerLocal, MatchesLoopbackBitwiseAndTheOracle) {
  COMET_REQUIRE_GPUS(2);
  for (int W : local_worlds())
    for (const LayerCase& lc : local_cases(W))
      for (const auto& [name, o] : testing::forward_variants()) {
        auto local = fabric::make_local_fabric(W);
        SCOPED_TRACE(describe(*local) + ": " + lc.describe() + " " + name);
        const LayerConfig c = lc.config();
        const MoeProblem p = make_problem(c, lc.tokens, lc.spec, lc.seed);
        const auto got = run(c, p, *local, o);
        auto loopback = fabric::make_loopback_fabric(W, 0);
        EXPECT_EQ(got, run(c, p, *loopback, o)) << "Local and Loopback differ";
        EXPECT_TRUE(testing::near_oracle(got, ref::oracle_forward(p), p.config.model.hidden));
      }
}

// The forward across GPUs captured once and replayed with new routing and token counts: the
// barrier generations live on the devices, so replays continue the sequence.
TEST(MoeLayerLocal, GraphReplayAcrossGpus) {
  COMET_REQUIRE_GPUS(2);
  for (int W : local_worlds()) {
    SCOPED_TRACE("W " + std::to_string(W));
    const LayerCase lc = local_cases(W)[0];
    testing::LayerRig rig(lc, fabric::make_local_fabric(W));
    const LayerConfig& c = rig.config;
    cuda::DeviceProblem& d = rig.device;
    LayerOptions o;
    o.path = ForwardPath::kFused;
    rig.layer.set_options(o);
    testing::CapturedForward graph(rig.layer, d.tensors());
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      std::vector<int> tokens = lc.tokens;
      std::rotate(tokens.begin(), tokens.begin() + (replay + 1) % W, tokens.end());
      MoeProblem p = make_problem(c, tokens, lc.spec, lc.seed + 10 + replay);
      p.weights = rig.problem.weights;
      d.assign_inputs(cuda::DeviceProblem(c, p, rig.fabric.get()));
      d.poison_y();
      graph.replay();
      EXPECT_TRUE(testing::near_oracle(d.download_y(), ref::oracle_forward(p), p.config.model.hidden));
    }
  }
}

// A rank that never moves its rows: its GEMM times out naming it, every other rank finishes
// (the barriers still run; a peer's barrier may time out too, waiting for the stuck rank, and
// check() reports the stuck rank's own record, not that), and after check() the layer works
// again.
TEST(MoeLayerLocal, WithheldRankTimesOutNamingItAndRecovers) {
  COMET_REQUIRE_GPUS(2);
  for (int W : local_worlds()) {
    SCOPED_TRACE("W " + std::to_string(W));
    LayerCase lc = local_cases(W)[0];
    lc.tokens = std::vector<int>(W, 64);
    testing::LayerRig rig(lc, fabric::make_local_fabric(W));
    LayerOptions o;
    o.path = ForwardPath::kFused;
    testing::expect_withheld_rank_times_out_then_recovers(rig.layer, rig.device, rig.problem, o, W - 1);
  }
}

// The same on a stream of the caller's own (GPU 0), the last rank on another GPU: check() must
// zero the counters from the caller's device (it once left the last rank's GPU current and then
// recorded the fork event of that GPU on GPU 0's stream, which CUDA refuses, so the error records
// stayed set and every later forward skipped its waits).
TEST(MoeLayerLocal, WithheldRankRecoversOnTheCallersStream) {
  COMET_REQUIRE_GPUS(2);
  for (int W : local_worlds()) {
    SCOPED_TRACE("W " + std::to_string(W));
    LayerCase lc = local_cases(W)[0];
    lc.tokens = std::vector<int>(W, 64);
    testing::LayerRig rig(lc, fabric::make_local_fabric(W));
    COMET_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t stream = nullptr;
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LayerOptions o;
    o.path = ForwardPath::kFused;
    testing::expect_withheld_rank_times_out_then_recovers(rig.layer, rig.device, rig.problem, o, W - 1, stream);
    int current = -1;
    COMET_CUDA_CHECK(cudaGetDevice(&current));
    EXPECT_EQ(current, 0) << "the layer left another GPU current";
    COMET_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// The same across GPUs, where each GPU's ranks run on a stream of their own: a forward that
// fails part way through its enqueue first waits for every group's stream, then puts the
// counters back; the next forward is the fused output bit for bit. Launches are counted group by
// group (the first W/2 ranks' layer0 and layer1, then the others'), so the failures below stop
// the enqueue before any kernel, inside the first group, and between the two groups, on the
// legacy stream and on a stream of the caller's on GPU 0.
TEST(MoeLayerLocal, FailedEnqueueLeavesTheLayerUsable) {
  COMET_REQUIRE_GPUS(2);
  for (int W : local_worlds()) {
    SCOPED_TRACE("W " + std::to_string(W));
    LayerCase lc = local_cases(W)[0];
    lc.tokens = std::vector<int>(W, 64);
    testing::LayerRig rig(lc, fabric::make_local_fabric(W));
    LayerOptions o;
    o.path = ForwardPath::kFused;
    const auto want = rig.forward(o);
    testing::expect_failed_enqueue_recovers(rig.layer, rig.device, o, {0, 1, W, 2 * W - 1}, want);
    COMET_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t stream = nullptr;
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    testing::expect_failed_enqueue_recovers(rig.layer, rig.device, o, {W + 1}, want, stream);
    COMET_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// Ranks on GPUs of their own have real links: link emulation is refused by name (as the
// baselines refuse it), and the layer runs as before.
TEST(MoeLayerLocal, RefusesLinkEmulation) {
  COMET_REQUIRE_GPUS(2);
  const int W = 8;  // several ranks per GPU below 8 GPUs: still real links between the GPUs
  testing::LayerRig rig(local_cases(W)[0], fabric::make_local_fabric(W));
  LayerOptions paced;
  paced.link.gbps = 100;
  EXPECT_TRUE(test::throws_with<Error>([&] { rig.layer.set_options(paced); },
                                       {"link emulation stands for a node on one GPU", "local fabric"}));
  EXPECT_TRUE(testing::near_oracle(rig.forward(LayerOptions{}), ref::oracle_forward(rig.problem), rig.problem.config.model.hidden));
}

TEST(MoeLayerLocal, RefusesTensorsForTheWrongNumberOfRanks) {
  COMET_REQUIRE_GPUS(2);
  const int W = std::min(visible_gpus(), 8);
  testing::LayerRig rig(local_cases(W)[0], fabric::make_local_fabric(W));
  std::vector<RankTensors> fewer = rig.device.tensors();
  fewer.pop_back();
  try {
    rig.layer.forward(fewer, nullptr);
    ADD_FAILURE() << "forward accepted tensors for " << fewer.size() << " of " << W << " ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this process drives"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace comet
