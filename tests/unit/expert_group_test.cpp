// unit/expert_group_test.cpp: cuda/expert_group.h, the EP group of an expert id as a
// multiplication (the device plan's chunk kernels use it instead of a division), against the
// division: every id below 2^16 for every E up to 300 and the presets' E, and the largest ids
// the exactness bound admits for large E; the bound itself.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/expert_group.h"

namespace comet::cuda {
namespace {

// The largest id with id * E < 2^32: the end of the range exact_below() admits.
int64_t last_exact_id(int e) { return ((int64_t(1) << 32) - 1) / e; }

TEST(ExpertGroup, EqualsTheDivisionForEveryIdBelow2To16UpToE300) {
  for (int e = 1; e <= 300; ++e) {
    const ExpertGroupOf group = ExpertGroupOf::for_experts_per_rank(e);
    for (int id = 0; id < (1 << 16); ++id) ASSERT_EQ(group(id), id / e) << "E=" << e << " id=" << id;
  }
}

TEST(ExpertGroup, EqualsTheDivisionUpToTheBoundForLargeE) {
  for (int e : {301, 509, 1000, 1024, 4093, 4096, 65535, 65536, 1 << 20}) {
    const ExpertGroupOf group = ExpertGroupOf::for_experts_per_rank(e);
    const int64_t last = std::min<int64_t>(last_exact_id(e), INT32_MAX);
    // Around every multiple of E near the top of the range, and the top itself.
    for (int64_t base = last - 4 * int64_t(e); base <= last; base += e)
      for (int64_t id = std::max<int64_t>(0, base - 2); id <= std::min(last, base + 2); ++id)
        ASSERT_EQ(group(int(id)), int(id / e)) << "E=" << e << " id=" << id;
    for (int64_t id = 0; id < 3 * int64_t(e) && id <= last; ++id) ASSERT_EQ(group(int(id)), int(id / e));
  }
}

TEST(ExpertGroup, OneExpertPerRankIsTheIdItself) {
  const ExpertGroupOf group = ExpertGroupOf::for_experts_per_rank(1);
  EXPECT_EQ(group.magic, 0u);
  for (int id : {0, 1, 7, 255, 65535, INT32_MAX}) EXPECT_EQ(group(id), id);
}

TEST(ExpertGroup, TheBoundAdmitsThePresetsAndRefusesTheOverflow) {
  // Every preset at every layout: at most 256 experts, at most 256 per rank.
  EXPECT_TRUE(ExpertGroupOf::exact_below(256, 256));
  EXPECT_TRUE(ExpertGroupOf::exact_below(256, 32));
  EXPECT_TRUE(ExpertGroupOf::exact_below(1, 1));
  EXPECT_TRUE(ExpertGroupOf::exact_below(65536, 65536));      // 65535 * 65536 < 2^32
  EXPECT_FALSE(ExpertGroupOf::exact_below(65538, 65536));     // 65537 * 65536 >= 2^32
  EXPECT_FALSE(ExpertGroupOf::exact_below(0, 4));
  EXPECT_FALSE(ExpertGroupOf::exact_below(4, 0));
  // Past the bound the multiplication is wrong: E = 2^16 (magic 2^16 + 1), id = 2^17 - 1 is 1.99998 E
  // but its product with the magic reaches 2^33.
  const ExpertGroupOf big = ExpertGroupOf::for_experts_per_rank(1 << 16);
  ASSERT_GT(131071, last_exact_id(1 << 16));  // past the bound
  EXPECT_NE(big(131071), 131071 / 65536) << "the bound would not be needed";
}

}  // namespace
}  // namespace comet::cuda
