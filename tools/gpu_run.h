// tools/gpu_run.h: `comet run --backend cuda`: the problem through MoeLayer on a fabric: W
// virtual ranks on one GPU (loopback), the ranks over the visible GPUs in this process (local), or this
// process's rank of a `comet launch` run (nccl). Only compiled into builds with CUDA.
#pragma once

#include <string>
#include <vector>

#include "comet/config.h"
#include "comet/link_emulation.h"
#include "comet/problem.h"
#include "comet/trace.h"

namespace comet::tools {

struct GpuRunOptions {
  std::string fabric = "loopback";  // loopback, local or nccl
  bool fused = false;
  bool trace = false;  // the fused kernels with LayerOptions::trace; GpuRun::trace holds the timeline
  LinkEmulation link;  // paces the inter-rank copies (comet/link_emulation.h; off by default)
  int layer0_stages = 0;  // LayerOptions::layer0_stages (fused; 0 chooses)
  double timeout_s = 5.0;  // LayerOptions::timeout_s (--timeout-ms)
};

struct GpuRun {
  std::vector<std::vector<float>> y;  // [ranks this process drove][T_r * H]
  int first_rank = 0;                 // y[i] is rank first_rank + i
  std::string fabric;                 // "loopback", "local" or "nccl"
  int devices = 1;                    // GPUs this process used
  double forward_us = 0;              // first call, CUDA events (includes the device plan)
  std::string device;
  TileConfig tiles;                   // the tile shapes MoeLayer ran (its own, not the config's)
  Trace trace;                        // with trace: the fused kernels' timeline
};

// True when a GPU is visible; otherwise `why` says what the runtime reported.
bool gpu_available(std::string* why);
// Throws comet::Error (MoeLayer::can_implement's reason, a device error, or an unknown fabric
// or a launch that does not match the layout: fabric::make_fabric) on failure.
GpuRun run_on_gpu(const LayerConfig& config, const MoeProblem& problem, const GpuRunOptions& options);

}  // namespace comet::tools
