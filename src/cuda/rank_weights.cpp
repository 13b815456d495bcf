// Per-rank slices of the expert weights in the GPU GEMM layouts.
#include "cuda/rank_weights.h"

#include <cstring>

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

}  // namespace comet::cuda
