// comet/plan.h: the dispatch plan and the two tile schedules that every backend executes.
//
// One plan drives every backend (DESIGN §3). It is a pure function of the layer config and
// the routing of all ranks, so each rank can build the same plan from the exchanged routing.
//
// Dispatch: rank src sends each of its tokens once to every destination rank that holds at
// least one of the token's experts (dedup per destination, DESIGN §2); with TP > 1 every TP
// rank of the expert's EP group is a destination. The send list src->dst holds those tokens
// in ascending token order. On dst, the expert-sorted buffer A holds one row per
// (token, slot) routed to a local expert, expert-major; inside an expert the rows are ordered
// by source rank in dst's ring order (dst, dst+1, ..., dst-1 mod W), then by token. Each
// expert's segment starts at a multiple of tiles.block_m (padding rows follow a partial last
// tile), so every M tile belongs to one expert and starts on a tile boundary (the GPU GEMM's
// TMA loads and stores whole tiles).
//
// Layer0 schedule: the M tiles of every local expert, run in order of the latest ring
// position among their rows, so that tiles fed only by the own rank run first. A tile's
// signal counts landed rows; it is ready when rows_expected rows have arrived.
// Layer1 schedule: column-block-major over all M tiles of all local experts; a column block
// is complete when every M tile has stored it (tiles_per_col_block arrivals).
#pragma once

#include <cstdint>
#include <vector>

#include "comet/config.h"
#include "comet/routing.h"

namespace comet {

struct RowSource {
  int src_rank;
  int token;  // index on src_rank
  int slot;   // 0..topk-1
};

class DispatchPlan {
 public:
  // Throws comet::Error if routing has the wrong rank count, too many tokens or a bad id.
  DispatchPlan(const LayerConfig& config, const std::vector<Routing>& routing);

  int world() const { return world_; }
  int tp() const { return tp_; }
  int num_experts() const { return num_experts_; }
  int experts_per_rank() const { return experts_per_rank_; }
  int topk() const { return topk_; }
  int num_tokens(int rank) const { return num_tokens_[rank]; }

  // Ring position of `src` as seen by `dst` (0 = dst itself) and its inverse.
  int ring_pos(int dst, int src) const { return (src - dst + world_) % world_; }
  int ring_src(int dst, int pos) const { return (dst + pos) % world_; }

  // Rows of local expert e_local on dst that come from src.
  int count(int src, int dst, int e_local) const {
    return counts_[(size_t(src) * world_ + dst) * experts_per_rank_ + e_local];
  }
  // Unique tokens src sends to dst, ascending. send_count = its length.
  int send_count(int src, int dst) const { return send_psum_[pair(src, dst) + 1] - send_psum_[pair(src, dst)]; }
  const int* send_tokens(int src, int dst) const { return send_tokens_.data() + send_psum_[pair(src, dst)]; }
  // Position of `token` of src in the send list src->dst, or -1 if not sent there.
  int send_pos(int src, int token, int dst) const { return send_pos_[src][size_t(token) * world_ + dst]; }

  // Rows on dst: (token, slot) rows held, the buffer extent including padding, and the range
  // of local expert e_local (segments aligned to row_align()).
  int rows_on_rank(int dst) const { return real_rows_[dst]; }
  int row_extent(int dst) const { return expert_psum_[dst][experts_per_rank_]; }
  int row_align() const { return row_align_; }
  int expert_row_begin(int dst, int e_local) const { return expert_psum_[dst][e_local]; }
  int expert_rows(int dst, int e_local) const {
    int rows = 0;
    for (int src = 0; src < world_; ++src) rows += count(src, dst, e_local);
    return rows;
  }
  // Where row `row` of dst's A comes from ({-1, -1, -1} for a padding row).
  const RowSource& row_source(int dst, int row) const { return row_sources_[dst][row]; }
  // Row in the A buffer of dst that (token, slot) of src lands in; -1 if masked or if dst
  // does not hold that slot's expert.
  int slot_row(int src, int token, int slot, int dst) const;
  // The A rows on dst fed by the token at position `pos` of the send list src->dst (1..topk
  // rows). Appends to `rows`.
  void rows_of_sent_token(int src, int dst, int pos, std::vector<int>& rows) const;

  int64_t total_rows() const;  // sum over ranks of rows_on_rank (padding excluded)

 private:
  size_t pair(int src, int dst) const { return size_t(src) * world_ + dst; }

  int world_, tp_, experts_per_rank_, topk_, num_experts_, row_align_;
  std::vector<int> real_rows_;                    // [dst]
  std::vector<int> num_tokens_;
  std::vector<int> counts_;      // [src][dst][e_local]
  std::vector<int> send_psum_;   // [src*W + dst], W*W+1 entries
  std::vector<int> send_tokens_;
  std::vector<std::vector<int>> send_pos_;        // [src][token*W + dst]
  std::vector<std::vector<int>> expert_psum_;     // [dst][E/EP + 1], aligned segment starts
  std::vector<std::vector<RowSource>> row_sources_;  // [dst][row]
  std::vector<std::vector<int>> slot_row_;        // [src][(token*topk + slot)*TP + tp]
  std::vector<std::vector<int32_t>> expert_ids_;  // [src][token*topk + slot]
};

// Throws comet::Error, naming `what` and both sides, unless `config` has the plan's world size,
// TP, experts (all and per rank) and topk: code that takes both indexes the plan with the
// config's sizes, and reads its rows as the config's layer holds them. H and F are not the
// plan's (its rows are the same for any), so the cost functions take them from `config`.
void check_plan_layer(const LayerConfig& config, const DispatchPlan& plan, const char* what);

// One M tile of a local expert: rows [row_begin, row_end) of the rank's A buffer.
struct MTile {
  int expert_local;
  int row_begin;
  int row_end;
  int first_source_pos;  // smallest ring position among its rows
  int last_source_pos;   // largest ring position among its rows
  int rows() const { return row_end - row_begin; }
};

// Stage of ring position `pos` when `world` positions fall into `stages` consecutive stages. One
// definition for the host schedule and the device plan kernel (constexpr: callable from CUDA
// code built with --expt-relaxed-constexpr).
constexpr int layer0_stage(int pos, int stages, int world) { return pos * stages / world; }

// Layer0 run order: the W ring positions fall into `stages` consecutive stages
// (layer0_stage); tiles run stage by stage, by the stage of their last ring
// position; expert-major inside even stages, reversed inside odd ones. W stages: every source
// its own stage (a tile runs as soon as its last source can have arrived); 1 stage: plain
// expert-major (each expert's weights read once: the order for data already in place).
struct Layer0Schedule {
  int rank = 0;
  int num_n_blocks = 0;       // tiles across F/TP per M tile
  int world = 1;
  int stages = 1;             // in [1, world]
  std::vector<MTile> m_tiles; // expert-major; signal id = index here
  std::vector<int> order;     // m-tile ids in run order
  int stage_of(int m_tile) const { return layer0_stage(m_tiles[m_tile].last_source_pos, stages, world); }
  // Signal model: a tile's counter must rise by rows_expected(id) in one call.
  int rows_expected(int m_tile) const { return m_tiles[m_tile].rows(); }
};

struct Layer1Schedule {
  int rank = 0;
  int num_col_blocks = 0;      // column blocks of H
  std::vector<MTile> m_tiles;  // the same tiles as layer0, expert-major
  // Run order: for col_block in 0..: for m_tile in 0..; a column block's counter must rise
  // by tiles_per_col_block() in one call.
  int tiles_per_col_block() const { return int(m_tiles.size()); }
  int64_t num_tiles() const { return int64_t(num_col_blocks) * tiles_per_col_block(); }
};

// M tiles of dst's experts, expert-major.
std::vector<MTile> build_m_tiles(const DispatchPlan& plan, int dst, int block_m);
// stages: 0 = W (one per ring position); more than W is taken as W.
Layer0Schedule build_layer0_schedule(const LayerConfig& config, const DispatchPlan& plan, int dst, int stages = 0);
// The fused GPU kernels' default: one stage per kSourcesPerLayer0Stage ring positions, at least
// one (measured: 2 stages at W = 8 on one H200, 1 at W = 2 on two; docs/gpu_layer.md).
inline constexpr int kSourcesPerLayer0Stage = 4;
int default_layer0_stages(int world);
// Whether the GPU layer's cooperative GEMMs skip the second warpgroup of an expert's last M
// tile when its rows all lie past the expert's end ("half tiles", docs/gemm.md). They pay when
// an expert holds many M tiles (the skip can remove a wave); with few, the tiles that end early
// stop the tiles sharing an operand from running in step, and the L2 misses cost more
// (deepseek-v3 at 256 rows per expert: 3% of compute-only). The default: on when the expected
// rows per routed expert at T_max, W * T_max * topk / E, are at least kHalfTileMinExpertRows.
inline constexpr int kHalfTileMinExpertRows = 512;
bool default_half_tiles(const LayerConfig& config);
Layer1Schedule build_layer1_schedule(const LayerConfig& config, const DispatchPlan& plan, int dst);

// A piece of communication work: positions [pos_begin, pos_end) of the send list peer->rank.
// Layer0: rank pulls those tokens from peer. Layer1: rank returns one pre-reduced row for
// each of them to peer, their owner.
struct CommChunk {
  int peer;
  int pos_begin;
  int pos_end;
};

// Layer0: chunks that rank `dst` pulls, in ring order of sources (own rows first).
std::vector<CommChunk> build_layer0_comm_chunks(const DispatchPlan& plan, int dst, int chunk_tokens);
// Layer1: chunks that rank `src` (the expert holder) pushes to owners, in ring order; each
// chunk is sent once per column block.
std::vector<CommChunk> build_layer1_comm_chunks(const DispatchPlan& plan, int rank, int chunk_tokens);

// Signal model of the combine: the arrivals owner `owner` expects from rank `peer` in one call
// (one per token per column block).
int64_t combine_arrivals_expected(const DispatchPlan& plan, int owner, int peer, int num_col_blocks);

}  // namespace comet
