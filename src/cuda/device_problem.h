// cuda/device_problem.h: a MoeProblem's per-rank tensors on the GPU, in the layout MoeLayer
// takes (comet/layer.h): x and y bf16 [T_max][H], routing [T_max][topk] (ids -1 and weights 0
// past the rank's tokens), the token count as one device int. Used by `comet run --backend cuda`
// and the GPU tests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comet/layer.h"
#include "comet/problem.h"

namespace comet::fabric {
class Fabric;
}

namespace comet::cuda {

class DeviceProblem {
 public:
  // Uploads every rank's inputs to the current device; y is filled with 0xffff (bf16 NaN), so
  // a row the layer does not write cannot pass a check. With a fabric: only the ranks this
  // process drives, each on its device (fabric.device_of); entry i of tensors() and
  // download_y() is then rank fabric->first_local_rank() + i.
  DeviceProblem(const LayerConfig& config, const MoeProblem& problem, const fabric::Fabric* fabric = nullptr);
  ~DeviceProblem();
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;

  const std::vector<RankTensors>& tensors() const { return tensors_; }
  // y of every rank, its first min(num_tokens, T_max) rows, as float.
  std::vector<std::vector<float>> download_y() const;
  void poison_y();
  // Overwrites entry `rank`'s device token count (tests of bad input and of changing counts); later
  // download_y() and poison_y() use it too.
  void set_token_count(int rank, int32_t count);
  // Overwrites every entry's inputs (x, routing, token count) with `other`'s, in place: the
  // device buffers stay where they are, so a captured CUDA graph reads the new inputs.
  void assign_inputs(const DeviceProblem& other);

 private:
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
  std::vector<RankTensors> tensors_;
  std::vector<int> tokens_;
  std::vector<int> devices_;  // of each entry
  int hidden_ = 0;
  int topk_ = 0;
  int t_max_ = 0;
  size_t rows(size_t rank) const;  // min(tokens_[rank], t_max_), at least 0
};

}  // namespace comet::cuda
