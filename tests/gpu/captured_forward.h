// tests/gpu/captured_forward.h: a MoeLayer forward captured once in a CUDA graph, replayed on
// demand (the graph-replay tests of every fabric). The inputs are read from the captured device
// buffers at each replay: rewrite them in place (DeviceProblem::assign_inputs) between replays.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "comet/layer.h"
#include "cuda/check.h"

namespace comet::testing {

class CapturedForward {
 public:
  // One forward outside the capture first (one-time launch attributes), then the capture.
  CapturedForward(MoeLayer& layer, const std::vector<RankTensors>& tensors) : layer_(layer) {
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    layer_.forward(tensors, stream_);
    layer_.check(stream_);
    COMET_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    layer_.forward(tensors, stream_);
    COMET_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
    COMET_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CapturedForward() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    cudaStreamDestroy(stream_);
  }
  CapturedForward(const CapturedForward&) = delete;
  CapturedForward& operator=(const CapturedForward&) = delete;

  // Launches the graph and waits; throws what MoeLayer::check throws.
  void replay() {
    COMET_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    layer_.check(stream_);
  }

 private:
  MoeLayer& layer_;
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace comet::testing
