// Per-rank slices of the expert weights in the GPU GEMM layouts.
#include "cuda/rank_weights.h"

#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "cuda/check.h"
#include "cuda/grouped_gemm.h"

namespace comet::cuda {

int gemm0_weight_rows(const LayerConfig& c) {
  return is_gated(c.model.activation) ? gemm_b_rows(GemmEpilogue::kSwiGlu, c.ffn_per_rank()) : c.ffn_per_rank();
}

RankWeights slice_rank_weights(const LayerConfig& c, const ExpertWeights& w, int rank) {
  const ModelShape& model = c.model;
  w.check(model);
  COMET_CHECK(rank >= 0 && rank < c.layout.world, "slice_rank_weights: no rank " << rank);
  const bool gated = is_gated(model.activation);
  const int epr = c.experts_per_rank();
  const size_t H = model.hidden, F = model.ffn, Fl = c.ffn_per_rank();
  const size_t ep = c.layout.ep_index(rank), tp = c.layout.tp_index(rank);
  std::vector<float> gate(gated ? epr * H * Fl : 0), up(epr * H * Fl), down(epr * Fl * H);
  for (size_t el = 0; el < size_t(epr); ++el) {
    const size_t e = ep * epr + el;
    for (size_t h = 0; h < H; ++h) {
      const size_t from = (e * H + h) * F + tp * Fl, to = (el * H + h) * Fl;
      std::memcpy(&up[to], &w.w_up[from], Fl * sizeof(float));
      if (gated) std::memcpy(&gate[to], &w.w_gate[from], Fl * sizeof(float));
    }
    std::memcpy(&down[el * Fl * H], &w.w_down[(e * F + tp * Fl) * H], Fl * H * sizeof(float));
  }
  RankWeights out;
  out.w0 = gated ? pack_swiglu_weights(gate, up, epr, int(H), int(Fl)) : transpose_weights(up, epr, int(H), int(Fl));
  out.w1 = transpose_weights(down, epr, int(Fl), int(H));
  return out;
}

void check_rank_weights(const LayerConfig& c, const RankExpertWeights& w) {
  const bool gated = is_gated(c.model.activation);
  COMET_CHECK(w.up && w.down, "set_rank_weights: the up and down projections are required");
  COMET_CHECK(gated == (w.gate != nullptr), "set_rank_weights: activation " << activation_name(c.model.activation)
                                                << (gated ? " needs a gate projection" : " has no gate projection"));
}

void copy_rank_weights(const LayerConfig& c, const RankExpertWeights& w, void* w0, void* w1) {
  check_rank_weights(c, w);
  const bool gated = is_gated(c.model.activation);
  const size_t epr = c.experts_per_rank(), H = c.model.hidden, Fl = c.ffn_per_rank(), row = H * 2;
  const size_t rows0 = size_t(gemm0_weight_rows(c));
  // Synchronous on every stream of the device (the copies below are not: device-to-device and
  // memset run on the legacy stream, which a non-blocking stream does not wait for): a forward
  // still running reads the old weights, and the next one, on any stream, the new.
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  const auto* gate = static_cast<const char*>(w.gate);
  const auto* up = static_cast<const char*>(w.up);
  char* dst0 = static_cast<char*>(w0);
  if (!gated) {  // w0 is up itself: [E/EP][F/TP][H]
    COMET_CUDA_CHECK(cudaMemcpy(dst0, up, epr * Fl * row, cudaMemcpyDefault));
  } else {
    const size_t P = kSwiGluPack, full = Fl / P, tail = Fl % P;
    COMET_CUDA_CHECK(cudaMemset(dst0, 0, epr * rows0 * row));  // the rows padding the last block
    for (size_t e = 0; e < epr; ++e) {
      char* dst = dst0 + e * rows0 * row;
      const size_t src = e * Fl * row;
      // Block b of the destination: gate rows [bP, bP + P), then up rows [bP, bP + P).
      for (const auto& [from, offset] : {std::pair{gate, size_t(0)}, std::pair{up, P * row}}) {
        if (full > 0)
          COMET_CUDA_CHECK(cudaMemcpy2D(dst + offset, 2 * P * row, from + src, P * row, P * row, full, cudaMemcpyDefault));
        if (tail > 0)
          COMET_CUDA_CHECK(cudaMemcpy(dst + full * 2 * P * row + offset, from + src + full * P * row, tail * row,
                                      cudaMemcpyDefault));
      }
    }
  }
  COMET_CUDA_CHECK(cudaMemcpy(w1, w.down, epr * H * Fl * 2, cudaMemcpyDefault));  // the same layout
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace comet::cuda
