// cuda/tensor_checks.h: the host-side checks of the tensors a layer's forward() is given, shared
// by MoeLayer and BaselineMoe. A null, misplaced or misaligned tensor fails here, by name and
// rank, instead of faulting on the device (a fault leaves the CUDA context unusable).
#pragma once

#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "comet/layer.h"
#include "fabric/fabric.h"

namespace comet::cuda {

// Why `p` cannot be a tensor of a rank on `device` (empty when it can): device memory of that
// GPU or managed memory are fine; host memory and another GPU's memory are not.
std::string misplaced_tensor(const void* p, int device);

// Checks the RankTensors of a process's local ranks. Pointers equal to the last call's were
// checked then (a graph replay or a training loop passes the same ones every step), so the
// steady state costs a comparison. Where a tensor lives is not asked while `stream` is being
// captured into a CUDA graph (a capture should enqueue nothing else), and is otherwise asked
// with this thread's capture mode relaxed, so that another stream's capture in global mode does
// not refuse the query.
class RankTensorCheck {
 public:
  struct Rules {
    const char* layer;         // named in every message: "MoeLayer", "BaselineMoe"
    bool x_aligned = false;    // x must be 16-byte aligned too (y always must)
    const char* y_why;         // why y must be aligned, for the message
  };
  explicit RankTensorCheck(Rules rules) : rules_(rules) {}

  // in[i] belongs to the fabric's local rank first_local_rank() + i, on its device_of().
  // Throws comet::Error.
  void check(const std::vector<RankTensors>& in, const fabric::Fabric& fabric, cudaStream_t stream);

 private:
  Rules rules_;
  std::vector<RankTensors> checked_;  // the pointers the last located check passed
};

}  // namespace comet::cuda
