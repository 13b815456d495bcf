// multi_gpu/moe_layer_multi_gpu_test.cu: MoeLayer with one process per GPU (Nccl fabric). Every
// rank builds the whole problem from the seed, runs its own rank, and compares its output with
// the same layer run with all W ranks on its own GPU (Loopback: the same kernels, plans and
// reduction orders, so bitwise equal) and with the fp64 oracle. The run and its rules:
// multi_gpu/nccl_run.h.
//   comet launch -n 2 build/tests/multi_gpu/moe_layer_multi_gpu_test
#include <string>
#include <vector>

#include "comet/layer.h"
#include "comet/problem.h"
#include "cuda/device_problem.h"
#include "gpu/captured_forward.h"
#include "gpu/layer_checks.h"
#include "multi_gpu/nccl_run.h"
#include "ref/oracle.h"
#include "support/test_support.h"

namespace comet {
namespace {

using testing::Run;
using testing::who;

struct Case {
  std::string model;
  int tp;
  RoutingSpec spec;
};

// EP, TP and EP+TP where W allows; rank 1 has no tokens.
std::vector<Case> cases(int world) {
  std::vector<Case> out{{"mixtral-8x7b", 1, {RoutingKind::kUniform, 0, 0}},
                        {"mixtral-8x7b", world, {RoutingKind::kZipf, 1.2, 0.1}}};  // F/16/W % 8 == 0
  if (world % 2 == 0 && world > 2) out.push_back({"deepseek-v3", 2, {RoutingKind::kImbalance, 0.05, 0}});
  return out;
}

LayerConfig config_of(const Case& k, int world) {
  LayerConfig c;
  c.model = ModelPresets::get(k.model).scaled_down(16);
  c.layout = {world, world / k.tp, k.tp};
  c.max_tokens_per_rank = 96;
  return c;
}

std::vector<int> tokens_of(int world, int call) {
  std::vector<int> t;
  for (int r = 0; r < world; ++r) t.push_back(r == 1 ? 0 : (96 - 17 * (r + call)) % 97);
  return t;
}

// This rank's output of a forward into poisoned outputs, after check().
std::vector<float> checked_forward(MoeLayer& layer, cuda::DeviceProblem& d) {
  d.poison_y();
  layer.forward(d.tensors(), nullptr);
  layer.check(nullptr);
  return d.download_y()[0];
}

// A checked forward: this rank's output must match the oracle's.
void expect_forward_matches_oracle(MoeLayer& layer, cuda::DeviceProblem& d, const MoeProblem& p, int me) {
  EXPECT_TRUE(testing::near_oracle({checked_forward(layer, d)}, {ref::oracle_forward(p)[me]}, p.config.model.hidden));
}

// Rank `me`'s output of the same layer with every rank on this process's GPU (Loopback): the
// same kernels, plans and reduction orders as the Nccl run, so bitwise its reference.
std::vector<float> loopback_y(const LayerConfig& c, const MoeProblem& p, const LayerOptions& o, int me, int device) {
  auto loopback = fabric::make_loopback_fabric(c.layout.world, device);
  MoeLayer alone(c, *loopback);
  alone.set_weights(p.weights);
  alone.set_options(o);
  cuda::DeviceProblem all(c, p);
  alone.forward(all.tensors(), nullptr);
  alone.check(nullptr);
  return all.download_y()[me];
}

TEST(MoeLayerNccl, MatchesLoopbackBitwiseAndTheOracle) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  fabric::Fabric& f = Run::instance->fabric();
  const int W = f.world(), me = f.first_local_rank();
  uint64_t seed = 7;
  for (const Case& k : cases(W))
    for (const auto& [name, o] : testing::forward_variants()) {
      SCOPED_TRACE(k.model + " TP=" + std::to_string(k.tp) + " " + name);
      const LayerConfig c = config_of(k, W);
      MoeLayer layer(c, f);  // collective (allocates the symmetric heap)
      ExpertWeights weights;
      for (int call = 0; call < 2; ++call) {  // new routing and token counts, same buffers
        MoeProblem p = make_problem(c, tokens_of(W, call), k.spec, seed++);
        if (call == 0) {
          layer.set_weights(p.weights);
          layer.set_options(o);
          weights = p.weights;
        }
        p.weights = weights;  // the layer keeps the first call's weights
        cuda::DeviceProblem d(c, p, &f);
        // A benchmark's barrier between forwards (Part::kBarrier) continues the ranks' barrier
        // sequence: the next forward's barriers still meet.
        if (call == 1) layer.run_part(MoeLayer::Part::kBarrier, nullptr);
        const std::vector<float> got = checked_forward(layer, d);
        EXPECT_EQ(got, loopback_y(c, p, o, me, f.device_of(me))) << "call " << call << ": Nccl and Loopback differ";
        EXPECT_TRUE(testing::near_oracle({got}, {ref::oracle_forward(p)[me]}, p.config.model.hidden)) << "call " << call;
      }
    }
}

// LayerOptions are each process's own: ranks exchange only published inputs, partial rows and
// barriers, and every option gives the same partial rows bit for bit. So ranks running different
// paths, copy and combine modes and n_comm in one forward still give Loopback's default output.
TEST(MoeLayerNccl, RanksMayRunDifferentOptions) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  fabric::Fabric& f = Run::instance->fabric();
  const int W = f.world(), me = f.first_local_rank();
  const Case k = cases(W)[1];
  const LayerConfig c = config_of(k, W);
  const auto variants = testing::forward_variants();
  MoeLayer layer(c, f);
  ExpertWeights weights;
  for (int call = 0; call < int(variants.size()); ++call) {
    const auto& [name, options] = variants[(me + call) % variants.size()];
    SCOPED_TRACE("call " + std::to_string(call) + ", this rank " + name);
    MoeProblem p = make_problem(c, tokens_of(W, call), k.spec, 200 + call);
    if (call == 0) {
      layer.set_weights(p.weights);
      weights = p.weights;
    }
    p.weights = weights;
    LayerOptions o = options;
    o.n_comm0 = o.n_comm1 = 1 + 7 * ((me + call) % 3);  // 1, 8 or 15 blocks, unused by some modes
    layer.set_options(o);
    cuda::DeviceProblem d(c, p, &f);
    const std::vector<float> got = checked_forward(layer, d);
    EXPECT_EQ(got, loopback_y(c, p, LayerOptions{}, me, f.device_of(me)))
        << "differs from Loopback with default options";
    EXPECT_TRUE(testing::near_oracle({got}, {ref::oracle_forward(p)[me]}, p.config.model.hidden));
  }
}

// Bad input (rank 0's token count above T_max, which every rank's plan reads) is reported by
// check() on every rank, and the layer keeps running: only a timeout leaves the ranks' counters
// out of step, which one process cannot repair for the others.
TEST(MoeLayerNccl, BadInputIsReportedOnEveryRankAndTheLayerStaysUsable) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  fabric::Fabric& f = Run::instance->fabric();
  const int W = f.world(), me = f.first_local_rank();
  const Case k = cases(W)[0];
  const LayerConfig c = config_of(k, W);
  const MoeProblem p = make_problem(c, tokens_of(W, 0), k.spec, 41);
  MoeLayer layer(c, f);
  layer.set_weights(p.weights);
  for (ForwardPath path : {ForwardPath::kUnfused, ForwardPath::kFused}) {
    SCOPED_TRACE(path == ForwardPath::kFused ? "fused" : "unfused");
    LayerOptions o;
    o.path = path;
    layer.set_options(o);
    cuda::DeviceProblem d(c, p, &f);
    if (me == 0) d.set_token_count(0, c.max_tokens_per_rank + 1);
    layer.forward(d.tensors(), nullptr);
    EXPECT_TRUE(test::throws_with<Error>([&] { layer.check(nullptr); }, {"bad input from rank 0"}));
    if (me == 0) d.set_token_count(0, p.num_tokens(0));
    expect_forward_matches_oracle(layer, d, p, me);
  }
}

// Ranks that build different layers (here rank 1 with one more token of T_max) fail at
// construction on every rank, naming the config; the fabric then serves a layer they agree on.
TEST(MoeLayerNccl, RanksWithDifferentConfigsFailAtConstruction) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  fabric::Fabric& f = Run::instance->fabric();
  const int W = f.world(), me = f.first_local_rank();
  if (W == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  LayerConfig c = config_of(cases(W)[0], W);
  LayerConfig mine = c;
  if (me == 1) mine.max_tokens_per_rank += 1;
  EXPECT_TRUE(test::throws_with<Error>([&] { MoeLayer layer(mine, f); },
                                       {"the ranks disagree on the MoeLayer's config", "T_max="}));
  MoeLayer layer(c, f);
  const MoeProblem p = make_problem(c, tokens_of(W, 0), cases(W)[0].spec, 43);
  layer.set_weights(p.weights);
  cuda::DeviceProblem d(c, p, &f);
  expect_forward_matches_oracle(layer, d, p, me);
}

// The forward of every rank captured once (barrier kernels included) and replayed in lockstep
// with new routing: each rank's barrier generation lives on its device, so replays continue it.
TEST(MoeLayerNccl, GraphReplay) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  fabric::Fabric& f = Run::instance->fabric();
  const int W = f.world(), me = f.first_local_rank();
  const Case k = cases(W)[0];
  const LayerConfig c = config_of(k, W);
  const MoeProblem first = make_problem(c, tokens_of(W, 0), k.spec, 99);
  MoeLayer layer(c, f);
  layer.set_weights(first.weights);
  LayerOptions o;
  o.path = ForwardPath::kFused;
  layer.set_options(o);
  cuda::DeviceProblem d(c, first, &f);
  testing::CapturedForward graph(layer, d.tensors());
  for (int replay = 1; replay <= 3; ++replay) {
    MoeProblem p = make_problem(c, tokens_of(W, replay), k.spec, 100 + replay);
    p.weights = first.weights;
    d.assign_inputs(cuda::DeviceProblem(c, p, &f));
    d.poison_y();
    graph.replay();
    EXPECT_TRUE(testing::near_oracle(d.download_y(), {ref::oracle_forward(p)[me]}, p.config.model.hidden)) << "replay " << replay;
  }
}

}  // namespace
}  // namespace comet
