// unit/problem_test.cpp: make_problem shapes, determinism, statistics and rounding
// (include/comet/problem.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comet/problem.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::throws_with;

struct ProblemCase {
  ModelShape model;
  int world = 1, tp = 1;
  DType dtype = DType::kBF16;
  std::vector<int> tokens;
  std::string describe() const {
    std::string s = model.name + " act=" + activation_name(model.activation) + " W=" + std::to_string(world) +
                    " TP=" + std::to_string(tp) + " dtype=" + dtype_name(dtype) + " tokens=";
    for (int t : tokens) s += std::to_string(t) + ",";
    return s;
  }
  LayerConfig config() const {
    LayerConfig c;
    c.model = model;
    c.layout = {world, world / tp, tp};
    c.max_tokens_per_rank = 64;
    c.dtype = dtype;
    return c;
  }
};

std::vector<ProblemCase> problem_cases() {
  std::vector<ProblemCase> out(3);
  out[0].model = ModelShape{"g", 64, 96, 8, 2, Activation::kSwiGlu};
  out[0].world = 4, out[0].tp = 2, out[0].dtype = DType::kBF16, out[0].tokens = {64, 0, 17, 3};
  out[1].model = ModelShape{"p", 48, 128, 4, 1, Activation::kGelu};
  out[1].world = 2, out[1].tp = 1, out[1].dtype = DType::kF16, out[1].tokens = {5, 64};
  out[2].model = ModelShape{"f", 32, 32, 16, 4, Activation::kRelu};
  out[2].world = 1, out[2].tp = 1, out[2].dtype = DType::kF32, out[2].tokens = {40};
  return out;
}

double variance(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float f : v) s += f, s2 += double(f) * f;
  const double n = double(v.size());
  return s2 / n - (s / n) * (s / n);
}

TEST(Problem, ShapesRoundingAndStatistics) {
  for (const ProblemCase& pc : problem_cases()) {
    SCOPED_TRACE(pc.describe());
    const LayerConfig c = pc.config();
    const MoeProblem p = make_problem(c, pc.tokens, RoutingSpec{}, 7);
    const ModelShape& m = pc.model;
    const size_t hf = size_t(m.num_experts) * m.hidden * m.ffn;
    EXPECT_EQ(p.weights.w_up.size(), hf);
    EXPECT_EQ(p.weights.w_down.size(), hf);
    EXPECT_EQ(p.weights.w_gate.size(), is_gated(m.activation) ? hf : 0u);
    EXPECT_NO_THROW(p.weights.check(m));
    ASSERT_EQ(int(p.x.size()), pc.world);
    ASSERT_EQ(int(p.routing.size()), pc.world);
    for (int r = 0; r < pc.world; ++r) {
      EXPECT_EQ(p.num_tokens(r), pc.tokens[r]);
      EXPECT_EQ(p.x[r].size(), size_t(pc.tokens[r]) * m.hidden);
      EXPECT_EQ(p.routing[r].topk, m.topk);
      EXPECT_NO_THROW(p.routing[r].check(m.num_experts, r));
    }
    // Every value is already a value of the dtype.
    auto check_rounded = [&](const std::vector<float>& v, const char* what) {
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_TRUE(std::isfinite(v[i])) << what << "[" << i << "]";
        ASSERT_EQ(float_bits(round_to(pc.dtype, v[i])), float_bits(v[i])) << what << "[" << i << "]";
      }
    };
    check_rounded(p.weights.w_up, "w_up");
    check_rounded(p.weights.w_down, "w_down");
    check_rounded(p.weights.w_gate, "w_gate");
    for (const auto& x : p.x) check_rounded(x, "x");
    // N(0, 1/fan_in) weights, N(0, 1) tokens (a few thousand samples: 15% is > 5 sigma).
    EXPECT_NEAR(variance(p.weights.w_up) * m.hidden, 1.0, 0.15);
    EXPECT_NEAR(variance(p.weights.w_down) * m.ffn, 1.0, 0.15);
    std::vector<float> all_x;
    for (const auto& x : p.x) all_x.insert(all_x.end(), x.begin(), x.end());
    EXPECT_NEAR(variance(all_x), 1.0, 0.15);
  }
}

TEST(Problem, DeterministicInTheSeed) {
  const ProblemCase pc = problem_cases()[0];
  const LayerConfig c = pc.config();
  const RoutingSpec spec{RoutingKind::kZipf, 1.2, 0.1};
  const MoeProblem a = make_problem(c, pc.tokens, spec, 3), b = make_problem(c, pc.tokens, spec, 3);
  const MoeProblem d = make_problem(c, pc.tokens, spec, 4);
  EXPECT_EQ(a.weights.w_up, b.weights.w_up);
  EXPECT_EQ(a.weights.w_gate, b.weights.w_gate);
  EXPECT_EQ(a.weights.w_down, b.weights.w_down);
  EXPECT_EQ(a.x, b.x);
  for (int r = 0; r < pc.world; ++r) {
    EXPECT_EQ(a.routing[r].expert_ids, b.routing[r].expert_ids);
    EXPECT_EQ(a.routing[r].weights, b.routing[r].weights);
  }
  EXPECT_NE(a.weights.w_up, d.weights.w_up);
  EXPECT_NE(a.x, d.x);
}

TEST(Problem, BadInputsThrow) {
  const ProblemCase pc = problem_cases()[0];
  const LayerConfig c = pc.config();
  EXPECT_TRUE(throws_with<Error>([&] { make_problem(c, {64, 0, 65, 3}, RoutingSpec{}, 1); }));
  EXPECT_TRUE(throws_with<Error>([&] { make_problem(c, {1, 2, 3}, RoutingSpec{}, 1); }));
  const MoeProblem p = make_problem(c, pc.tokens, RoutingSpec{}, 1);
  ExpertWeights w = p.weights;
  w.w_down.pop_back();
  EXPECT_TRUE(throws_with<Error>([&] { w.check(pc.model); }));
  w = p.weights;
  w.w_gate.clear();
  EXPECT_TRUE(throws_with<Error>([&] { w.check(pc.model); }));
}

}  // namespace
}  // namespace comet
