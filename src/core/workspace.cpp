// Symmetric workspace layout of one rank (the table in comet/workspace.h).
#include "comet/workspace.h"

namespace comet {

namespace {
int64_t align_up(int64_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
}  // namespace

WorkspaceLayout::WorkspaceLayout(const LayerConfig& config) {
  config.check();
  const int64_t d = dtype_bytes(config.dtype);
  const int64_t W = config.layout.world;
  const int64_t Tm = config.max_tokens_per_rank;
  const int64_t H = config.model.hidden;
  const int64_t K = config.model.topk;
  const int64_t R = config.max_rows_per_rank();
  const int64_t Fl = config.ffn_per_rank();
  add("x", "dtype", Tm * H, d);
  add("route_ids", "i32", Tm * K, 4);
  add("route_weights", "f32", Tm * K, 4);
  add("token_count", "i32", 1, 4);
  add("a_rows", "dtype", R * H, d);
  add("inter", "dtype", R * Fl, d);
  add("out_rows", "dtype", R * H, d);
  add("combine_recv", "dtype", W * Tm * H, d);
  add("y", "dtype", Tm * H, d);
  add("tile_arrivals", "u64", config.max_m_tiles_per_rank(), 8);
  add("col_done", "u64", config.num_col_blocks1(), 8);
  add("combine_arr", "u64", W, 8);
  add("barrier", "u64", 1, 8);
}

void WorkspaceLayout::add(const std::string& name, const std::string& element, int64_t elements,
                          int64_t elem_bytes) {
  WorkspaceRegion r{name, element, elements, total_bytes_, elements * elem_bytes};
  regions_.push_back(r);
  total_bytes_ += align_up(r.bytes);
}

const WorkspaceRegion& WorkspaceLayout::region(const std::string& name) const {
  for (const auto& r : regions_)
    if (r.name == name) return r;
  throw Error("workspace has no region named '" + name + "'");
}

int64_t workspace_size_hint(const LayerConfig& config) {
  config.check();
  const int64_t d = dtype_bytes(config.dtype);
  const int64_t W = config.layout.world, Tm = config.max_tokens_per_rank;
  const int64_t H = config.model.hidden, K = config.model.topk;
  const int64_t R = config.max_rows_per_rank(), Fl = config.ffn_per_rank();
  const int64_t MT = config.max_m_tiles_per_rank(), NB = config.num_col_blocks1();
  return align_up(Tm * H * d) + 2 * align_up(Tm * K * 4) + align_up(4) +
         2 * align_up(R * H * d) + align_up(R * Fl * d) + align_up(W * Tm * H * d) +
         align_up(Tm * H * d) + align_up(MT * 8) + align_up(NB * 8) + align_up(W * 8) + align_up(8);
}

}  // namespace comet
