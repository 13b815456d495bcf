// cuda/rank_weights.h: one rank's share of the expert weights (DESIGN §2: the experts of its EP
// index, the F/TP slice of its TP index) in the K-major layouts the GPU GEMMs read
// (cuda/grouped_gemm.h), as bf16 bits:
//   w0  gated (SwiGLU): [E/EP][gemm_b_rows(kSwiGlu, F/TP)][H], gate and up packed (pack_swiglu_weights)
//       plain:          [E/EP][F/TP][H]
//   w1  [E/EP][H][F/TP]
// The same slicing as MoeLayer::set_weights (src/cuda/moe_layer.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "comet/config.h"
#include "comet/layer.h"
#include "comet/problem.h"

namespace comet::cuda {

struct RankWeights {
  std::vector<uint16_t> w0;
  std::vector<uint16_t> w1;
};

// Rows of one expert's w0 (the GEMM0 output columns).
int gemm0_weight_rows(const LayerConfig& config);
// Throws comet::Error if the weights do not match the model.
RankWeights slice_rank_weights(const LayerConfig& config, const ExpertWeights& weights, int rank);

// One rank's bf16 weights in the checkpoint layout (comet/layer.h, RankExpertWeights) copied
// into the GEMM layouts above, w0 and w1 device buffers of the current device sized for
// `config` (gemm0_weight_rows rows of H per expert; [E/EP][H][F/TP]). Synchronous; the source
// may be host or device memory. gate/up rows are interleaved in blocks of kSwiGluPack by 2D
// copies (a block of the source is kSwiGluPack whole rows), and the rows that pad the last block
// Throws comet::Error when `weights` lacks a projection the activation needs or has one it lacks.
void check_rank_weights(const LayerConfig& config, const RankExpertWeights& weights);
// are zeroed. Throws comet::Error for a missing or superfluous projection (check_rank_weights,
// before anything is written).
void copy_rank_weights(const LayerConfig& config, const RankExpertWeights& weights, void* w0, void* w1);

}  // namespace comet::cuda
