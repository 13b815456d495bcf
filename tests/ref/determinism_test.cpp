// ref/determinism_test.cpp: bitwise-identical outputs across repeated forward calls (epoch
// counters are never reset) and across worker counts and chunk sizes; one backend object
// reused with changing routing and token counts stays correct (DESIGN §2, §4).
#include <gtest/gtest.h>

#include <vector>

#include "ref/ref_cases.h"

namespace comet::test {
namespace {

std::vector<RefCase> determinism_cases() {
  std::vector<RefCase> out;
  RefCase a;
  a.label = "tp2_ep2_zipf_bf16";
  a.model = {"det", 48, 64, 8, 2, Activation::kSwiGlu};
  a.world = 4, a.tp = 2, a.ep = 2;
  a.t_max = 48;
  a.tokens = uneven_tokens(4, 48, 1, 3, 0);
  a.spec = {RoutingKind::kZipf, 1.2, 0.1};
  a.dtype = DType::kBF16;
  a.tiles = {8, 16, 16};
  a.seed = 11;
  out.push_back(a);

  RefCase b;
  b.label = "ep8_uniform_f16";
  b.model = {"det", 32, 48, 16, 4, Activation::kSwiGlu};
  b.world = 8, b.tp = 1, b.ep = 8;
  b.t_max = 24;
  b.tokens = uneven_tokens(8, 24, 2, 5, 6);
  b.dtype = DType::kF16;
  b.tiles = {8, 16, 16};
  b.seed = 12;
  out.push_back(b);

  RefCase c;
  c.label = "tp4_ep1_imbalance_f32";
  c.model = {"det", 32, 64, 4, 2, Activation::kGelu};
  c.world = 4, c.tp = 4, c.ep = 1;
  c.t_max = 32;
  c.tokens = uneven_tokens(4, 32, 3, 0, 1);
  c.spec = {RoutingKind::kImbalance, 0.05, 0};
  c.dtype = DType::kF32;
  c.tiles = {16, 16, 32};
  c.seed = 13;
  out.push_back(c);
  return out;
}

class DeterminismTest : public ::testing::TestWithParam<RefCase> {};

TEST_P(DeterminismTest, RepeatedForwardIsBitwiseIdentical) {
  const RefCase& c = GetParam();
  SCOPED_TRACE(c.describe());
  const MoeProblem p = c.problem();
  ref::RefBackend backend(c.config(), c.options);
  backend.set_weights(p.weights);
  const auto first = backend.forward(p.x, p.routing);
  EXPECT_TRUE(matches_oracle(first, ref::oracle_forward(p), c.dtype, c.model.hidden));
  for (int call = 1; call < 4; ++call) {
    const auto again = backend.forward(p.x, p.routing);
    EXPECT_TRUE(bitwise_equal(first, again)) << "call " << call << " differs from call 0";
  }
}

TEST_P(DeterminismTest, IndependentOfWorkerCountsAndChunkSize) {
  const RefCase& base = GetParam();
  const MoeProblem p = base.problem();
  ref::RefBackend reference(base.config(), base.options);
  reference.set_weights(p.weights);
  const auto want = reference.forward(p.x, p.routing);
  struct Opt {
    int comm, compute, chunk, stages;  // stages of the layer0 order: when tiles run, not what they compute
  };
  for (const Opt& o : {Opt{1, 1, 1, 1}, Opt{3, 1, 5, 0}, Opt{1, 3, 64, 2}, Opt{4, 4, 2, 3}, Opt{2, 3, 1000, 1}}) {
    RefCase c = base;
    c.options.comm_workers = o.comm;
    c.options.compute_workers = o.compute;
    c.options.comm_chunk_tokens = o.chunk;
    c.options.layer0_stages = o.stages;
    SCOPED_TRACE(c.describe());
    ref::RefBackend backend(c.config(), c.options);
    backend.set_weights(p.weights);
    EXPECT_TRUE(bitwise_equal(want, backend.forward(p.x, p.routing)));
  }
}

// One backend, several calls with different routing, token counts and inputs (same weights):
// each call must equal a fresh backend's result bitwise and the oracle within tolerance.
TEST_P(DeterminismTest, ReusedBackendWithChangingRouting) {
  const RefCase& base = GetParam();
  const MoeProblem weights_problem = base.problem();
  ref::RefBackend backend(base.config(), base.options);
  backend.set_weights(weights_problem.weights);
  const RoutingSpec specs[] = {{RoutingKind::kUniform, 0, 0},
                               {RoutingKind::kZipf, 2.0, 0.3},
                               {RoutingKind::kImbalance, 0.05, 0},
                               {RoutingKind::kUniform, 0, 1.0},  // everything masked
                               {RoutingKind::kZipf, 1.2, 0}};
  for (int call = 0; call < 5; ++call) {
    RefCase c = base;
    c.spec = specs[call];
    c.seed = base.seed * 100 + call;
    c.tokens = uneven_tokens(c.world, c.t_max, c.seed, call, call + 2);
    if (call == 2) c.tokens.assign(c.world, 0);  // no tokens at all
    SCOPED_TRACE("call " + std::to_string(call) + ": " + c.describe());
    MoeProblem p = c.problem();
    p.weights = weights_problem.weights;
    const auto got = backend.forward(p.x, p.routing);
    EXPECT_TRUE(matches_oracle(got, ref::oracle_forward(p), c.dtype, c.model.hidden));
    ref::RefBackend fresh(c.config(), c.options);
    fresh.set_weights(p.weights);
    EXPECT_TRUE(bitwise_equal(got, fresh.forward(p.x, p.routing)));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DeterminismTest, ::testing::ValuesIn(determinism_cases()), ref_case_name);

}  // namespace
}  // namespace comet::test
