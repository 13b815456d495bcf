// comet/layer_choices.h: what MoeLayer decides from its options, a tuning table and the GPU it
// runs on (the forward path, n_comm, the layer0 mode, the layer1 combine), and the checks
// MoeLayer::set_options makes. Host code only: a choice can be asked for, and tested, without a
// GPU. MoeLayer calls these with its own GPU's target; path(), n_comm(), layer0_mode() and
// layer1_combine() return the result.
#pragma once

#include <string>

#include "comet/config.h"
#include "comet/error.h"
#include "comet/layer.h"
#include "comet/tuning.h"

namespace comet {

// Where a layer runs, as its choices depend on it.
struct LayerTarget {
  std::string gpu;  // the device name the driver reports (the tuning key's)
  int num_sms = 0;
  int gpus = 1;  // the GPUs the W ranks run on (TuningKey::gpus: 1 for Loopback)
  // Ranks on several GPUs or in several processes (their links are real: no link emulation).
  bool real_links = false;
  std::string fabric = "loopback";  // the fabric's name, for messages
  // Why a token row does not fit the GEMM blocks' copy ring (Layer0Copies::kGemmBlocks); empty:
  // it fits. The ring is the device code's (cuda/fused_layer.h), so the caller says.
  std::string copy_ring_refusal;
};

struct LayerChoices {
  PathChoice path;
  NCommChoice n_comm;
  Layer0ModeChoice layer0;
  Layer1CombineChoice layer1;
};

// Options first (a value they set wins), then the tuning table's nearest entry at T_max
// (comet/tuning.h), then the defaults: the unfused pipeline, communication blocks in ring order,
// and n_comm from the cost model. A table entry that asks for what cannot run here (copies or
// the combine in the GEMM blocks under link emulation, or rows too large for the copy ring)
// falls back to communication blocks, and the choice's source says why. Options are assumed to
// have passed check_layer_options.
LayerChoices resolve_layer_choices(const LayerConfig& config, const LayerOptions& options, const TuningTable& table,
                                   const LayerTarget& target);

// MoeLayer::set_options' checks: a failure names the option and what it must be.
Status check_layer_options(const LayerConfig& config, const LayerOptions& options, const LayerTarget& target);

}  // namespace comet
