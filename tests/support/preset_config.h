// support/preset_config.h: a layer config of a model preset, as the unit tests build it.
#pragma once

#include <string>

#include "comet/config.h"

namespace comet::test {

// `model` (a ModelPresets name) on W = ep x tp ranks with `t_max` tokens per rank; the other
// fields keep LayerConfig's defaults.
inline LayerConfig preset_config(const std::string& model, int ep, int tp, int t_max) {
  LayerConfig c;
  c.model = ModelPresets::get(model);
  c.layout = {ep * tp, ep, tp};
  c.max_tokens_per_rank = t_max;
  return c;
}

}  // namespace comet::test
