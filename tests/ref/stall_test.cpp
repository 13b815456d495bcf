// ref/stall_test.cpp: a rank whose comm workers never move data (fault injection) makes
// forward throw comet::TimeoutError naming the rank and the signal, within a few timeouts,
// instead of hanging (DESIGN §4: every spin-wait has a timeout).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ref/ref_cases.h"
#include "ref/symmetric_heap.h"

namespace comet::test {
namespace {

const char* stage_name(ref::StallStage s) {
  switch (s) {
    case ref::StallStage::kNone: return "none";
    case ref::StallStage::kLayer0Comm: return "layer0-comm";
    case ref::StallStage::kLayer1Comm: return "layer1-comm";
  }
  return "?";
}

struct StallCase {
  RefCase base;
  ref::StallStage stage;
  std::string describe() const { return std::string("stall_stage=") + stage_name(stage) + " " + base.describe(); }
};

void PrintTo(const StallCase& c, std::ostream* os) { *os << c.describe(); }

std::vector<StallCase> stall_cases() {
  std::vector<StallCase> out;
  uint64_t seed = 31;
  for (auto [tp, ep] : {std::pair{1, 2}, std::pair{2, 2}}) {
    for (ref::StallStage stage : {ref::StallStage::kLayer0Comm, ref::StallStage::kLayer1Comm}) {
      RefCase c;
      c.model = {"stall", 32, 32, 4, 2, Activation::kSwiGlu};
      c.tp = tp;
      c.ep = ep;
      c.world = tp * ep;
      c.t_max = 16;
      c.tokens.assign(c.world, 16);  // every rank sends to and receives from every other
      c.tiles = {8, 16, 16};
      c.options.timeout = std::chrono::milliseconds(200);
      c.options.stall_rank = 1;
      c.options.stall_stage = stage;
      c.seed = seed++;
      c.label = std::string(stage_name(stage)) + "_tp" + std::to_string(tp) + "_ep" + std::to_string(ep);
      out.push_back({c, stage});
    }
  }
  return out;
}

// What a stall of rank 1 at `stage` can leave waiting, as the waits describe it. Layer0: rank 1's
// own GEMM0 (its comm workers pull its tile inputs and never do), or, where that wait started
// later, another rank's combine waiting for rank 1's partial rows, which never come either.
// Layer1: only the combines wait, for rank 1's partial rows.
bool names_the_stalled_signal(ref::StallStage stage, const std::string& m) {
  const bool partials = m.find("combine_arr[1] (partial rows from rank 1") != std::string::npos;
  if (stage == ref::StallStage::kLayer1Comm) return partials;
  return partials || (m.find("rank 1 layer0 compute worker") != std::string::npos &&
                      m.find("waiting for tile_arrivals[") != std::string::npos);
}

class StallTest : public ::testing::TestWithParam<StallCase> {};

TEST_P(StallTest, TimesOutNamingRankAndSignalThenRecovers) {
  const StallCase& sc = GetParam();
  const RefCase& c = sc.base;
  SCOPED_TRACE(sc.describe());
  const MoeProblem p = c.problem();
  const auto want = ref::oracle_forward(p);
  ref::RefBackend backend(c.config(), c.options);
  backend.set_weights(p.weights);

  // A correct call first, so the stall hits advanced epoch counters.
  {
    ref::RefOptions healthy = c.options;
    healthy.stall_rank = -1;
    healthy.stall_stage = ref::StallStage::kNone;
    healthy.timeout = std::chrono::milliseconds(20000);
    backend.set_options(healthy);
    EXPECT_TRUE(matches_oracle(backend.forward(p.x, p.routing), want, c.dtype, c.model.hidden));
    backend.set_options(c.options);
  }
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    backend.forward(p.x, p.routing);
    ADD_FAILURE() << "rank 1 never moved data, yet forward returned";
  } catch (const TimeoutError& e) {
    message = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected comet::TimeoutError, got: " << e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // 200 ms per wait; a stuck rank must not cost one timeout per waiter in sequence.
  // (10 s leaves room for ThreadSanitizer on a loaded 2-core machine.)
  EXPECT_LT(seconds, 10.0) << "the stalled forward took " << seconds << " s";
  EXPECT_TRUE(contains(message, "rank 1")) << message;
  EXPECT_TRUE(names_the_stalled_signal(sc.stage, message)) << "not the stalled signal: " << message;

  // The same object recovers: signals were reset after the failure, so with the stall
  // cleared the next calls are correct (twice, so epochs advance from the reset state).
  ref::RefOptions cleared = c.options;
  cleared.stall_rank = -1;
  cleared.stall_stage = ref::StallStage::kNone;
  cleared.timeout = std::chrono::milliseconds(20000);
  backend.set_options(cleared);
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE("call after the stall " + std::to_string(call));
    std::vector<std::vector<float>> got;
    ASSERT_NO_THROW(got = backend.forward(p.x, p.routing));
    EXPECT_TRUE(matches_oracle(got, want, c.dtype, c.model.hidden));
  }

  // Nothing global was left broken: a backend without the stall works.
  RefCase healthy = c;
  healthy.options.stall_rank = -1;
  healthy.options.stall_stage = ref::StallStage::kNone;
  healthy.options.timeout = std::chrono::milliseconds(20000);
  ref::RefBackend fresh(healthy.config(), healthy.options);
  fresh.set_weights(p.weights);
  EXPECT_TRUE(matches_oracle(fresh.forward(p.x, p.routing), want, c.dtype, c.model.hidden));
}

INSTANTIATE_TEST_SUITE_P(Cases, StallTest, ::testing::ValuesIn(stall_cases()),
                         [](const ::testing::TestParamInfo<StallCase>& info) {
                           return std::to_string(info.index) + "_" + param_name(info.param.base.label);
                         });

// The timeout counts time without progress: a producer that adds 1 every 10 ms for 400 ms keeps
// a wait with a 100 ms timeout alive to the end, and one that stops makes it fail about 100 ms
// after its last step, naming the signal and the value it stopped at.
TEST(Stall, TimeoutCountsTimeWithoutProgress) {
  std::atomic<bool> abort{false};
  const ref::WaitPolicy policy{std::chrono::milliseconds(100), &abort};
  for (const int stop_at : {40, 5}) {
    SCOPED_TRACE("producer stops at " + std::to_string(stop_at));
    uint64_t flag = 0;
    std::thread producer([&] {
      for (int i = 0; i < stop_at; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        ref::signal_add(&flag, 1);
      }
    });
    const auto start = std::chrono::steady_clock::now();
    if (stop_at == 40) {
      EXPECT_NO_THROW(ref::wait_at_least(&flag, 40, policy, "the test", [] { return std::string("flag"); }));
      EXPECT_GT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));  // longer than the timeout
    } else {
      EXPECT_TRUE(throws_with<TimeoutError>(
          [&] { ref::wait_at_least(&flag, 40, policy, "the test", [] { return std::string("flag"); }); },
          {"the test: timed out after 100 ms without progress waiting for flag >= 40, observed 5"}));
    }
    producer.join();
  }
}

TEST(Stall, StallRankWithoutStageRunsNormally) {
  RefCase c = stall_cases()[0].base;
  c.options.stall_stage = ref::StallStage::kNone;
  c.options.timeout = std::chrono::milliseconds(20000);
  SCOPED_TRACE(c.describe());
  const MoeProblem p = c.problem();
  ref::RefBackend backend(c.config(), c.options);
  backend.set_weights(p.weights);
  EXPECT_TRUE(matches_oracle(backend.forward(p.x, p.routing), ref::oracle_forward(p), c.dtype, c.model.hidden));
}

}  // namespace
}  // namespace comet::test
