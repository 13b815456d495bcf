// tests/gpu/checkpoint_weights.h: a rank's expert weights in a checkpoint's layout
// (RankExpertWeights of comet/layer.h: nn.Linear [out][in], bf16), made from the full fp32
// weights of a MoeProblem, for the tests of set_rank_weights.
#pragma once

#include <cstdint>
#include <vector>

#include "comet/config.h"
#include "comet/dtype.h"
#include "comet/problem.h"

namespace comet::testing {

// Rank r's weights in the checkpoint layout (RankExpertWeights, nn.Linear [out][in], bf16) from
// the full fp32 weights (x W convention, [E][H][F] and [E][F][H]).
struct CheckpointWeights {
  std::vector<uint16_t> gate, up, down;
};
inline CheckpointWeights checkpoint_weights(const LayerConfig& c, const ExpertWeights& w, int rank) {
  const bool gated = is_gated(c.model.activation);
  const size_t epr = c.experts_per_rank(), H = c.model.hidden, F = c.model.ffn, Fl = c.ffn_per_rank();
  const size_t ep = c.layout.ep_index(rank), tp = c.layout.tp_index(rank);
  CheckpointWeights out;
  out.up.resize(epr * Fl * H);
  out.gate.resize(gated ? epr * Fl * H : 0);
  out.down.resize(epr * H * Fl);
  for (size_t el = 0; el < epr; ++el) {
    const size_t e = ep * epr + el;
    for (size_t f = 0; f < Fl; ++f)
      for (size_t h = 0; h < H; ++h) {
        const size_t in = (e * H + h) * F + tp * Fl + f, at = (el * Fl + f) * H + h;
        out.up[at] = float_to_bf16_bits(w.w_up[in]);
        if (gated) out.gate[at] = float_to_bf16_bits(w.w_gate[in]);
        out.down[(el * H + h) * Fl + f] = float_to_bf16_bits(w.w_down[(e * F + tp * Fl + f) * H + h]);
      }
  }
  return out;
}

}  // namespace comet::testing
