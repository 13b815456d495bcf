// tools/gpu_run.h: `comet run --backend cuda`: the problem through MoeLayer on one GPU (W
// virtual ranks on the Loopback fabric). Only compiled into builds with CUDA.
#pragma once

#include <string>
#include <vector>

#include "comet/config.h"
#include "comet/link_emulation.h"
#include "comet/problem.h"

namespace comet::tools {

struct GpuRun {
  std::vector<std::vector<float>> y;  // [W][T_r * H]
  double forward_us = 0;              // first call, CUDA events (includes the device plan)
  std::string device;
};

// True when a GPU is visible; otherwise `why` says what the runtime reported.
bool gpu_available(std::string* why);
// Throws comet::Error (MoeLayer::can_implement's reason, or a device error) on failure.
// `link` paces the inter-rank copies (comet/link_emulation.h; off by default).
GpuRun run_on_gpu(const LayerConfig& config, const MoeProblem& problem, const LinkEmulation& link = {});

}  // namespace comet::tools
