// ref/oracle_test.cpp: the fp64 oracle against hand-computed outputs and against a direct
// per-token computation written here; compare_outputs and tolerance_for (src/ref/oracle.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ref/oracle.h"
#include "support/custom_routing.h"
#include "support/test_support.h"

namespace comet::ref {
namespace {

// A 2x2 problem whose output is worked out by hand (DESIGN §2 semantics).
//   expert 0: W0 = I, W1 = 2I                    -> FFN0(x) = 2 relu(x)
//   expert 1: W0 = [[0,1],[1,0]] (swap), W1 = [[1,1],[2,-1]] (not symmetric: a transposed W1
//   reads [1,-1] for row 1 and changes token (0,0) and (1,0))
MoeProblem hand_problem() {
  MoeProblem p;
  p.config.model = {"hand", 2, 2, 2, 2, Activation::kRelu};
  p.config.layout = {2, 2, 1};
  p.config.max_tokens_per_rank = 4;
  p.config.dtype = DType::kF32;
  p.config.tiles = {8, 16, 16};
  p.weights.w_up = {1, 0, 0, 1, /* expert 1 */ 0, 1, 1, 0};
  p.weights.w_down = {2, 0, 0, 2, /* expert 1 */ 1, 1, 2, -1};
  // Rank 0: tokens [1,-2] and [2,1]; rank 1: token [3,3]; rank 1 has one token.
  p.x = {{1, -2, 2, 1}, {3, 3}};
  Routing r0;
  r0.num_tokens = 2;
  r0.topk = 2;
  r0.expert_ids = {0, 1, /* same expert twice */ 0, 0};
  r0.weights = {0.25f, 0.75f, 0.5f, 0.5f};
  Routing r1;
  r1.num_tokens = 1;
  r1.topk = 2;
  r1.expert_ids = {1, -1};
  r1.weights = {1.0f, 123.0f};  // masked slot: weight ignored
  p.routing = {r0, r1};
  return p;
}

TEST(Oracle, HandComputedRelu) {
  const MoeProblem p = hand_problem();
  const auto y = oracle_forward(p);
  ASSERT_EQ(y.size(), 2u);
  ASSERT_EQ(y[0].size(), 4u);
  ASSERT_EQ(y[1].size(), 2u);
  // token (0,0): 0.25 * FFN0([1,-2]) + 0.75 * FFN1([1,-2]) = 0.25*[2,0] + 0.75*[2,-1]
  // (FFN1: relu([-2,1]) = [0,1], times W1's row 1)
  EXPECT_DOUBLE_EQ(y[0][0], 2.0);
  EXPECT_DOUBLE_EQ(y[0][1], -0.75);
  // token (0,1): expert 0 twice with 0.5 each: FFN0([2,1]) = [4,2]
  EXPECT_DOUBLE_EQ(y[0][2], 4.0);
  EXPECT_DOUBLE_EQ(y[0][3], 2.0);
  // token (1,0): FFN1([3,3]) = relu([3,3]) W1 = [9, 0]; the masked slot adds nothing
  EXPECT_DOUBLE_EQ(y[1][0], 9.0);
  EXPECT_DOUBLE_EQ(y[1][1], 0.0);
}

// The terms' squares of the hand problem: sum over slots k and f of (w_k I_f W1[f][h])^2.
TEST(Oracle, TermSquaresOfTheHandProblem) {
  const MoeProblem p = hand_problem();
  std::vector<std::vector<double>> terms;
  const auto y = oracle_forward(p, &terms);
  EXPECT_EQ(y, oracle_forward(p));  // the same reference with or without them
  ASSERT_EQ(terms.size(), 2u);
  ASSERT_EQ(terms[0].size(), 4u);
  ASSERT_EQ(terms[1].size(), 2u);
  // token (0,0): 0.25^2 * ([2,0]^2) from expert 0 (I = [1,0]), 0.75^2 * ([2,-1]^2) from expert 1 (I = [0,1])
  EXPECT_DOUBLE_EQ(terms[0][0], 0.0625 * 4 + 0.5625 * 4);
  EXPECT_DOUBLE_EQ(terms[0][1], 0.5625);
  // token (0,1): expert 0 twice, 0.5^2 * ([4,0]^2 + [0,2]^2) each: under y^2 = [16, 4] (the two
  // slots add coherently)
  EXPECT_DOUBLE_EQ(terms[0][2], 8.0);
  EXPECT_DOUBLE_EQ(terms[0][3], 2.0);
  // token (1,0): I = [3,3], terms [3,6] and [3,-3]: y[1][1] = 3 - 3 cancels to 0, its terms do not
  EXPECT_DOUBLE_EQ(terms[1][0], 45.0);
  EXPECT_DOUBLE_EQ(terms[1][1], 18.0);
}

// One expert of width 1 (H = F = 1) on one rank, fp32; token t has x = xs[t] and routing weight
// ws[t]. The weights are set by the caller.
MoeProblem width_one_problem(Activation act, const std::vector<float>& xs, const std::vector<float>& ws) {
  MoeProblem p;
  p.config.model = {"hand", 1, 1, 1, 1, act};
  p.config.layout = {1, 1, 1};
  p.config.max_tokens_per_rank = int(xs.size());
  p.config.dtype = DType::kF32;
  p.x = {xs};
  Routing r;
  r.num_tokens = int(xs.size());
  r.topk = 1;
  r.expert_ids.assign(xs.size(), 0);
  r.weights = ws;
  p.routing = {r};
  return p;
}

// y = w_down * gelu(x * w_up), GELU the exact erf form (gelu(1) = 0.8413447460685429; the tanh
// approximation gives 0.8411919906082768).
TEST(Oracle, HandComputedGeluIsTheErfForm) {
  MoeProblem p = width_one_problem(Activation::kGelu, {1}, {1.0f});
  p.weights.w_up = {1};
  p.weights.w_down = {2};
  const auto y = oracle_forward(p);
  ASSERT_EQ(y.size(), 1u);
  ASSERT_EQ(y[0].size(), 1u);
  EXPECT_NEAR(y[0][0], 2 * 0.8413447460685429, 1e-12);
}

TEST(Oracle, HandComputedSwiGlu) {
  MoeProblem p = width_one_problem(Activation::kSwiGlu, {2, -1}, {1.0f, 0.5f});
  p.weights.w_gate = {1};
  p.weights.w_up = {3};
  p.weights.w_down = {0.5f};
  const auto y = oracle_forward(p);
  const auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  ASSERT_EQ(y.size(), 1u);
  ASSERT_EQ(y[0].size(), 2u);
  EXPECT_NEAR(y[0][0], silu(2.0) * 6.0 * 0.5, 1e-12);
  EXPECT_NEAR(y[0][1], 0.5 * silu(-1.0) * -3.0 * 0.5, 1e-12);
}

// ---- direct per-token computation ------------------------------------------------------------

double act(Activation a, double v) {
  switch (a) {
    case Activation::kSwiGlu:
    case Activation::kSilu: return v / (1 + std::exp(-v));
    case Activation::kRelu: return v > 0 ? v : 0;
    case Activation::kGelu: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  }
  return 0;
}

std::vector<std::vector<double>> direct_forward(const MoeProblem& p) {
  const ModelShape& m = p.config.model;
  const int h = m.hidden, f = m.ffn;
  std::vector<std::vector<double>> y(p.x.size());
  for (size_t r = 0; r < p.x.size(); ++r) {
    const Routing& rt = p.routing[r];
    y[r].assign(size_t(rt.num_tokens) * h, 0.0);
    for (int t = 0; t < rt.num_tokens; ++t) {
      const float* x = p.x[r].data() + size_t(t) * h;
      for (int k = 0; k < rt.topk; ++k) {
        const int e = rt.expert(t, k);
        if (e < 0) continue;
        const double w = rt.weight(t, k);
        std::vector<double> inter(f);
        for (int j = 0; j < f; ++j) {
          double up = 0, gate = 0;
          for (int i = 0; i < h; ++i) {
            up += double(x[i]) * p.weights.w_up[(size_t(e) * h + i) * f + j];
            if (is_gated(m.activation)) gate += double(x[i]) * p.weights.w_gate[(size_t(e) * h + i) * f + j];
          }
          inter[j] = is_gated(m.activation) ? act(m.activation, gate) * up : act(m.activation, up);
        }
        for (int i = 0; i < h; ++i) {
          double o = 0;
          for (int j = 0; j < f; ++j) o += inter[j] * p.weights.w_down[(size_t(e) * f + j) * h + i];
          y[r][size_t(t) * h + i] += w * o;
        }
      }
    }
  }
  return y;
}

struct OracleCase {
  ModelShape model;
  int world;
  int t_max;
  RoutingSpec spec;
  test::CustomRouting custom;
  DType dtype;
  uint64_t seed;
  std::string describe() const {
    return model.name + " H=" + std::to_string(model.hidden) + " F=" + std::to_string(model.ffn) +
           " E=" + std::to_string(model.num_experts) + " topk=" + std::to_string(model.topk) +
           " act=" + activation_name(model.activation) + " W=" + std::to_string(world) +
           " T_max=" + std::to_string(t_max) + " routing=" + spec.describe() +
           " mask=" + std::to_string(spec.mask_fraction) + " custom=" + test::custom_name(custom) +
           " dtype=" + dtype_name(dtype) + " seed=" + std::to_string(seed);
  }
};

std::vector<OracleCase> oracle_cases() {
  std::vector<OracleCase> out;
  uint64_t seed = 1;
  for (Activation a : {Activation::kSwiGlu, Activation::kGelu, Activation::kRelu, Activation::kSilu}) {
    out.push_back({{"direct", 24, 40, 8, 2, a}, 2, 12, {}, test::CustomRouting::kNone, DType::kBF16, seed++});
  }
  out.push_back({{"direct", 16, 16, 16, 16, Activation::kSwiGlu}, 4, 5, {RoutingKind::kZipf, 1.2, 0.3},
                 test::CustomRouting::kNone, DType::kF32, seed++});
  out.push_back({{"direct", 32, 24, 4, 3, Activation::kSwiGlu}, 4, 9, {},
                 test::CustomRouting::kAllToOne, DType::kF16, seed++});
  out.push_back({{"direct", 32, 24, 4, 2, Activation::kRelu}, 2, 9, {},
                 test::CustomRouting::kAllMasked, DType::kBF16, seed++});
  return out;
}

TEST(Oracle, MatchesDirectPerTokenComputation) {
  for (const OracleCase& c : oracle_cases()) {
    SCOPED_TRACE(c.describe());
    LayerConfig cfg;
    cfg.model = c.model;
    cfg.layout = {c.world, c.world, 1};
    if (c.model.num_experts % c.world != 0) cfg.layout = {c.world, 1, c.world};
    cfg.max_tokens_per_rank = c.t_max;
    cfg.dtype = c.dtype;
    std::vector<int> tokens;
    for (int r = 0; r < c.world; ++r) tokens.push_back(r == 1 ? 0 : c.t_max - r);
    MoeProblem p = make_problem(cfg, tokens, c.spec, c.seed);
    for (Routing& rt : p.routing) test::apply_custom_routing(rt, c.custom, c.model.num_experts);
    const auto got = oracle_forward(p);
    const auto want = direct_forward(p);
    ASSERT_EQ(got.size(), want.size());
    // Both are fp64 with the same (erf) GELU; only summation order differs. (The tanh form of
    // GELU differs from erf by up to 4.7e-4: a looser bound would let it pass.)
    const double tol = 1e-10;
    for (size_t r = 0; r < got.size(); ++r) {
      ASSERT_EQ(got[r].size(), want[r].size()) << "rank " << r;
      for (size_t i = 0; i < got[r].size(); ++i) {
        ASSERT_NEAR(got[r][i], want[r][i], tol * (1 + std::abs(want[r][i])))
            << "rank " << r << " element " << i;
      }
    }
  }
}

// ---- compare_outputs / tolerance_for ---------------------------------------------------------

TEST(Compare, ExactMatchNaNAndOneWrongRow) {
  const std::vector<std::vector<double>> want = {{1, 2, 3, 4}, {}, {-1, 0.5}};
  std::vector<std::vector<float>> got = {{1, 2, 3, 4}, {}, {-1, 0.5}};
  Comparison c = compare_outputs(got, want, 2);
  EXPECT_EQ(c.rel_l2, 0.0);
  EXPECT_EQ(c.max_abs, 0.0);
  EXPECT_EQ(c.non_finite, 0);
  EXPECT_EQ(c.elements, 6);
  EXPECT_TRUE(c.within(0.0));
  EXPECT_FALSE(c.describe().empty());

  got[2][1] = std::numeric_limits<float>::quiet_NaN();
  c = compare_outputs(got, want, 2);
  EXPECT_EQ(c.non_finite, 1);
  EXPECT_FALSE(c.within(1e30));  // NaN never passes
  got[2][1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(compare_outputs(got, want, 2).within(1e30));

  got = {{1, 2, 3, 4}, {}, {-1, 0.5}};
  got[0][3] = 0;  // ||diff|| = 4, ||want|| = sqrt(31.25)
  c = compare_outputs(got, want, 2);
  EXPECT_NEAR(c.rel_l2, 4 / std::sqrt(31.25), 1e-12);
  EXPECT_DOUBLE_EQ(c.max_abs, 4.0);
  EXPECT_FALSE(c.within(tolerance_for(DType::kBF16)));
}

// One token's output row zeroed among 2 x 8192 rows: the whole output's rel_l2 moves by about
// 1/sqrt(16384) = 8e-3, under the bf16 tolerance, so the global check alone passed it. The
// per-row bound fails it and names the row, while the output rounded to each dtype passes.
TEST(Compare, OneZeroedRowAmongManyFailsAndIsNamed) {
  constexpr int kHidden = 64, kTokens = 8192;
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  std::vector<std::vector<double>> want(2, std::vector<double>(size_t(kTokens) * kHidden));
  for (auto& rank : want)
    for (double& v : rank) v = normal(rng);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<std::vector<float>> got(2);
    for (size_t r = 0; r < 2; ++r)
      for (double v : want[r]) got[r].push_back(round_to(dtype, float(v)));
    const Comparison rounded = compare_outputs(got, want, kHidden);
    EXPECT_TRUE(rounded.within(tolerance_for(dtype))) << rounded.describe();

    std::fill_n(got[1].begin() + size_t(4321) * kHidden, kHidden, 0.0f);
    const Comparison c = compare_outputs(got, want, kHidden);
    if (dtype == DType::kBF16) {
      EXPECT_LT(c.rel_l2, tolerance_for(dtype)) << "the global error alone would pass";
    }
    EXPECT_FALSE(c.within(tolerance_for(dtype))) << c.describe();
    EXPECT_GT(c.worst_row_error, 0.5);
    EXPECT_EQ(c.worst_row_rank, 1);
    EXPECT_EQ(c.worst_row_token, 4321);
    EXPECT_TRUE(test::contains(c.describe(), "rank 1 token 4321"));
  }
}

// Tokens with every slot masked have an all-zero reference row (and output). The row scale is
// the RMS over the other rows: over all rows, 9990 zero rows in 10000 would shrink it 32-fold,
// so rounding of about 3e-3 would read as a worst row near 0.1 and fail the bound (comet run
// --mask-fraction 0.999 did), while a zeroed real row must still fail.
TEST(Compare, MaskedTokensDoNotShrinkTheRowScale) {
  constexpr int kHidden = 64, kTokens = 10000, kRouted = 10, kStride = kTokens / kRouted;
  std::mt19937 rng(11);
  std::normal_distribution<double> normal;
  std::vector<std::vector<double>> want(1, std::vector<double>(size_t(kTokens) * kHidden, 0.0));
  for (int t = 0; t < kRouted; ++t)
    for (int i = 0; i < kHidden; ++i) want[0][size_t(t) * kStride * kHidden + i] = normal(rng);
  std::vector<std::vector<float>> got(1);
  for (double v : want[0]) got[0].push_back(round_to(DType::kBF16, float(v * (1 + 3e-3 * normal(rng)))));
  const Comparison c = compare_outputs(got, want, kHidden);
  EXPECT_TRUE(c.within(tolerance_for(DType::kBF16))) << c.describe();
  // About 4e-3 against the routed rows' RMS; the scale over all rows would give about 0.13.
  EXPECT_LT(c.worst_row_error, 0.02) << c.describe();
  std::fill_n(got[0].begin() + size_t(3) * kStride * kHidden, kHidden, 0.0f);  // routed token 3
  const Comparison zeroed = compare_outputs(got, want, kHidden);
  EXPECT_FALSE(zeroed.within(tolerance_for(DType::kBF16))) << zeroed.describe();
  EXPECT_EQ(zeroed.worst_row_token, 3 * kStride);
}

// A reference that cancels below its terms' norm: measured against it, an error of rounding's
// size (2e-3 of the terms' norm) read as twice the value and failed. Against the terms' norm it
// passes, a value half the terms' norm off still fails, and terms under the reference change
// nothing.
TEST(Compare, ACancellingReferenceIsScaledByItsTerms) {
  const std::vector<std::vector<double>> want = {{1e-3}};
  const std::vector<std::vector<double>> terms = {{1.0}};
  const std::vector<std::vector<float>> rounded = {{float(1e-3 + 2e-3)}};
  const Comparison alone = compare_outputs(rounded, want, 1);
  EXPECT_FALSE(alone.within(tolerance_for(DType::kBF16))) << alone.describe();
  EXPECT_FALSE(alone.scaled_by_terms);
  const Comparison scaled = compare_outputs(rounded, want, 1, &terms);
  EXPECT_TRUE(scaled.within(tolerance_for(DType::kBF16))) << scaled.describe();
  EXPECT_TRUE(scaled.scaled_by_terms);
  EXPECT_NEAR(scaled.rel_l2, 2e-3, 1e-9);
  EXPECT_NEAR(scaled.worst_row_error, 2e-3, 1e-9);
  EXPECT_TRUE(test::contains(scaled.describe(), "relative to the terms' norm"));
  const Comparison wrong = compare_outputs({{0.5f}}, want, 1, &terms);
  EXPECT_FALSE(wrong.within(tolerance_for(DType::kBF16))) << wrong.describe();
  // Terms whose squares sum below the reference's leave the comparison as it was.
  const std::vector<std::vector<double>> small = {{0.5e-6}};
  const Comparison unscaled = compare_outputs(rounded, want, 1, &small);
  EXPECT_FALSE(unscaled.scaled_by_terms);
  EXPECT_EQ(unscaled.rel_l2, alone.rel_l2);
  EXPECT_EQ(unscaled.worst_row_error, alone.worst_row_error);
}

// With terms of the reference's expected size (random signs: E[y^2] = the terms' squares), a
// zeroed row among many still fails and is named.
TEST(Compare, AZeroedRowFailsWithTheTermsAsScale) {
  constexpr int kHidden = 64, kTokens = 4096;
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  std::vector<std::vector<double>> want(1, std::vector<double>(size_t(kTokens) * kHidden));
  for (double& v : want[0]) v = normal(rng);
  const std::vector<std::vector<double>> terms(1, std::vector<double>(want[0].size(), 1.0));
  std::vector<std::vector<float>> got(1);
  for (double v : want[0]) got[0].push_back(round_to(DType::kBF16, float(v)));
  const Comparison rounded = compare_outputs(got, want, kHidden, &terms);
  EXPECT_TRUE(rounded.within(tolerance_for(DType::kBF16))) << rounded.describe();
  std::fill_n(got[0].begin() + size_t(1234) * kHidden, kHidden, 0.0f);
  const Comparison zeroed = compare_outputs(got, want, kHidden, &terms);
  EXPECT_FALSE(zeroed.within(tolerance_for(DType::kBF16))) << zeroed.describe();
  EXPECT_GT(zeroed.worst_row_error, 0.5);
  EXPECT_EQ(zeroed.worst_row_token, 1234);
}

TEST(Compare, TermSquaresOfAnotherShapeAreRefused) {
  const std::vector<std::vector<double>> want = {{1, 2}, {3, 4}};
  const std::vector<std::vector<float>> got = {{1, 2}, {3, 4}};
  const std::vector<std::vector<double>> one_rank = {{1, 2}};
  const std::vector<std::vector<double>> short_rank = {{1, 2}, {3}};
  EXPECT_TRUE(test::throws_with<Error>([&] { compare_outputs(got, want, 2, &one_rank); },
                                       {"terms' squares have 1 ranks, the reference 2"}));
  EXPECT_TRUE(test::throws_with<Error>([&] { compare_outputs(got, want, 2, &short_rank); },
                                       {"rank 1: the terms' squares have 1 values, the reference 2"}));
}

TEST(Compare, RowsMustBeWholeAndAZeroReferenceMatchedExactly) {
  EXPECT_TRUE(test::throws_with<Error>([] { compare_outputs({{1, 2, 3}}, {{1, 2, 3}}, 2); }, {"hidden = 2"}));
  EXPECT_TRUE(test::throws_with<Error>([] { compare_outputs({{1, 2}}, {{1, 2}}, 0); }, {"hidden must be >= 1"}));
  const std::vector<std::vector<double>> zero = {{0, 0, 0, 0}};
  EXPECT_TRUE(compare_outputs({{0, 0, 0, 0}}, zero, 2).within(0.0));
  EXPECT_EQ(compare_outputs({{0, 0, 0, 0}}, zero, 2).worst_row_rank, -1);  // every token masked: no row to name
  // A row with a NaN (say, never written) is the worst row, wherever it is.
  const Comparison nan_row = compare_outputs({{1, 1, std::nanf(""), 0, 5, 5}}, {{1, 1, 0, 0, 1, 1}}, 2);
  EXPECT_EQ(nan_row.worst_row_token, 1);
  EXPECT_FALSE(nan_row.within(1e30));
  const Comparison c = compare_outputs({{0, 0, 0, 1e-30f}}, zero, 2);
  EXPECT_FALSE(c.within(1e30));
  EXPECT_EQ(c.worst_row_token, 1);
  const Comparison empty = compare_outputs({{}, {}}, {{}, {}}, 8);
  EXPECT_TRUE(empty.within(0.0));
  EXPECT_EQ(empty.worst_row_rank, -1);
}

TEST(Compare, Tolerances) {
  EXPECT_LE(tolerance_for(DType::kF32), 1e-5);
  EXPECT_GT(tolerance_for(DType::kF32), 0.0);
  EXPECT_LE(tolerance_for(DType::kF16), tolerance_for(DType::kBF16));
  EXPECT_LE(tolerance_for(DType::kF32), tolerance_for(DType::kF16));
  EXPECT_GE(tolerance_for(DType::kBF16), 1e-3);
  EXPECT_LE(tolerance_for(DType::kBF16), 1e-2);
}

}  // namespace
}  // namespace comet::ref
