// multi_gpu/baseline_multi_gpu_test.cu: the baselines (comet/baseline.h) on the Nccl fabric, one
// process per GPU (label `multi_gpu`). Run one copy per GPU under a launcher:
//   comet launch -n 2 build/tests/multi_gpu/baseline_multi_gpu_test
//   tests/multi_gpu/run_ranks.sh 2 build/tests/multi_gpu/baseline_multi_gpu_test   (stand-in)
// Without RANK/WORLD_SIZE, or with fewer GPUs than ranks, every test skips with a message
// containing "multi_gpu test skipped".
//
// Every rank builds the whole problem (every rank's tokens and routing) from a seed, runs its own
// rank through a BaselineMoe on an Nccl fabric, and compares its y with rank r's y of a Loopback
// BaselineMoe of all W ranks on its own GPU (the oracle of tests/gpu/baseline_test.cu), both with
// set_random_weights(seed) (or set_weights) so every rank holds the same weights in both.
// Bitwise: each rank runs the same kernels and cuBLAS calls with the same shapes in the same
// order on the same GPU model; NCCL's send/recv move bytes exactly, and the owner's sum over
// ranks runs in rank order in both. The Loopback run checks itself against the fp64 oracle once.
//
// Every rank runs the same tests in the same order with the same options, so the collective
// calls (fabric construction and teardown, BaselineMoe's constructor and forward) match up.
// Checks use EXPECT (not ASSERT) wherever a collective call follows.
#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "comet/baseline.h"
#include "comet/problem.h"
#include "cuda/device_problem.h"
#include "fabric/fabric.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_cases.h"
#include "multi_gpu/process_run.h"
#include "ref/oracle.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::LayerCase;
using test::throws_with;

// Each test makes its own Nccl fabric (a BaselineMoe owns its fabric's heap), collectively.
comet::testing::ProcessRun* const run =
    static_cast<comet::testing::ProcessRun*>(::testing::AddGlobalTestEnvironment(new comet::testing::ProcessRun));

// The tests' common start: skip or fail as the run says, this rank's GPU current.
class BaselineNcclRun : public ::testing::Test {
 protected:
  void SetUp() override {
    COMET_REQUIRE_PROCESS_RUN(*run);
    COMET_CUDA_CHECK(cudaSetDevice(env().local_rank));
  }
  static const ProcessEnv& env() { return run->env(); }
  static int world() { return run->env().world; }
  static int rank() { return run->env().rank; }
};

// Cases for W ranks: EP, TP = 2 and all-TP layouts where the preset's experts and F/TP divide,
// uneven token counts with an empty rank, Zipf routing with masked slots.
std::vector<LayerCase> cases(int W) {
  std::vector<int> tps = {1};
  if (W % 2 == 0) tps.push_back(2);
  if (W > 2) tps.push_back(W);
  std::vector<LayerCase> out;
  uint64_t seed = 100;
  for (const char* model : {"mixtral-8x7b", "qwen3-30b-a3b"})
    for (int tp : tps) {
      LayerCase c{model, 16, W, tp, 80, {}, {RoutingKind::kZipf, 1.2, 0.1}, ++seed};
      const LayerConfig config = c.config();
      if (config.model.num_experts % config.layout.ep != 0 || config.ffn_per_rank() % 8 != 0) continue;
      for (int r = 0; r < W; ++r) c.tokens.push_back(r == 1 ? 0 : 80 - 11 * r % 70);
      out.push_back(c);
    }
  return out;
}

// y of every rank after a Loopback forward of the whole problem on this GPU.
std::vector<std::vector<float>> loopback_y(BaselineMoe& layer, cuda::DeviceProblem& d) {
  d.poison_y();
  layer.forward(d.tensors(), nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  return d.download_y();
}

// y of this rank after an Nccl forward of its own tensors (collective).
std::vector<float> nccl_y(BaselineMoe& layer, cuda::DeviceProblem& d, int rank, cudaStream_t stream) {
  d.poison_y();
  layer.forward({d.tensors()[rank]}, stream);
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d.download_y()[rank];
}

bool same_traffic(const BaselineTraffic& a, const BaselineTraffic& b) {
  return a.dispatch_bytes == b.dispatch_bytes && a.dispatch_remote_bytes == b.dispatch_remote_bytes &&
         a.combine_bytes == b.combine_bytes && a.combine_remote_bytes == b.combine_remote_bytes;
}

TEST_F(BaselineNcclRun, EqualsLoopbackBitwise) {
  SCOPED_TRACE(run->who());
  const int W = world(), r = rank();
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<LayerCase> all = cases(W);
  for (size_t i = 0; i < all.size(); ++i) {
    const LayerCase& lc = all[i];
    SCOPED_TRACE(lc.describe());
    const LayerConfig c = lc.config();
    const MoeProblem p = make_problem(c, lc.tokens, lc.spec, lc.seed);
    const bool random_weights = i % 2 == 0;  // else the problem's weights, sliced per rank
    auto loopback = fabric::make_loopback_fabric(W, env().local_rank);
    BaselineMoe want_layer(c, *loopback);
    cuda::DeviceProblem want_inputs(c, p);
    auto nccl = fabric::make_nccl_fabric(env());
    BaselineMoe layer(c, *nccl);
    cuda::DeviceProblem inputs(c, p);
    if (random_weights) {
      want_layer.set_random_weights(lc.seed);
      layer.set_random_weights(lc.seed);
    } else {
      want_layer.set_weights(p.weights);
      layer.set_weights(p.weights);
    }

    const BaselineOptions schedules[] = {sequential_baseline(),
                                         chunked_baseline(1),
                                         chunked_baseline(2),
                                         chunked_baseline(3),
                                         chunked_baseline(8),
                                         {3, false, BaselineGemm::kPerExpertLoop},
                                         chunked_baseline(2, BaselineGemm::kGroupedBatched),
                                         sequential_baseline(BaselineGemm::kGroupedBatched)};
    for (const BaselineOptions& o : schedules) {
      SCOPED_TRACE(o.describe());
      want_layer.set_options(o);
      layer.set_options(o);
      const auto want = loopback_y(want_layer, want_inputs);
      if (!random_weights && o.chunks == 1 && !o.pipelined && o.gemm == BaselineGemm::kPerExpertLoop) {
        const ref::Comparison cmp = ref::compare_outputs(want, ref::oracle_forward(p), p.config.model.hidden);
        EXPECT_TRUE(cmp.within(ref::tolerance_for(DType::kBF16))) << "Loopback against the oracle: "
                                                                   << cmp.describe();
      }
      const std::vector<float> got = nccl_y(layer, inputs, r, stream);
      EXPECT_EQ(got, want[r]) << "Nccl rank " << r << " differs from Loopback";
      EXPECT_EQ(nccl_y(layer, inputs, r, stream), got) << "a second call differs";
      EXPECT_TRUE(same_traffic(layer.last_traffic(), want_layer.last_traffic())) << "traffic differs";
    }
    // run_part (collective) leaves the next forward unchanged.
    const auto want = loopback_y(want_layer, want_inputs);
    layer.run_part(BaselineMoe::Part::kCommunication, stream);
    layer.run_part(BaselineMoe::Part::kCompute, stream);
    EXPECT_EQ(nccl_y(layer, inputs, r, stream), want[r]) << "after run_part";
  }
  COMET_CUDA_CHECK(cudaStreamDestroy(stream));
}

// New token counts and routing between calls on one object, more chunks than some ranks have tokens.
TEST_F(BaselineNcclRun, NewRoutingBetweenCalls) {
  SCOPED_TRACE(run->who());
  const int W = world(), r = rank();
  const LayerCase lc{"mixtral-8x7b", 16, W, 1, 96, {}, {RoutingKind::kZipf, 1.5, 0.2}, 7};
  const LayerConfig c = lc.config();
  auto loopback = fabric::make_loopback_fabric(W, env().local_rank);
  BaselineMoe want_layer(c, *loopback, chunked_baseline(6));
  want_layer.set_random_weights(3);
  auto nccl = fabric::make_nccl_fabric(env());
  BaselineMoe layer(c, *nccl, chunked_baseline(6));
  layer.set_random_weights(3);
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    std::vector<int> tokens;  // uneven, 0..96, rank 0 with 3 tokens (< 6 chunks) in call 1
    for (int q = 0; q < W; ++q) tokens.push_back(call == 1 && q == 0 ? 3 : std::min(96, (q * 37 + call * 53) % 97));
    const MoeProblem p = make_problem(c, tokens, lc.spec, lc.seed + call);
    cuda::DeviceProblem want_inputs(c, p), inputs(c, p);
    const auto want = loopback_y(want_layer, want_inputs);
    EXPECT_EQ(nccl_y(layer, inputs, r, nullptr), want[r]);
  }
}

// Bad input on one rank fails on every rank (each reads every rank's counts), naming that rank;
// the layer stays usable. A wrong number of tensors fails before any collective.
TEST_F(BaselineNcclRun, BadInputFailsOnEveryRank) {
  SCOPED_TRACE(run->who());
  const int W = world(), r = rank(), bad = W - 1;
  const LayerCase lc{"mixtral-8x7b", 16, W, 1, 64, std::vector<int>(W, 40), {}, 11};
  const LayerConfig c = lc.config();
  const MoeProblem p = make_problem(c, lc.tokens, lc.spec, lc.seed);
  auto nccl = fabric::make_nccl_fabric(env());
  BaselineMoe layer(c, *nccl, chunked_baseline(2));
  layer.set_random_weights(1);
  cuda::DeviceProblem inputs(c, p);
  const std::vector<float> good = nccl_y(layer, inputs, r, nullptr);

  inputs.set_token_count(bad, 65);  // only rank `bad` passes these tensors
  EXPECT_TRUE(throws_with<Error>([&] { layer.forward({inputs.tensors()[r]}, nullptr); },
                                 {"bad input from rank " + std::to_string(bad), "num_tokens 65", "T_max = 64"}));
  inputs.set_token_count(bad, 40);
  EXPECT_TRUE(throws_with<Error>([&] { layer.forward(inputs.tensors(), nullptr); },
                                 {"forward got tensors for " + std::to_string(W), "this process drives 1",
                                  "ranks " + std::to_string(r) + ".." + std::to_string(r)}));
  EXPECT_TRUE(throws_with<Error>([&] { layer.forward({}, nullptr); }, {"tensors for 0 ranks"}));
  EXPECT_EQ(nccl_y(layer, inputs, r, nullptr), good) << "after the errors";
}

// After a good forward (NCCL's connections between the ranks are up, so the exchange is only
// enqueued), the last rank's forward fails on its own before the count exchange (a misaligned
// y); the others wait for its counts at most the fabric's timeout (2 s here) and fail naming
// the exchange, instead of hanging. (On a first forward the exchange's own set-up times out
// first, naming all_to_all_v.) Every rank's fabric then tears down within its timeout. Last in
// this file: the fabric made here ends aborted on some ranks.
TEST_F(BaselineNcclRun, PeerThatNeverSendsItsCountsTimesOutByName) {
  SCOPED_TRACE(run->who());
  const int W = world(), r = rank(), bad = W - 1;
  if (W == 1) GTEST_SKIP() << "needs a peer";
  const LayerCase lc{"mixtral-8x7b", 16, W, 1, 64, std::vector<int>(W, 40), {}, 13};
  const LayerConfig c = lc.config();
  const MoeProblem p = make_problem(c, lc.tokens, lc.spec, lc.seed);
  ProcessEnv short_wait = env();
  short_wait.timeout_s = 2;
  auto nccl = fabric::make_nccl_fabric(short_wait);
  BaselineMoe layer(c, *nccl, sequential_baseline());
  layer.set_random_weights(1);
  cuda::DeviceProblem inputs(c, p);
  nccl_y(layer, inputs, r, nullptr);
  std::vector<RankTensors> mine = {inputs.tensors()[r]};
  if (r == bad) {
    mine[0].y = static_cast<char*>(mine[0].y) + 2;
    EXPECT_TRUE(throws_with<Error>([&] { layer.forward(mine, nullptr); }, {"16-byte aligned"}));
  } else {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(throws_with<TimeoutError>([&] { layer.forward(mine, nullptr); },
                                          {"the baseline's exchange of token counts"}));
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  }
}

}  // namespace
}  // namespace comet
