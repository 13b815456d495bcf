// cuda/tensor_checks.cpp: see tensor_checks.h.
#include "cuda/tensor_checks.h"

#include <cstdint>
#include <utility>

#include "comet/error.h"
#include "cuda/check.h"

namespace comet::cuda {

std::string misplaced_tensor(const void* p, int device) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return "is not memory CUDA knows";
  }
  switch (a.type) {
    case cudaMemoryTypeManaged: return {};
    case cudaMemoryTypeDevice:
      return a.device == device ? std::string()
                                : "is memory of GPU " + std::to_string(a.device) + ", the rank runs on GPU " +
                                      std::to_string(device);
    case cudaMemoryTypeHost: return "is host memory";
    default: return "is host memory CUDA does not know";
  }
}

namespace {

bool same_pointers(const RankTensors& a, const RankTensors& b) {
  return a.x == b.x && a.expert_ids == b.expert_ids && a.weights == b.weights && a.num_tokens == b.num_tokens &&
         a.y == b.y;
}

}  // namespace

void RankTensorCheck::check(const std::vector<RankTensors>& in, const fabric::Fabric& fabric, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  COMET_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool locate = capture == cudaStreamCaptureStatusNone;
  for (size_t i = 0; i < in.size(); ++i) {
    const RankTensors& t = in[i];
    const int r = fabric.first_local_rank() + int(i);
    if (i < checked_.size() && same_pointers(t, checked_[i])) continue;
    const std::pair<const char*, const void*> named[] = {
        {"x", t.x}, {"expert_ids", t.expert_ids}, {"weights", t.weights}, {"num_tokens", t.num_tokens}, {"y", t.y}};
    for (const auto& [name, p] : named) {
      COMET_CHECK(p != nullptr, rules_.layer << ": rank " << r << "'s " << name << " is a null pointer");
      if (!locate) continue;
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      COMET_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      const std::string why = misplaced_tensor(p, fabric.device_of(r));
      COMET_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      COMET_CHECK(why.empty(), rules_.layer << ": rank " << r << "'s " << name << " " << why
                                            << " (tensors are device memory of the rank's GPU)");
    }
    COMET_CHECK(!rules_.x_aligned || aligned(t.x, 16),
                rules_.layer << ": rank " << r << "'s x is not 16-byte aligned (rows move 16 bytes at a time)");
    COMET_CHECK(aligned(t.y, 16), rules_.layer << ": rank " << r << "'s y is not 16-byte aligned (" << rules_.y_why << ")");
    // Checked here, before anything of the call is enqueued: the publish kernel reads them as
    // 4-byte words (its own check would refuse a group after earlier groups' copies ran).
    const std::pair<const char*, const void*> words[] = {
        {"expert_ids", t.expert_ids}, {"weights", t.weights}, {"num_tokens", t.num_tokens}};
    for (const auto& [name, p] : words)
      COMET_CHECK(aligned(p, 4),
                  rules_.layer << ": rank " << r << "'s " << name << " is not 4-byte aligned (int32 / fp32 elements)");
  }
  if (locate) checked_ = in;
}

}  // namespace comet::cuda
