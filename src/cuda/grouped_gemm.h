// cuda/grouped_gemm.h: the persistent, warp-specialized Hopper grouped GEMM over the experts of
// one rank, whose tile order, waits and signals the caller controls (DESIGN §4).
//
// Layouts (bf16, row-major, K contiguous everywhere so both operands are K-major for wgmma):
//   A  [max_rows][k]        expert-sorted rows; expert e's rows start at a multiple of
//                           kGemmBlockM (padded segments, see expert_row_offsets())
//   B  [E][n_b][k]          per-expert weight, "N x K" (the transpose of x W's W)
//                           identity epilogue: n_b = n
//                           SwiGLU: n_b = 2 * round_up(n, kSwiGluPack); rows alternate between
//                           kSwiGluPack gate columns and the kSwiGluPack matching up columns
//                           (pack_swiglu_weights()), so any tile whose width is a multiple of
//                           2 * kSwiGluPack holds both halves of its output columns
//                           plain activation: n_b = n, as identity
//   D  [max_rows][n]        output (SwiGLU: silu(gate) * up, n columns; plain activation:
//                           act(x W) with GroupedGemmArgs::activation, e.g. GELU)
// Schedule: `tiles` holds GemmTile entries in run order (built on the device by
// build_gemm_tiles, or by the layer's metadata kernel); `num_tiles` is read on the device, so
// no host synchronization is needed and the launch can be captured in a CUDA graph.
// Block b of the G GEMM blocks runs tiles b, b+G, b+2G, ... (with 2-block clusters: cluster c of
// G/2 runs tiles 2c and 2c+1, then 2(c+G/2) and 2(c+G/2)+1, ...); or, with `tile_claims` set, each
// block claims its next tile from that counter in schedule order, which balances blocks whose
// tiles take different times and lets blocks join late (a fused kernel's communication blocks,
// cuda/fused_layer.h). The counter must be 0 at launch, and the launch leaves it 0 (the last
// block to claim resets it), so one zeroed word serves every later launch on the stream. Which
// block runs a tile never changes a result: tiles are independent.
//
// Optional signals: before loading A for a tile, the producer waits until
// wait_flags[tile.signal] >= wait_targets[tile.signal] (acquire, timeout -> error record).
// After storing a tile, its warpgroup adds 1 to done_flags[tile.n_block] (release).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/config.h"
#include "comet/error.h"
#include "core/kernel_trace.h"
#include "cuda/device_error.h"
#include "cuda/host_device.h"

struct CUstream_st;

namespace comet::cuda {

inline constexpr int kGemmBlockM = 128;  // rows per tile; expert segments align to it
// K per k-tile (one pipeline stage) in every configuration; split pieces count in k-tiles.
// 128 (half the stages) was 1-16% slower (docs/results/2026-12-03-k-depth-128.md).
inline constexpr int kGemmTileK = 64;
inline constexpr int kSwiGluPack = 64;   // gate/up interleave of the SwiGLU weight layout

// kActivation: a plain (non-gated) activation applied to every output element
// (GroupedGemmArgs::activation: GELU, ReLU or SiLU, as cuda/activation.cuh defines them); only
// the ping-pong configuration is instantiated for it (can_implement says so).
enum class GemmEpilogue : int32_t { kIdentity, kSwiGlu, kActivation };
const char* gemm_epilogue_name(GemmEpilogue epilogue);  // "identity", "swiglu", "activation"

// Kernel configurations (one translation unit each per epilogue):
// - Cooperative128x256: both consumer warpgroups share each 128 x 256 tile (64 rows each).
// - Pingpong128x128: each consumer warpgroup runs whole 128 x 128 tiles, the two taking turns on
//   the tensor cores, so one's epilogue hides under the other's mainloop.
// - ...Cluster2x1: the same blocks in clusters of two that run two M tiles of one column block
//   together, each block loading half of the B tile and multicasting it to both (half the
//   L2 -> SM traffic of B); the schedule pairs the tiles (build_gemm_tiles).
// Claimed tiles (tile_claims) need Cooperative128x256, the fused kernels' configuration and the
// only one tested with them. kAuto resolves per shape (choose_gemm_kernel).
enum class GemmKernel : int32_t {
  kAuto,
  kCooperative128x256,
  kCooperative128x256Cluster2x1,
  kPingpong128x128,
  kPingpong128x128Cluster2x1,
};
inline constexpr GemmKernel kGemmKernels[] = {GemmKernel::kCooperative128x256, GemmKernel::kCooperative128x256Cluster2x1,
                                              GemmKernel::kPingpong128x128, GemmKernel::kPingpong128x128Cluster2x1};
const char* gemm_kernel_name(GemmKernel kernel);
// Columns of B per tile.
int gemm_tile_n(GemmKernel kernel);
// Blocks per cluster along M: consecutive schedule entries [c * m, c * m + m) run together.
int gemm_cluster_m(GemmKernel kernel);
GemmKernel choose_gemm_kernel(GemmEpilogue epilogue, int n, int k, int num_experts);
// Whether a caller building kAuto's schedule for these shapes should ask for a split (GemmSplit;
// the plan then splits only a partial last wave): GEMM1 (identity epilogue) on ping-pong with
// K >= 4096. (run_grouped_gemm runs the schedule it is given; the caller builds it.)
bool choose_gemm_split(GemmEpilogue epilogue, GemmKernel kernel, int k);

// One unit of work: rows [m_row, m_row + kGemmBlockM) of A, output column block n_block of
// expert `expert`; `signal` indexes wait_flags/wait_targets (ignored without them).
// A padding tile (m_row < 0) exists only in cluster and split schedules: it completes the last
// pair of an expert with an odd M tile count and an odd number of column blocks
// (build_gemm_tiles): its block loads A rows ~m_row (its partner's, so the load hits L2), takes
// its share of the B multicast, computes, and stores nothing: no output, no wait, no done
// signal, no trace record. Under a split list's idle pieces (the last round's fill) the split
// kernel loads and computes nothing; a plain kernel given that list treats them as above.
// `rows`: the expert's rows in the tile (1..kGemmBlockM; less in an expert's last M tile; a
// padding tile carries its partner's). The cooperative kernels skip the MMAs of a warpgroup
// whose 64 rows are all past the expert's end and store nothing there (D's padding rows are not
// part of the output). 0 means "not given" and counts as kGemmBlockM.
struct alignas(16) GemmTile {
  int32_t m_row;
  int32_t n_block;
  int16_t expert;  // below kMaxGemmExperts (can_implement)
  int16_t rows;
  int32_t signal;
};
static_assert(sizeof(GemmTile) == 16, "16-byte tile entries: the kernels load one per tile");
inline constexpr int kMaxGemmExperts = 32767;
COMET_HOST_DEVICE inline bool gemm_tile_is_padding(const GemmTile& t) { return t.m_row < 0; }
COMET_HOST_DEVICE inline int gemm_tile_a_row(const GemmTile& t) { return t.m_row < 0 ? ~t.m_row : t.m_row; }
COMET_HOST_DEVICE inline int gemm_tile_rows(const GemmTile& t) { return t.rows > 0 ? t.rows : kGemmBlockM; }
// The tile of rows [m_row, m_row + kGemmBlockM) of expert `expert`, whose rows end at `row_end`.
COMET_HOST_DEVICE inline GemmTile make_gemm_tile(int m_row, int n_block, int expert, int row_end, int signal) {
  const int rows = row_end - m_row < kGemmBlockM ? row_end - m_row : kGemmBlockM;
  return GemmTile{m_row, n_block, int16_t(expert), int16_t(rows > 0 ? rows : 0), signal};
}

// Split schedules (GemmSplit below) cut the tiles of the last, partial wave along K: entry i of
// the tile list then runs the part of its tile that piece i of `split_pieces` says. Kept apart
// from GemmTile so that plain schedules, the fused kernels' included, keep 16-byte entries.
enum class GemmSplitRole : int16_t {
  kWhole = 0,    // the whole tile (every entry of an unsplit schedule)
  kPartial = 1,  // k-tiles [k_begin, k_begin + k_count): writes its fp32 partial to slot `partial`
                 // of the split workspace and release-sets that slot's flag
  kFinish = 2,   // k-tiles [k_begin, k_begin + k_count), the tile's last: waits for the flags of
                 // slots [partial, partial + partials), adds those partials in slot order, and
                 // stores the tile (epilogue, done signal, trace) as a whole tile does
  kIdle = 3,     // nothing (its tile is a padding tile): fills the last round of a split list
};
struct alignas(16) GemmSplitPiece {
  int32_t k_begin = 0;
  int32_t k_count = 0;
  GemmSplitRole role = GemmSplitRole::kWhole;
  int16_t partials = 0;  // kFinish: how many partial slots it adds
  int32_t partial = -1;  // kPartial: its slot; kFinish: the first slot it adds
};
// The k-tiles a piece runs (k_tiles: the whole tile's); an idle piece runs none.
COMET_HOST_DEVICE inline void gemm_piece_k_range(const GemmSplitPiece& p, int k_tiles, int& k_begin, int& k_count) {
  k_begin = p.role == GemmSplitRole::kWhole ? 0 : p.k_begin;
  k_count = p.role == GemmSplitRole::kWhole ? k_tiles : p.role == GemmSplitRole::kIdle ? 0 : p.k_count;
}

// A grid of `blocks` persistent blocks runs a schedule's tiles b, b + G, ... per block, so when the
// tile count is not a multiple of the blocks, the last wave keeps some SMs one tile longer than
// others (Mixtral's GEMM1 at 4096 tokens per rank: 2048 ping-pong tiles are 15.5 per SM, and the
// slowest SMs run 16). A split schedule cuts that wave's tiles into equal k ranges dealt evenly
// over the blocks (cuda/gemm_schedule.h, gemm_split_plan). blocks 0: no split.
struct GemmSplit {
  int blocks = 0;           // the launch's grid
  int tiles_per_block = 1;  // tiles a block runs at once: 1 cooperative, 2 ping-pong
  int k_tiles = 0;          // k-tiles of a whole tile: ceil(K / kGemmTileK)
  // A split must also shorten the busiest block's schedule by this fraction of its unsplit
  // length (cuda/gemm_schedule.h, gemm_split_plan); 0: any last wave it shortens enough.
  float min_gain_fraction = 0.f;
  COMET_HOST_DEVICE int slots() const { return blocks * tiles_per_block; }
};
inline constexpr int kSplitMaxParts = 6;  // k ranges a split tile is cut into, at most

// Both orders walk the (M tile, column block) grid in groups so that the ~132 tiles in flight
// share few A row blocks and few B column blocks (L2 reuse: a wave of 16 M tiles x 8 column
// blocks reads about half the bytes of 66 x 2, and a quarter of 2 x 66; layer1's 33 x 4 is
// still compute-bound at 800 FLOP per byte of a k-step).
enum class TileOrder : int32_t {
  // layer0: groups of kRasterGroupM M tiles (expert-major, in schedule order); inside a group,
  // column block outer and M tile inner. Group g completes before group g + 2 starts.
  kRowMajor,
  // layer1: groups of kRasterGroupN column blocks; inside a group, M tile outer and column
  // block inner. Column block group j completes before group j + 2 starts.
  kColumnBlockMajor,
};
inline constexpr int kRasterGroupM = 16;
// Also layer1's combine granularity (cuda/comm_rows.cuh): a column group is combined only once
// GEMM1 stored all of it, so the first group is ready after 1/groups of GEMM1 (with groups of
// 8, H = 2048 was one group: no combine could start before GEMM1 ended). Groups of 4 are 1024
// columns, one 16-byte chunk per lane per kCombineUnroll in a combine item.
inline constexpr int kRasterGroupN = 4;
// The column-major raster group in output columns, the same at every tile width: 4 blocks of 256
// columns or 8 of 128 (the standalone schedule, build_gemm_tiles, and the fused plan's layer1
// combine groups, cuda/comm_rows.cuh, both take it from default_raster_group). So a wave of 264
// ping-pong tiles covers the 33 M tiles x 1024 columns that a wave of 132 cooperative ones does,
// and reads the same A rows.
// In groups of 4 blocks of 128, Mixtral's GEMM1 (K = 14336, 8173 rows at 4096 tokens) read all
// of A every wave, 8 times over (DRAM 2.2 GB against the cooperative kernel's 1.3 GB, ncu).
inline constexpr int kRasterGroupColumns = kRasterGroupN * 256;

// Where the identity epilogue puts one output row (GroupedGemmArgs::row_combine). GEMM1 of a
// fused layer: a row that is its token's only row on this rank is the token's whole partial,
// so the epilogue stores weight * row at `dst` (the owner's combine_recv row as this device
// addresses it), with the combine's arithmetic (fp32 fma onto 0, one bf16 rounding); dst null:
// the row goes to D and the combine reads it there. 16 bytes: one asynchronous copy per row.
struct alignas(16) RowCombine {
  void* dst;
  float weight;
  int32_t unused;
};

struct GroupedGemmArgs {
  GemmEpilogue epilogue = GemmEpilogue::kIdentity;
  Activation activation = Activation::kGelu;  // kActivation only: a plain (non-gated) activation
  GemmKernel kernel = GemmKernel::kAuto;  // the schedule's n blocks must match its tile width
  int num_experts = 0;
  int max_rows = 0;  // rows allocated in A and D
  int n = 0;         // output columns
  int k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const GemmTile* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  const uint64_t* wait_flags = nullptr;
  const uint64_t* wait_targets = nullptr;
  uint64_t* done_flags = nullptr;
  // Optional, identity epilogue: per A row, where it goes instead of D (RowCombine above).
  const RowCombine* row_combine = nullptr;
  unsigned* tile_claims = nullptr;  // optional: claimed tiles (above); 0 at launch, 0 after
  uint64_t* tile_end_ns = nullptr;  // optional: %globaltimer when each tile was stored
  // Optional timeline (core/kernel_trace.h): slot t = tile t; waits: the producer's wait on
  // tile t's signal (with wait_flags only). Null: not recorded, no cost beyond a null test.
  KernelTraceEvent* trace_tiles = nullptr;
  KernelTraceEvent* trace_waits = nullptr;
  // Split schedules: `split` = the GemmSplit the schedule was built with (blocks 0: none). The
  // launch checks that it matches this launch (grid, tiles per block, k-tiles of K) and needs the
  // schedule's pieces (split_pieces, from build_gemm_tiles) and the workspace: split_partials,
  // gemm_split_partial_floats(kernel, split) floats; split_flags, gemm_split_flags(split) words,
  // zero before the first launch. A launch that completes without an error leaves them zero;
  // after a launch that recorded one, zero them again (a partial that came late, or whose
  // finishing piece gave up, leaves its flag set). Not with wait_flags or tile_claims (a split
  // tile's parts must wait on nothing but each other), nor with clusters. The grid's blocks
  // wait on each other, so they must all be resident: the launch refuses more blocks than SMs
  // and is cooperative (the runtime runs all blocks together or refuses the launch).
  GemmSplit split;
  const GemmSplitPiece* split_pieces = nullptr;
  float* split_partials = nullptr;
  uint64_t* split_flags = nullptr;
  DeviceError* error = nullptr;     // required
  uint64_t timeout_ns = 5'000'000'000ull;
  int num_blocks = 0;               // 0: one per SM
  int rank = -1;                    // for error records
  int layer = -1;
};

// Rows of B for this epilogue (see the layout above).
int gemm_b_rows(GemmEpilogue epilogue, int n);
// Output columns per tile, and column blocks of the output (the n_block range of a schedule).
int gemm_out_tile_n(GemmEpilogue epilogue, GemmKernel kernel);
int gemm_num_n_blocks(GemmEpilogue epilogue, int n, GemmKernel kernel);
// kAuto resolved for these shapes; other values unchanged.
GemmKernel resolve_gemm_kernel(const GroupedGemmArgs& args);
// Whether the kernel can run these shapes, and why not.
Status can_implement(const GroupedGemmArgs& args);
// Launch (asynchronous on `stream`). Throws comet::Error if !can_implement.
void run_grouped_gemm(const GroupedGemmArgs& args, CUstream_st* stream);

// Padded row offsets of expert segments: offsets[e] = sum_{e'<e} round_up(rows[e'], kGemmBlockM).
std::vector<int> expert_row_offsets(const std::vector<int>& rows_per_expert);
// Upper bound of GEMM tiles of a schedule for `kernel` (cluster schedules add padding tiles, a
// split adds up to kSplitMaxParts rounds of slots).
int64_t max_gemm_tiles(int max_rows, int num_experts, int num_n_blocks, GemmKernel kernel, const GemmSplit& split = {});
// The split for `kernel` at K on the current device: its grid (num_blocks, or one block per SM,
// as run_grouped_gemm launches it) and slots per block; none ({}) for cluster configurations.
GemmSplit gemm_split_for(GemmKernel kernel, int k, int num_blocks = 0);
// A split schedule's workspace: flags (zero before the first launch; fewer than `blocks` tiles
// are cut, into at most kSplitMaxParts parts, so `slots` bounds them) and fp32 partial values
// (one tile per flag).
inline int64_t gemm_split_flags(const GemmSplit& split) { return int64_t(split.slots()) * (kSplitMaxParts - 1); }
int64_t gemm_split_partial_floats(GemmKernel kernel, const GemmSplit& split);

// Device-side schedule for `kernel`: from rows_per_expert[E] (device), writes tiles and *num_tiles.
// With clusters of two, entries 2u and 2u + 1 run together: every expert's M tiles in pairs of one
// column block (rastered as single tiles are), and, for each expert with an odd M tile count, its
// last M tile's column blocks in pairs (n, n + 1), the last completed by a padding tile when the
// column blocks are odd in number; row-major, those run inside the raster group of the expert's
// last pair, column-major after all pairs (cuda/gemm_schedule.h). `capacity` bounds the tiles
// written (*num_tiles = 0 past it). `accepted` (device, optional): when it reads 0 the schedule is
// empty (a refused plan's rows are not in place). `split` (no clusters): cut the last wave's tiles
// along K where gemm_split_plan says it pays (cuda/gemm_schedule.h), writing each entry's piece to
// `pieces` (capacity entries); the launch then needs them and the split workspace
// (GroupedGemmArgs). `half_tiles` false: every tile's `rows` is kGemmBlockM, so no warpgroup skips
// (comet/plan.h, default_half_tiles).
void build_gemm_tiles(const int32_t* rows_per_expert, int num_experts, int num_n_blocks, GemmKernel kernel,
                      TileOrder order, GemmTile* tiles, int32_t* num_tiles, int64_t capacity,
                      CUstream_st* stream, const int32_t* accepted = nullptr, const GemmSplit& split = {},
                      GemmSplitPiece* pieces = nullptr, bool half_tiles = true);

// Host helper: pack gate [E][k][n] and up [E][k][n] (row-major, x W convention) into the
// SwiGLU B layout above, as bf16 bits. The plain weight [E][k][n] -> [E][n][k] transpose
// uses transpose_weights().
std::vector<uint16_t> pack_swiglu_weights(const std::vector<float>& gate, const std::vector<float>& up,
                                          int num_experts, int k, int n);
std::vector<uint16_t> transpose_weights(const std::vector<float>& w, int num_experts, int k, int n);

}  // namespace comet::cuda
