// The CUDA path of `comet run`: upload, MoeLayer forward, download.
#include "gpu_run.h"

#include <cuda_runtime.h>

#include "comet/layer.h"
#include "cuda/check.h"
#include "cuda/device_info.h"
#include "cuda/device_problem.h"
#include "fabric/fabric.h"

namespace comet::tools {

bool gpu_available(std::string* why) {
  const cuda::DeviceInfo info = cuda::query_device_info();
  if (info.device_count > 0) return true;
  // Without an NVIDIA driver the runtime reports an "insufficient" driver; the runtime's words are
  // kept, marked as its own.
  if (why) *why = info.error.empty() ? "no CUDA device is visible" : "no CUDA device is visible (the CUDA runtime: " + info.error + ")";
  return false;
}

GpuRun run_on_gpu(const LayerConfig& config, const MoeProblem& p, const GpuRunOptions& options) {
  const Status ok = MoeLayer::can_implement(config);
  COMET_CHECK(ok.ok, "the CUDA backend cannot run this workload: " << ok.reason);
  const int W = config.layout.world;
  GpuRun out;
  out.device = cuda::query_device_info().name;
  auto fabric = fabric::make_fabric(options.fabric, W);
  out.fabric = options.fabric;
  out.first_rank = fabric->first_local_rank();
  out.devices = fabric->num_local_ranks() < W ? 1 : fabric->gpus();  // this process's GPUs
  MoeLayer layer(config, *fabric);
  out.tiles = layer.config().tiles;
  layer.set_weights(p.weights);
  LayerOptions lo;
  lo.path = options.fused || options.trace ? ForwardPath::kFused : ForwardPath::kUnfused;
  lo.trace = options.trace;
  lo.link = options.link;
  lo.layer0_stages = options.layer0_stages;
  lo.timeout_s = options.timeout_s;
  layer.set_options(lo);
  const cuda::DeviceProblem tensors(config, p, fabric.get());
  cudaEvent_t start, stop;
  COMET_CUDA_CHECK(cudaEventCreate(&start));
  COMET_CUDA_CHECK(cudaEventCreate(&stop));
  COMET_CUDA_CHECK(cudaEventRecord(start, nullptr));
  layer.forward(tensors.tensors(), nullptr);
  COMET_CUDA_CHECK(cudaEventRecord(stop, nullptr));
  layer.check(nullptr);
  float ms = 0;
  COMET_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  out.forward_us = ms * 1e3;
  out.y = tensors.download_y();
  if (options.trace) out.trace = layer.read_trace(nullptr);
  return out;
}

}  // namespace comet::tools
