// Tile schedules (layer0 source-rank order, layer1 column-block-major), comm chunks and the
// signal model's expected counts.
#include <algorithm>
#include <numeric>

#include "comet/plan.h"

namespace comet {

namespace {
// The builders index the plan's per-rank vectors with `rank`: outside [0, W) they would read
// past them.
void check_rank(const DispatchPlan& plan, int rank, const char* what) {
  COMET_CHECK(rank >= 0 && rank < plan.world(), what << ": rank " << rank << " outside [0, W=" << plan.world() << ")");
}
// A schedule from a config of another layer than the plan's would cut tiles across expert
// segments (or index past them).
void check_same_layer(const LayerConfig& config, const DispatchPlan& plan, const char* what) {
  check_plan_layer(config, plan, what);
  COMET_CHECK(config.tiles.block_m > 0 && plan.row_align() % config.tiles.block_m == 0,
              what << ": the plan's expert segments are aligned to " << plan.row_align()
                   << " rows, not a multiple of block_m " << config.tiles.block_m);
}
}  // namespace

std::vector<MTile> build_m_tiles(const DispatchPlan& plan, int dst, int block_m) {
  COMET_CHECK(block_m > 0, "block_m must be positive, got " << block_m);
  check_rank(plan, dst, "build_m_tiles");
  std::vector<MTile> tiles;
  for (int e = 0; e < plan.experts_per_rank(); ++e) {
    const int begin = plan.expert_row_begin(dst, e);
    const int end = begin + plan.expert_rows(dst, e);
    for (int row = begin; row < end; row += block_m) {
      MTile tile{e, row, std::min(end, row + block_m), 0, 0};
      // Rows inside an expert are sorted by ring position: first and last row bound the tile.
      tile.first_source_pos = plan.ring_pos(dst, plan.row_source(dst, tile.row_begin).src_rank);
      tile.last_source_pos = plan.ring_pos(dst, plan.row_source(dst, tile.row_end - 1).src_rank);
      tiles.push_back(tile);
    }
  }
  return tiles;
}

Layer0Schedule build_layer0_schedule(const LayerConfig& config, const DispatchPlan& plan, int dst, int stages) {
  COMET_CHECK(stages >= 0, "layer0 stages must be >= 0 (0: one per ring position), got " << stages);
  check_same_layer(config, plan, "build_layer0_schedule");
  Layer0Schedule s;
  s.rank = dst;
  s.world = plan.world();
  s.stages = stages == 0 ? s.world : std::min(stages, s.world);
  s.num_n_blocks = config.num_col_blocks0();
  s.m_tiles = build_m_tiles(plan, dst, config.tiles.block_m);
  s.order.resize(s.m_tiles.size());
  std::iota(s.order.begin(), s.order.end(), 0);
  // Stage 0's tiles first (those completed by the first ring positions), then stage 1's, ...
  // Stable, so inside a stage tiles keep expert-major order; odd stages then run backwards, so
  // that a stage starts on the experts whose weights the previous one read last (still in L2).
  std::stable_sort(s.order.begin(), s.order.end(),
                   [&](int a, int b) { return s.stage_of(a) < s.stage_of(b); });
  for (auto first = s.order.begin(); first != s.order.end();) {
    const int stage = s.stage_of(*first);
    const auto last = std::find_if(first, s.order.end(), [&](int m) { return s.stage_of(m) != stage; });
    if (stage % 2 == 1) std::reverse(first, last);
    first = last;
  }
  return s;
}

int default_layer0_stages(int world) {
  COMET_CHECK(world >= 1, "world must be positive, got " << world);
  return (world + kSourcesPerLayer0Stage - 1) / kSourcesPerLayer0Stage;
}

bool default_half_tiles(const LayerConfig& config) {
  const int64_t experts = config.model.routed_experts();
  COMET_CHECK(experts >= 1, "default_half_tiles: no routed experts");
  const int64_t rows = int64_t(config.layout.world) * config.max_tokens_per_rank * config.model.topk;
  return rows >= int64_t(kHalfTileMinExpertRows) * experts;
}

Layer1Schedule build_layer1_schedule(const LayerConfig& config, const DispatchPlan& plan, int dst) {
  check_same_layer(config, plan, "build_layer1_schedule");
  Layer1Schedule s;
  s.rank = dst;
  s.num_col_blocks = config.num_col_blocks1();
  s.m_tiles = build_m_tiles(plan, dst, config.tiles.block_m);
  return s;
}

namespace {
// Chunks of the send lists peer->rank, peers in rank's ring order (own rank first).
std::vector<CommChunk> ring_chunks(const DispatchPlan& plan, int rank, int chunk_tokens) {
  COMET_CHECK(chunk_tokens > 0, "comm chunk size must be positive, got " << chunk_tokens);
  check_rank(plan, rank, "comm chunks");
  std::vector<CommChunk> chunks;
  for (int pos = 0; pos < plan.world(); ++pos) {
    const int peer = plan.ring_src(rank, pos);
    const int n = plan.send_count(peer, rank);
    for (int begin = 0; begin < n; begin += chunk_tokens)
      chunks.push_back({peer, begin, std::min(n, begin + chunk_tokens)});
  }
  return chunks;
}
}  // namespace

// Layer0: rank pulls the send list peer->rank. Layer1: rank returns, for the same tokens, one
// pre-reduced row to the owner peer; both walk the list peer->rank.
std::vector<CommChunk> build_layer0_comm_chunks(const DispatchPlan& plan, int dst, int chunk_tokens) {
  return ring_chunks(plan, dst, chunk_tokens);
}

std::vector<CommChunk> build_layer1_comm_chunks(const DispatchPlan& plan, int rank, int chunk_tokens) {
  return ring_chunks(plan, rank, chunk_tokens);
}

int64_t combine_arrivals_expected(const DispatchPlan& plan, int owner, int peer, int num_col_blocks) {
  check_rank(plan, owner, "combine_arrivals_expected (owner)");
  check_rank(plan, peer, "combine_arrivals_expected (peer)");
  return int64_t(plan.send_count(owner, peer)) * num_col_blocks;
}

}  // namespace comet
