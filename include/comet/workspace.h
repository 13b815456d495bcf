// comet/workspace.h: the symmetric buffer of one rank, sized for T_max.
//
// Every rank allocates the same layout; peers address each other's regions through the
// fabric's peer-pointer table (DESIGN §3). Regions, element types and sizes (R = max rows per
// rank = round_up(W * T_max * min(topk, E/EP) + E/EP * (block_m - 1), block_m), the rows
// plus each expert segment's padding to a tile boundary; Fl = F/TP; Tm = T_max;
// NB = ceil(H / block_n1), on the GPU with its narrowest layer1 column block, 128; MT = max M
// tiles = R / block_m; d = dtype bytes):
//
//   x              dtype [Tm][H]          this rank's tokens, published at the start of a call
//   route_ids      i32   [Tm][topk]       this rank's routing, published with x
//   route_weights  f32   [Tm][topk]
//   token_count    i32   [1]              this rank's num_tokens for the call
//   a_rows         dtype [R][H]           expert-sorted layer0 input (pulled from owners)
//   inter          dtype [R][Fl]          act(A W0) for the local F slice
//   out_rows       dtype [R][H]           I W1 (partial over the TP slice)
//   combine_recv   dtype [W][Tm][H]       slot [peer][pos]: peer's pre-reduced row for the
//                                         token at pos of this rank's send list to peer
//   y              dtype [Tm][H]          final output of this rank's tokens
//   tile_arrivals  u64   [MT]             layer0: rows landed per M tile (epoch counter)
//   col_done       u64   [NB]             layer1: M tiles stored per column block
//   combine_arr    u64   [W]              combine: token-column-blocks arrived from each peer
//   barrier        u64   [1]              arrivals at the end-of-call barrier
//
// Each region starts at a multiple of kWorkspaceAlign bytes. workspace_size_hint() computes
// the total with the same formula in closed form; a unit test checks that both agree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/config.h"

namespace comet {

inline constexpr int64_t kWorkspaceAlign = 256;

struct WorkspaceRegion {
  std::string name;
  std::string element;  // "dtype", "i32", "f32", "u64"
  int64_t elements = 0;
  int64_t offset_bytes = 0;
  int64_t bytes = 0;
};

class WorkspaceLayout {
 public:
  explicit WorkspaceLayout(const LayerConfig& config);

  const std::vector<WorkspaceRegion>& regions() const { return regions_; }
  const WorkspaceRegion& region(const std::string& name) const;  // throws comet::Error
  int64_t total_bytes() const { return total_bytes_; }

 private:
  void add(const std::string& name, const std::string& element, int64_t elements, int64_t elem_bytes);
  std::vector<WorkspaceRegion> regions_;
  int64_t total_bytes_ = 0;
};

// Bytes of one rank's symmetric workspace for `config` (closed form of the layout above).
int64_t workspace_size_hint(const LayerConfig& config);

}  // namespace comet
