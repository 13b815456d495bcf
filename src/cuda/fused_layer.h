// cuda/fused_layer.h: the two Comet kernels of one rank (DESIGN §1, §4): one persistent,
// cooperative grid of num_SMs blocks per layer; blocks [0, n_comm) move data, the others run
// the grouped GEMM (cuda/grouped_gemm.h), and they meet through signals in global memory.
//
//   layer0  comm blocks pull every received token once from its owner (ring order: own rows
//           first), write it to each A row it feeds, and release-add 1 per row to its M tile's
//           counter; the GEMM producer acquire-waits tile_arrivals[m] >= tile_target[m] before
//           loading A (GEMM0 + SwiGLU, tiles in the layer0 order of the plan); with tile claims
//           (GroupedGemmArgs::tile_claims), comm blocks whose copies are done join the GEMM, so
//           the SMs given to communication are lent, not lost
//   layer1  GEMM blocks run GEMM1 column-block groups and release-add 1 per stored tile to
//           col_done[n_block]; comm warps acquire-wait for a column group's blocks, then
//           pre-reduce each received token's rows over the group's columns (fp32, slot order,
//           weighted) and store the bf16 partial into the owner's combine_recv slot; GEMM
//           blocks whose tiles are done join the comm warps (combine_claims), comm blocks whose
//           items are done join GEMM1 (tile claims). With the epilogue combine (the plan's
//           row_combine, GroupedGemmArgs::row_combine) a token with a single row on the rank is
//           stored into its owner's slot by GEMM1's epilogue and not listed for the comm warps
// The data movement is cuda/comm_rows.cuh, shared with the unfused pipeline. The owner's
// reduce over ranks runs after layer1 (MoeLayer). Every wait has a timeout; the first one to
// expire fills the DeviceError record and the kernel still finishes.
#pragma once

#include <cstdint>

#include "core/kernel_trace.h"
#include "cuda/device_plan.h"
#include "cuda/grouped_gemm.h"
#include "cuda/link_pace.h"

struct CUstream_st;

namespace comet::cuda {

// Where the communication warps of one kernel record their chunks and waits
// (core/kernel_trace.h, cuda/trace_record.cuh). Null `chunks`: tracing off.
struct TraceSink {
  KernelTraceEvent* chunks = nullptr;  // [capacity]
  unsigned* count = nullptr;           // slots claimed (zeroed before the forward)
  unsigned capacity = 0;
};

// Everything the communication blocks of one rank need (POD, passed to the kernel by value).
struct FusedCommArgs {
  DevicePlanView plan{};
  void* const* peers = nullptr;       // fabric peer table of this rank (device array [W])
  int64_t x_offset = 0;               // byte offset of region x in every rank's heap
  int64_t combine_offset = 0;         // byte offset of region combine_recv in every heap
  void* a_rows = nullptr;             // layer0 destination, this rank's heap
  const void* out_rows = nullptr;     // layer1 source, this rank's heap
  uint64_t* tile_arrivals = nullptr;  // [MT] layer0 counters, this rank's heap
  uint64_t* col_done = nullptr;       // [NB1] layer1 counters, this rank's heap
  const uint64_t* col_target = nullptr;  // [NB1] this call's layer1 targets (device plan)
  int hidden = 0, rows_per_token = 0, world = 1, rank = 0, t_max = 0;
  int num_col_blocks = 0;             // layer1 column blocks
  int col_width = 256;                // output columns of one layer1 column block
  int combine_group_blocks = 4;       // column blocks per combine group (combine_group_blocks())
  int n_comm = 16;                    // blocks that communicate
  // layer0 only: no communication blocks; a warp of every GEMM block moves the rows with bulk
  // asynchronous copies (LayerOptions::layer0_copies, cuda/dispatch_bulk.cuh); n_comm unused.
  int gemm_block_copies = 0;
  // layer0 (fused or not): dispatch in A-row order (expert-major, plan.row_source) instead of by
  // received token in ring order (LayerOptions::dispatch_order); the A rows are the same.
  int dispatch_by_row = 0;
  int stall = 0;                      // fault injection (tests): the comm blocks do nothing
  uint64_t timeout_ns = 5'000'000'000ull;
  DeviceError* error = nullptr;
  // layer1 work counter, zeroed by this call's plan kernel: comm warps and, once their tiles are
  // done, GEMM warps claim combine items from it. Null: a static split over the comm warps.
  unsigned* combine_claims = nullptr;
  TraceSink trace{};                  // LayerOptions::trace
  // Link emulation (cuda/link_pace.h): this phase's pacer (dispatch: the rank's incoming link,
  // combine: its outgoing one; off by default), and the other phase's pacer, which this kernel
  // zeroes for the rank's next phase (docs/link_emulation.md).
  LinkPace link{};
  LinkPacer* link_reset = nullptr;
};

// Launch one layer cooperatively on num_SMs blocks (asynchronous on `stream`). `gemm` carries
// the GEMM side (tiles, signals: layer0 sets wait_flags/wait_targets, layer1 done_flags).
// Throws comet::Error if n_comm leaves no GEMM block or the grid cannot be co-resident.
void run_fused_layer0(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream);
// The configuration run_fused_layer0 launches when comm.gemm_block_copies is set.
void run_fused_layer0_gemm_copies(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream);
// Shared memory a GEMM block of that configuration sets aside for its copy ring; the rows of
// one token must fit it (hidden * 2 bytes, under 45 KB).
inline constexpr int kDispatchRingBytes = 47 * 1024;
// Whether a token row of `hidden` bf16 fits that ring (cuda/dispatch_bulk.cuh).
bool bulk_dispatch_fits(int hidden);
void run_fused_layer1(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream);
// Layer1Combine::kGemmBlocks: GEMM1 on ping-pong 128x128 tiles (gemm.kernel must say so), the
// combine run by warps 1-3 of every block's producer warpgroup with registers moved to them from
// the consumers; no communication blocks (comm.n_comm unused); needs claimed tiles and items.
void run_fused_layer1_gemm_combine(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, CUstream_st* stream);

}  // namespace comet::cuda
