// cuda/comm_rows.cuh: the data movement of one rank's layer, written once and used twice: by
// the communication blocks of the fused kernels (with signals) and by the unfused pipeline's
// copy kernels (without). Same code, same arithmetic: fused and unfused are bitwise equal by
// construction, not by two implementations agreeing.
//
//   dispatch  one warp per received token (ring order, own rows first), kDispatchTokens tokens
//             at once: every lane loads kCopyUnroll 16-byte chunks of each owner's row before
//             storing any of them, then stores them to every A row the token feeds; with
//             tile_arrivals set, each lane owning one of those rows release-adds 1 to the row's
//             M tile counter. With f.dispatch_by_row (DispatchOrder::kRows) the items are the A
//             rows in order instead (expert-major, GEMM0's order), each read from its owner
//             through plan.row_source and written once
//   combine   one warp per item (column group, listed received token), column-group-major: the
//             token's rows are summed in fp32 in slot order (acc = fma(w, x, acc)), kCombineUnroll
//             chunks per lane of up to kCombineRows rows loaded before their fmas, rounded to
//             bf16 once and stored into the owner's combine_recv slot; with col_done set, a warp
//             acquire-waits every column block of a group once when it enters the group; with
//             combine_claims set, warps claim items from a counter, so blocks that finish their
//             GEMM tiles join in
//   tracing   with f.trace set, lane 0 of each warp records its chunks and waits
//             (cuda/trace_record.cuh); the data movement is the same either way
//
// Why this shape (H200, docs/results/): a warp that loads one chunk per lane and stores it
// before the next load is bound by load latency (~1 us per 512 bytes per warp, more across
// NVLink); keeping 8 chunks per lane of each of 2 tokens in flight (dispatch) and the chunks of
// up to 4 rows (combine) gives each SM that many times the bytes in flight. Where a token's rows
// come from and go is itself a load (the plan's entries), so every loop loads the next item's
// entries before it moves the current one: one load latency per item instead of two (on one
// H200, W = 8: communication-only 14-16% shorter on qwen3 and deepseek, docs/results). The fused
// kernels' register budget is the GEMM's (168 per thread), so the copies' registers are free there.
//
// NOTES (memory ordering): dispatch lanes fence their row stores (__threadfence), the warp
// synchronizes, then the lanes holding a row release-add; the GEMM producer's acquire plus
// fence.proxy.async makes the rows visible to its TMA loads. In combine, lane 0 acquires, the
// warp synchronizes, and every lane then reads the column block with ordinary loads.
#pragma once

#include <cuda_bf16.h>

#include "cuda/bf16_rows.cuh"
#include "cuda/fused_layer.h"
#include "cuda/gemm_schedule.h"  // find_range
#include "cuda/grouped_gemm.h"
#include "cuda/link_pace.cuh"
#include "cuda/signal.cuh"
#include "cuda/trace_record.cuh"

namespace comet::cuda {

inline constexpr int kCopyUnroll = 8;     // 16-byte chunks in flight per lane and token (dispatch)
inline constexpr int kDispatchTokens = 2; // tokens a dispatch warp moves at once
inline constexpr int kMaxRowsPerToken = 32;  // a token's local rows fit one warp's lanes
inline constexpr int kMaxWorld = 64;         // ranks (recv_psum is staged in shared memory)

// Ring position of received slot `slot` (largest p with psum[p] <= slot; a binary search, so
// that W = 64 costs 6 steps per item, not 63), psum in shared memory.
__device__ __forceinline__ int ring_pos(const int32_t* psum, int world, int slot) {
  return find_range(psum, world, slot);
}

// Rank `rank`'s partial row of the token at `position` among its owner's tokens, in the owner's
// combine_recv region ([W][T_max][hidden] bf16, by sending rank) at `combine_offset` of the
// owner's heap `owner_heap`: where the combine (and GEMM1's epilogue, for a token's only row)
// stores it and the owner reduce reads it.
__host__ __device__ __forceinline__ uint4* combine_recv_row(void* owner_heap, int64_t combine_offset, int rank,
                                                            int t_max, int position, int hidden) {
  return reinterpret_cast<uint4*>(static_cast<char*>(owner_heap) + combine_offset) +
         (int64_t(rank) * t_max + position) * (hidden / 8);
}

// Whether the combine moves a received token with `local_rows` rows on this rank: with the
// epilogue combine (GEMM1 stores a token's only row itself) those with two or more, else all.
// The plan's counting and placing kernels both list by it, so their list bases agree.
__host__ __device__ __forceinline__ bool combine_lists(int local_rows, bool epilogue_combine) {
  return local_rows >= (epilogue_combine ? 2 : 1);
}

// The block's copy of recv_psum [W + 1]; every thread of the block must call it.
__device__ inline void load_recv_psum(const FusedCommArgs& f, int32_t* psum) {
  for (int i = int(threadIdx.x); i <= f.world; i += int(blockDim.x)) psum[i] = f.plan.recv_psum[i];
  __syncthreads();
}

// The plan's entries for kDispatchTokens items: per lane, the item's A row `lane` (-1 past its
// rows), the token's index at its source and the source's ring position (-1: nothing to move).
// Items are received slots (ring order; every A row the token feeds) or, with f.dispatch_by_row,
// A rows (expert-major; one row each, from plan.row_source). Loaded one batch ahead.
struct DispatchBatch {
  int my_row[kDispatchTokens];
  int token[kDispatchTokens];
  int pos[kDispatchTokens];
};
__device__ __forceinline__ DispatchBatch load_dispatch_batch(const FusedCommArgs& f, const int32_t* psum, int first,
                                                             int num_warps, int total, int lane) {
  DispatchBatch batch;
#pragma unroll
  for (int b = 0; b < kDispatchTokens; ++b) {
    const int item = first + b * num_warps;
    batch.my_row[b] = -1;
    batch.token[b] = 0;
    batch.pos[b] = -1;
    if (item >= total) continue;
    if (f.dispatch_by_row) {
      const int source = f.plan.row_source[item];
      if (source < 0) continue;  // an expert's padding row
      batch.my_row[b] = lane == 0 ? item : -1;
      batch.token[b] = row_source_token(source);
      batch.pos[b] = row_source_pos(source);
    } else {
      batch.my_row[b] = lane < f.rows_per_token ? f.plan.recv_rows[int64_t(item) * f.rows_per_token + lane] : -1;
      batch.token[b] = f.plan.recv_token[item];
      batch.pos[b] = ring_pos(psum, f.world, item);
    }
  }
  return batch;
}

// Items of the dispatch: received slots, or with f.dispatch_by_row the A rows of this call's M
// tiles (padding included; padding rows move nothing).
__device__ __forceinline__ int dispatch_items(const FusedCommArgs& f, const int32_t* psum) {
  return f.dispatch_by_row ? f.plan.counts[0] * kGemmBlockM : psum[f.world];
}

// Dispatch: warp `warp` of `num_warps` moves items warp, warp + num_warps, ..., kDispatchTokens
// of them at once (their loads in flight together, then each item's stores and signal). The
// next batch's plan entries are loaded before this batch's rows, so a batch costs one load
// latency for its rows, not a second one for where they come from and go.
__device__ inline void dispatch_rows(const FusedCommArgs& f, const int32_t* psum, int warp, int num_warps) {
  const int lane = int(threadIdx.x) % 32, chunks = f.hidden / 8, total = dispatch_items(f, psum);
  uint4* a_rows = static_cast<uint4*>(f.a_rows);
  if (warp == 0 && lane == 0) link_zero(f.link_reset);  // link emulation: the combine's pacer
  ChunkRecorder trace(f.trace, 0, f.rank);
  DispatchBatch upcoming = load_dispatch_batch(f, psum, warp, num_warps, total, lane);
  for (int first = warp; first < total; first += kDispatchTokens * num_warps) {
    const DispatchBatch batch = upcoming;
    upcoming = load_dispatch_batch(f, psum, first + kDispatchTokens * num_warps, num_warps, total, lane);
    const uint4* x[kDispatchTokens];
    int my_row[kDispatchTokens], num_rows[kDispatchTokens];
    uint64_t landed[kDispatchTokens];
#pragma unroll
    for (int b = 0; b < kDispatchTokens; ++b) {  // warp-uniform: a slot past the end moves nothing
      const int item = first + b * num_warps;
      x[b] = nullptr;
      my_row[b] = -1;
      num_rows[b] = 0;
      landed[b] = 0;
      if (batch.pos[b] < 0) continue;
      trace.begin_item(item);
      const int src = (f.rank + batch.pos[b]) % f.world;
      landed[b] = link_pull(f.link, src == f.rank ? 0 : uint64_t(chunks) * 16);  // emulated link
      my_row[b] = batch.my_row[b];
      num_rows[b] = __popc(__ballot_sync(~0u, my_row[b] >= 0));  // rows are -1 padded at the end
      x[b] = reinterpret_cast<const uint4*>(static_cast<const char*>(f.peers[src]) + f.x_offset) +
             int64_t(batch.token[b]) * chunks;
    }
    for (int c0 = 0; c0 < chunks; c0 += 32 * kCopyUnroll) {
      uint4 v[kDispatchTokens][kCopyUnroll];
#pragma unroll
      for (int b = 0; b < kDispatchTokens; ++b)
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u) {
          const int c = c0 + 32 * u + lane;
          if (x[b] != nullptr && c < chunks) v[b][u] = x[b][c];  // read once over the link
        }
#pragma unroll
      for (int b = 0; b < kDispatchTokens; ++b)
        for (int j = 0; j < num_rows[b]; ++j) {  // written to every row the token feeds
          uint4* dst = a_rows + int64_t(__shfl_sync(~0u, my_row[b], j)) * chunks;
#pragma unroll
          for (int u = 0; u < kCopyUnroll; ++u) {
            const int c = c0 + 32 * u + lane;
            if (c < chunks) dst[c] = v[b][u];
          }
        }
    }
#pragma unroll
    for (int b = 0; b < kDispatchTokens; ++b) {
      if (x[b] == nullptr) continue;
      link_wait(f.link, landed[b]);
      if (f.tile_arrivals != nullptr) {
        __threadfence();
        __syncwarp();
        if (my_row[b] >= 0) red_release_gpu(f.tile_arrivals + my_row[b] / kGemmBlockM, 1);
      }
    }
    // After every token's wait and signal, so that a chunk record closed here covers them all.
#pragma unroll
    for (int b = 0; b < kDispatchTokens; ++b)
      if (x[b] != nullptr) trace.end_item();
  }
  trace.flush();
}

// Combine items: (column group g, entry i of the plan's combine list), column-group-major,
// item = g * listed + i.
// A column group is combine_group_blocks(width) layer1 column blocks: GEMM1's raster stores a
// group's blocks together (TileOrder::kColumnBlockMajor), so waiting for the whole group costs
// little and one item carries enough columns to keep kCopyUnroll chunks per lane in flight.
inline constexpr int kCombineClaim = 8;   // items a warp claims at once from the work counter
                                          // (one atomic on one address per 8 items)
inline constexpr int kCombineUnroll = 4;  // 16-byte chunks per lane in flight per row (fp32
                                          // accumulators bound it: 8 per chunk)
inline constexpr int kCombineRows = 4;    // rows of a token whose loads are in flight together

// acc += w_i * row_i over rows i = 0 .. num_rows-1 in that order, for the lane's
// kCombineUnroll chunks c0 + 32 u + lane (those below c_end): row(i) gives the warp-uniform
// source row and weight of row i. The loads of up to kCombineRows rows are issued before their
// fmas (bytes in flight); the fmas are the same, in the same order, as one row at a time. The
// combine (rows of a token, weighted) and the owner reduce (ranks' partials, weight 1) both sum
// through it, so they share one arithmetic.
struct WeightedRow {
  const uint4* src;
  float w;
};
template <int kRows = kCombineRows, class RowOf>
__device__ __forceinline__ void fma_rows_chunks(float* acc, int num_rows, const RowOf& row, int c0, int c_end,
                                                int lane) {
  for (int r0 = 0; r0 < num_rows; r0 += kRows) {
    uint4 v[kRows][kCombineUnroll];
    float w[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (r0 + i < num_rows) {  // warp-uniform
        const WeightedRow r = row(r0 + i);
        w[i] = r.w;
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
          const int c = c0 + 32 * u + lane;
          if (c < c_end) v[i][u] = r.src[c];
        }
      }
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (r0 + i < num_rows) {
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u)
          if (c0 + 32 * u + lane < c_end) fma_chunk(acc + 8 * u, w[i], v[i][u]);
      }
  }
}

// The same chunks of acc, rounded to bf16 once, stored into the row dst.
__device__ __forceinline__ void store_row_chunks(uint4* dst, const float* acc, int c0, int c_end, int lane) {
#pragma unroll
  for (int u = 0; u < kCombineUnroll; ++u) {
    const int c = c0 + 32 * u + lane;
    if (c < c_end) dst[c] = to_bf16_chunk(acc + 8 * u);
  }
}

// Column blocks per combine group at a layer1 column width: the group is GEMM1's column-major
// raster group (default_raster_group, cuda/tile_raster.h: kRasterGroupColumns columns at any
// tile width), so an item carries as many bytes (with half as wide items, communication-only
// rose 27% for qwen3 on one H200) and a group's blocks are stored together.
__host__ __device__ inline int combine_group_blocks(int col_width) {
  return default_raster_group(TileOrder::kColumnBlockMajor, col_width);
}
__host__ __device__ inline int combine_groups(int num_col_blocks, int group_blocks) {
  return (num_col_blocks + group_blocks - 1) / group_blocks;
}

// One combine item as a warp holds it: its index, its received slot and, per lane j <
// rows_per_token, the token's j-th local row and weight (row -1 and weight 0 past its rows; the
// plan writes both).
struct CombineItem {
  int index;
  int slot;
  int my_row;
  float my_weight;
};

// Issues the item's metadata loads: the slot from the plan's combine list, then the slot's row
// and weight (those two in parallel); nothing is loaded for an index past the last item.
__device__ __forceinline__ CombineItem load_combine_item(const FusedCommArgs& f, int i, int items, int listed,
                                                         int lane) {
  CombineItem item{i, 0, -1, 0.f};
  if (i < items) {
    item.slot = f.plan.combine_slots[i % listed];
    if (lane < f.rows_per_token) {
      const int64_t at = int64_t(item.slot) * f.rows_per_token + lane;
      item.my_row = f.plan.recv_rows[at];
      item.my_weight = f.plan.recv_weight[at];
    }
  }
  return item;
}

// Combine: with f.combine_claims set, warps claim items from that counter (any number of warps
// of any block may join, e.g. GEMM blocks whose tiles are done); otherwise warp `warp` of
// `num_warps` takes items warp, warp + num_warps, ... The arithmetic of an item does not depend
// on who runs it. A warp loads the next item's rows and weights before it moves the current
// one, so an item costs one load latency (its data), not two (its metadata, then its data):
// a qwen3 token has about 1.5 rows on a rank, too few bytes to hide a second round trip.
__device__ inline void combine_rows(const FusedCommArgs& f, const int32_t* psum, int warp, int num_warps) {
  // The slots the plan listed: with LayerOptions::epilogue_combine, a token with a single row
  // here was stored into its owner's slot by GEMM1's epilogue and is not listed.
  const int lane = int(threadIdx.x) % 32, chunks = f.hidden / 8, listed = f.plan.counts[3];
  const int gb = f.combine_group_blocks;
  const int group_chunks = gb * f.col_width / 8;
  const int items = combine_groups(f.num_col_blocks, gb) * listed;  // < 2^31: W * T_max * groups
  const uint4* out_rows = static_cast<const uint4*>(f.out_rows);
  int ready_group = -1;  // the column group this warp last waited for
  int next = warp, claim_end = 0;
  // The next item (claimed in batches from the counter, or the static stride).
  auto claim = [&]() {
    if (f.combine_claims == nullptr) {
      const int i = next;
      next += num_warps;
      return i;
    }
    if (next >= claim_end) {
      unsigned first = 0;
      if (lane == 0) first = atomicAdd(f.combine_claims, unsigned(kCombineClaim));
      // A claim past the items ends the loop whatever the counter reads (never a negative int).
      const unsigned claimed = __shfl_sync(~0u, first, 0);
      next = claimed >= unsigned(items) ? items : int(claimed);
      claim_end = next + kCombineClaim;
    }
    return next++;
  };
  ChunkRecorder trace(f.trace, 1, f.rank);
  if (warp == 0 && lane == 0) link_zero(f.link_reset);  // link emulation: the dispatch's pacer
  uint64_t last_sent = 0;
  CombineItem item = load_combine_item(f, claim(), items, listed, lane);
  while (item.index < items) {
    // Step 1: the next item's metadata, in flight while this one moves (the plan wrote it
    // before this kernel, so it needs no wait).
    const CombineItem upcoming = load_combine_item(f, claim(), items, listed, lane);
    const int i = item.index, g = i / listed, slot = item.slot;
    // Step 2: wait (once per group) until GEMM1 stored every tile of the group's column blocks.
    if (f.col_done != nullptr && g != ready_group) {
      trace.flush();  // a chunk record never spans a wait
      if (lane == 0) {
        const uint64_t wait_begin = trace.clock();
        for (int j = g * gb; j < min(f.num_col_blocks, (g + 1) * gb); ++j) {
          const WaitSite site{f.rank, 1, WaitRole::kCommColumnBlock, j};
          if (!wait_at_least(f.col_done + j, f.col_target[j], f.timeout_ns, f.error, site)) break;
        }
        trace.wait(wait_begin, g);
      }
      __syncwarp();
      ready_group = g;
    }
    trace.begin_item(i);
    // Step 3: the token's partial row for the group's columns: acc = sum over its rows in slot
    // order of w * x (fp32), one bf16 rounding, stored into the owner's slot.
    const int pos = ring_pos(psum, f.world, slot);
    const int owner = (f.rank + pos) % f.world, position = slot - psum[pos];
    uint4* dst = combine_recv_row(f.peers[owner], f.combine_offset, f.rank, f.t_max, position, f.hidden);
    const int my_row = item.my_row;
    const float my_weight = item.my_weight;
    const int num_rows = __popc(__ballot_sync(~0u, my_row >= 0));
    const int c_end = min(chunks, (g + 1) * group_chunks);
    const uint64_t sent = link_push(f.link, owner == f.rank ? 0 : uint64_t(c_end - g * group_chunks) * 16);
    for (int c0 = g * group_chunks; c0 < c_end; c0 += 32 * kCombineUnroll) {
      float acc[8 * kCombineUnroll];
#pragma unroll
      for (int q = 0; q < 8 * kCombineUnroll; ++q) acc[q] = 0.f;
      fma_rows_chunks(acc, num_rows, [&](int r) {
        return WeightedRow{out_rows + int64_t(__shfl_sync(~0u, my_row, r)) * chunks, __shfl_sync(~0u, my_weight, r)};
      }, c0, c_end, lane);
      store_row_chunks(dst, acc, c0, c_end, lane);
    }
    link_wait(f.link, sent);
    last_sent = max(last_sent, sent);
    trace.end_item();
    item = upcoming;
  }
  link_drain(f.link, last_sent);
  trace.flush();
}

// Owner reduce (after layer1, on the owner): one warp per own token; the partial rows of the
// ranks the token was sent to, summed in fp32 in rank order 0..W-1 (one bf16 rounding); a
// token sent nowhere (every slot masked) gets a zero row.
struct OwnerReduceArgs {
  const int32_t* send_pos = nullptr;     // [T_max][W] position in the send list to rank d, or -1
  const void* combine_recv = nullptr;    // [W][T_max][H] bf16 partial rows, this rank's heap
  const int32_t* token_count = nullptr;  // this call's own token count (device)
  void* y = nullptr;                     // [T_max][H] bf16
  int hidden = 0, world = 1, t_max = 0;
};

// Ranks' partial rows whose loads are in flight together: 3, not kCombineRows, so that the
// kernel fits 128 registers per thread without spilling and two blocks share an SM (the reduce
// is bound by load latency, so twice the warps per SM keep more bytes in flight).
inline constexpr int kOwnerReduceRows = 3;
__device__ inline void owner_reduce_rows(const OwnerReduceArgs& a, int warp, int num_warps) {
  // The count as the plan read it (device_plan.cu, published_tokens): outside [0, T_max] it is
  // 0 and the plan wrote no send positions, so none is read here; check() raises the error.
  const int count = *a.token_count;
  const int tokens = count >= 0 && count <= a.t_max ? count : 0;
  const int lane = int(threadIdx.x) % 32, chunks = a.hidden / 8;
  const uint4* partials = static_cast<const uint4*>(a.combine_recv);
  uint4* y = static_cast<uint4*>(a.y);
  // A token's send positions, per lane (ranks lane and lane + 32); -1 where it was not sent.
  // The warp loads the next token's while it sums the current one (one load latency less each).
  auto load_positions = [&](int t, int& lo, int& hi) {
    const int32_t* pos = a.send_pos + int64_t(t) * a.world;
    lo = t < tokens && lane < a.world ? pos[lane] : -1;
    hi = t < tokens && lane + 32 < a.world ? pos[lane + 32] : -1;
  };
  int pos_lo, pos_hi;
  load_positions(warp, pos_lo, pos_hi);
  for (int t = warp; t < tokens; t += num_warps) {
    int next_lo, next_hi;
    load_positions(t + num_warps, next_lo, next_hi);
    // The ranks the token was sent to, in rank order: contributor j < 32 is held by lane j in
    // `first`, j >= 32 by lane j - 32 in `second`, as the offset of its partial row.
    int64_t first = 0, second = 0;
    int contributors = 0;
    for (int half = 0; half < 2; ++half) {
      const int my_pos = half == 0 ? pos_lo : pos_hi;
      for (unsigned m = __ballot_sync(~0u, my_pos >= 0); m != 0; m &= m - 1, ++contributors) {
        const int d = 32 * half + __ffs(int(m)) - 1;
        const int64_t offset = (int64_t(d) * a.t_max + __shfl_sync(~0u, my_pos, d % 32)) * chunks;
        if (lane == contributors % 32) (contributors < 32 ? first : second) = offset;
      }
    }
    for (int c0 = 0; c0 < chunks; c0 += 32 * kCombineUnroll) {
      float acc[8 * kCombineUnroll];
#pragma unroll
      for (int q = 0; q < 8 * kCombineUnroll; ++q) acc[q] = 0.f;
      fma_rows_chunks<kOwnerReduceRows>(acc, contributors, [&](int j) {
        return WeightedRow{partials + __shfl_sync(~0u, j < 32 ? first : second, j % 32), 1.f};
      }, c0, chunks, lane);
      store_row_chunks(y + int64_t(t) * chunks, acc, c0, chunks, lane);
    }
    pos_lo = next_lo;
    pos_hi = next_hi;
  }
}

}  // namespace comet::cuda
