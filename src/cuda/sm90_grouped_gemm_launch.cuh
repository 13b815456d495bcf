// cuda/sm90_grouped_gemm_launch.cuh: the launcher shared by the per-configuration translation
// units (each .cu instantiates exactly one kernel configuration).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>

#include "cuda/check.h"
#include "cuda/dependent_launch.h"
#include "cuda/sm90_grouped_gemm.cuh"

namespace comet::cuda::sm90 {

// Launch attributes are per device: the launchers remember per device ordinal what they set.
inline constexpr int kMaxDevices = 64;

// The attributes of a Kernel launch: clusters of Kernel::kClusterM blocks when that is above 1.
template <class Kernel>
LaunchAttributes kernel_attributes(bool dependent) {
  LaunchAttributes attributes(dependent);
  if constexpr (Kernel::kClusterM > 1) attributes.cluster(Kernel::kClusterM);
  return attributes;
}

// Blocks of a launch: args.num_blocks, or one per SM; with clusters, as many whole clusters as
// can be resident at once (a persistent grid must never wait for a second wave), which can be
// fewer than SMs / cluster size when a GPC's free SMs do not pair up.
template <class Kernel, bool kSplitTiles>
int grouped_gemm_blocks(const GroupedGemmArgs& args, int device, int num_sms) {
  if (args.num_blocks > 0) return args.num_blocks;
  if constexpr (Kernel::kClusterM == 1) {
    return num_sms;
  } else {
    static std::array<std::atomic<int>, kMaxDevices> resident{};  // clusters, per device
    int clusters = resident[device].load(std::memory_order_relaxed);
    if (clusters == 0) {
      // Residency does not depend on how the launch is ordered.
      LaunchAttributes attributes = kernel_attributes<Kernel>(false);
      const cudaLaunchConfig_t config = launch_config(dim3(num_sms / Kernel::kClusterM * Kernel::kClusterM),
                                                      dim3(Kernel::kThreads), Kernel::kSmemBytes, nullptr, attributes);
      COMET_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, grouped_gemm_kernel<Kernel, kSplitTiles>, &config));
      COMET_CHECK(clusters > 0, "grouped GEMM: no cluster of " << Kernel::kClusterM << " blocks fits on device " << device);
      resident[device].store(clusters, std::memory_order_relaxed);
    }
    return std::min(clusters, num_sms / Kernel::kClusterM) * Kernel::kClusterM;
  }
}

// kSplitTiles: the instantiation for split schedules (args.split.blocks > 0); the plain one
// refuses them, the split one is built for the configurations without clusters only.
template <class Kernel, bool kSplitTiles = false>
void launch_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream) {
  static_assert(!kSplitTiles || Kernel::kClusterM == 1, "clusters cannot split tiles");
  static_assert(Kernel::kTileK == kGemmTileK, "split schedules (gemm_split_for) count k-tiles of kGemmTileK");
  const Status ok = can_implement(args);
  COMET_CHECK(ok.ok, "grouped GEMM cannot run: " << ok.reason);
  int device = 0, num_sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  static std::array<std::atomic<bool>, kMaxDevices> attribute_set{};  // per configuration and device
  COMET_CHECK(device < kMaxDevices, "grouped GEMM: device " << device << " beyond " << kMaxDevices);
  if (!attribute_set[device].load(std::memory_order_relaxed)) {
    COMET_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<Kernel, kSplitTiles>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          Kernel::kSmemBytes));
    attribute_set[device].store(true, std::memory_order_relaxed);
  }
  COMET_CHECK((args.split.blocks > 0) == kSplitTiles, "grouped GEMM: a " << (kSplitTiles ? "split" : "plain")
                                                         << " launcher given " << (kSplitTiles ? "no " : "") << "split schedule");
  const int blocks = grouped_gemm_blocks<Kernel, kSplitTiles>(args, device, num_sms);
  COMET_CHECK(args.split.blocks == 0 || args.split.blocks == blocks,
              "grouped GEMM: the split schedule was built for " << args.split.blocks << " blocks; this launch runs " << blocks);
  // A split grid's blocks wait on each other: all of them must be resident at once (one block
  // per SM fits; Kernel::kSmemBytes leaves no room for a second). The launch is cooperative (as
  // the fused kernels' are): the runtime guarantees that all its blocks are resident together,
  // or refuses it, so no finishing piece waits on a partial whose block never started.
  COMET_CHECK(!kSplitTiles || blocks <= num_sms,
              "grouped GEMM: a split schedule for " << blocks << " blocks cannot run on " << num_sms << " SMs at once");
  const typename Kernel::Params params = Kernel::make_params(args, blocks);
  LaunchAttributes attributes = kernel_attributes<Kernel>(!kSplitTiles);  // a split grid is cooperative
  if constexpr (kSplitTiles) attributes.cooperative();
  launch_kernel(grouped_gemm_kernel<Kernel, kSplitTiles>, dim3(blocks), dim3(Kernel::kThreads), Kernel::kSmemBytes,
                stream, attributes, params);
}

}  // namespace comet::cuda::sm90
