// cuda/expert_group.h: an expert id's EP group, id / experts_per_rank, as a multiplication.
//
// An integer division is some twenty instructions on the GPU, and the device plan's chunk
// kernels need a slot's group for every slot of every token they read. With
// magic = floor(2^32 / E) + 1, the high word of id * magic equals id / E for every id with
// id * E < 2^32: id * magic / 2^32 = id / E + id * (E - 2^32 mod E) / (E * 2^32), and the second
// term is below 1 / E, too little to reach the next multiple of 1 / E. E = 1 needs a magic of
// 2^32 + 1, so it is kept as 0 and the group is the id itself. Host and device compute the same
// value (tests/unit/expert_group_test.cpp checks it against the division).
#pragma once

#include <cstdint>

#include "cuda/host_device.h"

namespace comet::cuda {

struct ExpertGroupOf {
  uint32_t magic = 0;  // 0: one expert per rank

  // For E experts per rank (E >= 1). Exact for ids below num_experts when exact_below() holds.
  static ExpertGroupOf for_experts_per_rank(int experts_per_rank) {
    ExpertGroupOf g;
    if (experts_per_rank > 1) g.magic = uint32_t((uint64_t(1) << 32) / uint64_t(experts_per_rank) + 1);
    return g;
  }
  // Whether every id in [0, num_experts) maps exactly: (num_experts - 1) * E < 2^32.
  static bool exact_below(int64_t num_experts, int experts_per_rank) {
    return num_experts >= 1 && experts_per_rank >= 1 &&
           (num_experts - 1) * int64_t(experts_per_rank) < (int64_t(1) << 32);
  }
  COMET_HOST_DEVICE int operator()(int id) const {
#if defined(__CUDA_ARCH__)
    return magic ? int(__umulhi(uint32_t(id), magic)) : id;
#else
    return magic ? int((uint64_t(uint32_t(id)) * magic) >> 32) : id;
#endif
  }
};

}  // namespace comet::cuda
