// ref/backend_test.cpp: the CPU backend (RefBackend) against the fp64 oracle on the covering
// set of backend_cases(), plus exact checks with integer-valued inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ref/ref_cases.h"

namespace comet::test {
namespace {

class BackendTest : public ::testing::TestWithParam<RefCase> {};

TEST_P(BackendTest, MatchesOracle) {
  const RefCase& c = GetParam();
  SCOPED_TRACE(c.describe());
  const LayerConfig cfg = c.config();
  ASSERT_TRUE(cfg.validate().ok) << cfg.validate().reason;
  const MoeProblem p = c.problem();
  const auto want = ref::oracle_forward(p);

  ref::RefBackend backend(cfg, c.options);
  backend.set_weights(p.weights);
  const auto got = backend.forward(p.x, p.routing);
  EXPECT_TRUE(matches_oracle(got, want, c.dtype, cfg.model.hidden));

  // Every A row was landed once (the plan's rows, all ranks).
  const DispatchPlan plan(cfg, p.routing);
  EXPECT_EQ(backend.last_stats().rows_landed, plan.total_rows());
  EXPECT_EQ(backend.config().describe(), cfg.describe());
}

INSTANTIATE_TEST_SUITE_P(Cases, BackendTest, ::testing::ValuesIn(backend_cases()), ref_case_name);

// ---- exact checks ----------------------------------------------------------------------------
// Integer-valued x and weights with dyadic routing weights: with ReLU every product and sum is
// exact in fp32 (and small enough to be exact in bf16), so the backend must equal the oracle
// exactly; a row taken from the wrong token, expert or rank cannot hide in a tolerance.

struct ExactCase {
  int world, tp, ep;
  DType dtype;
  int topk;
  uint64_t seed;
  std::string describe() const {
    return "W=" + std::to_string(world) + " TP=" + std::to_string(tp) + " EP=" + std::to_string(ep) +
           " dtype=" + dtype_name(dtype) + " topk=" + std::to_string(topk) + " seed=" + std::to_string(seed);
  }
};

void PrintTo(const ExactCase& c, std::ostream* os) { *os << c.describe(); }

class ExactTest : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ExactTest, IntegerInputsGiveExactOutputs) {
  const ExactCase& ec = GetParam();
  SCOPED_TRACE(ec.describe());
  LayerConfig cfg;
  // bf16: |x W0| <= 16 and |I W1| <= 16 * 16 = 256 stay exact integers in 8 bits.
  cfg.model = {"exact", 16, 16, 8, ec.topk, Activation::kRelu};
  cfg.layout = {ec.world, ec.ep, ec.tp};
  cfg.max_tokens_per_rank = 24;
  cfg.dtype = ec.dtype;
  cfg.tiles = {8, 16, 16};
  std::vector<int> tokens = uneven_tokens(ec.world, 24, ec.seed, 1, 0);
  MoeProblem p = make_problem(cfg, tokens, RoutingSpec{RoutingKind::kUniform, 0, 0.1}, ec.seed);
  Rng rng(derive_seed(ec.seed, 77));
  auto small_int = [&](int lo, int hi) { return float(lo + rng.uniform_int(hi - lo + 1)); };
  for (float& v : p.weights.w_up) v = small_int(-1, 1);
  for (float& v : p.weights.w_down) v = small_int(-1, 1);
  for (auto& x : p.x) {
    for (float& v : x) v = small_int(-1, 1);
  }
  for (Routing& rt : p.routing) {
    for (int t = 0; t < rt.num_tokens; ++t) {
      for (int k = 0; k < rt.topk; ++k) {
        // f32: dyadic weights 0.25, 0.5, ... are exact; bf16 cases use topk 1 with weight 1.
        rt.weights[size_t(t) * rt.topk + k] = ec.dtype == DType::kF32 ? 0.25f * float(1 + k) : 1.0f;
      }
    }
  }
  const auto want = ref::oracle_forward(p);
  ref::RefBackend backend(cfg, test_options());
  backend.set_weights(p.weights);
  const auto got = backend.forward(p.x, p.routing);
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want[r].size()) << "rank " << r;
    for (size_t i = 0; i < got[r].size(); ++i) {
      // The oracle's value must itself be representable (else the case is not exact).
      ASSERT_EQ(double(round_to(ec.dtype, float(want[r][i]))), want[r][i]) << "rank " << r << " element " << i;
      ASSERT_EQ(double(got[r][i]), want[r][i])
          << "rank " << r << " token " << i / 16 << " column " << i % 16;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ExactTest,
                         ::testing::Values(ExactCase{1, 1, 1, DType::kF32, 2, 1},
                                           ExactCase{4, 1, 4, DType::kF32, 2, 2},
                                           ExactCase{4, 2, 2, DType::kF32, 3, 3},
                                           ExactCase{8, 8, 1, DType::kF32, 2, 4},
                                           ExactCase{8, 2, 4, DType::kF32, 4, 5},
                                           ExactCase{4, 2, 2, DType::kBF16, 1, 6},
                                           ExactCase{8, 1, 8, DType::kBF16, 1, 7}),
                         [](const ::testing::TestParamInfo<ExactCase>& info) {
                           return std::to_string(info.index) + "_" + param_name(info.param.describe());
                         });

}  // namespace
}  // namespace comet::test
