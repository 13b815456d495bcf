// multi_gpu/nccl_run.h: a multi_gpu test run (multi_gpu/process_run.h) with one Nccl fabric the
// tests share, made before the first test and destroyed after the last, collectively, on every
// rank. A binary includes this header once; its tests start with COMET_REQUIRE_RUN().
//   comet launch -n 2 build/tests/multi_gpu/<binary>
#pragma once

#include <memory>
#include <string>

#include "fabric/fabric.h"
#include "multi_gpu/process_run.h"

namespace comet::testing {

class Run : public ProcessRun {
 public:
  void SetUp() override {
    ProcessRun::SetUp();
    if (!ready()) return;
    try {
      fabric_ = ::comet::fabric::make_nccl_fabric(env());
    } catch (const Error& e) {
      setup_error_ = std::string("making the fabric failed: ") + e.what();
    }
  }
  void TearDown() override { fabric_.reset(); }
  ::comet::fabric::Fabric& fabric() const { return *fabric_; }

  inline static Run* instance = nullptr;

 private:
  std::unique_ptr<::comet::fabric::Fabric> fabric_;
};

// Registered once per binary, before main() runs the tests.
inline const bool kRunRegistered =
    (Run::instance = static_cast<Run*>(::testing::AddGlobalTestEnvironment(new Run)), true);

#define COMET_REQUIRE_RUN() COMET_REQUIRE_PROCESS_RUN(*::comet::testing::Run::instance)

inline std::string who() { return Run::instance->who(); }

}  // namespace comet::testing
