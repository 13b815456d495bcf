// support/custom_routing.h: hand-made routings that generators never produce, applied on top
// of a generated routing (the weights stay those of the generator).
#pragma once

#include <cstdint>

#include "comet/routing.h"

namespace comet::test {

// kAllToOne: slot 0 of every token goes to the last expert, the other slots are masked.
// kAllMasked: every slot is -1. kDuplicates (slot 1 repeats slot 0 on every other token) and
// kAllSlotsOneExpert (every slot of every token on the last expert) are invalid routings:
// Routing::check rejects an expert repeated within a token, and the tests check that it does.
enum class CustomRouting { kNone, kDuplicates, kAllToOne, kAllSlotsOneExpert, kAllMasked };

inline const char* custom_name(CustomRouting c) {
  switch (c) {
    case CustomRouting::kNone: return "none";
    case CustomRouting::kDuplicates: return "duplicate-experts";
    case CustomRouting::kAllToOne: return "all-to-one-expert";
    case CustomRouting::kAllSlotsOneExpert: return "all-slots-one-expert";
    case CustomRouting::kAllMasked: return "all-masked";
  }
  return "?";
}

inline void apply_custom_routing(Routing& rt, CustomRouting custom, int num_experts) {
  for (int t = 0; t < rt.num_tokens; ++t) {
    for (int k = 0; k < rt.topk; ++k) {
      int32_t& id = rt.expert_ids[size_t(t) * rt.topk + k];
      switch (custom) {
        case CustomRouting::kNone: break;
        case CustomRouting::kDuplicates:
          if (k == 1 && t % 2 == 0) id = rt.expert(t, 0);
          break;
        case CustomRouting::kAllToOne: id = k == 0 ? num_experts - 1 : -1; break;
        case CustomRouting::kAllSlotsOneExpert: id = num_experts - 1; break;
        case CustomRouting::kAllMasked: id = -1; break;
      }
    }
  }
}

}  // namespace comet::test
