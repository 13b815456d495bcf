// tests/gpu/layer_checks.h: checks shared by the MoeLayer suites of every fabric (Loopback,
// Local, Nccl).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "comet/error.h"
#include "comet/layer.h"
#include "comet/problem.h"
#include "cuda/device_problem.h"
#include "ref/oracle.h"

namespace comet::testing {

// The forwards a multi-GPU test compares with Loopback: the unfused pipeline, the fused kernels
// with the default layer0 mode (communication blocks, ring order) and with copies by the GEMM
// blocks in row order (bulk copies reading the peers' rows), fused without the epilogue combine
// (every token through the combine's stores into the peers' slots), and layer1's combine in the
// GEMM blocks (Layer1Combine::kGemmBlocks: 128-column layer1, fused without the epilogue combine
// so that every token goes through those blocks' stores, and unfused).
inline std::vector<std::pair<std::string, LayerOptions>> forward_variants() {
  LayerOptions unfused, fused, gemm_rows, combine_only;
  unfused.path = ForwardPath::kUnfused;
  fused.path = ForwardPath::kFused;
  fused.layer0_copies = Layer0Copies::kCommBlocks;
  fused.dispatch_order = DispatchOrder::kRing;
  fused.layer1_combine = Layer1Combine::kCommBlocks;
  gemm_rows.path = ForwardPath::kFused;
  gemm_rows.layer0_copies = Layer0Copies::kGemmBlocks;
  gemm_rows.dispatch_order = DispatchOrder::kRows;
  combine_only = fused;
  combine_only.epilogue_combine = false;
  LayerOptions gemm_combine = combine_only, unfused_gemm_combine = unfused;
  gemm_combine.layer1_combine = Layer1Combine::kGemmBlocks;
  unfused_gemm_combine.layer1_combine = Layer1Combine::kGemmBlocks;
  return {{"unfused", unfused},
          {"fused blocks/ring", fused},
          {"fused gemm/rows", gemm_rows},
          {"fused, no epilogue combine", combine_only},
          {"fused, layer1 combine in the GEMM blocks, no epilogue combine", gemm_combine},
          {"unfused, 128-column layer1 (combine1 gemm)", unfused_gemm_combine}};
}

// `got` (one entry per rank, [T_r][hidden]) within the bf16 tolerance of `want` (the fp64
// oracle's rows), as a whole and row by row.
inline ::testing::AssertionResult near_oracle(const std::vector<std::vector<float>>& got,
                                              const std::vector<std::vector<double>>& want, int hidden) {
  const ref::Comparison cmp = ref::compare_outputs(got, want, hidden);
  if (cmp.within(ref::tolerance_for(DType::kBF16))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << cmp.describe();
}

// With `options` (fused) and rank `stall_rank`'s communication blocks idle, the forward times
// out: check() throws TimeoutError naming the rank, layer0 and the signal. The same options
// without the stall then give the oracle's output: the layer stays usable. `d` holds the inputs
// of `p` (every local rank). The forwards and checks run on `stream` (a stream of the current
// device; null: its legacy stream).
inline void expect_withheld_rank_times_out_then_recovers(MoeLayer& layer, cuda::DeviceProblem& d,
                                                         const MoeProblem& p, LayerOptions options,
                                                         int stall_rank, cudaStream_t stream = nullptr) {
  options.timeout_s = 0.2;
  options.stall_rank = stall_rank;  // its rows never move: its GEMM waits for tile signals
  layer.set_options(options);
  layer.forward(d.tensors(), stream);
  try {
    layer.check(stream);
    ADD_FAILURE() << "a withheld rank did not time out";
  } catch (const TimeoutError& e) {  // a stuck signal, not bad input
    const std::string m = e.what();
    EXPECT_NE(m.find("rank " + std::to_string(stall_rank)), std::string::npos) << m;
    EXPECT_NE(m.find("layer0"), std::string::npos) << m;
    // The withheld rank's GEMM0 is what waits: its tile inputs never arrive.
    EXPECT_NE(m.find("timed out waiting for GEMM tile input"), std::string::npos) << m;
    EXPECT_NE(m.find("signal"), std::string::npos) << m;
  }
  options.stall_rank = -1;
  options.timeout_s = 5.0;
  layer.set_options(options);
  layer.forward(d.tensors(), stream);
  layer.check(stream);
  EXPECT_TRUE(near_oracle(d.download_y(), ref::oracle_forward(p), p.config.model.hidden));
}

// A fused forward that throws part way through its enqueue (LayerOptions::fail_before_launch:
// for each launch index in `fail_at`, the earlier kernels already enqueued) leaves the layer
// usable: the next forward without the fault gives `want` (the fused output of `options`) bit
// for bit, and check() finds nothing. `d` holds the inputs; on `stream`, as above.
inline void expect_failed_enqueue_recovers(MoeLayer& layer, cuda::DeviceProblem& d, LayerOptions options,
                                           const std::vector<int>& fail_at,
                                           const std::vector<std::vector<float>>& want,
                                           cudaStream_t stream = nullptr) {
  for (int at : fail_at) {
    SCOPED_TRACE("fail before launch " + std::to_string(at));
    options.fail_before_launch = at;
    layer.set_options(options);
    try {
      layer.forward(d.tensors(), stream);
      ADD_FAILURE() << "the injected launch failure did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fault injection"), std::string::npos) << e.what();
    }
    options.fail_before_launch = -1;
    layer.set_options(options);
    d.poison_y();
    layer.forward(d.tensors(), stream);
    layer.check(stream);
    EXPECT_EQ(d.download_y(), want);
  }
}

}  // namespace comet::testing
