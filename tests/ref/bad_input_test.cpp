// ref/bad_input_test.cpp: bad inputs through RefBackend::forward throw comet::Error naming
// the rank, and the backend stays usable: the next good forward is correct.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ref/ref_cases.h"

namespace comet::test {
namespace {

// W = 4 as (TP 2, EP 2): rank 1 is (ep 0, tp 1).
RefCase bad_input_base() {
  RefCase c;
  c.label = "bad_input";
  c.model = {"bad", 32, 48, 8, 2, Activation::kSwiGlu};
  c.world = 4, c.tp = 2, c.ep = 2;
  c.t_max = 16;
  c.tokens = {16, 9, 0, 12};
  c.dtype = DType::kBF16;
  c.tiles = {8, 16, 16};
  c.seed = 21;
  return c;
}

// One way to break the input of rank 1 (or of the call), and what the message must contain.
struct BadInput {
  std::string what;
  std::function<void(const RefCase&, std::vector<std::vector<float>>&, std::vector<Routing>&)> mutate;
  std::vector<std::string> message_parts;
};

std::vector<BadInput> bad_inputs() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  return {
      {"expert id == E on rank 1",
       [](const RefCase& c, auto&, auto& rt) { rt[1].expert_ids[3] = c.model.num_experts; }, {"rank 1"}},
      {"expert id > E on rank 1", [](const RefCase&, auto&, auto& rt) { rt[1].expert_ids[0] = 1000; }, {"rank 1"}},
      {"expert id -2 on rank 1", [](const RefCase&, auto&, auto& rt) { rt[1].expert_ids[5] = -2; }, {"rank 1"}},
      {"more tokens than T_max on rank 1",
       [](const RefCase& c, auto& x, auto& rt) {
         rt[1] = generate_routing(c.spec, c.t_max + 1, c.model.num_experts, c.model.topk, 5, 1);
         x[1].assign(size_t(c.t_max + 1) * c.model.hidden, 0.5f);
       },
       {"rank 1"}},
      {"one routing too few", [](const RefCase&, auto&, auto& rt) { rt.pop_back(); }, {}},
      {"one routing too many", [](const RefCase&, auto&, auto& rt) { rt.push_back(rt.back()); }, {}},
      {"one x too few", [](const RefCase&, auto& x, auto&) { x.pop_back(); }, {}},
      {"x of rank 1 one value short", [](const RefCase&, auto& x, auto&) { x[1].pop_back(); }, {"rank 1"}},
      {"x of rank 1 one token long",
       [](const RefCase& c, auto& x, auto&) { x[1].resize(x[1].size() + c.model.hidden, 0.0f); }, {"rank 1"}},
      {"NaN in x of rank 1", [nan](const RefCase&, auto& x, auto&) { x[1][40] = nan; }, {"rank 1"}},
      {"Inf in x of rank 1", [inf](const RefCase&, auto& x, auto&) { x[1][0] = -inf; }, {"rank 1"}},
      {"NaN routing weight on rank 1",
       [nan](const RefCase&, auto&, auto& rt) {
         rt[1].expert_ids[2] = 3;
         rt[1].weights[2] = nan;
       },
       {"rank 1"}},
      {"routing topk 1 on rank 1 (config topk 2)",
       [](const RefCase& c, auto&, auto& rt) {
         rt[1] = generate_routing(c.spec, rt[1].num_tokens, c.model.num_experts, 1, 5, 1);
       },
       {"rank 1"}},
      {"expert repeated within a token on rank 1",
       [](const RefCase&, auto&, auto& rt) {
         rt[1].expert_ids[2] = 6;
         rt[1].expert_ids[3] = 6;
       },
       {"rank 1", "token 1", "expert 6"}},
      {"routing ids of rank 1 one short", [](const RefCase&, auto&, auto& rt) { rt[1].expert_ids.pop_back(); },
       {"rank 1"}},
  };
}

TEST(BadInput, ThrowsNamingTheRankAndStaysUsable) {
  const RefCase c = bad_input_base();
  SCOPED_TRACE(c.describe());
  const MoeProblem p = c.problem();
  const auto want = ref::oracle_forward(p);
  ref::RefBackend backend(c.config(), c.options);
  backend.set_weights(p.weights);
  // A good call first, so that the failures happen with advanced epoch counters.
  EXPECT_TRUE(matches_oracle(backend.forward(p.x, p.routing), want, c.dtype, c.model.hidden));
  for (const BadInput& bad : bad_inputs()) {
    SCOPED_TRACE("bad input: " + bad.what);
    auto x = p.x;
    auto routing = p.routing;
    bad.mutate(c, x, routing);
    std::string message;
    const auto result = throws_with<Error>([&] { backend.forward(x, routing); }, bad.message_parts, &message);
    EXPECT_TRUE(result);
    // The backend stays usable: a good call right after is correct.
    std::vector<std::vector<float>> got;
    ASSERT_NO_THROW(got = backend.forward(p.x, p.routing));
    EXPECT_TRUE(matches_oracle(got, want, c.dtype, c.model.hidden));
  }
}

TEST(BadInput, NaNPassesThroughWhenChecksAreOff) {
  RefCase c = bad_input_base();
  c.options.check_inputs = false;
  c.tokens = {16, 9, 4, 12};
  c.spec = {RoutingKind::kUniform, 0, 0};
  SCOPED_TRACE(c.describe());
  const MoeProblem p = c.problem();
  ref::RefBackend backend(c.config(), c.options);
  backend.set_weights(p.weights);
  const auto clean = backend.forward(p.x, p.routing);
  auto x = p.x;
  const int bad_token = 3;
  x[1][size_t(bad_token) * c.model.hidden + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> got;
  ASSERT_NO_THROW(got = backend.forward(x, p.routing));
  // The NaN token's output is NaN; every other token (sharing tiles with it) is unchanged.
  bool any_nan = false;
  const int h = c.model.hidden;
  for (int i = 0; i < h; ++i) any_nan = any_nan || std::isnan(got[1][size_t(bad_token) * h + i]);
  EXPECT_TRUE(any_nan) << "a NaN input vanished from its token's output";
  for (int r = 0; r < c.world; ++r) {
    for (size_t i = 0; i < got[r].size(); ++i) {
      if (r == 1 && int(i) / h == bad_token) continue;
      ASSERT_EQ(float_bits(got[r][i]), float_bits(clean[r][i])) << "rank " << r << " token " << i / h;
    }
  }
}

TEST(BadInput, BadConfigOrWeightsThrow) {
  RefCase c = bad_input_base();
  LayerConfig bad = c.config();
  bad.layout = {4, 4, 2};  // W != EP * TP
  EXPECT_TRUE(throws_with<Error>([&] { ref::RefBackend b(bad, c.options); }));
  const MoeProblem p = c.problem();
  ref::RefBackend backend(c.config(), c.options);
  ExpertWeights w = p.weights;
  w.w_up.pop_back();
  EXPECT_TRUE(throws_with<Error>([&] { backend.set_weights(w); }));
  backend.set_weights(p.weights);
  EXPECT_TRUE(matches_oracle(backend.forward(p.x, p.routing), ref::oracle_forward(p), c.dtype, c.model.hidden));
}

// Weights and inputs are checked in the storage type: a NaN or infinite weight, or a value finite
// in fp32 but not in f16 (1e5), is refused naming it; before, the output was NaN without a word.
TEST(BadInput, NonFiniteWeightsAndInputsInTheStorageTypeAreRefused) {
  RefCase c = bad_input_base();
  c.dtype = DType::kF16;
  const MoeProblem p = c.problem();
  ref::RefBackend backend(c.config(), c.options);
  ExpertWeights w = p.weights;
  w.w_up[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(throws_with<Error>([&] { backend.set_weights(w); }, {"w_up", "not finite"}));
  w = p.weights;
  w.w_down[3] = 1e5f;  // f16's largest is 65504
  EXPECT_TRUE(throws_with<Error>([&] { backend.set_weights(w); }, {"w_down", "100000", "not finite as f16"}));
  backend.set_weights(p.weights);
  auto x = p.x;
  x[1][5] = 1e5f;
  EXPECT_TRUE(throws_with<Error>([&] { backend.forward(x, p.routing); }, {"rank 1", "not finite as f16"}));
  EXPECT_TRUE(matches_oracle(backend.forward(p.x, p.routing), ref::oracle_forward(p), c.dtype, c.model.hidden));
}

// Options outside what the backend can run are refused by name: worker counts whose threads
// would overflow (or exhaust) the process, a timeout whose conversion to nanoseconds overflows.
TEST(BadInput, OptionsOutOfRangeAreRefused) {
  RefCase c = bad_input_base();
  ref::RefOptions o = c.options;
  o.comm_workers = std::numeric_limits<int>::max();
  EXPECT_TRUE(throws_with<Error>([&] { ref::RefBackend b(c.config(), o); }, {"between 1 and 1024"}));
  o = c.options;
  o.compute_workers = ref::RefOptions::kMaxWorkers + 1;
  EXPECT_TRUE(throws_with<Error>([&] { ref::RefBackend b(c.config(), o); }, {"compute workers"}));
  o = c.options;
  o.timeout = std::chrono::milliseconds::max();
  EXPECT_TRUE(throws_with<Error>([&] { ref::RefBackend b(c.config(), o); }, {"timeout must be within"}));
}

// The oracle refuses what it cannot read in bounds (it is the reference of every check).
TEST(BadInput, OracleRefusesInputsItCannotRead) {
  RefCase c = bad_input_base();
  MoeProblem p = c.problem();
  MoeProblem bad = p;
  bad.routing[1].expert_ids[0] = c.model.num_experts;
  EXPECT_TRUE(throws_with<Error>([&] { ref::oracle_forward(bad); }, {"rank 1"}));
  bad = p;
  bad.x[1].pop_back();
  EXPECT_TRUE(throws_with<Error>([&] { ref::oracle_forward(bad); }, {"rank 1's x holds"}));
  bad = p;
  bad.routing.pop_back();
  EXPECT_TRUE(throws_with<Error>([&] { ref::oracle_forward(bad); }, {"routing for 3 ranks, tokens for 4"}));
}

}  // namespace
}  // namespace comet::test
