// unit/workspace_test.cpp: the symmetric workspace layout agrees with the formulas of the
// comment in include/comet/workspace.h and with workspace_size_hint().
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "comet/workspace.h"
#include "support/test_support.h"
#include "unit/plan_cases.h"

namespace comet {
namespace {

using test::throws_with;

struct WorkspaceCase {
  LayerConfig config;
  std::string describe() const { return config.describe(); }
};

std::vector<WorkspaceCase> workspace_cases() {
  std::vector<WorkspaceCase> out;
  for (const test::PlanCase& c : test::plan_cases()) out.push_back({c.config()});
  const DType dtypes[] = {DType::kBF16, DType::kF32, DType::kF16};
  const TileConfig tiles[] = {{128, 128, 128}, {64, 128, 256}, {8, 16, 16}, {16, 32, 24}};
  int i = 0;
  for (const ModelShape& m : ModelPresets::all()) {
    for (int world : {1, 8}) {
      for (int tp : {1, 2, world}) {
        if (tp > world) continue;
        for (int t_max : {1, 128, 4096, 16384}) {
          LayerConfig c;
          c.model = m;
          c.layout = {world, world / tp, tp};
          c.max_tokens_per_rank = t_max;
          c.dtype = dtypes[i % 3];
          c.tiles = tiles[i % 4];
          ++i;
          out.push_back({c});
        }
      }
    }
  }
  return out;
}

int64_t align_up(int64_t v) { return (v + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

struct Expected {
  const char* name;
  const char* element;
  int64_t elements;
  int64_t elem_bytes;
};

std::vector<Expected> expected_regions(const LayerConfig& c) {
  const int64_t w = c.layout.world, tm = c.max_tokens_per_rank, h = c.model.hidden;
  const int64_t topk = c.model.topk, epr = c.experts_per_rank();
  const int64_t bm = c.tiles.block_m;
  const int64_t r = (w * tm * std::min<int64_t>(topk, epr) + epr * (bm - 1) + bm - 1) / bm * bm;
  const int64_t fl = c.ffn_per_rank();
  const int64_t nb = (h + c.tiles.block_n1 - 1) / c.tiles.block_n1;
  const int64_t mt = r / bm;
  const int64_t d = dtype_bytes(c.dtype);
  return {
      {"x", "dtype", tm * h, d},
      {"route_ids", "i32", tm * topk, 4},
      {"route_weights", "f32", tm * topk, 4},
      {"token_count", "i32", 1, 4},
      {"a_rows", "dtype", r * h, d},
      {"inter", "dtype", r * fl, d},
      {"out_rows", "dtype", r * h, d},
      {"combine_recv", "dtype", w * tm * h, d},
      {"y", "dtype", tm * h, d},
      {"tile_arrivals", "u64", mt, 8},
      {"col_done", "u64", nb, 8},
      {"combine_arr", "u64", w, 8},
      {"barrier", "u64", 1, 8},
  };
}

TEST(Workspace, LayoutMatchesTheDocumentedFormulasAndTheSizeHint) {
  for (const WorkspaceCase& wc : workspace_cases()) {
    const LayerConfig& c = wc.config;
    SCOPED_TRACE(wc.describe());
    ASSERT_TRUE(c.validate().ok) << c.validate().reason;
    const WorkspaceLayout layout(c);
    const std::vector<Expected> want = expected_regions(c);
    const auto& regions = layout.regions();
    ASSERT_EQ(regions.size(), want.size());
    int64_t end = 0;
    for (size_t i = 0; i < regions.size(); ++i) {
      const WorkspaceRegion& got = regions[i];
      SCOPED_TRACE(std::string("region ") + want[i].name);
      EXPECT_EQ(got.name, want[i].name);
      EXPECT_EQ(got.element, want[i].element);
      EXPECT_EQ(got.elements, want[i].elements);
      EXPECT_EQ(got.bytes, want[i].elements * want[i].elem_bytes);
      EXPECT_EQ(got.offset_bytes % kWorkspaceAlign, 0);
      EXPECT_GE(got.offset_bytes, end) << "overlaps the previous region";
      EXPECT_EQ(got.offset_bytes, align_up(end)) << "not packed in order";
      end = got.offset_bytes + got.bytes;
      EXPECT_EQ(&layout.region(got.name), &got);
    }
    EXPECT_GE(layout.total_bytes(), end);
    EXPECT_LT(layout.total_bytes(), end + kWorkspaceAlign);
    EXPECT_EQ(layout.total_bytes(), workspace_size_hint(c));
    EXPECT_EQ(c.max_rows_per_rank(), want[4].elements / c.model.hidden);
    EXPECT_EQ(c.max_m_tiles_per_rank(), want[9].elements);
  }
}

TEST(Workspace, UnknownRegionThrows) {
  LayerConfig c;
  c.model = {"w", 32, 64, 8, 2, Activation::kSwiGlu};
  c.layout = {2, 2, 1};
  c.max_tokens_per_rank = 16;
  const WorkspaceLayout layout(c);
  EXPECT_TRUE(throws_with<Error>([&] { layout.region("no_such_region"); }, {"no_such_region"}));
  EXPECT_TRUE(throws_with<Error>([&] { layout.region(""); }));
  EXPECT_NO_THROW(layout.region("a_rows"));
}

}  // namespace
}  // namespace comet
