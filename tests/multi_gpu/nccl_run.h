// multi_gpu/nccl_run.h: the run a multi_gpu test binary is one rank of (label `multi_gpu`).
// Started by `comet launch -n N` or tests/multi_gpu/run_ranks.sh, which set RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE and COMET_BOOTSTRAP_FILE. Without those variables, or with
// fewer GPUs than ranks, every test skips with a message containing "multi_gpu test skipped"
// (ctest reports the test as skipped).
//
// Every rank runs the same tests in the same order, so collective calls match up. Checks use
// EXPECT (not ASSERT) wherever a collective call follows, so that a failed check on one rank
// does not leave the others waiting.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "core/process_env.h"
#include "fabric/fabric.h"
#include "gpu/gpu_test_util.h"

namespace comet::testing {

// The run: this process's place in it and the fabric the tests share. The fabric is made
// before the first test and destroyed after the last, collectively, on every rank.
class Run : public ::testing::Environment {
 public:
  void SetUp() override {
    try {
      env_ = read_process_env();
    } catch (const Error& e) {
      setup_error_ = e.what();
      return;
    }
    if (!env_) {
      skip_ = "RANK/WORLD_SIZE are not set: run under `comet launch -n N` or tests/multi_gpu/run_ranks.sh "
              "(multi_gpu test skipped)";
      return;
    }
    const int gpus = comet::testing::have_gpu() ? device_count() : 0;
    if (gpus < env_->local_world) {
      std::ostringstream os;
      os << env_->local_world << " ranks need as many GPUs, " << gpus << " visible (multi_gpu test skipped)";
      skip_ = os.str();
      return;
    }
    try {
      fabric_ = ::comet::fabric::make_nccl_fabric(*env_);
    } catch (const Error& e) {
      setup_error_ = e.what();
    }
  }
  void TearDown() override { fabric_.reset(); }

  inline static Run* instance = nullptr;
  const std::string& skip() const { return skip_; }
  const std::string& setup_error() const { return setup_error_; }
  const ProcessEnv& env() const { return *env_; }
  ::comet::fabric::Fabric& fabric() const { return *fabric_; }

 private:
  static int device_count() {
    int n = 0;
    COMET_CUDA_CHECK(cudaGetDeviceCount(&n));
    return n;
  }
  std::optional<ProcessEnv> env_;
  std::unique_ptr<::comet::fabric::Fabric> fabric_;
  std::string skip_, setup_error_;
};

// Registered once per binary, before main() runs the tests.
inline const bool kRunRegistered = (Run::instance = static_cast<Run*>(::testing::AddGlobalTestEnvironment(new Run)), true);

#define COMET_REQUIRE_RUN()                                                                         \
  do {                                                                                              \
    if (!::comet::testing::Run::instance->skip().empty()) GTEST_SKIP() << ::comet::testing::Run::instance->skip();\
    ASSERT_TRUE(::comet::testing::Run::instance->setup_error().empty()) << "making the fabric failed: "               \
                                                      << ::comet::testing::Run::instance->setup_error();            \
  } while (0)

inline std::string who() {
  std::ostringstream os;
  os << "rank " << Run::instance->env().rank << " of " << Run::instance->env().world;
  return os.str();
}

}  // namespace comet::testing
