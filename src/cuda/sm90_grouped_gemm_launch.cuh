// cuda/sm90_grouped_gemm_launch.cuh: the launcher shared by the per-configuration translation
// units (each .cu instantiates exactly one kernel configuration).
#pragma once

#include <array>
#include <atomic>

#include "cuda/check.h"
#include "cuda/sm90_grouped_gemm.cuh"

namespace comet::cuda::sm90 {

// Launch attributes are per device: the launchers remember per device ordinal what they set.
inline constexpr int kMaxDevices = 64;

template <class Kernel>
void launch_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream) {
  const Status ok = can_implement(args);
  COMET_CHECK(ok.ok, "grouped GEMM cannot run: " << ok.reason);
  int device = 0, num_sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int blocks = args.num_blocks > 0 ? args.num_blocks : num_sms;
  static std::array<std::atomic<bool>, kMaxDevices> attribute_set{};  // per configuration and device
  COMET_CHECK(device < kMaxDevices, "grouped GEMM: device " << device << " beyond " << kMaxDevices);
  if (!attribute_set[device].load(std::memory_order_relaxed)) {
    COMET_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          Kernel::kSmemBytes));
    attribute_set[device].store(true, std::memory_order_relaxed);
  }
  const typename Kernel::Params params = Kernel::make_params(args, blocks);
  grouped_gemm_kernel<Kernel><<<blocks, Kernel::kThreads, Kernel::kSmemBytes, stream>>>(params);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::cuda::sm90
