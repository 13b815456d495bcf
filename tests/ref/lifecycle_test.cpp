// ref/lifecycle_test.cpp: how a RefBackend object is used over time and next to others:
// replacing weights, masked slots whose weights are garbage, and independent backends running
// forward at the same time on different threads (ThreadSanitizer sees any shared state).
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <limits>
#include <thread>
#include <vector>

#include "ref/ref_cases.h"

namespace comet::test {
namespace {

RefCase lifecycle_case() {
  RefCase c;
  c.label = "lifecycle";
  c.model = {"life", 32, 48, 8, 2, Activation::kSwiGlu};
  c.world = 4, c.tp = 2, c.ep = 2;
  c.t_max = 24;
  c.tokens = {24, 7, 0, 19};
  c.spec = {RoutingKind::kUniform, 0, 0.25};
  c.dtype = DType::kBF16;
  c.tiles = {8, 16, 16};
  c.seed = 51;
  return c;
}

TEST(Lifecycle, SetWeightsAgainReplacesTheWeights) {
  RefCase c = lifecycle_case();
  SCOPED_TRACE(c.describe());
  const MoeProblem first = c.problem();
  c.seed += 1;
  const MoeProblem second = c.problem();
  ref::RefBackend backend(c.config(), c.options);
  backend.set_weights(first.weights);
  EXPECT_TRUE(matches_oracle(backend.forward(first.x, first.routing), ref::oracle_forward(first), c.dtype,
                             c.model.hidden));
  backend.set_weights(second.weights);
  EXPECT_TRUE(matches_oracle(backend.forward(second.x, second.routing), ref::oracle_forward(second),
                             c.dtype, c.model.hidden));
}

// routing.h: "An id of -1 masks the slot (its weight is ignored)": NaN, Inf or huge weights
// in masked slots must not reach the output.
TEST(Lifecycle, MaskedSlotWeightsAreIgnored) {
  const RefCase c = lifecycle_case();
  SCOPED_TRACE(c.describe());
  MoeProblem p = c.problem();
  const float garbage[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -1e30f, 7.0f};
  int masked = 0;
  for (Routing& rt : p.routing) {
    for (size_t i = 0; i < rt.expert_ids.size(); ++i) {
      if (rt.expert_ids[i] < 0) rt.weights[i] = garbage[masked++ % 4];
    }
  }
  ASSERT_GT(masked, 4) << "the case should have masked slots";
  const auto want = ref::oracle_forward(p);
  for (const auto& y : want) {
    for (double v : y) ASSERT_TRUE(std::isfinite(v)) << "the oracle used a masked slot's weight";
  }
  ref::RefBackend backend(c.config(), c.options);
  backend.set_weights(p.weights);
  std::vector<std::vector<float>> got;
  ASSERT_NO_THROW(got = backend.forward(p.x, p.routing));
  EXPECT_TRUE(matches_oracle(got, want, c.dtype, c.model.hidden));
}

// "One forward() at a time per backend object": different objects may run at once.
TEST(Lifecycle, IndependentBackendsRunConcurrently) {
  RefCase a = lifecycle_case();
  RefCase b = lifecycle_case();
  b.world = 2, b.tp = 1, b.ep = 2;
  b.tokens = {5, 24};
  b.dtype = DType::kF32;
  b.seed = 52;
  SCOPED_TRACE(a.describe() + " || " + b.describe());
  const MoeProblem pa = a.problem(), pb = b.problem();
  ref::RefBackend ba(a.config(), a.options), bb(b.config(), b.options);
  ba.set_weights(pa.weights);
  bb.set_weights(pb.weights);
  std::vector<std::vector<float>> ya[3], yb[3];
  std::exception_ptr ea, eb;
  std::thread ta([&] {
    try {
      for (auto& y : ya) y = ba.forward(pa.x, pa.routing);
    } catch (...) {
      ea = std::current_exception();
    }
  });
  std::thread tb([&] {
    try {
      for (auto& y : yb) y = bb.forward(pb.x, pb.routing);
    } catch (...) {
      eb = std::current_exception();
    }
  });
  ta.join();
  tb.join();
  ASSERT_NO_THROW(if (ea) std::rethrow_exception(ea));
  ASSERT_NO_THROW(if (eb) std::rethrow_exception(eb));
  const auto wa = ref::oracle_forward(pa), wb = ref::oracle_forward(pb);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(matches_oracle(ya[i], wa, a.dtype, a.model.hidden)) << "call " << i;
    EXPECT_TRUE(matches_oracle(yb[i], wb, b.dtype, b.model.hidden)) << "call " << i;
    EXPECT_TRUE(bitwise_equal(ya[i], ya[0]));
    EXPECT_TRUE(bitwise_equal(yb[i], yb[0]));
  }
}

}  // namespace
}  // namespace comet::test
