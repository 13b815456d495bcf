// unit/routing_test.cpp: softmax-top-k gating, routing generators, load distributions, spec
// parsing, Routing::check and the seeded RNG (include/comet/routing.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "comet/routing.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::contains;
using test::throws_with;

// ---- softmax_topk_gating -------------------------------------------------------------------

// Direct computation: softmax in double, then a stable sort by (-probability, id).
struct Gated {
  std::vector<int> ids;
  std::vector<double> probs;  // raw softmax probabilities of the kept ids
};
Gated gate_by_hand(const std::vector<float>& logits, int e, int topk) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float l : logits) mx = std::max(mx, double(l));
  std::vector<double> p(e);
  double z = 0;
  for (int i = 0; i < e; ++i) z += p[i] = std::exp(double(logits[i]) - mx);
  for (double& v : p) v /= z;
  std::vector<int> order(e);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  Gated g;
  for (int k = 0; k < topk; ++k) {
    g.ids.push_back(order[k]);
    g.probs.push_back(p[order[k]]);
  }
  return g;
}

void expect_gating_matches(const std::vector<float>& logits, int tokens, int e, int topk) {
  for (bool renormalize : {true, false}) {
    SCOPED_TRACE(renormalize ? "renormalize" : "raw softmax");
    const Routing r = softmax_topk_gating(logits, tokens, e, topk, renormalize);
    ASSERT_EQ(r.num_tokens, tokens);
    ASSERT_EQ(r.topk, topk);
    ASSERT_EQ(r.expert_ids.size(), size_t(tokens) * topk);
    ASSERT_EQ(r.weights.size(), size_t(tokens) * topk);
    for (int t = 0; t < tokens; ++t) {
      SCOPED_TRACE("token " + std::to_string(t));
      const std::vector<float> row(logits.begin() + size_t(t) * e, logits.begin() + size_t(t + 1) * e);
      const Gated want = gate_by_hand(row, e, topk);
      double kept = 0;
      for (double p : want.probs) kept += p;
      double sum = 0;
      for (int k = 0; k < topk; ++k) {
        EXPECT_EQ(r.expert(t, k), want.ids[k]) << "slot " << k;
        const double w = renormalize ? want.probs[k] / kept : want.probs[k];
        EXPECT_NEAR(r.weight(t, k), w, 2e-6 * std::max(1.0, w)) << "slot " << k;
        EXPECT_TRUE(std::isfinite(r.weight(t, k)));
        sum += r.weight(t, k);
      }
      if (renormalize) {
        EXPECT_NEAR(sum, 1.0, 1e-5);
      }
    }
  }
}

TEST(Gating, HandComputedCases) {
  const int e = 4;
  const std::vector<float> logits = {
      1, 3, 2, 0,          // ids 1, 2
      0.5, 0.5, 0.5, 0.5,  // all tied: 0, 1
      -1, 5, 5, -2,        // tie at the top: 1 before 2
      0, 0, 7, 0,          // 2, then the lowest of the tied rest: 0
  };
  const Routing r = softmax_topk_gating(logits, 4, e, 2, true);
  EXPECT_EQ(r.expert(0, 0), 1);
  EXPECT_EQ(r.expert(0, 1), 2);
  EXPECT_NEAR(r.weight(0, 0), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.weight(0, 1), 1.0 / (1.0 + std::exp(1.0)), 1e-6);
  EXPECT_EQ(r.expert(1, 0), 0);
  EXPECT_EQ(r.expert(1, 1), 1);
  EXPECT_NEAR(r.weight(1, 0), 0.5, 1e-6);
  EXPECT_EQ(r.expert(2, 0), 1);
  EXPECT_EQ(r.expert(2, 1), 2);
  EXPECT_EQ(r.expert(3, 0), 2);
  EXPECT_EQ(r.expert(3, 1), 0);

  const Routing raw = softmax_topk_gating(logits, 4, e, 2, false);
  EXPECT_NEAR(raw.weight(1, 0), 0.25, 1e-6);
  EXPECT_NEAR(raw.weight(1, 1), 0.25, 1e-6);
  const double z0 = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
  EXPECT_NEAR(raw.weight(0, 0), std::exp(3.0) / z0, 1e-6);
  EXPECT_NEAR(raw.weight(0, 1), std::exp(2.0) / z0, 1e-6);

  expect_gating_matches(logits, 4, e, 1);
  expect_gating_matches(logits, 4, e, 2);
  expect_gating_matches(logits, 4, e, 4);
}

TEST(Gating, LargeLogitsStayFinite) {
  const std::vector<float> logits = {1000, 999, -1000, 0, -3e4f, 3e4f, 3e4f - 1, 0};
  expect_gating_matches(logits, 2, 4, 2);
}

TEST(Gating, MaskedLogitsAreSkippedAndNonFiniteOnesRefused) {
  const float inf = std::numeric_limits<float>::infinity();
  const Routing r = softmax_topk_gating({-inf, 1, -inf, 0}, 1, 4, 2, true);
  EXPECT_EQ(r.expert(0, 0), 1);
  EXPECT_EQ(r.expert(0, 1), 3);
  EXPECT_NEAR(r.weight(0, 0) + r.weight(0, 1), 1.0, 1e-6);
  // Fewer unmasked experts than topk: the rest of the slots are masked, not given an expert at
  // weight 0 (which would still move the token and run its FFN).
  const Routing fewer = softmax_topk_gating({-inf, 1, -inf, -inf, -inf, -inf, -inf, 0}, 2, 4, 2, false);
  EXPECT_EQ(fewer.expert(0, 0), 1);
  EXPECT_FLOAT_EQ(fewer.weight(0, 0), 1.f);
  EXPECT_EQ(fewer.expert(0, 1), -1);
  EXPECT_EQ(fewer.weight(0, 1), 0.f);
  EXPECT_EQ(fewer.expert(1, 0), 3);
  EXPECT_EQ(fewer.expert(1, 1), -1);
  EXPECT_NO_THROW(fewer.check(4, 0));
  // An unmasked expert whose probability underflows to 0 (a logit 1000 below the largest) still
  // takes a slot before a masked one with a lower id.
  const Routing underflow = softmax_topk_gating({-inf, 0, -1000, -inf}, 1, 4, 2, false);
  EXPECT_EQ(underflow.expert(0, 0), 1);
  EXPECT_EQ(underflow.expert(0, 1), 2);
  EXPECT_TRUE(test::throws_with<Error>([&] { softmax_topk_gating({0, 0, 0, 0, 1, inf, 0, 0}, 2, 4, 2); },
                                       {"token 1, expert 1", "inf"}));
  EXPECT_TRUE(test::throws_with<Error>([&] { softmax_topk_gating({0, std::nanf(""), 0, 0}, 1, 4, 2); },
                                       {"token 0, expert 1", "nan"}));
  EXPECT_TRUE(test::throws_with<Error>([&] { softmax_topk_gating({0, 0, 0, 0, -inf, -inf, -inf, -inf}, 2, 4, 2); },
                                       {"token 1", "every logit is -inf"}));
}

TEST(Gating, RandomLogitsMatchDirectComputation) {
  Rng rng(99);
  for (int e : {4, 8, 16, 64}) {
    for (int topk : {1, 2, 4, 8}) {
      if (topk > e) continue;
      SCOPED_TRACE("E=" + std::to_string(e) + " topk=" + std::to_string(topk));
      const int tokens = 17;
      std::vector<float> logits(size_t(tokens) * e);
      for (float& l : logits) l = float(rng.normal() * 2);
      // A few exact ties.
      logits[3] = logits[1];
      logits[size_t(e) + 2] = logits[size_t(e)];
      expect_gating_matches(logits, tokens, e, topk);
    }
  }
}

TEST(Gating, ZeroTokens) {
  const Routing r = softmax_topk_gating({}, 0, 8, 2, true);
  EXPECT_EQ(r.num_tokens, 0);
  EXPECT_TRUE(r.expert_ids.empty());
  EXPECT_TRUE(r.weights.empty());
}

// ---- generators ----------------------------------------------------------------------------

struct GenCase {
  RoutingSpec spec;
  int num_tokens;
  int num_experts;
  int topk;
  uint64_t seed;
  std::string describe() const {
    return spec.describe() + " mask=" + std::to_string(spec.mask_fraction) +
           " tokens=" + std::to_string(num_tokens) + " E=" + std::to_string(num_experts) +
           " topk=" + std::to_string(topk) + " seed=" + std::to_string(seed);
  }
};

std::vector<GenCase> gen_cases() {
  std::vector<GenCase> out;
  const RoutingSpec specs[] = {{RoutingKind::kUniform, 0, 0},
                               {RoutingKind::kZipf, 1.2, 0},
                               {RoutingKind::kImbalance, 0.05, 0},
                               {RoutingKind::kUniform, 0, 0.2},
                               {RoutingKind::kZipf, 2.0, 0.5}};
  uint64_t seed = 1;
  for (const RoutingSpec& s : specs) {
    for (auto [e, topk] : {std::pair{4, 1}, {8, 2}, {16, 4}, {16, 16}, {64, 8}, {256, 8}}) {
      out.push_back({s, 37, e, topk, seed++});
    }
  }
  return out;
}

Routing gen(const GenCase& c, int rank) {
  return generate_routing(c.spec, c.num_tokens, c.num_experts, c.topk, c.seed, rank);
}

bool same_routing(const Routing& a, const Routing& b) {
  if (a.num_tokens != b.num_tokens || a.topk != b.topk || a.expert_ids != b.expert_ids) return false;
  if (a.weights.size() != b.weights.size()) return false;
  for (size_t i = 0; i < a.weights.size(); ++i) {
    if (float_bits(a.weights[i]) != float_bits(b.weights[i])) return false;
  }
  return true;
}

TEST(Generate, ShapeRangeAndDistinctIds) {
  for (const GenCase& c : gen_cases()) {
    SCOPED_TRACE(c.describe());
    for (int rank : {0, 3}) {
      const Routing r = gen(c, rank);
      ASSERT_EQ(r.num_tokens, c.num_tokens);
      ASSERT_EQ(r.topk, c.topk);
      ASSERT_EQ(r.expert_ids.size(), size_t(c.num_tokens) * c.topk);
      ASSERT_EQ(r.weights.size(), size_t(c.num_tokens) * c.topk);
      EXPECT_NO_THROW(r.check(c.num_experts, rank));
      for (int t = 0; t < r.num_tokens; ++t) {
        std::set<int> seen;
        double sum = 0;
        for (int k = 0; k < r.topk; ++k) {
          const int id = r.expert(t, k);
          ASSERT_GE(id, -1) << "token " << t << " slot " << k;
          ASSERT_LT(id, c.num_experts) << "token " << t << " slot " << k;
          if (id < 0) continue;
          EXPECT_TRUE(seen.insert(id).second) << "token " << t << " repeats expert " << id;
          const float w = r.weight(t, k);
          EXPECT_TRUE(std::isfinite(w));
          EXPECT_GT(w, 0.0f);
          EXPECT_LE(w, 1.0f + 1e-6f);
          sum += w;
        }
        if (c.spec.mask_fraction == 0) {
          EXPECT_EQ(int(seen.size()), c.topk) << "token " << t;
          EXPECT_NEAR(sum, 1.0, 1e-5) << "token " << t;  // softmax over the drawn experts
        }
      }
    }
  }
}

TEST(Generate, DeterministicPerSeedAndRankDifferentAcrossThem) {
  for (const GenCase& c : gen_cases()) {
    SCOPED_TRACE(c.describe());
    EXPECT_TRUE(same_routing(gen(c, 0), gen(c, 0)));
    EXPECT_TRUE(same_routing(gen(c, 5), gen(c, 5)));
    if (c.topk == c.num_experts && c.spec.mask_fraction == 0) continue;  // ids forced; weights differ
    EXPECT_FALSE(same_routing(gen(c, 0), gen(c, 1)));
    GenCase other = c;
    other.seed += 1000;
    EXPECT_FALSE(same_routing(gen(c, 0), gen(other, 0)));
  }
  // Weights differ across ranks even when every token takes every expert.
  const RoutingSpec uniform;
  EXPECT_FALSE(same_routing(generate_routing(uniform, 20, 4, 4, 1, 0),
                            generate_routing(uniform, 20, 4, 4, 1, 1)));
}

TEST(Generate, ZeroTokens) {
  const Routing r = generate_routing(RoutingSpec{}, 0, 8, 2, 1, 0);
  EXPECT_EQ(r.num_tokens, 0);
  EXPECT_EQ(r.topk, 2);
  EXPECT_TRUE(r.expert_ids.empty());
}

// Fraction of slots per expert over `ranks` ranks, and the masked fraction.
struct Loads {
  std::vector<double> share;  // per expert, over unmasked slots
  double masked = 0;
};
Loads measure(const RoutingSpec& spec, int tokens, int e, int topk, uint64_t seed, int ranks) {
  Loads out;
  out.share.assign(e, 0);
  int64_t slots = 0, masked = 0, used = 0;
  for (int r = 0; r < ranks; ++r) {
    const Routing rt = generate_routing(spec, tokens, e, topk, seed, r);
    for (int32_t id : rt.expert_ids) {
      ++slots;
      if (id < 0) {
        ++masked;
        continue;
      }
      ++used;
      out.share[id] += 1;
    }
  }
  for (double& s : out.share) s /= std::max<int64_t>(used, 1);
  out.masked = double(masked) / slots;
  return out;
}

TEST(Generate, MaskFractionIsRespected) {
  for (double f : {0.0, 0.2, 0.5, 1.0}) {
    for (RoutingKind kind : {RoutingKind::kUniform, RoutingKind::kZipf}) {
      RoutingSpec spec{kind, kind == RoutingKind::kZipf ? 1.2 : 0.0, f};
      SCOPED_TRACE(spec.describe() + " mask " + std::to_string(f));
      // 8000 slots: the binomial std of the fraction is <= 0.006.
      const Loads l = measure(spec, 2000, 16, 4, 42, 1);
      if (f == 0.0 || f == 1.0) {
        EXPECT_EQ(l.masked, f);
      } else {
        EXPECT_NEAR(l.masked, f, 0.03);
      }
    }
  }
}

TEST(Generate, UniformAndImbalanceZeroAreFlat) {
  for (const char* text : {"uniform", "imbalance:0"}) {
    SCOPED_TRACE(text);
    const RoutingSpec spec = parse_routing_spec(text);
    const auto dist = expert_load_distribution(spec, 8, 3);
    for (double p : dist) EXPECT_NEAR(p, 1.0 / 8, 1e-12);
    // 4 ranks x 1000 tokens x topk 2 = 8000 slots, 1000 per expert expected (std ~30).
    const Loads l = measure(spec, 1000, 8, 2, 3, 4);
    for (int e = 0; e < 8; ++e) EXPECT_NEAR(l.share[e], 1.0 / 8, 0.15 / 8) << "expert " << e;
  }
}

TEST(Generate, ZipfSkewsLoadToFewExpertsOnEveryRank) {
  const RoutingSpec spec = parse_routing_spec("zipf:1.2");
  const int e = 16;
  // topk 1: the per-expert shares follow the distribution (sorted).
  const Loads l = measure(spec, 5000, e, 1, 11, 4);
  std::vector<double> got = l.share;
  std::vector<double> want = expert_load_distribution(spec, e, 11);
  std::sort(got.rbegin(), got.rend());
  std::sort(want.rbegin(), want.rend());
  for (int i = 0; i < e; ++i) EXPECT_NEAR(got[i], want[i], 0.02) << "rank-order " << i;
  EXPECT_GT(got[0] + got[1], 0.4);  // uniform would give 2/16
  // topk 2: still skewed; and every rank favours the same experts (a global hot spot).
  int hottest = -1;
  for (int rank = 0; rank < 4; ++rank) {
    const Routing rt = generate_routing(spec, 2000, e, 2, 11, rank);
    std::vector<int> count(e, 0);
    for (int32_t id : rt.expert_ids) count[id]++;
    const int top = int(std::max_element(count.begin(), count.end()) - count.begin());
    EXPECT_GT(count[top], 2 * 4000 / e) << "rank " << rank;
    if (hottest < 0) hottest = top;
    EXPECT_EQ(top, hottest) << "rank " << rank << " has another hottest expert";
  }
}

TEST(LoadDistribution, SumsToOneAndZipfShape) {
  for (int e : {1, 4, 16, 256}) {
    for (const char* text : {"uniform", "zipf:1.2", "zipf:0.5", "imbalance:0.05", "imbalance:0.001"}) {
      for (uint64_t seed : {1, 2, 3}) {
        SCOPED_TRACE(std::string(text) + " E=" + std::to_string(e) + " seed=" + std::to_string(seed));
        const RoutingSpec spec = parse_routing_spec(text);
        const auto d = expert_load_distribution(spec, e, seed);
        ASSERT_EQ(int(d.size()), e);
        double sum = 0;
        for (double p : d) {
          EXPECT_GE(p, 0.0);
          EXPECT_TRUE(std::isfinite(p));
          sum += p;
        }
        EXPECT_NEAR(sum, 1.0, 1e-9);
        EXPECT_EQ(d, expert_load_distribution(spec, e, seed));  // deterministic
        if (spec.kind == RoutingKind::kZipf) {
          std::vector<double> sorted = d;
          std::sort(sorted.rbegin(), sorted.rend());
          double z = 0;
          for (int i = 0; i < e; ++i) z += 1.0 / std::pow(i + 1.0, spec.param);
          for (int i = 0; i < e; ++i) {
            EXPECT_NEAR(sorted[i], 1.0 / std::pow(i + 1.0, spec.param) / z, 1e-12) << i;
          }
        }
      }
    }
  }
}

TEST(LoadDistribution, ImbalanceStdIsTheParameter) {
  // E = 64: 1/E = 0.0156 is ~8 std above 0 for std 0.002, so clipping never happens.
  for (uint64_t seed : {1, 2, 3, 4}) {
    const auto d = expert_load_distribution(parse_routing_spec("imbalance:0.002"), 64, seed);
    double var = 0;
    for (double p : d) var += (p - 1.0 / 64) * (p - 1.0 / 64);
    const double sd = std::sqrt(var / 64);
    EXPECT_GT(sd, 0.0012) << "seed " << seed;
    EXPECT_LT(sd, 0.0028) << "seed " << seed;
  }
}

// ---- parse_routing_spec ----------------------------------------------------------------------

TEST(RoutingSpec, ParsesGoodStrings) {
  RoutingSpec s = parse_routing_spec("uniform");
  EXPECT_EQ(s.kind, RoutingKind::kUniform);
  EXPECT_EQ(s.mask_fraction, 0.0);
  s = parse_routing_spec("zipf:1.2");
  EXPECT_EQ(s.kind, RoutingKind::kZipf);
  EXPECT_DOUBLE_EQ(s.param, 1.2);
  s = parse_routing_spec("imbalance:0.03");
  EXPECT_EQ(s.kind, RoutingKind::kImbalance);
  EXPECT_DOUBLE_EQ(s.param, 0.03);
  s = parse_routing_spec("imbalance:0");
  EXPECT_EQ(s.kind, RoutingKind::kImbalance);
  EXPECT_EQ(s.param, 0.0);
  EXPECT_TRUE(contains(parse_routing_spec("zipf:1.2").describe(), "zipf"));
  EXPECT_TRUE(contains(parse_routing_spec("uniform").describe(), "uniform"));
  EXPECT_TRUE(contains(parse_routing_spec("imbalance:0.03").describe(), "imbalance"));
}

TEST(RoutingSpec, RejectsBadStrings) {
  for (const char* bad : {"", "unif", "zipf:", "zipf:abc", "zipf:1.2x", "imbalance:", "imbalance:x",
                          "gaussian:0.1", ":1.2", "uniform:abc", "uniform:"}) {
    EXPECT_TRUE(throws_with<Error>([&] { parse_routing_spec(bad); })) << "'" << bad << "'";
  }
}

// "uniform:" is a parameter left out, not uniform; a parameter that underflows a double
// (1e-310, stod's out_of_range) is the tiny number it is, and one that overflows is named too
// large rather than "not a number".
TEST(RoutingSpec, TrailingColonTinyAndHugeParameters) {
  EXPECT_TRUE(throws_with<Error>([] { parse_routing_spec("uniform:"); }, {"'uniform:'", "uniform takes no parameter"}));
  for (const char* tiny : {"zipf:1e-310", "zipf:4.9e-324", "zipf:1e-400", "imbalance:1e-320"}) {
    SCOPED_TRACE(tiny);
    RoutingSpec spec;
    ASSERT_NO_THROW(spec = parse_routing_spec(tiny));
    EXPECT_GE(spec.param, 0.0);
    EXPECT_LT(spec.param, 1e-300);
    const auto d = expert_load_distribution(spec, 8, 1);
    for (double p : d) EXPECT_NEAR(p, 1.0 / 8, 1e-12);
  }
  EXPECT_TRUE(throws_with<Error>([] { parse_routing_spec("zipf:-1e-310"); }, {"expected a number >= 0"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_routing_spec("zipf:1e400"); }, {"1e400 is too large"}));
}

// A spec built in code with a NaN, infinite or negative parameter is refused where it is used,
// naming it (the string parser refuses them too); uniform ignores its parameter.
TEST(RoutingSpec, BadParametersBuiltInCodeAreRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (RoutingKind kind : {RoutingKind::kZipf, RoutingKind::kImbalance})
    for (double param : {nan, inf, -0.5}) {
      const RoutingSpec spec{kind, param, 0.0};
      EXPECT_TRUE(throws_with<Error>([&] { generate_routing(spec, 4, 8, 2, 1, 0); },
                                     {"routing", "must be a finite number >= 0"}))
          << spec.describe();
    }
  EXPECT_NO_THROW(generate_routing({RoutingKind::kUniform, nan, 0.0}, 4, 8, 2, 1, 0));
  EXPECT_TRUE(throws_with<Error>([&] { generate_routing({RoutingKind::kUniform, 0, nan}, 4, 8, 2, 1, 0); },
                                 {"mask fraction nan"}));
}

// imbalance:STD is the std of a load fraction: beyond kMaxImbalanceStd it is refused, in text
// and built in code. 1e307 used to pass and overflow the loads' sum to inf, so every load came
// out 0 or NaN and generation degenerated without an error.
TEST(RoutingSpec, ImbalanceStdBeyondTheBoundIsRefused) {
  EXPECT_DOUBLE_EQ(parse_routing_spec("imbalance:1").param, kMaxImbalanceStd);
  for (const char* bad : {"imbalance:1.5", "imbalance:10", "imbalance:1e307"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(throws_with<Error>([&] { parse_routing_spec(bad); }, {bad, "std of an expert's load fraction", "at most 1"}));
  }
  const RoutingSpec huge{RoutingKind::kImbalance, 1e307, 0.0};
  EXPECT_TRUE(throws_with<Error>([&] { expert_load_distribution(huge, 64, 1); }, {"imbalance:1e+307", "at most 1"}));
  EXPECT_TRUE(throws_with<Error>([&] { generate_routing(huge, 4, 64, 2, 1, 0); }, {"at most 1"}));
  // At the bound the loads are still a distribution.
  const auto d = expert_load_distribution({RoutingKind::kImbalance, kMaxImbalanceStd, 0.0}, 64, 1);
  double sum = 0;
  for (double p : d) {
    EXPECT_TRUE(std::isfinite(p) && p >= 0) << p;
    sum += p;
  }
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

// ---- Routing::check --------------------------------------------------------------------------

Routing three_tokens() {
  Routing r;
  r.num_tokens = 3;
  r.topk = 2;
  r.expert_ids = {0, 7, 3, -1, 5, 6};
  r.weights = {0.5f, 0.5f, 1.0f, 0.0f, 0.25f, 0.75f};
  return r;
}

TEST(RoutingCheck, AcceptsValidRouting) {
  EXPECT_NO_THROW(three_tokens().check(8, 3));
  Routing unmasked = three_tokens();
  unmasked.expert_ids = {0, 7, 3, 2, 5, 6};
  EXPECT_NO_THROW(unmasked.check(8, 0));
  Routing garbage_in_masked = three_tokens();  // a masked slot's weight is ignored
  garbage_in_masked.weights[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NO_THROW(garbage_in_masked.check(8, 0));
  Routing empty;
  empty.topk = 2;
  EXPECT_NO_THROW(empty.check(8, 0));
}

TEST(RoutingCheck, RepeatedExpertInATokenThrows) {
  Routing r = three_tokens();
  r.expert_ids[5] = 5;  // token 2 selects expert 5 in both slots
  EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 3); }, {"rank 3", "token 2", "expert 5", "slots 0 and 1"}));
  r = three_tokens();
  r.expert_ids[3] = 3;  // a masked slot turned into a repeat of slot 0
  EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 0); }, {"token 1", "expert 3"}));
  r = three_tokens();
  r.expert_ids[2] = -1;  // two masked slots are not a repeat
  r.expert_ids[3] = -1;
  EXPECT_NO_THROW(r.check(8, 0));
}

TEST(RoutingCheck, IdOutOfRangeNamesTokenAndSlot) {
  Routing r = three_tokens();
  r.expert_ids[2 * 2 + 1] = 8;
  EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 3); }, {"rank 3", "token 2", "slot 1", "8"}));
  r = three_tokens();
  r.expert_ids[0] = -2;
  EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 3); }, {"rank 3", "token 0", "slot 0", "-2"}));
  r = three_tokens();
  r.expert_ids[3] = 1000000;
  EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 1); }, {"rank 1", "token 1", "slot 1"}));
}

TEST(RoutingCheck, NonFiniteWeightThrows) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    Routing r = three_tokens();
    r.weights[2 * 1 + 0] = bad;
    EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 3); }, {"rank 3", "token 1"})) << bad;
  }
}

TEST(RoutingCheck, SizeMismatchThrows) {
  Routing r = three_tokens();
  r.expert_ids.pop_back();
  EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 3); }));
  r = three_tokens();
  r.weights.push_back(0.0f);
  EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 3); }));
  r = three_tokens();
  r.num_tokens = 4;
  EXPECT_TRUE(throws_with<Error>([&] { r.check(8, 3); }));
}

// ---- Rng ---------------------------------------------------------------------------------------

TEST(Rng, DeterministicAndInRange) {
  Rng a(5), b(5), c(6);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t va = a.next_u64();
    EXPECT_EQ(va, b.next_u64());
    differs = differs || va != c.next_u64();
  }
  EXPECT_TRUE(differs);
  Rng r(1);
  double sum = 0, sum2 = 0;
  std::vector<int> hits(7, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const int k = r.uniform_int(7);
    ASSERT_GE(k, 0);
    ASSERT_LT(k, 7);
    hits[k]++;
    const double z = r.normal();
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum2 += z * z;
  }
  for (int h : hits) EXPECT_NEAR(h, n / 7.0, n / 7.0 * 0.1);
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(sum2 / n, 1.0, 0.05);
  // An empty range is refused (n = 0 divided by zero, a negative n gave values outside it).
  EXPECT_EQ(r.uniform_int(1), 0);
  for (int bad : {0, -5}) EXPECT_TRUE(throws_with<Error>([&] { r.uniform_int(bad); }, {"uniform_int", "no value"}));
}

TEST(Rng, DerivedSeedsAreDistinct) {
  std::set<uint64_t> seen;
  for (uint64_t seed : {0, 1, 2}) {
    for (uint64_t stream = 0; stream < 100; ++stream) seen.insert(derive_seed(seed, stream));
  }
  EXPECT_EQ(seen.size(), 300u);
  EXPECT_EQ(derive_seed(7, 3), derive_seed(7, 3));
}

}  // namespace
}  // namespace comet
