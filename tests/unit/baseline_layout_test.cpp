// Unit tests of the baseline layout (src/core/baseline_layout.h): for every case of
// plan_cases() and several chunk counts, every token is followed through the index formulas the
// baseline kernels use (pack -> dispatch -> permute -> un-permute -> combine), which must visit
// every row of every buffer exactly once and agree with the dispatch plan's counts.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "comet/plan.h"
#include "core/baseline_layout.h"
#include "support/test_support.h"
#include "unit/plan_cases.h"

namespace comet {
namespace {

using core::BaselineCounts;
using core::BaselineLayout;

// Marks index i of a buffer; a second visit or an index outside [0, size) fails.
struct Visits {
  std::vector<int> hits;
  explicit Visits(int size) : hits(size_t(std::max(size, 0)), 0) {}
  ::testing::AssertionResult visit(int i) {
    if (i < 0 || i >= int(hits.size()))
      return ::testing::AssertionFailure() << "row " << i << " outside [0, " << hits.size() << ")";
    if (hits[i]++) return ::testing::AssertionFailure() << "row " << i << " visited twice";
    return ::testing::AssertionSuccess();
  }
  bool all_once() const {
    for (int h : hits)
      if (h != 1) return false;
    return true;
  }
};

// Tokens of chunk c before `token` that select `pred` (the rank a kernel computes with scans).
template <class Pred>
int rank_before(const Routing& rt, int chunks, int token, Pred pred) {
  const int c = core::chunk_of(token, rt.num_tokens, chunks);
  int n = 0;
  for (int t = core::chunk_begin(rt.num_tokens, chunks, c); t < token; ++t)
    for (int k = 0; k < rt.topk; ++k)
      if (pred(rt.expert(t, k))) {
        ++n;
        break;
      }
  return n;
}

void check_layout(const test::PlanCase& pc, int chunks) {
  SCOPED_TRACE(pc.describe() + " chunks=" + std::to_string(chunks));
  const LayerConfig config = pc.config();
  const std::vector<Routing> routing = pc.routing();
  const BaselineCounts counts = core::count_baseline_routing(config, routing, chunks);
  const BaselineLayout layout(config, counts);
  const DispatchPlan plan(config, routing);
  const int W = config.layout.world, TP = config.layout.tp, epr = config.experts_per_rank();

  std::vector<Visits> send, recv, a;
  for (int r = 0; r < W; ++r) {
    send.emplace_back(layout.send_total(r));
    recv.emplace_back(layout.recv_total(r));
    a.emplace_back(layout.a_total(r));
  }
  for (int s = 0; s < W; ++s) {
    const Routing& rt = routing[s];
    for (int t = 0; t < rt.num_tokens; ++t) {
      const int c = core::chunk_of(t, rt.num_tokens, chunks);
      for (int g = 0; g < config.layout.ep; ++g) {
        auto in_group = [&](int e) { return e >= 0 && e / epr == g; };
        bool selects = false;
        for (int k = 0; k < rt.topk; ++k) selects = selects || in_group(rt.expert(t, k));
        if (!selects) continue;
        const int tok_rank = rank_before(rt, chunks, t, in_group);
        for (int tp = 0; tp < TP; ++tp) {
          const int d = g * TP + tp;
          ASSERT_LT(tok_rank, layout.send_rows(s, c, d));
          const int pos = layout.send_begin(s, c, d) + tok_rank;  // pack; the combine returns here
          ASSERT_TRUE(send[s].visit(pos)) << "send buffer of rank " << s;
          const int j = layout.recv_begin(d, c, s) + tok_rank;  // dispatch lands here
          ASSERT_GE(j, layout.recv_chunk_begin(d, c));
          ASSERT_LT(j, layout.recv_chunk_begin(d, c + 1));
          ASSERT_TRUE(recv[d].visit(j)) << "recv buffer of rank " << d;
          for (int k = 0; k < rt.topk; ++k) {
            const int e = rt.expert(t, k);
            if (!in_group(e)) continue;
            const int row = layout.a_row_from(s, c, e) + rank_before(rt, chunks, t, [&](int x) { return x == e; });
            const int el = e % epr;
            ASSERT_GE(row, layout.a_begin(d, c, el));  // inside expert e's segment of chunk c
            ASSERT_LT(row, layout.a_begin(d, c, el) + layout.a_rows(d, c, el));
            ASSERT_TRUE(a[d].visit(row)) << "A buffer of rank " << d;
          }
        }
      }
    }
  }
  for (int r = 0; r < W; ++r) {
    EXPECT_TRUE(send[r].all_once()) << "rank " << r << ": a send row nobody fills";
    EXPECT_TRUE(recv[r].all_once()) << "rank " << r << ": a recv row nobody fills";
    EXPECT_TRUE(a[r].all_once()) << "rank " << r << ": an A row nobody fills";
    for (int el = 0; el < epr; ++el) {
      int rows = 0;
      for (int c = 0; c < chunks; ++c) rows += layout.a_rows(r, c, el);
      EXPECT_EQ(rows, plan.expert_rows(r, el)) << "rank " << r << " expert " << el;
    }
    for (int d = 0; d < W; ++d) {
      int rows = 0;
      for (int c = 0; c < chunks; ++c) rows += layout.send_rows(r, c, d);
      EXPECT_EQ(rows, plan.send_count(r, d)) << "tokens " << r << " -> " << d;
    }
    // Worst-case buffer bounds the GPU baseline allocates (docs/baselines.md).
    const int64_t t_max = config.max_tokens_per_rank;
    EXPECT_LE(layout.send_total(r), t_max * std::min(config.layout.ep, config.model.topk) * TP);
    EXPECT_LE(layout.recv_total(r), W * t_max);
    EXPECT_LE(layout.a_total(r), W * t_max * std::min(config.model.topk, epr));
  }
  EXPECT_EQ(layout.moved_rows(false), [&] {
    int64_t n = 0;
    for (int s = 0; s < W; ++s)
      for (int d = 0; d < W; ++d) n += plan.send_count(s, d);
    return n;
  }());
}

class BaselineLayoutTest : public ::testing::TestWithParam<test::PlanCase> {};

TEST_P(BaselineLayoutTest, EveryRowOnceAndCountsMatchThePlan) {
  for (int chunks : {1, 2, 3, 4, core::kBaselineMaxChunks}) check_layout(GetParam(), chunks);
}

INSTANTIATE_TEST_SUITE_P(Cases, BaselineLayoutTest, ::testing::ValuesIn(test::plan_cases()),
                         [](const auto& info) {
                           return test::param_name(info.param.short_name()) + "_" + std::to_string(info.index);
                         });

TEST(BaselineChunks, ChunkOfInvertsChunkBegin) {
  for (int tokens = 1; tokens <= 70; ++tokens)
    for (int chunks = 1; chunks <= 9; ++chunks)
      for (int t = 0; t < tokens; ++t) {
        const int c = core::chunk_of(t, tokens, chunks);
        ASSERT_GE(c, 0);
        ASSERT_LT(c, chunks);
        ASSERT_GE(t, core::chunk_begin(tokens, chunks, c)) << tokens << " tokens, " << chunks << " chunks";
        ASSERT_LT(t, core::chunk_begin(tokens, chunks, c + 1)) << tokens << " tokens, " << chunks << " chunks";
      }
}

// The rows the device publishes, built by hand: parsing returns the counts, an error names the rank.
TEST(BaselineCountRows, ParseRoundTripAndErrors) {
  test::PlanCase pc;
  pc.world = 2;
  pc.ep = 2;
  pc.tokens = {5, 3};
  const LayerConfig config = pc.config();
  const int chunks = 2, len = core::baseline_count_row_len(config, chunks);
  EXPECT_EQ(len % 4, 0);
  EXPECT_GE(len, core::kBaselineCountHeader + chunks * (config.model.num_experts + config.layout.ep));
  const BaselineCounts want = core::count_baseline_routing(config, pc.routing(), chunks);
  std::vector<int32_t> rows(size_t(2) * len, 0);
  const int E = config.model.num_experts, G = config.layout.ep;
  for (int r = 0; r < 2; ++r) {
    rows[size_t(r) * len] = want.num_tokens[r];
    for (int c = 0; c < chunks; ++c) {
      int32_t* counts = rows.data() + size_t(r) * len + core::kBaselineCountHeader + c * (E + G);
      for (int e = 0; e < E; ++e) counts[e] = want.row(r, c, e);
      for (int g = 0; g < G; ++g) counts[E + g] = want.token_count(r, c, g);
    }
  }
  const BaselineCounts got = core::parse_baseline_counts(config, rows.data(), chunks);
  EXPECT_EQ(got.num_tokens, want.num_tokens);
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.tokens, want.tokens);

  rows[size_t(len) + 1] = int32_t(core::BaselineInputError::kExpertId);
  rows[size_t(len) + 2] = 4;
  rows[size_t(len) + 3] = 1;
  rows[size_t(len) + 4] = 99;
  EXPECT_TRUE(test::throws_with<Error>([&] { core::parse_baseline_counts(config, rows.data(), chunks); },
                                       {"bad input from rank 1", "token 4 slot 1", "expert id 99"}));
  rows[size_t(len) + 1] = int32_t(core::BaselineInputError::kTokenCount);
  rows[size_t(len) + 4] = 17;
  EXPECT_TRUE(test::throws_with<Error>([&] { core::parse_baseline_counts(config, rows.data(), chunks); },
                                       {"rank 1", "num_tokens 17", "T_max = 16"}));
  rows[size_t(len) + 1] = int32_t(core::BaselineInputError::kRepeatedExpert);
  EXPECT_TRUE(test::throws_with<Error>([&] { core::parse_baseline_counts(config, rows.data(), chunks); },
                                       {"rank 1", "twice"}));
  rows[size_t(len) + 1] = int32_t(core::BaselineInputError::kWeight);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(&rows[size_t(len) + 4], &inf, sizeof inf);
  EXPECT_TRUE(test::throws_with<Error>([&] { core::parse_baseline_counts(config, rows.data(), chunks); },
                                       {"rank 1", "token 4 slot 1", "routing weight inf is not finite"}));
  EXPECT_TRUE(test::throws_with<Error>([&] { core::baseline_count_row_len(config, 0); }, {"chunks must be within"}));
  EXPECT_TRUE(test::throws_with<Error>([&] { core::baseline_count_row_len(config, core::kBaselineMaxChunks + 1); },
                                       {"chunks must be within"}));
}

}  // namespace
}  // namespace comet
