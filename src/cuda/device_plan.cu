// The dispatch plan of one rank from every rank's routing, in three kernels. Only the first and
// the last read routing (through peer pointers: with ranks on several GPUs, across NVLink), and
// both are one block per (rank, ring position, chunk of kChunkTokens tokens), so those reads are
// all in flight at once instead of one chunk after another.
//
// Counting kernel, one block per (rank, ring position, chunk): reads the chunk's routing once,
//   checks it (token count, expert ids, an expert repeated within a token), and writes the
//   chunk's rows per local expert, its received tokens and, for the own tokens, its tokens per
//   destination EP group (warp-aggregated shared atomics: the counts are order-free).
// Layout kernel, one block per rank, from those counts alone: the chunks' prefix sums (their
//   bases), expert segments (padded to 128 rows) and the row base of each (ring position,
//   expert), received-token prefix sums, M tiles and their last ring position, the layer0 order
//   (stable counting sort: warp matches and per-key scans), the epochs.
// Placing kernel, one block per (rank, ring position, chunk): the chunk's tokens get consecutive
//   slots (block scan) and each (token, slot) its row (per warp, a mask of the lanes holding each
//   expert, from shared atomics) on top of the chunk's bases; the own chunks also write their
//   send positions (a block scan per EP group). All the rank's blocks share the two GEMM tile
//   lists (a tile per thread).
//   With DevicePlanArgs::combine_peers, a token with a single local row gives that row its
//   owner's combine_recv row (row_combine: GEMM1's epilogue stores it there) and the others go
//   to the combine list (a block scan on top of the chunk's list base); without, every token is
//   listed.
//
// NOTES: the order rules are those of comet::DispatchPlan (include/comet/plan.h): inside an
// expert, sources in ring order, then tokens ascending; a token's rows in slot order.
// Determinism comes from scans and ballots (no atomics decide an order).
#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>

#include <cub/block/block_scan.cuh>

#include "comet/plan.h"
#include "cuda/check.h"
#include "cuda/comm_rows.cuh"
#include "cuda/dependent_launch.h"
#include "cuda/device_plan.h"
#include "cuda/expert_group.h"
#include "cuda/gemm_schedule.h"
#include "cuda/signal.cuh"
#include "cuda/tile_raster.h"

namespace comet::cuda {

namespace {

// Tokens per chunk, one thread each, in the counting and placing kernels. Their work per block is
// per token, so small chunks spread it over many SMs: with one rank per GPU (W = 2, 4096 tokens)
// 1024-token chunks gave each rank only 8 blocks, and qwen3's placing kernel took 69 us.
constexpr int kChunkTokens = 256;
constexpr int kChunkWarps = kChunkTokens / 32;
constexpr int kMaxTopk = 16;
// Every preset routes a token to at most 8 experts: the counting kernel has an instantiation
// that holds only that many slots in registers.
constexpr int kFewSlots = 8;
// Both chunk kernels are bound by load latency, so blocks per SM matter: 6 blocks of 256
// threads (40 registers) fit each one without spilling; the counting kernel for up to
// kFewSlots slots per token fits 8 (32 registers), so with 8 ranks on one GPU (W x W x 16
// chunks = 1024 blocks) it runs in one wave. The placing kernel spills below 40 registers.
constexpr int kChunkBlocksPerSm = 6;
template <int kSlots>
constexpr int kCountBlocksPerSm = kSlots <= kFewSlots ? 8 : kChunkBlocksPerSm;
using ChunkScan = cub::BlockScan<int, kChunkTokens>;
// The layout kernel: one block per rank.
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullWarp = 0xffffffffu;
using BlockScan = cub::BlockScan<int, kThreads>;

struct PlanShape {
  int world, tp, ep, experts_per_rank, num_experts, topk, t_max, rows_per_token, hidden;
  int chunks;  // token chunks per source: ceil(t_max / kChunkTokens)
  int64_t max_rows, max_m_tiles;
  int n_blocks0, n_blocks1;
  int raster_n1;  // layer1 raster group in column blocks: a combine group (combine_group_blocks)
  // id / experts_per_rank without a division (cuda/expert_group.h; exactness checked on the host).
  ExpertGroupOf group_of;
};

__device__ void record_input_error(DeviceError* error, int rank, WaitRole role, int src, uint64_t bound,
                                   uint64_t value) {
  record_timeout(error, WaitSite{rank, -1, role, src}, bound, value);
}

// Tokens published by `src`; a count above T_max is recorded (when `report`) and read as 0, so
// nothing is read past T_max.
__device__ int published_tokens(const DevicePlanArgs& a, const PlanShape& s, int src, bool report) {
  const int t = *a.token_counts[src];
  if (t >= 0 && t <= s.t_max) return t;
  if (report) record_input_error(a.error, a.rank, WaitRole::kBadTokenCount, src, s.t_max, uint64_t(int64_t(t)));
  return 0;
}

// Adds to counter[key] the number of lanes holding each distinct key >= 0 (all 32 lanes call
// it): one atomic per warp and key, so contention stays low even for one local expert.
__device__ __forceinline__ void warp_count(int* counter, int key) {
  const unsigned same = __match_any_sync(kFullWarp, key);
  if (key >= 0 && (threadIdx.x % 32) == unsigned(__ffs(same) - 1)) atomicAdd(&counter[key], __popc(same));
}

// A token's local expert per slot (-1: none), 16 bits each, two slots per register; indexed
// by unrolled loops only (constant k), so it stays in registers: the placing kernel fits 40
// registers without spilling.
static_assert(kMaxTopk % 2 == 0);
struct SlotIds {
  uint32_t packed[kMaxTopk / 2] = {};  // slot k: id + 1 in bits 16 (k % 2) ..
  __device__ __forceinline__ void set(int k, int id) { packed[k / 2] |= uint32_t(id + 1) << (16 * (k % 2)); }
  __device__ __forceinline__ int get(int k) const { return int(packed[k / 2] >> (16 * (k % 2)) & 0xffffu) - 1; }
};
inline constexpr int kSlotIdCount = 0xffff;  // ids 0 .. 0xfffe fit (id + 1 in 16 bits)

// Up to kPlanBatch ranks' plans in one launch (virtual ranks on one GPU plan concurrently).
constexpr int kPlanBatch = 8;
struct PlanBatch {
  DevicePlanArgs ranks[kPlanBatch];
};

// Counts of chunk blockIdx.x of ring position blockIdx.y of rank batch.ranks[blockIdx.z], into
// the scratch the layout kernel turns into bases: chunk_row_base[pos][ch][e] (rows per local
// expert), chunk_slot_base[pos][ch] (tokens with a local row), chunk_send_base[ch][g] (own tokens
// with an expert in EP group g; ring position 0 only), chunk_flags[pos][ch] (1: an expert
// repeated within a token), chunk_list_base[pos][ch] (tokens the combine moves: with
// combine_peers those with two or more local rows, else every token with one). Every block
// writes its counts, also with no tokens in its chunk.
template <int kSlots>
__global__ void __launch_bounds__(kChunkTokens, kCountBlocksPerSm<kSlots>)
    device_plan_count_kernel(PlanShape s, const __grid_constant__ PlanBatch batch) {
  begin_dependent_kernel();
  const DevicePlanArgs& a = batch.ranks[blockIdx.z];
  const DevicePlanView& plan = a.plan;
  const int ch = int(blockIdx.x), pos = int(blockIdx.y), tid = threadIdx.x;
  const int W = s.world, E = s.experts_per_rank, K = s.topk, C = s.chunks;
  const int r = a.rank, my_ep = r / s.tp, src = (r + pos) % W;
  extern __shared__ int smem_raw[];
  int* rows = smem_raw;          // [E]
  int* group_tokens = rows + E;  // [EP]
  for (int i = tid; i < E + s.ep; i += kChunkTokens) smem_raw[i] = 0;
  __syncthreads();
  const int T = published_tokens(a, s, src, ch == 0 && tid == 0);
  const int t = ch * kChunkTokens + tid;
  const int32_t* ids = a.route_ids[src] + size_t(t) * K;
  // Slot loops run to kSlots (>= K), unrolled, guarded by k < K (uniform over the block): e[]
  // stays in registers (a loop to the runtime K indexes it, which puts it in local memory).
  int e[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) e[k] = k < K && t < T ? ids[k] : -1;  // one read of the token's slots
  // Each slot as (EP group << 16) | local expert (-1: masked): one division per slot, and equal
  // values are equal experts. An id out of range is masked, as the placing kernel masks it.
  int bad_id = -1;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int id = e[k];
    const bool bad = k < K && (id < -1 || id >= s.num_experts);
    bad_id = bad ? id : bad_id;
    const int g = s.group_of(id);
    e[k] = k < K && id >= 0 && !bad ? (g << 16) | (id - g * E) : -1;
  }
  // The token's first repeated expert, packed as e[] (-1: none): the lowest slot k equal to an
  // earlier one, found last. Every rank checks every token (not only its own experts), so all
  // refuse together.
  int repeated = -1;
#pragma unroll
  for (int k = kSlots - 1; k >= 1; --k) {
    bool seen = false;
#pragma unroll
    for (int j = 0; j < k; ++j) seen |= e[j] == e[k];
    repeated = k < K && e[k] >= 0 && seen ? e[k] : repeated;
  }
  bool mine = false;
  int local_rows = 0;
  uint64_t groups_seen = 0;  // bit g: an earlier slot of the token is in EP group g
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    if (k >= K) break;
    const int g = e[k] >> 16;  // -1 for a masked slot
    const bool local = e[k] >= 0 && g == my_ep;
    mine |= local;
    local_rows += local;
    warp_count(rows, local ? e[k] & 0xffff : -1);
    if (pos == 0) {  // the token goes to group g once, at its first slot there
      const bool first = e[k] >= 0 && (groups_seen >> g & 1u) == 0;
      if (e[k] >= 0) groups_seen |= uint64_t(1) << g;
      warp_count(group_tokens, first ? g : -1);
    }
  }
  // The errors, off the slot loops (rare): the last bad id, the first repeated expert.
  if (bad_id != -1) record_input_error(a.error, r, WaitRole::kBadExpertId, src, s.num_experts, uint64_t(int64_t(bad_id)));
  if (repeated >= 0) {
    const int id = (repeated >> 16) * E + (repeated & 0xffff);
    record_input_error(a.error, r, WaitRole::kRepeatedExpert, src, uint64_t(s.num_experts), uint64_t(id));
  }
  const int received = __syncthreads_count(mine);
  const int listed = __syncthreads_count(combine_lists(local_rows, a.combine_peers != nullptr));
  const int any_repeated = __syncthreads_or(repeated >= 0);
  for (int i = tid; i < E; i += kChunkTokens) plan.chunk_row_base[(int64_t(pos) * C + ch) * E + i] = rows[i];
  if (pos == 0)
    for (int g = tid; g < s.ep; g += kChunkTokens) plan.chunk_send_base[ch * W + g] = group_tokens[g];
  if (tid == 0) {
    plan.chunk_slot_base[pos * C + ch] = received;
    plan.chunk_list_base[pos * C + ch] = listed;
    plan.chunk_flags[pos * C + ch] = any_repeated;
  }
}

// Shared memory of the layout kernel: cnt[W][E], base[W][E], recv_cnt[W], tile_psum[E + 1],
// key_next[W], key_end[W], warp_cnt[W][kWarps], expert_rows[E]. What later steps read back is
// kept here rather than re-read from the plan in global memory (a load of a just-written value
// goes to L2: one latency per step of a serial chain).
struct LayoutSmem {
  int* cnt;
  int* base;
  int* recv_cnt;
  int* tile_psum;
  int* key_next;
  int* key_end;
  int* warp_cnt;
  int* expert_rows;
  __device__ LayoutSmem(int* p, const PlanShape& s) {
    const int W = s.world, E = s.experts_per_rank;
    cnt = p;
    base = cnt + W * E;
    recv_cnt = base + W * E;
    tile_psum = recv_cnt + W;
    key_next = tile_psum + E + 1;
    key_end = key_next + W;
    warp_cnt = key_end + W;
    expert_rows = warp_cnt + W * kWarps;
  }
  static size_t bytes(const PlanShape& s) {
    const int W = s.world, E = s.experts_per_rank;
    return sizeof(int) * size_t(2 * W * E + W + E + 1 + 2 * W + W * kWarps + E);
  }
};

// Exclusive prefix over the chunks of one counter, in place; returns the total. The counts are
// loaded 8 at a time before any is stored (one load latency per 8 chunks, not per chunk).
__device__ int chunk_prefix(int32_t* first, int64_t stride, int chunks) {
  constexpr int kBatch = 8;
  int running = 0;
  for (int ch0 = 0; ch0 < chunks; ch0 += kBatch) {
    int c[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) c[i] = ch0 + i < chunks ? first[(ch0 + i) * stride] : 0;
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (ch0 + i < chunks) {
        first[(ch0 + i) * stride] = running;
        running += c[i];
      }
  }
  return running;
}

// Layer1's M tiles cut in two (layer1_cut_m_tiles): only where the half tiles go last, in a list
// of the cooperative kernel's 256-column blocks (a ping-pong warpgroup computes all 128 rows
// from the tile's first row, so the second half would store over the next M tile's rows).
// The layout kernel asks (layer1's length and column targets); the placing kernel, which writes
// the lists, reads the length back.
template <class RowsOf>
__device__ int layer1_cuts(const DevicePlanArgs& a, const PlanShape& s, int combine_slots, const RowsOf& rows_of) {
  if (!a.half_tiles || combine_slots != 0 || a.layer1_width != 256) return 0;
  return layer1_cut_m_tiles(s.experts_per_rank, rows_of, s.n_blocks1, a.layer1_grid);
}

__global__ void __launch_bounds__(kThreads, 1) device_plan_layout_kernel(PlanShape s, const __grid_constant__ PlanBatch batch) {
  begin_dependent_kernel();
  const DevicePlanArgs& a = batch.ranks[blockIdx.x];
  const DevicePlanView& plan = a.plan;
  extern __shared__ int smem_raw[];
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int total_rows, total_tiles, bad_rows, cut_m;
  __shared__ int list_base[kMaxWorld + 1];  // combine_slots entries before each ring position
  __shared__ int recv_base[kMaxWorld + 1];  // received tokens before each ring position (recv_psum)
  LayoutSmem sm(smem_raw, s);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int W = s.world, E = s.experts_per_rank, C = s.chunks;
  const int r = a.rank;

  // Chunk counts -> chunk bases relative to their (ring position, expert), ring position, or
  // destination group; the totals per (ring position, expert) and per ring position.
  for (int i = tid; i < W * E; i += kThreads) {
    const int pos = i / E, e = i % E;
    sm.cnt[i] = chunk_prefix(plan.chunk_row_base + int64_t(pos) * C * E + e, E, C);
  }
  bool repeated = false;
  for (int pos = tid; pos < W; pos += kThreads) {
    sm.recv_cnt[pos] = chunk_prefix(plan.chunk_slot_base + pos * C, 1, C);
    list_base[pos + 1] = chunk_prefix(plan.chunk_list_base + pos * C, 1, C);
  }
  for (int i = tid; i < W * C; i += kThreads) repeated |= plan.chunk_flags[i] != 0;
  for (int g = tid; g < s.ep; g += kThreads) chunk_prefix(plan.chunk_send_base + g, W, C);
  if (tid == 0) total_rows = total_tiles = 0;
  repeated = __syncthreads_or(repeated);  // also: cnt and recv_cnt complete

  // Expert segments: tiles per expert scanned (a segment starts at 128 x the tiles before it),
  // row base of each (ring position, expert) inside the segment.
  for (int e0 = 0; e0 < E; e0 += kThreads) {
    const int e = e0 + tid;
    int n = 0;
    if (e < E)
      for (int pos = 0; pos < W; ++pos) n += sm.cnt[pos * E + e];
    const int tiles = (n + kGemmBlockM - 1) / kGemmBlockM;
    int before, sum;
    BlockScan(scan_storage).ExclusiveSum(tiles, before, sum);
    before += total_tiles;
    if (e < E) {
      plan.expert_rows[e] = n;
      sm.expert_rows[e] = n;
      plan.expert_offset[e] = before * kGemmBlockM;
      sm.tile_psum[e] = before;
      int b = before * kGemmBlockM;
      for (int pos = 0; pos < W; ++pos) {
        sm.base[pos * E + e] = b;
        b += sm.cnt[pos * E + e];
      }
      atomicAdd(&total_rows, n);  // an order-free integer sum
    }
    __syncthreads();  // scan storage reused; everyone read total_tiles
    if (tid == 0) total_tiles += sum;
    __syncthreads();
  }
  const int num_m = total_tiles, offset_end = num_m * kGemmBlockM;
  if (tid == 0) {
    plan.expert_offset[E] = offset_end;
    sm.tile_psum[E] = num_m;
    plan.counts[0] = num_m;
    plan.counts[1] = total_rows;
    plan.counts[2] = 1;
    list_base[0] = 0;
    for (int pos = 0; pos < W; ++pos) list_base[pos + 1] += list_base[pos];
    plan.counts[3] = list_base[W];
    recv_base[0] = 0;
    for (int pos = 0; pos < W; ++pos) recv_base[pos + 1] = recv_base[pos] + sm.recv_cnt[pos];
    // Rows beyond the buffers, or an expert repeated within a token (which breaks the row
    // placement): refuse the whole plan.
    bad_rows = offset_end > s.max_rows || repeated;
    if (offset_end > s.max_rows)
      record_input_error(a.error, r, WaitRole::kRowOverflow, r, uint64_t(s.max_rows), uint64_t(offset_end));
    cut_m = bad_rows ? 0 : layer1_cuts(a, s, plan.counts[3], [&](int e) { return sm.expert_rows[e]; });
    if (bad_rows) {
      plan.counts[0] = 0;
      plan.counts[2] = 0;  // the placing kernel writes nothing
      plan.counts[3] = 0;
      plan.num_tiles[0] = plan.num_tiles[1] = 0;
    } else {
      plan.num_tiles[0] = num_m * s.n_blocks0;
      plan.num_tiles[1] = (num_m + cut_m) * s.n_blocks1;
    }
  }
  __syncthreads();
  for (int pos = tid; pos <= W; pos += kThreads) {
    if (pos < W) plan.recv_count[pos] = sm.recv_cnt[pos];
    plan.recv_psum[pos] = bad_rows ? 0 : recv_base[pos];  // refused: nothing to dispatch or combine
  }
  if (bad_rows) {
    // No later kernel may follow stale indices: the own tokens are sent nowhere. The combine's
    // claim counter starts from 0 as after an accepted plan: its warps still claim (and find
    // nothing), and refused forwards in a row would otherwise raise it until it wrapped.
    const int T = published_tokens(a, s, r, false);
    for (int64_t i = tid; i < int64_t(T) * W; i += kThreads) plan.send_pos[i] = -1;
    if (a.combine_claims != nullptr && tid == 0) *a.combine_claims = 0;
    return;
  }

  // Chunk bases made absolute: the source's row base per expert, the source's first slot.
  for (int i = tid; i < W * C * E; i += kThreads) {
    const int pos = i / (C * E), e = i % E;
    plan.chunk_row_base[i] += sm.base[pos * E + e];
  }
  for (int i = tid; i < W * C; i += kThreads) {
    plan.chunk_slot_base[i] += recv_base[i / C];
    plan.chunk_list_base[i] += list_base[i / C];
  }

  // M tiles (expert-major) and the layer0 order (Layer0Schedule, include/comet/plan.h): a
  // stable counting sort of the tiles by the stage of their last ring position, odd stages
  // reversed. key_next[k] is where the next tile of stage k goes (inside a chunk of tiles,
  // warps in order, lanes in order); key_end[k] is one past the stage's last position.
  const int stages = a.layer0_stages > 0 ? min(a.layer0_stages, W) : W;
  auto stage_of = [&](int last_pos) { return layer0_stage(last_pos, stages, W); };
  auto expert_of = [&](int m) { return find_range(sm.tile_psum, E, m); };  // largest e with tile_psum[e] <= m
  for (int i = tid; i < W; i += kThreads) sm.key_next[i] = 0;
  __syncthreads();
  for (int m = tid; m < num_m; m += kThreads) {
    const int e = expert_of(m), i = m - sm.tile_psum[e];
    const int rows = min(kGemmBlockM, sm.expert_rows[e] - i * kGemmBlockM);
    const int first_row = m * kGemmBlockM;  // segments are whole tiles: M tile m starts at row 128 m
    const int last_row = first_row + rows - 1;
    int last = 0;
    for (int pos = W - 1; pos >= 0; --pos)
      if (sm.cnt[pos * E + e] > 0 && sm.base[pos * E + e] <= last_row) {
        last = pos;
        break;
      }
    plan.m_tile_row[m] = first_row;
    plan.m_tile_rows[m] = rows;
    plan.m_tile_last[m] = last;
    atomicAdd(&sm.key_next[stage_of(last)], 1);
  }
  // Padding rows (past an expert's rows in its last tile) move nothing and store nothing.
  for (int i = tid; i < E * kGemmBlockM; i += kThreads) {
    const int e = i / kGemmBlockM, row = sm.tile_psum[e] * kGemmBlockM + sm.expert_rows[e] + i % kGemmBlockM;
    if (row < sm.tile_psum[e + 1] * kGemmBlockM) {
      plan.row_source[row] = -1;
      plan.row_combine[row] = RowCombine{nullptr, 0.f, 0};
    }
  }
  __syncthreads();
  if (tid == 0)
    for (int p = 0, start = 0; p < W; ++p) {
      const int n = sm.key_next[p];
      sm.key_next[p] = start;
      start += n;
      sm.key_end[p] = start;
    }
  for (int m0 = 0; m0 < num_m; m0 += kThreads) {
    const int m = m0 + tid;
    const int key = m < num_m ? stage_of(plan.m_tile_last[m]) : -1;  // written by this thread above
    const unsigned same = __match_any_sync(kFullWarp, key);
    const int rank_in_warp = __popc(same & ((1u << lane) - 1u));
    for (int i = tid; i < W * kWarps; i += kThreads) sm.warp_cnt[i] = 0;
    __syncthreads();
    if (key >= 0 && lane == __ffs(same) - 1) sm.warp_cnt[key * kWarps + warp] = __popc(same);
    __syncthreads();
    for (int p = tid; p < W; p += kThreads) {  // per key: exclusive scan over the warps
      int next = sm.key_next[p];
      for (int w = 0; w < kWarps; ++w) {
        const int c = sm.warp_cnt[p * kWarps + w];
        sm.warp_cnt[p * kWarps + w] = next;
        next += c;
      }
      sm.key_next[p] = next;
    }
    __syncthreads();
    if (key >= 0) {
      const int at = sm.warp_cnt[key * kWarps + warp] + rank_in_warp;  // ascending inside the stage
      const int key_begin = key == 0 ? 0 : sm.key_end[key - 1];
      plan.layer0_order[key % 2 == 0 ? at : key_begin + sm.key_end[key] - 1 - at] = m;
    }
    __syncthreads();  // warp_cnt is zeroed again for the next chunk
  }

  // Epoch targets of this call (docs/protocol.md): each counter rises by exactly the expected
  // count, so target = what earlier calls delivered + this call's expectation.
  if (a.combine_claims != nullptr && tid == 0) *a.combine_claims = 0;
  if (a.tile_base != nullptr) {
    for (int m = tid; m < num_m; m += kThreads) {
      a.tile_target[m] = a.tile_base[m] + uint64_t(plan.m_tile_rows[m]);
      a.tile_base[m] = a.tile_target[m];
    }
    for (int j = tid; j < s.n_blocks1; j += kThreads) {
      a.col_target[j] = a.col_base[j] + uint64_t(num_m + cut_m);  // a cut M tile stores two
      a.col_base[j] = a.col_target[j];
    }
  }
}

// The GEMM tile lists from the layout (layer0's groups follow the layer0 order), by thread
// `thread` of `threads`: the placing kernel's blocks share them, since one block (the layout
// kernel) would take a tile per thread and step, thousands of tiles.
__device__ void write_tile_lists(const DevicePlanArgs& a, const PlanShape& s, int thread, int threads) {
  const DevicePlanView& plan = a.plan;
  const int num_m = plan.counts[0], E = s.experts_per_rank;
  // expert_offset[e] = 128 x the M tiles before expert e: the largest e with expert_offset[e]
  // <= 128 m holds M tile m.
  auto expert_of = [&](int m) { return find_range(plan.expert_offset, E, int64_t(m) * kGemmBlockM); };
  auto tile_rows = [&](int m) { return a.half_tiles ? plan.m_tile_rows[m] : kGemmBlockM; };
#pragma unroll 1
  for (int i = thread; i < num_m * s.n_blocks0; i += threads) {
    int q, n;
    raster_tile(TileOrder::kRowMajor, a.layer0_group_m, i, num_m, s.n_blocks0, q, n);
    const int m = plan.layer0_order[q];
    plan.tiles0[i] = make_gemm_tile(m * kGemmBlockM, n, expert_of(m), m * kGemmBlockM + tile_rows(m), m);
  }
  // Layer1 in column-block groups, so that the combine can start on the first groups. With no
  // combine slots listed (every token's only row here leaves through GEMM1's epilogue, as with
  // one expert per rank), nothing waits for a column block, and the half tiles (an expert's last
  // M tile of at most 64 rows, about half a tile's time) go after all whole tiles, in the same
  // groups: the claims then fill the last round with them instead of starting a whole tile
  // there. Mixtral at 1024 tokens per rank with 2049-2112 rows (256 whole tiles and 16 half
  // ones, 264 tile-times for 132 blocks) can then end after two rounds of tiles, not two and a
  // half. Where layer1_cuts says so, a last M tile of 65-127 rows is two half tiles there, rows
  // [0, 64) and [64, rows) of the tile (layer1_cut_m_tiles).
  const bool halves_last = a.half_tiles && plan.counts[3] == 0;
  // The layout kernel counted the cut M tiles (layer1_cuts) into layer1's length; read back here
  // rather than asked again, which would cost this kernel registers it does not have.
  const int tiles1 = plan.num_tiles[1];
  const int cut_halves = halves_last && tiles1 > num_m * s.n_blocks1 ? 2 : 0;  // of a cut M tile
  // Half tiles of expert e's last M tile where they go last: 1 (at most 64 rows), 2 (cut), 0 (a
  // whole tile).
  auto halves_of = [&](int e) {
    const int first = plan.expert_offset[e] / kGemmBlockM, end = plan.expert_offset[e + 1] / kGemmBlockM;
    if (end == first) return 0;
    const int rows = tile_rows(end - 1);
    return rows <= kGemmBlockM / 2 ? 1 : rows < kGemmBlockM ? cut_halves : 0;
  };
  int half_entries = 0, split_m = 0;  // half tiles; M tiles run as half tiles
  if (halves_last) {
#pragma unroll 1
    for (int e = 0; e < E; ++e) {
      const int h = halves_of(e);
      half_entries += h;
      split_m += h > 0 ? 1 : 0;
    }
  }
  const int whole_m = num_m - split_m;
  // The first row of the j-th whole M tile, or of the j-th half tile (part 0 or 1 of its M tile:
  // 64 rows further for part 1), in expert order, and its expert.
  auto first_row_of = [&](int j, bool half, int& expert) {
#pragma unroll 1
    for (int e = 0; e < E; ++e) {
      const int first = plan.expert_offset[e] / kGemmBlockM, tiles = plan.expert_offset[e + 1] / kGemmBlockM - first;
      const int h = halves_of(e);
      const int here = half ? h : tiles - (h > 0 ? 1 : 0);
      if (j < here) {
        expert = e;
        return half ? (first + tiles - 1) * kGemmBlockM + j * (kGemmBlockM / 2) : (first + j) * kGemmBlockM;
      }
      j -= here;
    }
    expert = E - 1;
    return (num_m - 1) * kGemmBlockM;  // not reached: j is below whole_m or half_entries
  };
#pragma unroll 1
  for (int i = thread; i < tiles1; i += threads) {  // (whole_m + half_entries) x the column blocks
    int begin, n, e;
    if (half_entries == 0) {
      raster_tile(TileOrder::kColumnBlockMajor, s.raster_n1, i, num_m, s.n_blocks1, begin, n);
      e = expert_of(begin);
      begin *= kGemmBlockM;
    } else {
      const bool half = i >= whole_m * s.n_blocks1;
      const int j = half ? i - whole_m * s.n_blocks1 : i;
      raster_tile(TileOrder::kColumnBlockMajor, s.raster_n1, j, half ? half_entries : whole_m, s.n_blocks1, begin, n);
      begin = first_row_of(begin, half, e);
    }
    // A half tile ends 64 rows after its first row at most (the first of a cut M tile's two).
    const int m = begin / kGemmBlockM, end = m * kGemmBlockM + tile_rows(m);
    plan.tiles1[i] = make_gemm_tile(begin, n, e, i >= whole_m * s.n_blocks1 ? min(begin + kGemmBlockM / 2, end) : end, m);
  }
}

// Chunk blockIdx.x of ring position blockIdx.y of rank batch.ranks[blockIdx.z]: the chunk's
// tokens get consecutive slots from chunk_slot_base (block scan), each (token, slot) its row:
// the expert's chunk base, plus the earlier warps' count, plus its rank in the warp. Chunks of
// the own tokens (ring position 0) also write the send positions to every destination.
__device__ __forceinline__ void place_chunk(const PlanShape& s, const DevicePlanArgs& a) {
  const DevicePlanView& plan = a.plan;
  const int ch = int(blockIdx.x), pos = int(blockIdx.y);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int W = s.world, E = s.experts_per_rank, K = s.topk, R = s.rows_per_token;
  const int r = a.rank, my_ep = r / s.tp, src = (r + pos) % W;
  const int T = published_tokens(a, s, src, false);
  if (ch * kChunkTokens >= T) return;
  extern __shared__ int smem_raw[];
  int* warp_cnt = smem_raw;                      // [kChunkWarps][E]
  int* chunk_base = warp_cnt + kChunkWarps * E;  // [E]
  unsigned* warp_mask = reinterpret_cast<unsigned*>(chunk_base + E);  // [kChunkWarps][E]
  __shared__ typename ChunkScan::TempStorage scan_storage;
  const int32_t* ids = a.route_ids[src];
  const float* weights = a.route_weights[src];
  for (int e = tid; e < E; e += kChunkTokens) chunk_base[e] = plan.chunk_row_base[(int64_t(pos) * s.chunks + ch) * E + e];
  const int t = ch * kChunkTokens + tid;
  // Loops over a token's slots run to kMaxTopk, unrolled, with k < K as a guard, so the slots'
  // local experts stay in registers (a loop to the runtime K indexes them, which puts them in
  // local memory), two per register (SlotIds).
  SlotIds lk;
  int local_rows = 0;
  uint64_t groups = 0;  // bit g: the token has an expert in EP group g
#pragma unroll
  for (int k = 0; k < kMaxTopk; ++k) {
    const int e = k < K && t < T ? ids[size_t(t) * K + k] : -1;  // bad ids were reported by the counting kernel
    const bool valid = e >= 0 && e < s.num_experts;
    if (valid) {
      const int g = s.group_of(e);
      if (g == my_ep) {
        lk.set(k, e - g * E);
        ++local_rows;
      }
      groups |= uint64_t(1) << g;
    }
  }
  const int mine = local_rows > 0;
  const bool singles = a.combine_peers != nullptr;  // single-row tokens go to GEMM1's epilogue
  int p, total, listed_before, listed_total;
  ChunkScan(scan_storage).ExclusiveSum(mine, p, total);
  __syncthreads();  // scan storage reused
  ChunkScan(scan_storage).ExclusiveSum(int(combine_lists(local_rows, singles)), listed_before, listed_total);
  if (pos == 0)
    for (int g = 0; g < s.ep; ++g) {  // send positions: the token's rank among the own tokens for group g
      const int flag = int(groups >> g & 1u);
      int q, n;
      __syncthreads();  // scan storage reused
      ChunkScan(scan_storage).ExclusiveSum(flag, q, n);
      if (t < T) {
        const int at = flag ? plan.chunk_send_base[ch * W + g] + q : -1;
        for (int d = g * s.tp; d < (g + 1) * s.tp; ++d) plan.send_pos[size_t(t) * W + d] = at;
      }
    }
  // Rank of each slot among this warp's earlier tokens with the same expert: the warp's lanes
  // holding expert e as a bit mask per e (shared atomics; a token holds an expert at most once,
  // a repeat refused the plan above); a slot's rank is the count of the lanes below its own.
  unsigned* my_masks = warp_mask + warp * E;
  for (int e = lane; e < E; e += 32) my_masks[e] = 0;
  __syncwarp();
#pragma unroll
  for (int k = 0; k < kMaxTopk; ++k)
    if (k < K && lk.get(k) >= 0) atomicOr(&my_masks[lk.get(k)], 1u << lane);
  __syncwarp();
  for (int e = lane; e < E; e += 32) warp_cnt[warp * E + e] = __popc(my_masks[e]);
  __syncthreads();
  // Per expert: exclusive scan over warps on top of the chunk's base.
  for (int e = tid; e < E; e += kChunkTokens) {
    int acc = chunk_base[e];
    for (int w = 0; w < kChunkWarps; ++w) {
      const int c = warp_cnt[w * E + e];
      warp_cnt[w * E + e] = acc;
      acc += c;
    }
  }
  __syncthreads();
  if (mine) {
    const int slot = plan.chunk_slot_base[pos * s.chunks + ch] + p;
    plan.recv_token[slot] = t;
    const bool single = singles && local_rows == 1;
    if (!single) plan.combine_slots[plan.chunk_list_base[pos * s.chunks + ch] + listed_before] = slot;
    // A single row's partial is the row itself, weighted: its owner's combine_recv row (the
    // combine's destination, comm_rows.cuh) takes it from GEMM1's epilogue.
    void* dst = nullptr;
    if (single) {
      const int owner = (r + pos) % W, position = slot - plan.recv_psum[pos];
      dst = combine_recv_row(a.combine_peers[owner], a.combine_offset, r, s.t_max, position, s.hidden);
    }
    int j = 0;
    uint32_t bad_weight = 0;  // the bits of a NaN or infinite weight (never 0), reported after the loop
#pragma unroll
    for (int k = 0; k < kMaxTopk; ++k) {
      const int e = lk.get(k);
      if (k >= K || e < 0 || j >= R) continue;
      const unsigned lanes_below = (1u << lane) - 1u;
      const int row = warp_cnt[warp * E + e] + __popc(my_masks[e] & lanes_below);
      const float w = weights[size_t(t) * K + k];
      bad_weight = isfinite(w) ? bad_weight : __float_as_uint(w);
      plan.recv_rows[size_t(slot) * R + j] = row;
      plan.row_source[row] = pack_row_source(pos, t);
      plan.recv_weight[size_t(slot) * R + j] = w;
      plan.row_combine[row] = RowCombine{dst, single ? w : 0.f, 0};
      ++j;
    }
    for (; j < R; ++j) {
      plan.recv_rows[size_t(slot) * R + j] = -1;
      plan.recv_weight[size_t(slot) * R + j] = 0.f;
    }
    if (bad_weight != 0) record_input_error(a.error, r, WaitRole::kBadWeight, src, 0, bad_weight);
  }
}

__global__ void __launch_bounds__(kChunkTokens, kChunkBlocksPerSm)
    device_plan_place_kernel(PlanShape s, const __grid_constant__ PlanBatch batch) {
  begin_dependent_kernel();
  const DevicePlanArgs& a = batch.ranks[blockIdx.z];
  if (a.plan.counts[2] == 0) return;  // a refused plan places nothing (the counting kernels said why)
  place_chunk(s, a);
  // After the chunk (fewer registers live): every block, also one past the source's tokens.
  write_tile_lists(a, s, int(blockIdx.y * gridDim.x + blockIdx.x) * kChunkTokens + int(threadIdx.x),
                   int(gridDim.x * gridDim.y) * kChunkTokens);
}

// `layer1_width`: the launch's layer1 column width (DevicePlanArgs::layer1_width).
PlanShape plan_shape(const LayerConfig& c, int layer1_width) {
  const DevicePlanLayout layout(c);
  PlanShape s;
  s.world = c.layout.world;
  s.tp = c.layout.tp;
  s.ep = c.layout.ep;
  s.experts_per_rank = c.experts_per_rank();
  s.num_experts = c.model.num_experts;
  s.topk = c.model.topk;
  s.t_max = c.max_tokens_per_rank;
  s.rows_per_token = layout.rows_per_token;
  s.hidden = c.model.hidden;
  s.max_rows = layout.max_rows;
  s.max_m_tiles = layout.max_m_tiles;
  s.n_blocks0 = int(layout.n_blocks0);
  s.n_blocks1 = (s.hidden + layer1_width - 1) / layer1_width;  // at most layout.n_blocks1 (128 wide)
  s.raster_n1 = combine_group_blocks(layer1_width);
  s.chunks = (s.t_max + kChunkTokens - 1) / kChunkTokens;
  s.group_of = ExpertGroupOf::for_experts_per_rank(s.experts_per_rank);
  return s;
}

// The plan kernels' bounds on a shape (shared memory, 32-bit indices, exact expert groups):
// checked at every launch and, through device_plan_can_implement, before a layer is built.
// The layer1 column widths a launch may ask for: GEMM1's tile widths (ping-pong, cooperative).
constexpr int kLayer1Widths[] = {128, 256};

// The plan kernels' dynamic shared memory limit (check_plan_shape refuses shapes above it).
constexpr size_t kPlanSmemLimit = 200 * 1024;

size_t count_smem_bytes(const PlanShape& s) { return sizeof(int) * size_t(s.experts_per_rank + s.ep); }
size_t place_smem_bytes(const PlanShape& s) { return sizeof(int) * size_t(2 * kChunkWarps + 1) * s.experts_per_rank; }

void check_plan_shape(const PlanShape& s) {
  // The placing kernel keeps a token's EP groups in a 64-bit mask.
  COMET_CHECK(s.world <= kMaxWorld, "build_device_plan: at most " << kMaxWorld << " ranks, got " << s.world);
  const size_t layout_smem = LayoutSmem::bytes(s), place_smem = place_smem_bytes(s);
  COMET_CHECK(layout_smem <= kPlanSmemLimit && place_smem <= kPlanSmemLimit,
              "build_device_plan: " << std::max(layout_smem, place_smem) << " bytes of shared memory for W=" << s.world
                                    << " and E/EP=" << s.experts_per_rank << " is too much");
  // Implied by the shared-memory bound (68 bytes per local expert), stated for SlotIds.
  COMET_CHECK(s.experts_per_rank <= kSlotIdCount,
              "build_device_plan: " << s.experts_per_rank << " experts per rank, at most " << kSlotIdCount);
  COMET_CHECK(s.experts_per_rank <= kMaxGemmExperts, "build_device_plan: " << s.experts_per_rank
                                                         << " experts per rank, the tiles hold at most "
                                                         << kMaxGemmExperts);
  // The layout kernel indexes the chunk counts and the tile lists in 32 bits.
  COMET_CHECK(int64_t(s.world) * s.chunks * s.experts_per_rank < INT32_MAX,
              "build_device_plan: T_max " << s.t_max << " with W=" << s.world << " and E/EP=" << s.experts_per_rank
                                          << " is too large for the device plan's 32-bit indices");
  COMET_CHECK(s.max_m_tiles * std::max(s.n_blocks0, s.n_blocks1) < INT32_MAX,
              "build_device_plan: " << s.max_m_tiles << " M tiles x " << std::max(s.n_blocks0, s.n_blocks1)
                                    << " column blocks are too many GEMM tiles for the device plan's 32-bit indices "
                                       "(fewer tokens per rank, or a smaller H or F/TP)");
  // PlanShape::group_of is exact below this bound (the counting kernel's packed slots also need
  // local experts below 2^16: kSlotIdCount above).
  COMET_CHECK(ExpertGroupOf::exact_below(s.num_experts, s.experts_per_rank),
              "build_device_plan: " << s.num_experts << " experts x " << s.experts_per_rank
                                    << " per rank is too many (their product must stay below 2^32)");
}

}  // namespace

DevicePlanLayout::DevicePlanLayout(const LayerConfig& c) {
  c.check();
  COMET_CHECK(c.tiles.block_m == kGemmBlockM, "the CUDA backend needs tiles.block_m = " << kGemmBlockM << ", got "
                                                                                        << c.tiles.block_m);
  COMET_CHECK(c.model.topk <= kMaxTopk, "the CUDA backend supports topk <= " << kMaxTopk << ", got " << c.model.topk);
  COMET_CHECK(c.max_tokens_per_rank >= 1,
              "the device plan needs max_tokens_per_rank >= 1 (its kernels have a block per token chunk), got "
                  << c.max_tokens_per_rank);
  const int64_t W = c.layout.world, Tm = c.max_tokens_per_rank, E = c.experts_per_rank();
  const int64_t chunks = (Tm + kChunkTokens - 1) / kChunkTokens;
  COMET_CHECK(Tm < (int64_t(1) << kRowSourceTokenBits),
              "the device plan needs max_tokens_per_rank below 2^" << kRowSourceTokenBits << ", got " << Tm);
  rows_per_token = std::min<int>(c.model.topk, int(E));
  max_rows = c.max_rows_per_rank();
  max_m_tiles = c.max_m_tiles_per_rank();
  n_blocks0 = gemm_num_n_blocks(GemmEpilogue::kSwiGlu, c.ffn_per_rank(), GemmKernel::kCooperative128x256);
  // Sized for the narrowest layer1 column blocks (DevicePlanArgs::layer1_width).
  n_blocks1 = gemm_num_n_blocks(GemmEpilogue::kIdentity, c.model.hidden, GemmKernel::kPingpong128x128);
  max_tiles1 = (max_m_tiles + E) * n_blocks1;  // at most one cut M tile per expert
  const int64_t K = rows_per_token;
  const int64_t sizes[] = {E * 4, (E + 1) * 4, W * 4, (W + 1) * 4, W * Tm * 4, W * Tm * K * 4, W * Tm * K * 4,
                           Tm * W * 4, max_m_tiles * 4, max_m_tiles * 4, max_m_tiles * 4, max_m_tiles * 4, 4 * 4,
                           max_m_tiles * n_blocks0 * int64_t(sizeof(GemmTile)),
                           max_tiles1 * int64_t(sizeof(GemmTile)), 2 * 4, W * chunks * E * 4,
                           W * chunks * 4, chunks * W * 4, W * chunks * 4, max_rows * 4,
                           max_rows * int64_t(sizeof(RowCombine)), W * Tm * 4, W * chunks * 4};
  for (int64_t bytes : sizes) {
    offsets_.push_back(total_bytes_);
    total_bytes_ += (bytes + 255) / 256 * 256;
  }
}

DevicePlanView DevicePlanLayout::view(void* base) const {
  auto at = [&](int i) { return static_cast<char*>(base) + offsets_[i]; };
  return {reinterpret_cast<int32_t*>(at(0)),  reinterpret_cast<int32_t*>(at(1)),  reinterpret_cast<int32_t*>(at(2)),
          reinterpret_cast<int32_t*>(at(3)),  reinterpret_cast<int32_t*>(at(4)),  reinterpret_cast<int32_t*>(at(5)),
          reinterpret_cast<float*>(at(6)),    reinterpret_cast<int32_t*>(at(7)),  reinterpret_cast<int32_t*>(at(8)),
          reinterpret_cast<int32_t*>(at(9)),  reinterpret_cast<int32_t*>(at(10)), reinterpret_cast<int32_t*>(at(11)),
          reinterpret_cast<int32_t*>(at(12)), reinterpret_cast<GemmTile*>(at(13)), reinterpret_cast<GemmTile*>(at(14)),
          reinterpret_cast<int32_t*>(at(15)), reinterpret_cast<int32_t*>(at(16)), reinterpret_cast<int32_t*>(at(17)),
          reinterpret_cast<int32_t*>(at(18)), reinterpret_cast<int32_t*>(at(19)), reinterpret_cast<int32_t*>(at(20)),
          reinterpret_cast<RowCombine*>(at(21)), reinterpret_cast<int32_t*>(at(22)), reinterpret_cast<int32_t*>(at(23))};
}

namespace {

// Raises `kernel`'s shared memory limit on the current device to `bytes` when it is lower, never
// lowers it. Set on every launch to that launch's size, the limit could be lowered by another
// layer's plan, launched from another host thread, between this thread's set and its launch.
void allow_plan_smem(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> allowed;  // (kernel, device) -> limit set
  int device = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& limit = allowed[{kernel, device}];
  if (bytes <= limit) return;
  COMET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  limit = bytes;
}

// The chunk kernels in the instantiation for up to kSlots slots per token, then the layout.
template <int kSlots>
void launch_plan_kernels(const PlanShape& s, const DevicePlanArgs* args, int count, size_t count_smem,
                         size_t layout_smem, size_t place_smem, CUstream_st* stream) {
  allow_plan_smem(reinterpret_cast<const void*>(device_plan_count_kernel<kSlots>), count_smem);
  allow_plan_smem(reinterpret_cast<const void*>(device_plan_layout_kernel), layout_smem);
  allow_plan_smem(reinterpret_cast<const void*>(device_plan_place_kernel), place_smem);
  for (int first = 0; first < count; first += kPlanBatch) {
    PlanBatch batch{};
    const int n = std::min(kPlanBatch, count - first);
    std::copy(args + first, args + first + n, batch.ranks);
    const dim3 chunks(s.chunks, s.world, n);
    launch_kernel(device_plan_count_kernel<kSlots>, chunks, dim3(kChunkTokens), count_smem, stream, LaunchAttributes(), s, batch);
    launch_kernel(device_plan_layout_kernel, dim3(n), dim3(kThreads), layout_smem, stream, LaunchAttributes(), s, batch);
    launch_kernel(device_plan_place_kernel, chunks, dim3(kChunkTokens), place_smem, stream, LaunchAttributes(), s, batch);
  }
}

}  // namespace

void build_device_plans(const LayerConfig& config, const DevicePlanArgs* args, int count, CUstream_st* stream) {
  // Layer1's column blocks, as wide as the launch's GEMM1 tiles (the same for every rank).
  const int width = count > 0 ? args[0].layer1_width : 0;
  COMET_CHECK(std::find(std::begin(kLayer1Widths), std::end(kLayer1Widths), width) != std::end(kLayer1Widths),
              "build_device_plan: layer1_width " << width << " must be 128 or 256");
  for (int i = 0; i < count; ++i)
    COMET_CHECK(args[i].layer1_width == width, "build_device_plan: the ranks of one launch disagree on layer1_width");
  const PlanShape s = plan_shape(config, width);
  for (int i = 0; i < count; ++i) {
    const DevicePlanArgs& a = args[i];
    COMET_CHECK(a.rank >= 0 && a.rank < s.world, "build_device_plan: rank " << a.rank << " outside [0, " << s.world << ")");
    COMET_CHECK(a.token_counts && a.route_ids && a.route_weights && a.error,
                "build_device_plan: a null routing or error pointer");
    COMET_CHECK(a.layer0_group_m >= 1, "build_device_plan: layer0_group_m " << a.layer0_group_m << " must be >= 1");
    COMET_CHECK(a.layer0_stages >= 0, "build_device_plan: layer0_stages " << a.layer0_stages << " must be >= 0");
  }
  check_plan_shape(s);
  const size_t count_smem = count_smem_bytes(s), layout_smem = LayoutSmem::bytes(s), place_smem = place_smem_bytes(s);
  if (s.topk <= kFewSlots)
    launch_plan_kernels<kFewSlots>(s, args, count, count_smem, layout_smem, place_smem, stream);
  else
    launch_plan_kernels<kMaxTopk>(s, args, count, count_smem, layout_smem, place_smem, stream);
}

Status device_plan_can_implement(const LayerConfig& config) {
  try {
    for (int width : kLayer1Widths) check_plan_shape(plan_shape(config, width));  // with DevicePlanLayout's checks
  } catch (const Error& e) {
    return Status::failure(e.what());
  }
  return Status::success();
}

void build_device_plan(const LayerConfig& config, const DevicePlanArgs& args, CUstream_st* stream) {
  build_device_plans(config, &args, 1, stream);
}

}  // namespace comet::cuda
