// cuda/dispatch_bulk.cuh: layer0's dispatch run by the GEMM blocks themselves
// (Layer0Copies::kGemmBlocks): warp 1 of each block's producer warpgroup, idle in the GEMM,
// moves received tokens with bulk asynchronous copies (cuda/bulk_copy.cuh) through a ring in
// the shared memory the block set aside, while the block's consumers run GEMM0 tiles.
//
// Why: with communication blocks (cuda/comm_rows.cuh) a copy holds its SM for the whole copy,
// and on one GPU, where the GEMMs keep every SM busy, that time adds to the GEMM's. A bulk copy
// needs no registers for the bytes it moves, so the producer's 40 registers suffice, and the
// copy runs on the TMA unit beside the GEMM's loads (docs/gpu_layer.md).
//
// The work: G helpers (one per block) take items helper, helper + G, ... of the dispatch's order
// (comm_rows.cuh's items: received slots in ring order, or A rows with f.dispatch_by_row). A
// batch is as many items as the ring holds rows: lane b of the warp issues item b's load; while
// the loads are in flight, the lanes wait for the previous batch's stores to have written
// memory, fence, and release-add 1 per A row to its M tile's counter (as comm_rows.cuh's
// dispatch does); then they store each landed row to every A row it feeds and wait only until
// the stores have read the ring, so the next batch's loads can reuse it. The A buffer ends up
// byte for byte the same, so the GEMM's output is too.
//
// The loads complete on mbarriers and wait without a timeout: they read published rows, which
// are always there; the waits that can time out are the GEMM's, on the tile counters.
#pragma once

#include "cuda/bulk_copy.cuh"
#include "cuda/comm_rows.cuh"

namespace comet::cuda {

inline constexpr int kBulkSlotsMax = 16;  // ring slots (rows in flight per block); < 32 lanes

// The helper's shared memory: tables first, then the ring of row slots.
struct BulkDispatchTables {
  uint64_t full[kBulkSlotsMax];            // slot b's load landed (one phase per batch)
  int32_t psum[kMaxWorld + 1];             // recv_psum
  int32_t rows[kBulkSlotsMax * kMaxRowsPerToken];  // the batch's A rows, [slot][row of token]
};
inline constexpr int kBulkRingOffset = (int(sizeof(BulkDispatchTables)) + 127) / 128 * 128;

// Rows of `hidden` bf16 the ring holds in `ring_bytes` of helper memory (0: none; the host refuses).
__host__ __device__ constexpr int bulk_dispatch_slots(int ring_bytes, int hidden) {
  const int rows = (ring_bytes - kBulkRingOffset) / (2 * hidden);
  return rows < kBulkSlotsMax ? rows : kBulkSlotsMax;
}

// Release-adds 1 per A row of the batch in tables.rows (n items of rpt rows) to its M tile's
// counter, once this lane's stores of them have written memory.
__device__ __forceinline__ void publish_bulk_rows(const FusedCommArgs& f, const BulkDispatchTables& tables, int n,
                                                  int rpt, int lane) {
  wait_bulk_writes();
  if (f.tile_arrivals == nullptr || n == 0) return;
  fence_proxy_async_global();  // written through the async proxy, published by a generic release
  __threadfence();
  for (int e = lane; e < n * rpt; e += 32) {  // the same lane that stored the row
    const int b = e / rpt, row = tables.rows[b * kMaxRowsPerToken + e - b * rpt];
    if (row >= 0) red_release_gpu(f.tile_arrivals + row / kGemmBlockM, 1);
  }
}

__device__ inline void dispatch_rows_bulk(const FusedCommArgs& f, char* smem, int ring_bytes, int helper,
                                          int num_helpers) {
  auto& tables = *reinterpret_cast<BulkDispatchTables*>(smem);
  char* ring = smem + kBulkRingOffset;
  const int lane = int(threadIdx.x) % 32;
  const int rpt = f.dispatch_by_row ? 1 : f.rows_per_token;  // A rows per item
  const uint32_t row_bytes = uint32_t(f.hidden) * 2;
  const int slots = bulk_dispatch_slots(ring_bytes, f.hidden);
  for (int i = lane; i <= f.world; i += 32) tables.psum[i] = f.plan.recv_psum[i];
  if (lane < slots) mbarrier_init_one(tables.full + lane);
  fence_mbarrier_init();
  __syncwarp();
  if (helper == 0 && lane == 0) link_zero(f.link_reset);  // link emulation: the combine's pacer
  char* a_rows = static_cast<char*>(f.a_rows);
  const int total = dispatch_items(f, tables.psum);
  uint32_t parity = 0;  // bit b: the phase of slot b's barrier being waited for
  int stored = 0;       // items of the previous batch, stored but not yet published
  for (int first = helper; first < total; first += slots * num_helpers) {
    const int n = min(slots, (total - first + num_helpers - 1) / num_helpers);  // items in this batch
    bool loads = false;  // lane b: item b moves a row (a padding row in row order does not)
    int item_row = -1;
    if (lane < n) {      // lane b: item b's source row, loaded into ring slot b
      const int item = first + lane * num_helpers;
      int pos = -1, token = 0;
      if (f.dispatch_by_row) {
        const int source = f.plan.row_source[item];
        if (source >= 0) {
          pos = row_source_pos(source);
          token = row_source_token(source);
          item_row = item;
        }
      } else {
        pos = ring_pos(tables.psum, f.world, item);
        token = f.plan.recv_token[item];
      }
      loads = pos >= 0;
      if (loads) {
        const char* x = static_cast<const char*>(f.peers[(f.rank + pos) % f.world]) + f.x_offset + int64_t(token) * row_bytes;
        mbarrier_arrive_expect_bytes(tables.full + lane, row_bytes);
        bulk_load(ring + lane * row_bytes, x, row_bytes, tables.full + lane);
      }
    }
    const uint32_t loaded = __ballot_sync(~0u, loads);
    // The previous batch's writes land while these loads are in flight; then its rows are
    // published and its table entries may be replaced.
    publish_bulk_rows(f, tables, stored, rpt, lane);
    __syncwarp();
    if (f.dispatch_by_row) {
      if (lane < n) tables.rows[lane * kMaxRowsPerToken] = item_row;
    } else {
      for (int e = lane; e < n * rpt; e += 32) {
        const int b = e / rpt, j = e - b * rpt;
        tables.rows[b * kMaxRowsPerToken + j] = f.plan.recv_rows[int64_t(first + b * num_helpers) * rpt + j];
      }
    }
    __syncwarp();
    for (int e = lane; e < n * rpt; e += 32) {
      const int b = e / rpt, row = tables.rows[b * kMaxRowsPerToken + e - b * rpt];
      if (row < 0) continue;  // rows are -1 padded at the end
      while (!mbarrier_try_wait(tables.full + b, (parity >> b) & 1u)) {
      }
      bulk_store(a_rows + int64_t(row) * row_bytes, ring + b * row_bytes, row_bytes);
    }
    bulk_commit();
    wait_bulk_reads();  // the ring's slots are read, so the next batch may reload them
    parity ^= loaded;
    stored = n;
    __syncwarp();  // every lane is past this batch's phase and slots before the next reuses them
  }
  publish_bulk_rows(f, tables, stored, rpt, lane);
}

}  // namespace comet::cuda
