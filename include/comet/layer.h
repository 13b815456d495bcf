// comet/layer.h: the MoE layer on GPUs (no CUDA headers: streams and tensors are opaque).
//
//   auto fabric = comet::fabric::make_loopback_fabric(8);   // 8 virtual ranks on one GPU
//   comet::MoeLayer layer(config, *fabric);
//   layer.set_weights(weights);                              // full fp32 weights, sliced per rank
//                             // (or set_rank_weights(r, {gate, up, down}) per local rank: bf16
//                             //  shards in a checkpoint's layout, host or device memory)
//   layer.forward(ranks, stream);                            // enqueues every rank's forward
//   layer.check(stream);                                     // sync + throw on a device error
//
// Contract:
// - Tensors are device pointers of each rank's device, bf16 row-major: x [T_max][H] (the
//   first *num_tokens rows are used), y [T_max][H]; routing [T_max][topk] int32 ids (-1 masked,
//   each expert at most once per token) and fp32 weights; num_tokens is one int32 in device
//   memory, so token counts and routing may change between calls (and between replays of a
//   captured CUDA graph) without host synchronization. The host never reads them.
// - forward() takes one RankTensors per rank this process drives (fabric.num_local_ranks():
//   every rank on Loopback and Local, the process's own rank on Nccl), in rank order.
// - `stream` belongs to the current device. With ranks on several GPUs of this process (Local
//   fabric) forward() forks to one internal stream per rank and joins back into `stream`; ranks
//   on several GPUs or processes meet in two device-side barriers per call
//   (docs/gpu_layer.md, "Ranks on several GPUs"). Every process must call forward() as often.
// - forward() is asynchronous on `stream` and never synchronizes; a device-side problem (bad
//   token count or expert id, a timeout) is recorded and reported by check().
// - One forward of a layer at a time: every call uses the layer's one workspace (symmetric heap,
//   plans, counters), so a layer's calls must be ordered on the device (one stream, or streams
//   ordered with events); two layers, each on its own fabric, may run concurrently. A MoeLayer
//   is not to be used from several host threads at once.
// - config.tiles is replaced by the GPU kernels' tile shapes (block_m = 128).
// - forward() runs the unfused pipeline (one kernel per step, docs/gpu_layer.md) or the two
//   Comet kernels (comm blocks + GEMM blocks): LayerOptions::path. By default the faster of the
//   two as the tuning table measured it (set_tuning_table), the unfused pipeline without one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comet/config.h"
#include "comet/link_emulation.h"
#include "comet/problem.h"
#include "comet/trace.h"
#include "comet/tuning.h"

struct CUstream_st;

namespace comet {

namespace fabric {
class Fabric;
}

// Which grouped GEMMs the unfused pipeline (and compute-only, MoeLayer::Part::kGemms) runs:
// - kFusedSchedule: the fused kernels' configuration (cooperative 128 x 256) on the plan's tile
//   order, tiles claimed from a counter; for a short batch, GEMM1 on ping-pong 128 x 128 tiles
//   of a static schedule (docs/gpu_layer.md "Short batches");
// - kAuto: the configuration kAuto chooses per layer (docs/gemm.md) on a static schedule built
//   from the plan's expert rows. Faster alone in `comet bench gemm`, but not in the layer: in
//   one run against kFusedSchedule (W = 8, five presets) its compute-only was equal or up to
//   2.8% slower after the run's drift (docs/results/2026-11-30-split-tiles.md), so not the
//   default.
// Both give the same output bit for bit; either may split tiles along K (split_gemms below).
enum class UnfusedGemms { kFusedSchedule, kAuto };

// Which forward() runs. Both compute the same output bit for bit (docs/gpu_layer.md), unless the
// unfused GEMMs split tiles along K (LayerOptions::split_gemms): then within bf16 rounding.
enum class ForwardPath {
  kUnfused,  // the unfused pipeline: one kernel per step
  kFused,    // the two fused Comet kernels
  // The one the nearest tuning-table entry measured faster (comet/tuning.h, choose_path); the
  // unfused pipeline when no entry is near or an entry lacks the unfused time. path() says which.
  // Neither wins everywhere: on one H200 (W = 8) fused is faster for the large-expert presets at
  // large T and slower for the small-expert ones (docs/gpu_layer.md).
  kTuned,
};

// LayerOptions::split_gemms unset: the shortest schedule a layer's split GEMM must save, as a
// fraction of its unsplit schedule (the busiest SM's tiles): in effect, a single wave that
// fills under half the SMs. A split piece re-pays the pipeline fill and moves its fp32 partial
// through L2 twice, and a split list is built by a kernel of its own on a cooperative launch,
// so smaller gains lost to the layer's claimed tiles (12-19% of a schedule in waves, Mixtral's
// and Phi's GEMM0 at 128-512 tokens per rank: docs/results/2026-12-01-short-batches.md).
inline constexpr double kLayerSplitMinGainFraction = 0.5;

// How forward() runs.
struct LayerOptions {
  ForwardPath path = ForwardPath::kTuned;
  UnfusedGemms unfused_gemms = UnfusedGemms::kFusedSchedule;
  // Communication blocks of each fused kernel; 0 chooses: the nearest tuning-table entry
  // (set_tuning_table, comet/tuning.h) or else the analytic cost model; n_comm_source() says which.
  int n_comm0 = 0;
  int n_comm1 = 0;
  // How the fused layer0 moves rows (comet/layer0_mode.h); unset: the nearest tuning-table
  // entry's, else kCommBlocks and kRing; layer0_mode() says which. kGemmBlocks leaves n_comm0
  // unused; its copies record no trace chunks (the GEMM's tiles and waits are recorded), and it
  // cannot be paced to an emulated link (LayerOptions::link): with link emulation on, a table's
  // kGemmBlocks is not taken.
  std::optional<Layer0Copies> layer0_copies;
  std::optional<DispatchOrder> dispatch_order;
  // Height in M tiles of the fused layer0 GEMM's raster groups (L2 reuse of B against how many
  // rows the first wave needs); 0 chooses (docs/gpu_layer.md).
  int layer0_group_m = 0;
  // Stages of the fused layer0's tile order (Layer0Schedule, comet/plan.h): with W stages a
  // tile runs as soon as its last source can have arrived; fewer stages read each expert's
  // weights fewer times (L2). 0 chooses (docs/gpu_layer.md). The unfused pipeline runs GEMM0
  // after the whole dispatch, in one stage (expert-major).
  int layer0_stages = 0;
  // GEMM1's epilogue stores a received token whose only row on this rank is that row straight
  // into the token's slot on its owner (weighted, with the combine's arithmetic), so the combine
  // reads and writes only tokens with two or more rows here (docs/gpu_layer.md "Epilogue
  // combine"). Fused and unfused alike; the output is bitwise the same either way. Not under
  // link emulation (`link`: the epilogue's stores cannot be paced), where every token goes
  // through the combine.
  bool epilogue_combine = true;
  // Who runs layer1's combine (comet/layer1_combine.h); unset: the nearest tuning-table entry's,
  // else kCommBlocks; layer1_combine() says which. kGemmBlocks leaves n_comm1 unused and cannot
  // be paced to an emulated link (`link`): with link emulation on, a table's kGemmBlocks is not
  // taken.
  std::optional<Layer1Combine> layer1_combine;
  // Half tiles in the cooperative GEMMs: the second warpgroup of an expert's last M tile skips
  // its MMAs when all its rows lie past the expert (docs/gemm.md "Rows past an expert's end").
  // Unset: comet/plan.h default_half_tiles, on for long experts (COMET_HALF_TILES=0 or 1 in the
  // environment overrides that default). The output is bitwise the same either way.
  std::optional<bool> half_tiles;
  // Split schedules in the unfused pipeline's GEMMs (and compute-only): a GEMM whose tiles leave
  // most SMs idle, or a last wave partly idle, has those tiles cut into k ranges that run on
  // more SMs, their fp32 partial sums added in a fixed order (docs/gemm.md "Split schedules").
  // The device decides per call from the real rows (no host synchronization); the layer builds
  // split schedules at all only for the GEMMs that would split at T_max under uniform routing.
  // Unset: those GEMMs, where the split shortens the schedule by at least
  // kLayerSplitMinGainFraction (decode-sized batches with long K: Mixtral's GEMM1 at 32 tokens
  // per rank and EP 8 has 32 ping-pong tiles for 132 SMs); true: every GEMM whose configuration
  // can split (no clusters, not the plain-activation epilogue), at any gain of a quarter tile;
  // false: never. A split changes the rounding of the split tiles' sums: the output is
  // deterministic, within bf16 rounding of the unsplit one, and then not bitwise the fused
  // kernels' (which never split). (Short batches also run GEMM1 on ping-pong 128 x 128 tiles,
  // docs/gpu_layer.md "Short batches": the same sums, bit for bit.)
  std::optional<bool> split_gemms;
  double timeout_s = 5.0;  // every device-side wait: fails when its signal has not moved for this long
  int stall_rank = -1;     // fault injection for tests: this rank's communication blocks do nothing
  // Fault injection for tests: forward() throws comet::Error in place of its n-th fused-kernel
  // launch (0-based, counted over the local ranks and both layers in enqueue order), as a launch
  // refused mid-enqueue would, with the earlier kernels already enqueued; -1: never.
  int fail_before_launch = -1;
  // Testing: before each forward, fill the regions the kernels pass rows through (every local
  // rank's published x, A rows, intermediate rows, GEMM1 output rows and combine receive slots)
  // with 0xff bytes, a NaN in bf16 and fp32. A row that a forward should have written but did
  // not (a skipped copy, a tile that read before its signal) then reads as NaN instead of as the
  // previous forward's value, which the same inputs would make equal. Costs one memset of those
  // regions per forward (on the forward's stream; captured into a CUDA graph with it).
  bool poison_workspace = false;
  // Record the fused kernels' timeline (needs path kFused): per block, every GEMM tile, the GEMM
  // producer's waits, and the communication chunks and waits (docs/gpu_layer.md "Timeline");
  // read_trace() returns it. Off: no records, no cost beyond a null test per tile and chunk.
  bool trace = false;
  // Communication records kept per kernel; 0: the plan's bound, which never overflows. Records
  // past it are counted (Trace::dropped_events), never written.
  int64_t trace_chunk_capacity = 0;
  // Paces the dispatch and combine copies between ranks (fused and unfused alike, run_part's
  // kCommunication too) to an emulated link per rank and direction (docs/link_emulation.md).
  // Results are bitwise the same; only the timing changes. Off by default.
  LinkEmulation link;
};

// One rank's share of the expert weights in the layout of PyTorch's nn.Linear weights ([out][in],
// row-major) and of Hugging Face checkpoints (Mixtral's w1/w3/w2, Qwen's and DeepSeek's
// gate_proj/up_proj/down_proj), bf16, the rank's experts in order (E/EP of them, those of its
// EP index) and its F/TP slice (its TP index), each projection contiguous:
//   gate [E/EP][F/TP][H]   gated activations (SwiGLU) only; null for a plain activation
//   up   [E/EP][F/TP][H]
//   down [E/EP][H][F/TP]
// Host or device memory (any GPU): the layer copies them into its own layout on the rank's GPU.
struct RankExpertWeights {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
};

struct RankTensors {
  const void* x = nullptr;
  const int32_t* expert_ids = nullptr;
  const float* weights = nullptr;
  const int32_t* num_tokens = nullptr;
  void* y = nullptr;
};

class MoeLayer {
 public:
  // Throws comet::Error when the configuration cannot run on the GPU, with the reason.
  MoeLayer(const LayerConfig& config, fabric::Fabric& fabric);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // Whether `config` can run on the GPU backend, and why not.
  static Status can_implement(const LayerConfig& config);

  // Both weight setters are synchronous on every stream of the ranks' devices: they wait for
  // the work already there (a forward in flight reads the old weights) and return once the
  // copies are done (the next forward, on any stream, reads the new ones).
  // Full fp32 weights of every expert (x W convention, ExpertWeights), sliced and converted here.
  void set_weights(const ExpertWeights& weights);
  // One local rank's bf16 weights as a checkpoint stores them (RankExpertWeights), copied on the
  // device: for real models, whose full fp32 weights would not fit in one process's memory.
  // forward() needs every local rank's weights, from either call.
  void set_rank_weights(int rank, const RankExpertWeights& weights);
  // From the next forward on. Throws comet::Error for invalid values, and where the choices
  // need device memory that cannot be allocated (the split GEMMs' workspace); a call that
  // throws leaves the options, the table and the layer's choices as they were.
  void set_options(const LayerOptions& options);
  const LayerOptions& options() const;  // as last set
  // Entries measured by `comet tune`; replaces any previous table (as set_options on failure).
  void set_tuning_table(const TuningTable& table);
  // The n_comm the fused kernels use, and where they come from ("options", "tuning table: ...",
  // "cost model: ..."). Tokens per rank are taken as T_max: the host never reads the live count.
  NCommChoice n_comm() const;
  // The path forward() runs (LayerOptions::path resolved) and why ("options" or the tuning
  // table's verdict); like n_comm(), looked up at T_max.
  PathChoice path() const;
  // How the fused layer0 moves rows (LayerOptions::layer0_copies, dispatch_order, else the
  // nearest tuning-table entry's, else communication blocks in ring order), and why.
  Layer0ModeChoice layer0_mode() const;
  // Who runs layer1's combine (LayerOptions::layer1_combine, else the nearest tuning-table
  // entry's, else communication blocks), and why.
  Layer1CombineChoice layer1_combine() const;
  // Whether the GEMM tile lists use half tiles (LayerOptions::half_tiles, else the default).
  bool half_tiles() const;
  // Whether the unfused pipeline builds split schedules for layer `layer`'s GEMM (0 or 1;
  // LayerOptions::split_gemms); the device then splits when the call's rows make it pay.
  bool split_gemms(int layer) const;

  // Benchmarks only. Deterministic pseudo-random weights (uniform, scale 1/sqrt(fan-in)) written
  // on the device: full-size presets have more weights than fit in host fp32. Synchronous as
  // the two setters above.
  void set_random_weights(uint64_t seed);
  // Benchmarks only: one part of the unfused pipeline on every rank, on the plans and buffers of
  // the last forward() (call it once first). kGemms: the two grouped GEMMs as the unfused
  // pipeline runs them (the compute-only time; LayerOptions::unfused_gemms); kCommunication: the dispatch and combine copy kernels (the communication-only time);
  // kPlan: every rank's device plan kernel (the metadata cost of a forward); kFusedGemms: the
  // two fused kernels with their communication blocks idle and no waits or signals (data in
  // place): the grouped GEMMs on the SMs the fused kernels leave them, so that fused minus this
  // is the cost of moving data inside them, and this minus kGemms the cost of the split.
  // kBarrier: the forward's device-side barrier of the ranks alone (nothing when every rank
  // shares one stream), so that a timed step can start with ranks in other processes in step.
  enum class Part { kGemms, kCommunication, kPlan, kFusedGemms, kBarrier };
  void run_part(Part part, CUstream_st* stream);
  void forward(const std::vector<RankTensors>& ranks, CUstream_st* stream);
  // Waits for `stream`, then throws comet::Error describing the first recorded device error in
  // rank order (comet::TimeoutError when it is a wait that timed out, with no bad input behind
  // it); a barrier timeout only when no rank recorded another error (a rank stuck on a missing
  // signal also keeps its peers waiting in the next barrier; its own record names why).
  void check(CUstream_st* stream);
  // The timeline of the last forward() with LayerOptions::trace (call check() first): one event
  // per GEMM tile, producer wait that took time, communication chunk and communication wait of
  // every rank's two kernels; lane = thread block, sublane = warp; times in ns from the
  // forward's first recorded event. Waits for `stream`. Throws comet::Error when the last
  // forward was not traced or did not finish.
  Trace read_trace(CUstream_st* stream);
  const LayerConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace comet
