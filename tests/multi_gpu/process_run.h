// tests/multi_gpu/process_run.h: this process's place in a multi_gpu test run (label `multi_gpu`),
// as a gtest environment shared by the multi_gpu test binaries.
//
// SetUp() reads the variables of `comet launch` (core/process_env.h). Without RANK/WORLD_SIZE,
// or with fewer GPUs than ranks on this node, skip() says why and every test skips with a
// message containing "multi_gpu test skipped" (ctest then reports the test as skipped, see
// CMakeLists.txt); a malformed variable is a setup_error() every test fails with. Subclasses
// extend SetUp() (making a fabric) and record their own failures in setup_error_.
//   class Run : public comet::testing::ProcessRun { ... };
//   Run* Run::instance = static_cast<Run*>(::testing::AddGlobalTestEnvironment(new Run));
//   TEST(...) { COMET_REQUIRE_PROCESS_RUN(*Run::instance); ... }
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <sstream>
#include <string>

#include "core/process_env.h"
#include "gpu/gpu_test_util.h"

namespace comet::testing {

class ProcessRun : public ::testing::Environment {
 public:
  void SetUp() override {
    try {
      env_ = read_process_env();
    } catch (const Error& e) {
      setup_error_ = std::string("reading the environment failed: ") + e.what();
      return;
    }
    if (!env_) {
      skip_ = "RANK/WORLD_SIZE are not set: run under `comet launch -n N` or tests/multi_gpu/run_ranks.sh "
              "(multi_gpu test skipped)";
      return;
    }
    int gpus = 0;
    if (have_gpu()) COMET_CUDA_CHECK(cudaGetDeviceCount(&gpus));
    if (gpus < env_->local_world) {
      std::ostringstream os;
      os << env_->local_world << " ranks need as many GPUs, " << gpus << " visible (multi_gpu test skipped)";
      skip_ = os.str();
    }
  }

  // True when the tests can run: launched, enough GPUs, no setup error so far.
  bool ready() const { return skip_.empty() && setup_error_.empty(); }
  const std::string& skip() const { return skip_; }
  const std::string& setup_error() const { return setup_error_; }
  const ProcessEnv& env() const { return *env_; }
  // "rank r of W", for SCOPED_TRACE.
  std::string who() const {
    std::ostringstream os;
    os << "rank " << env_->rank << " of " << env_->world;
    return os.str();
  }

 protected:
  std::string setup_error_;

 private:
  std::optional<ProcessEnv> env_;
  std::string skip_;
};

#define COMET_REQUIRE_PROCESS_RUN(run)                                                 \
  do {                                                                                 \
    if (!(run).skip().empty()) GTEST_SKIP() << (run).skip();                           \
    ASSERT_TRUE((run).setup_error().empty()) << (run).setup_error();                   \
  } while (0)

}  // namespace comet::testing
