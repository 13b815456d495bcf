// MoeLayer: the MoE layer on GPUs, as the unfused pipeline (one kernel per step) or the two
// fused Comet kernels (LayerOptions::path).
//
// Per call and rank r:
//   1. publish: copy x, routing and the token count into r's symmetric regions (cuda/publish.h:
//      the rows below the token count, every rank of a device in one launch)
//   2. plan:    build_device_plan (reads every rank's routing through the peer table)
//   3. dispatch: pull each received token's row once from its owner, write it to every A row
//      it feeds
//   4. GEMM0 (+ SwiGLU) and GEMM1 with the plan's tile lists (the grouped GEMM)
//   5. combine: pre-reduce each received token's rows (fp32, weighted, slot order), convert to
//      bf16 and store it into the owner's combine_recv slot; with LayerOptions::epilogue_combine
//      a token with a single row here was stored there by GEMM1's epilogue (step 4) instead
//   6. owner reduce: sum the partial rows of each own token in rank order 0..W-1 (fp32) into y
//      (every rank of a device in one launch)
// Fused, steps 3-5 are the layer0 kernel (dispatch + GEMM0) and the layer1 kernel (GEMM1 +
// combine). The same reduction structure as the CPU backend; no float atomics: deterministic.
//
// Two ways to order the ranks (docs/gpu_layer.md, "Ranks on several GPUs"):
// - one stream (every rank on one GPU, all in this process: Loopback): phase by phase across
//   ranks, so a phase's kernels see every rank's previous phase complete; stream order is the
//   barrier.
// - one stream per GPU (Local: the ranks over several GPUs, one or several per GPU; Nccl: a
//   process per rank): each GPU's ranks one after another on that device, with a device-side
//   barrier between ranks after step 1 (peers' inputs are published) and after step 5 (peers'
//   partial rows have arrived). The second barrier also keeps the next call's publish and
//   pushes away from buffers peers still read.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string_view>

#include "comet/layer.h"
#include "comet/layer_choices.h"
#include "comet/plan.h"
#include "comet/workspace.h"
#include "cuda/check.h"
#include "cuda/comm_rows.cuh"
#include "cuda/dependent_launch.h"
#include "cuda/device_info.h"
#include "cuda/device_plan.h"
#include "cuda/fused_layer.h"
#include "cuda/grouped_gemm.h"
#include "cuda/publish.h"
#include "cuda/random_fill.h"
#include "cuda/rank_barrier.h"
#include "cuda/rank_weights.h"
#include "cuda/tensor_checks.h"
#include "cuda/trace_record.cuh"
#include "fabric/fabric.h"
#include "fabric/fabric_util.h"

namespace comet {

namespace {

using cuda::DevicePlanView;
using fabric::detail::DeviceGuard;

constexpr int kWarpsPerBlock = 8;
// The copy kernels run one block per SM (grid-stride loops: any grid is correct), the owner
// reduce two (its blocks fit two per SM, cuda/comm_rows.cuh).
constexpr int kOwnerReduceBlocksPerSm = 2;
// The fused layer0's raster group height: its first wave then waits for the rows of this many
// M tiles instead of kRasterGroupM (docs/results/ has the measurement).
constexpr int kFusedLayer0GroupM = 4;
// A 0 / 1 switch in the environment, to compare two schedules on one binary: -1 when unset; any
// other value throws, naming the variable ("off" must not mean on).
int env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return -1;
  const std::string_view s(v);
  COMET_CHECK(s == "0" || s == "1", name << " must be 0 or 1, got '" << s << "'");
  return s == "1" ? 1 : 0;
}
// The layer's default half tiles (comet/plan.h default_half_tiles), or COMET_HALF_TILES=0 / 1 in
// the environment (read once); LayerOptions::half_tiles wins.
bool layer_half_tiles(const LayerConfig& config) {
  static const int forced = env_switch("COMET_HALF_TILES");
  return forced >= 0 ? forced == 1 : default_half_tiles(config);
}
// Whether layer1's lists may cut a last M tile in two (cuda/device_plan.h layer1_cut_m_tiles):
// on, unless COMET_CUT_TILES=0 in the environment (read once).
bool layer1_cut_tiles() {
  static const bool on = env_switch("COMET_CUT_TILES") != 0;
  return on;
}

// The unfused pipeline's copy kernels run the fused kernels' data movement (cuda/comm_rows.cuh)
// without signals, in blocks of kWarpsPerBlock warps.
__global__ void dispatch_kernel(const __grid_constant__ cuda::FusedCommArgs f) {
  cuda::begin_dependent_kernel();
  __shared__ int32_t psum[cuda::kMaxWorld + 1];
  cuda::load_recv_psum(f, psum);
  const int warps = int(blockDim.x) / 32;
  cuda::dispatch_rows(f, psum, int(blockIdx.x) * warps + int(threadIdx.x) / 32, int(gridDim.x) * warps);
}

__global__ void combine_kernel(const __grid_constant__ cuda::FusedCommArgs f) {
  cuda::begin_dependent_kernel();
  __shared__ int32_t psum[cuda::kMaxWorld + 1];
  cuda::load_recv_psum(f, psum);
  const int warps = int(blockDim.x) / 32;
  cuda::combine_rows(f, psum, int(blockIdx.x) * warps + int(threadIdx.x) / 32, int(gridDim.x) * warps);
}

// The owner reduce of up to kOwnerReduceBatch ranks of one device in one launch (blockIdx.y: the
// rank in the batch): at W = 8 on one GPU, one launch instead of eight short ones.
constexpr int kOwnerReduceBatch = 8;
struct OwnerReduceBatch {
  cuda::OwnerReduceArgs ranks[kOwnerReduceBatch];
};
__global__ void __launch_bounds__(32 * kWarpsPerBlock, kOwnerReduceBlocksPerSm) owner_reduce_kernel(const __grid_constant__ OwnerReduceBatch b) {
  cuda::begin_dependent_kernel();
  const int warps = int(blockDim.x) / 32;
  cuda::owner_reduce_rows(b.ranks[blockIdx.y], int(blockIdx.x) * warps + int(threadIdx.x) / 32, int(gridDim.x) * warps);
}

// The tiles the GPU runs, whatever the config asked for (its tiles are the CPU backend's).
LayerConfig gpu_config(LayerConfig c) {
  c.tiles = {cuda::kGemmBlockM, 128, 256};
  return c;
}

// The configuration the workspace is laid out for: layer1 column blocks of the narrowest width
// any GEMM1 configuration stores (ping-pong 128x128, Layer1Combine::kGemmBlocks). col_done holds
// a word per column block, and the layer1 combine (and with it the width) may change per forward.
LayerConfig workspace_config(LayerConfig c) {
  c.tiles.block_n1 = cuda::gemm_out_tile_n(cuda::GemmEpilogue::kIdentity, cuda::GemmKernel::kPingpong128x128);
  return c;
}

}  // namespace

struct MoeLayer::Impl {
  LayerConfig config;
  fabric::Fabric& fabric;
  WorkspaceLayout layout;
  cuda::DevicePlanLayout plan_layout;
  struct Rank {
    int rank = 0;    // in [0, W)
    int device = 0;  // fabric.device_of(rank)
    void* plan_buffer = nullptr;
    DevicePlanView plan{};
    void* w0 = nullptr;  // [E/EP][n_b][H] packed gate/up
    void* w1 = nullptr;  // [E/EP][H][F/TP]
    bool weights_set = false;
    // Two records, one allocation: error[0] for timeouts and schedule errors, which every wait
    // watches (one dead peer costs one timeout); error[1] for bad input found by the plan, which
    // no wait watches, so the forward and the ones after it still run the protocol in step.
    static constexpr int kErrorRecords = 2;
    cuda::DeviceError* error = nullptr;
    cuda::DeviceError* input_error() const { return error + 1; }
    const int32_t** count_table = nullptr;  // [W] peers' token_count regions
    const int32_t** id_table = nullptr;
    const float** weight_table = nullptr;
    // The unfused pipeline's GEMM schedules (one allocation): layer0's tiles, layer1's tiles,
    // layer0's split pieces, layer1's, then their two counts, built each forward from the plan's
    // expert rows when the unfused GEMMs do not run the plan's own lists (unfused_gemm_kernel,
    // splits), unfused_capacity[layer] entries each.
    cuda::GemmTile* unfused_tiles[2] = {nullptr, nullptr};
    cuda::GemmSplitPiece* unfused_pieces[2] = {nullptr, nullptr};
    int32_t* unfused_num_tiles = nullptr;
    // Epoch bookkeeping of the fused kernels, one allocation: tile base/target [MT] each,
    // column base/target [NB1] each (cuda/device_plan.h), the combine work counter, then the
    // link pacers of dispatch and combine (cuda/link_pace.h), then the rank barrier's generation
    // (cuda/rank_barrier.h).
    uint64_t* epochs = nullptr;
  };
  std::vector<Rank> ranks;  // this process's ranks: entry i is rank fabric.first_local_rank() + i
  // The local ranks of one GPU: entries [first, first + count) of `ranks` (a fabric puts the
  // ranks of a GPU next to each other). With group_streams, the group's stream on its device,
  // and the event that marks the end of its work of a call.
  // The split workspace (GroupedGemmArgs::split_partials, split_flags) is the group's: its
  // ranks' GEMMs run one after another on one stream, so one serves them all. Allocated when a
  // layer may split (ensure_split_workspace); the flags zeroed then and after a timeout.
  struct Group {
    int device = 0;
    int first = 0, count = 0;
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    float* split_partials = nullptr;
    uint64_t* split_flags = nullptr;
  };
  std::vector<Group> groups;
  const Group& group_of(const Rank& k) const {
    const int i = local_index(k);
    for (const Group& g : groups)
      if (i >= g.first && i < g.first + g.count) return g;
    COMET_CHECK(false, "MoeLayer: rank " << k.rank << " is in no GPU group");
    return groups.front();
  }
  // Timeline buffers (LayerOptions::trace), one allocation per local rank made by the first
  // traced forward and zeroed before each one; every record is a KernelTraceEvent (32 bytes):
  //   tiles0  [MT * NB0]  layer0 GEMM tiles, slot = tile index
  //   waits0  [MT * NB0]  layer0 GEMM producer waits, slot = tile index
  //   tiles1  [max_tiles1]  layer1 GEMM tiles (DevicePlanLayout)
  //   chunks0 [C0]        layer0 communication records, C = trace_chunk_capacity() of the plan's
  //   chunks1 [C1]        bounds (W * T_max slots or M tiles x 128 rows, every warp of the grid), or the option
  //   counts  unsigned [2] in one more record: chunk records claimed by each layer
  struct TraceBuffers {
    int64_t tiles0 = 0, tiles1 = 0, chunks0 = 0, chunks1 = 0;
    std::vector<KernelTraceEvent*> base;  // [local ranks]
    bool last_forward_traced = false;
    int n_comm[2] = {0, 0};  // of the traced forward
    int64_t records() const { return 2 * tiles0 + tiles1 + chunks0 + chunks1 + 1; }
    KernelTraceEvent* tiles(int i, int layer) const { return base[i] + (layer == 0 ? 0 : 2 * tiles0); }
    KernelTraceEvent* waits(int i) const { return base[i] + tiles0; }
    KernelTraceEvent* chunks(int i, int layer) const { return base[i] + 2 * tiles0 + tiles1 + (layer == 0 ? 0 : chunks0); }
    int64_t chunk_capacity(int layer) const { return layer == 0 ? chunks0 : chunks1; }
    unsigned* counts(int i) const { return reinterpret_cast<unsigned*>(base[i] + records() - 1); }
  } trace;
  int local_index(const Rank& k) const { return k.rank - fabric.first_local_rank(); }
  // Ranks on several GPUs or in several processes: each GPU's ranks run on a stream of their own
  // and meet the other GPUs' in barrier kernels. Otherwise every rank runs on the caller's
  // stream and stream order is the barrier.
  bool group_streams = false;
  bool config_half_tiles = true;  // layer_half_tiles(config), unless options say otherwise
  bool half_tiles() const { return options.half_tiles.value_or(config_half_tiles); }
  std::map<int, cudaEvent_t> fork_events;  // per device of a caller's stream
  std::string unusable;                     // why forward() refuses (after a multi-process error)
  bool have_weights() const {  // every local rank's
    return std::all_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.weights_set; });
  }
  // A weight setter marks the ranks it writes as unset first and each one set again once its
  // copies are done: one that throws half way leaves forward() refusing to run (until the weights
  // are set again) rather than running a mix of old and new weights.
  template <class It>
  void forget_weights(It first, It last) {
    for (; first != last; ++first) first->weights_set = false;
  }

  // Rank k's weight buffers on its (current) device, allocated once: w0 [E/EP][n_b][H], w1
  // [E/EP][H][F/TP], as element counts.
  size_t w0_elements() const {
    return size_t(config.experts_per_rank()) * cuda::gemm_b_rows(gemm_shape(0).epilogue, config.ffn_per_rank()) *
           config.model.hidden;
  }
  size_t w1_elements() const { return size_t(config.experts_per_rank()) * config.model.hidden * config.ffn_per_rank(); }
  void allocate_weights(Rank& k) const {
    if (!k.w0) COMET_CUDA_CHECK(cudaMalloc(&k.w0, w0_elements() * 2));
    if (!k.w1) COMET_CUDA_CHECK(cudaMalloc(&k.w1, w1_elements() * 2));
  }
  LayerOptions options;
  TuningTable tuning;
  LayerChoices choices;  // path, n_comm, layer0 mode, layer1 combine: resolve_choices()
  // Layer1's column width of the last plan built (forward() or run_part(kPlan)): run_part's
  // GEMMs and copies run on that plan, so they must not switch width before a new one.
  int planned_layer1_width = 0;
  uint64_t heap_generation = 0;              // the fabric's, after this layer's allocate()
  cuda::RankTensorCheck tensor_check{{"MoeLayer", false, "the output is stored 16 bytes at a time"}};
  bool fused_path() const { return choices.path.fused; }
  // SwiGLU (the presets' experts): GEMM0 + SwiGLU, fused or unfused. A plain activation (GELU,
  // ReLU, SiLU): GEMM0 with the plain-activation epilogue, which is instantiated for the ping-pong
  // configuration only, so the unfused pipeline runs it on the kAuto schedule; the fused kernels
  // fuse SwiGLU only.
  bool gated() const { return is_gated(config.model.activation); }
  // LayerOptions::epilogue_combine as it runs: the plan (combine list, row_combine) and GEMM1
  // (its epilogue's stores) must agree, so both ask this.
  bool epilogue_combine() const { return options.epilogue_combine && !options.link.on(); }
  // The GPU the choices are made for (LayerTarget, comet/layer_choices.h), set when the layer is
  // made: options and tables change, the device does not.
  LayerTarget target;
  // The path, the layer0 mode, the layer1 combine and n_comm from options, the tuning table
  // (nearest entry at T_max) or the defaults and the cost model.
  void resolve_choices() {
    choices = resolve_layer_choices(config, options, tuning, target);
    for (int layer = 0; layer < 2; ++layer) splits[layer] = unfused_split(layer);
    ensure_split_workspace();
  }
  // resolve_choices after options or the table changed; where it throws (the split workspace
  // could not be allocated), `restore` puts the previous options or table back and their
  // choices are resolved again (they need no allocation: they were resolved before), so a
  // refused change leaves the layer as it was.
  template <class Restore>
  void resolve_choices_or_restore(Restore restore) {
    try {
      resolve_choices();
    } catch (...) {
      restore();
      resolve_choices();
      throw;
    }
  }
  int layer0_group_m() const {
    if (options.layer0_group_m > 0) return options.layer0_group_m;
    return fused_path() ? kFusedLayer0GroupM : cuda::kRasterGroupM;
  }
  // Stages of the layer0 order (Layer0Schedule). Unfused, every row is in place before GEMM0:
  // one stage. Fused, one stage per source re-reads each expert's weights W times (qwen3, W = 8
  // on one GPU: GEMM0 read 1.04 GB for 133 MB of A and 100 MB of B), while the dispatch is short
  // next to GEMM0: default_layer0_stages (comet/plan.h, docs/gpu_layer.md).
  int layer0_stages() const {
    if (!fused_path()) return 1;
    if (options.layer0_stages > 0) return options.layer0_stages;
    if (choices.layer0.mode.order == DispatchOrder::kRows) return 1;  // rows land in GEMM0's expert-major order
    return default_layer0_stages(config.layout.world);
  }
  // Tile base/target [MT] each, column base/target [NB1] each, the combine work counter (one
  // word), the two layers' GEMM tile-claim counters (one word each), one LinkPacer per layer,
  // then the rank barrier's generation (one word). Layer0's pacer paces the rank's dispatch
  // pulls (its incoming link), layer1's its combine pushes (its outgoing link). Each phase's
  // kernels zero the other phase's pacer, so every phase starts from a zero pacer without a
  // memset (the plan kernel need not run: run_part(kCommunication) is paced too); reset_epochs
  // zeroes both.
  int64_t claims_word() const { return 2 * plan_layout.max_m_tiles + 2 * plan_layout.n_blocks1; }
  int64_t epoch_words() const { return claims_word() + 3 + 2 * cuda::kLinkPacerWords + 1; }
  unsigned* combine_claims(const Rank& k) const { return reinterpret_cast<unsigned*>(k.epochs + claims_word()); }
  // Layer `layer`'s GEMM tile claims (GroupedGemmArgs::tile_claims): zeroed with the epochs,
  // and every launch leaves it zero.
  unsigned* tile_claims(const Rank& k, int layer) const {
    return reinterpret_cast<unsigned*>(k.epochs + claims_word() + 1 + layer);
  }
  cuda::LinkPacer* link_pacer(const Rank& k, int layer) const {
    return reinterpret_cast<cuda::LinkPacer*>(k.epochs + claims_word() + 3) + layer;
  }
  uint64_t* barrier_generation(const Rank& k) const { return k.epochs + epoch_words() - 1; }
  char* region(const Rank& k, const char* name) const {
    return static_cast<char*>(fabric.base(k.rank)) + layout.region(name).offset_bytes;
  }

  // The shape of layer 0's GEMM (GEMM0 + SwiGLU) or layer 1's (GEMM1), every rank's the same.
  cuda::GroupedGemmArgs gemm_shape(int layer) const {
    cuda::GroupedGemmArgs g;
    g.epilogue = layer == 1 ? cuda::GemmEpilogue::kIdentity : gated() ? cuda::GemmEpilogue::kSwiGlu
                                                                       : cuda::GemmEpilogue::kActivation;
    g.activation = config.model.activation;
    g.num_experts = config.experts_per_rank();
    g.max_rows = int(config.max_rows_per_rank());
    g.n = layer == 0 ? config.ffn_per_rank() : config.model.hidden;
    g.k = layer == 0 ? config.model.hidden : config.ffn_per_rank();
    return g;
  }
  // GEMM arguments of a rank for a layer as the fused kernels run them: the cooperative
  // configuration, the plan's tiles, claimed from the layer's counter.
  cuda::GroupedGemmArgs gemm_args(const Rank& k, int layer) const {
    cuda::GroupedGemmArgs g = gemm_shape(layer);
    g.kernel = layer == 1 ? layer1_kernel() : cuda::GemmKernel::kCooperative128x256;
    g.a = region(k, layer == 0 ? "a_rows" : "inter");
    g.b = layer == 0 ? k.w0 : k.w1;
    g.d = region(k, layer == 0 ? "inter" : "out_rows");
    g.tiles = layer == 0 ? k.plan.tiles0 : k.plan.tiles1;
    g.num_tiles = k.plan.num_tiles + layer;
    g.tile_claims = tile_claims(k, layer);
    if (layer == 1 && epilogue_combine()) g.row_combine = k.plan.row_combine;
    g.error = k.error;
    g.timeout_ns = timeout_ns();
    g.rank = k.rank;
    g.layer = layer;
    return g;
  }
  uint64_t timeout_ns() const { return uint64_t(options.timeout_s * 1e9); }
  // Layer1's GEMM configuration, column blocks and combine groups follow who runs the combine
  // (LayerOptions::layer1_combine): the plan, the GEMMs and the combine must agree, so all ask here.
  bool layer1_gemm_combine() const { return choices.layer1.combine == Layer1Combine::kGemmBlocks; }
  cuda::GemmKernel layer1_kernel() const {
    return layer1_gemm_combine() ? cuda::GemmKernel::kPingpong128x128 : cuda::GemmKernel::kCooperative128x256;
  }
  int layer1_col_width() const { return cuda::gemm_out_tile_n(cuda::GemmEpilogue::kIdentity, layer1_kernel()); }
  int layer1_col_blocks() const { return (config.model.hidden + layer1_col_width() - 1) / layer1_col_width(); }
  int combine_group_blocks() const { return cuda::combine_group_blocks(layer1_col_width()); }

  enum class Signals { kOff, kOn };
  // What the data movement of a rank's layer needs (cuda/comm_rows.cuh); with signals on, the
  // fused kernels' counters and targets.
  cuda::FusedCommArgs comm_args(const Rank& k, int layer, Signals signals) const {
    cuda::FusedCommArgs f;
    f.plan = k.plan;
    f.peers = fabric.peer_table(k.rank);
    f.x_offset = layout.region("x").offset_bytes;
    f.combine_offset = layout.region("combine_recv").offset_bytes;
    f.a_rows = region(k, "a_rows");
    f.out_rows = region(k, "out_rows");
    f.hidden = config.model.hidden;
    f.rows_per_token = plan_layout.rows_per_token;
    f.world = config.layout.world;
    f.rank = k.rank;
    f.t_max = config.max_tokens_per_rank;
    f.num_col_blocks = layer1_col_blocks();
    f.col_width = layer1_col_width();
    f.combine_group_blocks = combine_group_blocks();
    f.n_comm = layer == 0 ? choices.n_comm.n_comm0 : choices.n_comm.n_comm1;
    f.gemm_block_copies = layer == 0 && choices.layer0.mode.copies == Layer0Copies::kGemmBlocks;
    f.dispatch_by_row = layer == 0 && choices.layer0.mode.order == DispatchOrder::kRows;
    f.stall = options.stall_rank == k.rank;
    f.timeout_ns = timeout_ns();
    f.error = k.error;
    f.link = cuda::make_link_pace(options.link, link_pacer(k, layer), 1, f.timeout_ns);
    f.link_reset = link_pacer(k, 1 - layer);
    if (signals == Signals::kOn) {
      const int64_t mt = plan_layout.max_m_tiles, nb = plan_layout.n_blocks1;
      if (layer == 0) f.tile_arrivals = reinterpret_cast<uint64_t*>(region(k, "tile_arrivals"));
      else f.col_done = reinterpret_cast<uint64_t*>(region(k, "col_done"));
      if (layer == 1) f.combine_claims = combine_claims(k);
      f.col_target = k.epochs + 2 * mt + nb;
    }
    return f;
  }

  // ---- The steps of one rank (the caller has made the rank's device current).
  // LayerOptions::poison_workspace, before step 1: NaN in every region rows pass through.
  void poison(const Rank* first, int n, cudaStream_t s) const {
    for (int i = 0; i < n; ++i)
      for (const char* name : {"x", "a_rows", "inter", "out_rows", "combine_recv"})
        COMET_CUDA_CHECK(cudaMemsetAsync(region(first[i], name), 0xff, size_t(layout.region(name).bytes), s));
  }
  // Step 1 for `n` ranks of one device from `first` (one launch; cuda/publish.h).
  void publish(const Rank* first, const RankTensors* const* t, int n, cudaStream_t s) const {
    std::vector<cuda::PublishCopy> copies(n);
    for (int i = 0; i < n; ++i) {
      const Rank& k = first[i];
      cuda::PublishCopy& c = copies[i];
      c.x = t[i]->x;
      c.x_dst = region(k, "x");
      c.ids = t[i]->expert_ids;
      c.ids_dst = reinterpret_cast<int32_t*>(region(k, "route_ids"));
      c.weights = t[i]->weights;
      c.weights_dst = reinterpret_cast<float*>(region(k, "route_weights"));
      c.count = t[i]->num_tokens;
      c.count_dst = reinterpret_cast<int32_t*>(region(k, "token_count"));
    }
    cuda::publish_inputs({config.max_tokens_per_rank, config.model.hidden, config.model.topk}, copies.data(), n,
                         target.num_sms, s);
  }
  // The plan kernels of `count` ranks from `first` (one launch for up to 8 ranks of one device);
  // with signals on, also this call's epoch targets (fused kernels).
  void plans(const Rank* first, int count, Signals signals, cudaStream_t s) const {
    std::vector<cuda::DevicePlanArgs> args(count);
    for (int i = 0; i < count; ++i) {
      const Rank& k = first[i];
      cuda::DevicePlanArgs& a = args[i];
      a.rank = k.rank;
      a.token_counts = k.count_table;
      a.route_ids = k.id_table;
      a.route_weights = k.weight_table;
      a.plan = k.plan;
      a.error = k.input_error();
      a.layer0_group_m = layer0_group_m();
      a.layer0_stages = layer0_stages();
      a.half_tiles = half_tiles();
      a.layer1_width = layer1_col_width();
      // Layer1's claimed tiles run on every SM (the fused kernel's communication blocks with no
      // combine slots join at once); the cut M tiles need the cooperative kernel's half tiles.
      if (layer1_kernel() == cuda::GemmKernel::kCooperative128x256 && layer1_cut_tiles()) a.layer1_grid = target.num_sms;
      if (signals == Signals::kOn) {
        uint64_t* e = k.epochs;
        const int64_t mt = plan_layout.max_m_tiles, nb = plan_layout.n_blocks1;
        a.tile_base = e;
        a.tile_target = e + mt;
        a.col_base = e + 2 * mt;
        a.col_target = e + 2 * mt + nb;
        a.combine_claims = combine_claims(k);
      }
      if (epilogue_combine()) {
        a.combine_peers = fabric.peer_table(k.rank);
        a.combine_offset = layout.region("combine_recv").offset_bytes;
      }
    }
    cuda::build_device_plans(config, args.data(), count, s);
  }
  // The unfused dispatch (also run_part(kCommunication)) always in ring order, whatever the
  // layer0 mode: GEMM0 starts after every row is in place, so nothing gains from rows landing in
  // GEMM0's order, and ring order reads each received token once for all its rows where row
  // order reads it once per row (over the link, from a peer: qwen3 at EP 2 about 4 times).
  void dispatch(const Rank& k, cudaStream_t s) const {
    cuda::FusedCommArgs f = comm_args(k, 0, Signals::kOff);
    f.dispatch_by_row = false;
    cuda::launch_kernel(dispatch_kernel, dim3(target.num_sms), dim3(32 * kWarpsPerBlock), 0, s, cuda::LaunchAttributes(), f);
  }
  // The unfused pipeline's GEMMs (also run_part(kGemms), compute-only), LayerOptions::unfused_gemms:
  // the fused kernels' configuration and claimed tiles of the plan, or the configuration kAuto
  // chooses per layer (docs/gemm.md) on static tiles of a schedule built on the stream from the
  // plan's expert rows (the same row segments, so the same outputs bit for bit).
  cuda::GemmKernel unfused_kernel[2] = {cuda::GemmKernel::kAuto, cuda::GemmKernel::kAuto};
  int64_t unfused_capacity[2] = {0, 0};
  // The configurations a layer's unfused GEMM can run: kAuto's, and the fused kernels' (layer1's
  // follows the combine: cooperative 128 x 256 or ping-pong 128 x 128).
  static constexpr cuda::GemmKernel kFusedGemmKernels[] = {cuda::GemmKernel::kCooperative128x256,
                                                           cuda::GemmKernel::kPingpong128x128};
  // kAuto's configurations, and tile lists for any of them, split on `num_sms` blocks or not.
  void resolve_unfused_gemms(int num_sms) {
    for (int layer = 0; layer < 2; ++layer) {
      const cuda::GroupedGemmArgs g = gemm_shape(layer);
      unfused_kernel[layer] = cuda::resolve_gemm_kernel(g);
      unfused_capacity[layer] = 0;
      std::vector<cuda::GemmKernel> kernels(std::begin(kFusedGemmKernels), std::end(kFusedGemmKernels));
      kernels.push_back(unfused_kernel[layer]);
      for (cuda::GemmKernel kernel : kernels)
        unfused_capacity[layer] = std::max(
            unfused_capacity[layer],
            cuda::max_gemm_tiles(g.max_rows, g.num_experts, cuda::gemm_num_n_blocks(g.epilogue, g.n, kernel), kernel,
                                 cuda::gemm_split_for(kernel, g.k, num_sms)));
    }
  }
  // The configuration a layer's unfused GEMM runs (LayerOptions::unfused_gemms): the fused
  // kernels' (the plan's tile lists, unless it splits), or kAuto's on a list built from the
  // plan's expert rows. GEMM0 of a plain activation runs kAuto's: its epilogue is instantiated
  // for ping-pong only, and the fused kernels fuse SwiGLU.
  bool unfused_runs_fused_schedule(int layer) const {
    return options.unfused_gemms == UnfusedGemms::kFusedSchedule && (layer == 1 || gated());
  }
  // GEMM1 of a short batch runs ping-pong 128 x 128 instead of cooperative 128 x 256 (the same
  // sums, bit for bit): twice the tiles fill twice the SMs where fewer cooperative tiles than
  // half the SMs are expected at T_max (Mixtral's GEMM1 at 128 tokens per rank, EP 8: 77 us
  // against 139, docs/results/2026-12-01-short-batches.md).
  cuda::GemmKernel unfused_gemm_kernel(int layer) const {
    if (!unfused_runs_fused_schedule(layer)) return unfused_kernel[layer];
    if (layer == 0) return cuda::GemmKernel::kCooperative128x256;
    const cuda::GemmKernel fused = layer1_kernel();
    if (fused == cuda::GemmKernel::kCooperative128x256 && 2 * expected_tiles(1, fused) < target.num_sms)
      return cuda::GemmKernel::kPingpong128x128;
    return fused;
  }
  // Tiles of a layer's GEMM on `kernel` at T_max under uniform routing: W * T_max * topk rows
  // spread over the routed experts.
  int64_t expected_tiles(int layer, cuda::GemmKernel kernel) const {
    const cuda::GroupedGemmArgs g = gemm_shape(layer);
    const int64_t routed = std::max(1, config.model.routed_experts());
    const int64_t rows = (int64_t(config.layout.world) * config.max_tokens_per_rank * config.model.topk + routed - 1) / routed;
    return (rows + cuda::kGemmBlockM - 1) / cuda::kGemmBlockM * g.num_experts * cuda::gemm_num_n_blocks(g.epilogue, g.n, kernel);
  }
  // The split a layer's unfused GEMM builds its schedules with (LayerOptions::split_gemms;
  // blocks 0: none): by default only where the GEMM would split at T_max under uniform routing,
  // W * T_max * topk rows spread over the routed experts, by at least kLayerSplitMinGainFraction.
  // The device builder decides again from each call's rows.
  cuda::GemmSplit splits[2];
  cuda::GemmSplit unfused_split(int layer) const {
    const cuda::GroupedGemmArgs g = gemm_shape(layer);
    const cuda::GemmKernel kernel = unfused_gemm_kernel(layer);
    if (options.split_gemms == false || cuda::gemm_cluster_m(kernel) != 1 || g.epilogue == cuda::GemmEpilogue::kActivation)
      return {};
    cuda::GemmSplit split = cuda::gemm_split_for(kernel, g.k, target.num_sms);
    if (options.split_gemms == true) return split;
    split.min_gain_fraction = float(kLayerSplitMinGainFraction);
    return cuda::gemm_split_plan(expected_tiles(layer, kernel), split).parts > 1 ? split : cuda::GemmSplit{};
  }
  // Every group's split workspace, once a layer may split: sized for either configuration that
  // splits (cooperative or ping-pong, whatever the options choose later), so never reallocated
  // (a captured graph keeps its pointers).
  void ensure_split_workspace() {
    if (splits[0].blocks == 0 && splits[1].blocks == 0) return;
    int64_t floats = 0, flags = 0;
    for (int layer = 0; layer < 2; ++layer)
      for (cuda::GemmKernel kernel : kFusedGemmKernels) {
        const cuda::GemmSplit split = cuda::gemm_split_for(kernel, gemm_shape(layer).k, target.num_sms);
        floats = std::max(floats, cuda::gemm_split_partial_floats(kernel, split));
        flags = std::max(flags, cuda::gemm_split_flags(split));
      }
    split_flag_words = flags;
    DeviceGuard guard;
    for (Group& g : groups) {
      if (g.split_flags) continue;
      COMET_CUDA_CHECK(cudaSetDevice(g.device));
      void* partials = nullptr;
      void* words = nullptr;
      // Nothing is kept unless all of it succeeds (the caller then restores the previous choices).
      auto refuse = [&](cudaError_t e, const char* what) {
        cudaGetLastError();
        cudaFree(partials);
        cudaFree(words);
        COMET_CHECK(false, "MoeLayer: could not " << what << " on GPU " << g.device << ": " << cudaGetErrorString(e));
      };
      if (cudaError_t e = cudaMalloc(&partials, size_t(floats) * sizeof(float)); e != cudaSuccess)
        refuse(e, "allocate the split GEMMs' partial sums");
      if (cudaError_t e = cudaMalloc(&words, size_t(flags) * sizeof(uint64_t)); e != cudaSuccess)
        refuse(e, "allocate the split GEMMs' flags");
      if (cudaError_t e = cudaMemset(words, 0, size_t(flags) * sizeof(uint64_t)); e != cudaSuccess)
        refuse(e, "zero the split GEMMs' flags");
      if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) refuse(e, "zero the split GEMMs' flags");
      g.split_partials = static_cast<float*>(partials);
      g.split_flags = static_cast<uint64_t*>(words);
    }
  }
  int64_t split_flag_words = 0;
  // Gemm1Rows::kComputeOnly (run_part(kGemms)): GEMM1 stores every row to its output, as a plain
  // grouped GEMM does, never into owners' slots; kAsPlanned follows epilogue_combine().
  enum class Gemm1Rows { kAsPlanned, kComputeOnly };
  void gemms(const Rank& k, cudaStream_t s, Gemm1Rows rows = Gemm1Rows::kAsPlanned) const {
    for (int layer = 0; layer < 2; ++layer) {
      cuda::GroupedGemmArgs g = gemm_args(k, layer);
      if (rows == Gemm1Rows::kComputeOnly) g.row_combine = nullptr;
      const cuda::GemmSplit& split = splits[layer];
      const cuda::GemmKernel kernel = unfused_gemm_kernel(layer);
      if (unfused_runs_fused_schedule(layer) && kernel == g.kernel && split.blocks == 0) {  // the plan's tiles, claimed
        cuda::run_grouped_gemm(g, s);
        continue;
      }
      g.kernel = kernel;
      g.tiles = k.unfused_tiles[layer];
      g.num_tiles = k.unfused_num_tiles + layer;
      g.tile_claims = nullptr;
      cuda::GemmSplitPiece* pieces = split.blocks > 0 ? k.unfused_pieces[layer] : nullptr;
      cuda::build_gemm_tiles(k.plan.expert_rows, g.num_experts, cuda::gemm_num_n_blocks(g.epilogue, g.n, g.kernel),
                             g.kernel, layer == 0 ? cuda::TileOrder::kRowMajor : cuda::TileOrder::kColumnBlockMajor,
                             k.unfused_tiles[layer], k.unfused_num_tiles + layer, unfused_capacity[layer], s,
                             k.plan.counts + 2, split, pieces, half_tiles());  // a refused plan: no tiles
      if (split.blocks > 0) {
        const Group& group = group_of(k);
        g.split = split;
        g.split_pieces = pieces;
        g.split_partials = group.split_partials;
        g.split_flags = group.split_flags;
        g.num_blocks = split.blocks;
      }
      cuda::run_grouped_gemm(g, s);
    }
  }
  void combine(const Rank& k, cudaStream_t s) const {
    cuda::launch_kernel(combine_kernel, dim3(target.num_sms), dim3(32 * kWarpsPerBlock), 0, s, cuda::LaunchAttributes(),
                        comm_args(k, 1, Signals::kOff));
  }
  // One of the two Comet kernels of a rank (cuda/fused_layer.h). Layer0 only pulls published
  // rows and layer1 only pushes, so no kernel waits on another rank's kernel.
  mutable int fused_launches = 0;  // in the forward being enqueued (LayerOptions::fail_before_launch)
  void fused(const Rank& k, int layer, cudaStream_t s) const {
    COMET_CHECK(fused_launches++ != options.fail_before_launch,
                "MoeLayer: fault injection (LayerOptions::fail_before_launch): rank " << k.rank << " layer" << layer
                                                                                       << " not launched");
    cuda::FusedCommArgs f = comm_args(k, layer, Signals::kOn);
    cuda::GroupedGemmArgs g = gemm_args(k, layer);
    if (options.trace) {
      const int i = local_index(k);
      g.trace_tiles = trace.tiles(i, layer);
      if (layer == 0) g.trace_waits = trace.waits(i);
      f.trace = {trace.chunks(i, layer), trace.counts(i) + layer, unsigned(trace.chunk_capacity(layer))};
    }
    if (layer == 0) {
      g.wait_flags = f.tile_arrivals;
      g.wait_targets = k.epochs + plan_layout.max_m_tiles;
      cuda::run_fused_layer0(g, f, s);
    } else {
      g.done_flags = f.col_done;
      run_fused_layer1(g, f, s);
    }
  }
  // The fused layer1 kernel of the resolved combine (LayerOptions::layer1_combine).
  void run_fused_layer1(const cuda::GroupedGemmArgs& g, const cuda::FusedCommArgs& f, cudaStream_t s) const {
    if (layer1_gemm_combine()) cuda::run_fused_layer1_gemm_combine(g, f, s);
    else cuda::run_fused_layer1(g, f, s);
  }
  // The fused kernels with idle communication blocks and no signals (run_part(kFusedGemms)).
  void fused_gemms_only(const Rank& k, cudaStream_t s) const {
    for (int layer = 0; layer < 2; ++layer) {
      cuda::FusedCommArgs f = comm_args(k, layer, Signals::kOff);
      f.stall = 1;  // comm blocks return at once; GEMM blocks neither wait nor join the combine
      const cuda::GroupedGemmArgs g = gemm_args(k, layer);
      if (layer == 0) cuda::run_fused_layer0(g, f, s);
      else run_fused_layer1(g, f, s);
    }
  }
  // Step 6 for `n` ranks of one device from `first` (one launch per kOwnerReduceBatch ranks).
  void owner_reduce(const Rank* first, const RankTensors* const* t, int n, cudaStream_t s) const {
    for (int b = 0; b < n; b += kOwnerReduceBatch) {
      OwnerReduceBatch batch{};
      const int count = std::min(kOwnerReduceBatch, n - b);
      for (int i = 0; i < count; ++i) {
        const Rank& k = first[b + i];
        cuda::OwnerReduceArgs& a = batch.ranks[i];
        a.send_pos = k.plan.send_pos;
        a.combine_recv = region(k, "combine_recv");
        a.token_count = reinterpret_cast<const int32_t*>(region(k, "token_count"));
        a.y = t[b + i]->y;
        a.hidden = config.model.hidden;
        a.world = config.layout.world;
        a.t_max = config.max_tokens_per_rank;
      }
      // The SMs' worth of blocks shared by the batch's ranks (each rank's warps stride its tokens).
      const dim3 grid(std::max(1, target.num_sms * kOwnerReduceBlocksPerSm / count), count);
      cuda::launch_kernel(owner_reduce_kernel, grid, dim3(32 * kWarpsPerBlock), 0, s, cuda::LaunchAttributes(), batch);
    }
  }
  // A GPU's ranks always fit one launch: can_implement bounds W by kMaxWorld.
  static_assert(cuda::kMaxBarrierRanks >= cuda::kMaxWorld, "one barrier launch must hold every rank of a GPU");
  // The forward's barrier number `which` for `count` ranks of one GPU from `first` (one launch).
  void barrier(const Rank* first, int count, int which, cudaStream_t s) const {
    cuda::RankBarrierArgs a;
    a.count = count;
    for (int i = 0; i < count; ++i) {
      const Rank& k = first[i];
      a.ranks[i] = {fabric.peer_table(k.rank), barrier_generation(k), k.error, k.rank};
    }
    a.counter_offset = layout.region("barrier").offset_bytes;
    a.world = config.layout.world;
    a.which = which;
    a.timeout_ns = timeout_ns();
    cuda::rank_barrier(a, s);
  }

  // ---- Running the steps of every local rank.
  // One stream: each step for every rank, in rank order, on the caller's stream.
  // Group streams: the groups' streams start after the caller's work so far, each step runs for
  // every group on its own device and stream (for the group's ranks in rank order), and the
  // caller's stream continues after all of them. Steps are enqueued step-major: a group's
  // barrier kernel can spin on its GPU only until the host has enqueued the other groups'
  // barriers, never behind a later launch of its own (with lazy module loading, a first launch
  // may wait for the device's running kernels).
  // The caller's stream belongs to the current device (the CUDA convention; cudaStreamGetDevice
  // is not allowed during graph capture).
  using GroupStep = std::function<void(const Rank* first, int count, cudaStream_t)>;
  using Step = std::function<void(const Rank&, cudaStream_t)>;
  void on_groups(cudaStream_t caller, const std::vector<GroupStep>& steps) {
    if (!group_streams) {
      for (const GroupStep& step : steps) step(ranks.data(), int(ranks.size()), caller);
      return;
    }
    DeviceGuard guard;
    int caller_device = 0;
    COMET_CUDA_CHECK(cudaGetDevice(&caller_device));
    if (groups.size() == 1 && groups[0].device == caller_device) {  // one process per GPU, on its device
      for (const GroupStep& step : steps) step(ranks.data(), int(ranks.size()), caller);
      return;
    }
    cudaEvent_t& fork = fork_events[caller_device];
    if (!fork) COMET_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    COMET_CUDA_CHECK(cudaEventRecord(fork, caller));
    for (const Group& g : groups) COMET_CUDA_CHECK(cudaStreamWaitEvent(g.stream, fork, 0));
    for (const GroupStep& step : steps)
      for (const Group& g : groups) {
        COMET_CUDA_CHECK(cudaSetDevice(g.device));
        step(&ranks[g.first], g.count, g.stream);
      }
    for (const Group& g : groups) {
      COMET_CUDA_CHECK(cudaSetDevice(g.device));
      COMET_CUDA_CHECK(cudaEventRecord(g.done, g.stream));
    }
    COMET_CUDA_CHECK(cudaSetDevice(caller_device));
    for (const Group& g : groups) COMET_CUDA_CHECK(cudaStreamWaitEvent(caller, g.done, 0));
  }
  // Steps of one rank each, run for every rank of a group in turn.
  void on_ranks(cudaStream_t caller, std::initializer_list<Step> steps) {
    std::vector<GroupStep> each;
    for (const Step& step : steps)
      each.push_back([&step](const Rank* first, int count, cudaStream_t s) {
        for (int i = 0; i < count; ++i) step(first[i], s);
      });
    on_groups(caller, each);
  }

  void forward(const std::vector<RankTensors>& in, cudaStream_t stream) {
    const bool fused_kernels = fused_path();
    fused_launches = 0;
    const Signals signals = fused_kernels ? Signals::kOn : Signals::kOff;
    auto tensors = [&](const Rank& k) -> const RankTensors& { return in[k.rank - fabric.first_local_rank()]; };
    // A fused launch that fails on the host after the plan kernels advanced the epoch bases
    // must not leave them advanced.
    try {
      if (group_streams) {
        // A group's ranks one after the other on its stream: layer0 only pulls rows published
        // before barrier 0 and layer1 only pushes, so no rank's kernel waits for another's.
        auto layer_steps = [&](const Rank* first, int count, cudaStream_t s) {
          for (int i = 0; i < count; ++i) {
            const Rank& k = first[i];
            if (fused_kernels) {
              fused(k, 0, s);
              fused(k, 1, s);
            } else {
              dispatch(k, s);
              gemms(k, s);
              combine(k, s);
            }
          }
        };
        auto inputs_of = [&](const Rank* first, int count) {
          std::vector<const RankTensors*> t;
          for (int i = 0; i < count; ++i) t.push_back(&tensors(first[i]));
          return t;
        };
        on_groups(stream, {[&](const Rank* first, int count, cudaStream_t s) {
                             if (options.poison_workspace) poison(first, count, s);
                             publish(first, inputs_of(first, count).data(), count, s);
                           },
                           [&](const Rank* first, int count, cudaStream_t s) { barrier(first, count, 0, s); },
                           [&](const Rank* first, int count, cudaStream_t s) {
                             // run_part's GEMMs and copies follow the width of the plans last enqueued
                             planned_layer1_width = layer1_col_width();
                             plans(first, count, signals, s);
                           },
                           layer_steps,
                           [&](const Rank* first, int count, cudaStream_t s) { barrier(first, count, 1, s); },
                           [&](const Rank* first, int count, cudaStream_t s) {
                             owner_reduce(first, inputs_of(first, count).data(), count, s);
                           }});
        return;
      }
      // One stream: phase by phase across ranks (a phase's kernels see every rank's previous
      // phase complete), with the plans of all ranks in as few launches as possible.
      std::vector<const RankTensors*> inputs;
      for (const Rank& k : ranks) inputs.push_back(&tensors(k));
      if (options.poison_workspace) poison(ranks.data(), int(ranks.size()), stream);
      publish(ranks.data(), inputs.data(), int(ranks.size()), stream);
      planned_layer1_width = layer1_col_width();
      plans(ranks.data(), int(ranks.size()), signals, stream);
      for (int layer = 0; layer < 2; ++layer) {
        if (fused_kernels) {
          for (const Rank& k : ranks) fused(k, layer, stream);
          continue;
        }
        for (const Rank& k : ranks) layer == 0 ? dispatch(k, stream) : gemms(k, stream);
        if (layer == 1)
          for (const Rank& k : ranks) combine(k, stream);
      }
      owner_reduce(ranks.data(), inputs.data(), int(ranks.size()), stream);
    } catch (...) {
      recover_from_enqueue_failure(stream, fused_kernels);
      throw;
    }
  }

  // A forward that threw mid-enqueue may have left part of its kernels running: the plans may
  // have advanced the epoch bases, and with group streams one group's barrier may wait for
  // another group's that was never launched (until its timeout, which it records). Drain what
  // was enqueued, then zero the counters and the error records, so the next forward starts in
  // step. Nothing ran while the stream was being captured, so nothing needs undoing then. A
  // failure here must not replace the caller's exception: it leaves the layer refusing to run.
  void recover_from_enqueue_failure(cudaStream_t stream, bool fused_kernels) noexcept {
    if (!fused_kernels && !group_streams) return;  // no counters or barriers were touched
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return;
    try {
      DeviceGuard guard;
      // Every group's enqueued work ends first (each wait has its timeout): a group still
      // running could signal into counters the reset has already zeroed.
      COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (group_streams)
        for (const Group& g : groups) {
          COMET_CUDA_CHECK(cudaSetDevice(g.device));
          COMET_CUDA_CHECK(cudaStreamSynchronize(g.stream));
        }
    } catch (...) {
      unusable = "a forward failed while enqueueing and its kernels could not be drained; create a new MoeLayer";
      return;
    }
    try {
      on_ranks(stream, {[&](const Rank& k, cudaStream_t s) {
                 COMET_CUDA_CHECK(cudaMemsetAsync(k.error, 0, Rank::kErrorRecords * sizeof(cuda::DeviceError), s));
               }});
      reset_epochs(stream, "a forward that failed while enqueueing");
    } catch (...) {
      unusable = "a forward failed while enqueueing and the layer's counters could not be reset; create a new MoeLayer";
    }
  }

  // The trace buffers of every local rank for this forward: allocated once (sized for T_max) on
  // the rank's device, zeroed on the stream the rank's work runs on.
  void prepare_trace(cudaStream_t stream) {
    const int64_t mt = plan_layout.max_m_tiles, warps = int64_t(target.num_sms) * cuda::kTraceWarpsPerBlock;
    const int64_t slots = int64_t(config.layout.world) * config.max_tokens_per_rank;
    const int groups = cuda::combine_groups(layer1_col_blocks(), combine_group_blocks());
    TraceBuffers want;
    want.tiles0 = mt * plan_layout.n_blocks0;
    want.tiles1 = plan_layout.max_tiles1;
    // Layer0's items are received tokens, or A rows (padding included) in DispatchOrder::kRows.
    const int64_t items0 = std::max(slots, mt * cuda::kGemmBlockM);
    want.chunks0 = options.trace_chunk_capacity > 0 ? options.trace_chunk_capacity
                                                    : cuda::trace_chunk_capacity(0, items0, groups, warps);
    want.chunks1 = options.trace_chunk_capacity > 0 ? options.trace_chunk_capacity
                                                    : cuda::trace_chunk_capacity(1, slots, groups, warps);
    if (trace.base.empty() || want.tiles0 != trace.tiles0 || want.tiles1 != trace.tiles1 ||
        want.chunks0 != trace.chunks0 || want.chunks1 != trace.chunks1) {
      // The new buffers first: a failed allocation frees them and leaves the old ones in place.
      DeviceGuard guard;
      try {
        for (const Rank& k : ranks) {
          COMET_CUDA_CHECK(cudaSetDevice(k.device));
          void* p = nullptr;
          COMET_CUDA_CHECK(cudaMalloc(&p, want.records() * sizeof(KernelTraceEvent)));
          want.base.push_back(static_cast<KernelTraceEvent*>(p));
        }
      } catch (...) {
        for (KernelTraceEvent* b : want.base) cudaFree(b);
        throw;
      }
      // The old buffers are kept until the layer goes: a CUDA graph captured from an earlier
      // traced forward still writes its records there when replayed.
      retired_trace.insert(retired_trace.end(), trace.base.begin(), trace.base.end());
      trace.base.clear();
      trace = want;
    }
    on_ranks(stream, {[&](const Rank& k, cudaStream_t s) {
               COMET_CUDA_CHECK(
                   cudaMemsetAsync(trace.base[local_index(k)], 0, trace.records() * sizeof(KernelTraceEvent), s));
             }});
    // Layers whose copies or combine run in the GEMM blocks have no communication blocks.
    trace.n_comm[0] = choices.layer0.mode.copies == Layer0Copies::kGemmBlocks ? 0 : choices.n_comm.n_comm0;
    trace.n_comm[1] = layer1_gemm_combine() ? 0 : choices.n_comm.n_comm1;
  }
  std::vector<KernelTraceEvent*> retired_trace;  // replaced trace buffers (prepare_trace)
  void free_trace() {
    for (KernelTraceEvent* b : trace.base) cudaFree(b);
    for (KernelTraceEvent* b : retired_trace) cudaFree(b);
    trace.base.clear();
    retired_trace.clear();
  }

  // After a failure the counters, bases and barrier generations no longer agree: zero them all
  // and wait, so that the next forward (possibly on a non-blocking stream) sees them zeroed. On
  // a multi-process fabric the other ranks' words are out of reach: the layer refuses to run.
  // `cause` says what failed ("a device error", "a forward that failed while enqueueing").
  // Nothing is written once another layer has reallocated the heap: this layer's regions now
  // lie in that layer's memory (forward and run_part refuse to run then, check_heap).
  void reset_epochs(cudaStream_t stream, const char* cause) {
    if (fabric.heap_generation() != heap_generation) return;
    if (fabric.num_local_ranks() < config.layout.world) {
      unusable = std::string(cause) + " left the ranks' barrier and signal counters out of step; on a multi-process "
                 "fabric every rank must create a new MoeLayer";
      return;
    }
    on_ranks(stream, {[&](const Rank& k, cudaStream_t s) {
               COMET_CUDA_CHECK(cudaMemsetAsync(k.epochs, 0, epoch_words() * sizeof(uint64_t), s));
               for (const char* name : {"tile_arrivals", "col_done", "barrier"})
                 COMET_CUDA_CHECK(cudaMemsetAsync(region(k, name), 0, layout.region(name).bytes, s));
             }});
    // A split piece that timed out (or came after its finishing piece gave up) leaves its flag set.
    on_groups(stream, {[&](const Rank* first, int, cudaStream_t s) {
                const Group& g = group_of(*first);
                if (g.split_flags)
                  COMET_CUDA_CHECK(cudaMemsetAsync(g.split_flags, 0, size_t(split_flag_words) * sizeof(uint64_t), s));
              }});
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  // A second layer built on this fabric reallocated the heap, or the fabric lost it: this
  // layer's peer tables and regions point into freed memory.
  void check_heap() const { fabric.check_heap_generation(heap_generation, "MoeLayer"); }
  // One stream for every rank: the kernels launch on the current device, which must be the
  // ranks' GPU. (The stream's own device is not asked: cudaStreamGetDevice is refused while the
  // stream is being captured; a stream of another GPU fails at the first launch.)
  void check_current_device() const {
    if (group_streams) return;  // forked to the groups' own streams from any device
    int current = 0;
    COMET_CUDA_CHECK(cudaGetDevice(&current));
    COMET_CHECK(current == ranks[0].device,
                "MoeLayer: the current device is GPU " << current << ", the ranks run on GPU " << ranks[0].device);
  }
  Impl(const LayerConfig& c, fabric::Fabric& f) : config(gpu_config(c)), fabric(f), layout(workspace_config(config)), plan_layout(config) {
    // Every layer1 width the options can choose must fit the column signals.
    COMET_CHECK(plan_layout.n_blocks1 <= layout.region("col_done").elements,
                "MoeLayer: " << plan_layout.n_blocks1 << " layer1 column blocks, the workspace's col_done holds "
                             << layout.region("col_done").elements);
  }
  ~Impl() {
    int saved = 0;  // restored below; no throwing guard in a destructor
    cudaGetDevice(&saved);
    for (Rank& r : ranks) {
      cudaSetDevice(r.device);
      for (void* p : {r.plan_buffer, r.w0, r.w1, static_cast<void*>(r.error), static_cast<void*>(r.count_table),
                      static_cast<void*>(r.id_table), static_cast<void*>(r.weight_table),
                      static_cast<void*>(r.epochs), static_cast<void*>(r.unfused_tiles[0])})
        if (p) cudaFree(p);
    }
    for (Group& g : groups) {
      cudaSetDevice(g.device);
      if (g.stream) cudaStreamDestroy(g.stream);
      if (g.done) cudaEventDestroy(g.done);
      if (g.split_partials) cudaFree(g.split_partials);
      if (g.split_flags) cudaFree(g.split_flags);
    }
    for (auto& [device, e] : fork_events) {
      cudaSetDevice(device);
      cudaEventDestroy(e);
    }
    free_trace();
    cudaSetDevice(saved);
  }
};

Status MoeLayer::can_implement(const LayerConfig& config) {
  if (config.dtype != DType::kBF16)
    return Status::failure(std::string("the CUDA backend runs bf16 only, got ") + dtype_name(config.dtype) +
                           " (the CPU backend runs fp16 and fp32)");
  // The row and tile bounds are checked for the tiles the GPU runs, not the config's.
  const LayerConfig c = gpu_config(config);
  const Status s = c.validate();
  if (!s) return s;
  if (c.model.hidden % 8 != 0 || c.ffn_per_rank() % 8 != 0)
    return Status::failure("the CUDA backend needs H and F/TP multiples of 8 (16-byte rows), got H=" +
                           std::to_string(c.model.hidden) + ", F/TP=" + std::to_string(c.ffn_per_rank()));
  if (c.model.topk > 16) return Status::failure("the CUDA backend supports topk <= 16, got " + std::to_string(c.model.topk));
  if (c.max_tokens_per_rank < 1) return Status::failure("max_tokens_per_rank must be >= 1");
  if (c.layout.world > cuda::kMaxWorld)
    return Status::failure("the CUDA backend supports at most " + std::to_string(cuda::kMaxWorld) + " ranks, got " +
                           std::to_string(c.layout.world));
  return cuda::device_plan_can_implement(c);  // refused here, not at the first forward()
}

MoeLayer::MoeLayer(const LayerConfig& config, fabric::Fabric& fabric) {
  const Status ok = can_implement(config);
  COMET_CHECK(ok.ok, "MoeLayer: " << ok.reason);
  COMET_CHECK(fabric.world() == config.layout.world,
              "MoeLayer: the fabric has " << fabric.world() << " ranks, the layout " << config.layout.world);
  impl_ = std::make_unique<Impl>(config, fabric);
  Impl& m = *impl_;
  const int W = m.config.layout.world, first = fabric.first_local_rank(), local = fabric.num_local_ranks();
  // The tuning key's GPU name and SM count, and the layer's grids, from the device of the first
  // local rank (with one process per GPU, this process's GPU, not device 0).
  const cuda::DeviceInfo info = cuda::query_device_info(fabric.device_of(first));
  COMET_CHECK(info.error.empty(), "MoeLayer: device " << fabric.device_of(first) << ": " << info.error);
  m.resolve_unfused_gemms(info.num_sms);
  for (int r = first; r < first + local; ++r) {
    const int device = fabric.device_of(r);
    if (m.groups.empty() || m.groups.back().device != device) {
      for (const Impl::Group& g : m.groups)
        COMET_CHECK(g.device != device, "MoeLayer: the " << fabric.name() << " fabric puts rank " << r << " on GPU "
                                                          << device << " apart from that GPU's other ranks; the "
                                                          << "ranks of a GPU must be consecutive");
      m.groups.push_back({device, r - first, 0});
    }
    ++m.groups.back().count;
  }
  m.group_streams = m.groups.size() > 1 || local < W;
  m.config_half_tiles = layer_half_tiles(m.config);
  // Collective, before the heap: ranks that built different layers would otherwise fail later
  // and less clearly (a heap size, a timeout, wrong output).
  m.fabric.agree(config_fingerprint(m.config), "the MoeLayer's config", m.config.describe());
  m.fabric.allocate(m.layout.total_bytes());
  m.heap_generation = m.fabric.heap_generation();
  DeviceGuard guard;
  m.ranks.resize(local);
  for (int i = 0; i < local; ++i) {
    Impl::Rank& k = m.ranks[i];
    k.rank = first + i;
    k.device = fabric.device_of(k.rank);
    COMET_CUDA_CHECK(cudaSetDevice(k.device));
    // Entry p of each table: a region of rank p's heap, as addressed from this rank's device.
    const std::vector<void*> heaps = fabric.peer_table_host(k.rank);
    std::vector<const void*> counts(W), ids(W), weights(W);
    for (int p = 0; p < W; ++p) {
      const char* heap = static_cast<const char*>(heaps[p]);
      counts[p] = heap + m.layout.region("token_count").offset_bytes;
      ids[p] = heap + m.layout.region("route_ids").offset_bytes;
      weights[p] = heap + m.layout.region("route_weights").offset_bytes;
    }
    COMET_CUDA_CHECK(cudaMalloc(&k.plan_buffer, m.plan_layout.total_bytes()));
    k.plan = m.plan_layout.view(k.plan_buffer);
    COMET_CUDA_CHECK(cudaMalloc(&k.error, Impl::Rank::kErrorRecords * sizeof(cuda::DeviceError)));
    COMET_CUDA_CHECK(cudaMemset(k.error, 0, Impl::Rank::kErrorRecords * sizeof(cuda::DeviceError)));
    COMET_CUDA_CHECK(cudaMalloc(&k.count_table, W * sizeof(void*)));
    COMET_CUDA_CHECK(cudaMalloc(&k.id_table, W * sizeof(void*)));
    COMET_CUDA_CHECK(cudaMalloc(&k.weight_table, W * sizeof(void*)));
    COMET_CUDA_CHECK(cudaMemcpy(k.count_table, counts.data(), W * sizeof(void*), cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(k.id_table, ids.data(), W * sizeof(void*), cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(k.weight_table, weights.data(), W * sizeof(void*), cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMalloc(&k.epochs, m.epoch_words() * sizeof(uint64_t)));
    COMET_CUDA_CHECK(cudaMemset(k.epochs, 0, m.epoch_words() * sizeof(uint64_t)));
    {
      const int64_t tiles = m.unfused_capacity[0] + m.unfused_capacity[1];
      void* p = nullptr;
      COMET_CUDA_CHECK(
          cudaMalloc(&p, tiles * (sizeof(cuda::GemmTile) + sizeof(cuda::GemmSplitPiece)) + 2 * sizeof(int32_t)));
      k.unfused_tiles[0] = static_cast<cuda::GemmTile*>(p);
      k.unfused_tiles[1] = k.unfused_tiles[0] + m.unfused_capacity[0];
      k.unfused_pieces[0] = reinterpret_cast<cuda::GemmSplitPiece*>(k.unfused_tiles[1] + m.unfused_capacity[1]);
      k.unfused_pieces[1] = k.unfused_pieces[0] + m.unfused_capacity[0];
      k.unfused_num_tiles = reinterpret_cast<int32_t*>(k.unfused_pieces[1] + m.unfused_capacity[1]);
    }
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
  if (m.group_streams)
    for (Impl::Group& g : m.groups) {
      COMET_CUDA_CHECK(cudaSetDevice(g.device));
      COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
      COMET_CUDA_CHECK(cudaEventCreateWithFlags(&g.done, cudaEventDisableTiming));
    }
  m.target.gpu = info.name;
  m.target.num_sms = info.num_sms;
  m.target.gpus = fabric.gpus();  // Loopback 1: the virtual ranks share one GPU
  m.target.real_links = m.group_streams;
  m.target.fabric = fabric.name();
  if (!cuda::bulk_dispatch_fits(m.config.model.hidden))
    m.target.copy_ring_refusal = "a token row of hidden " + std::to_string(m.config.model.hidden) +
                                 " does not fit their ring, the " + std::to_string(cuda::kDispatchRingBytes / 1024) +
                                 " KB copy ring";
  m.resolve_choices();
}

void MoeLayer::set_options(const LayerOptions& o) {
  const Status ok = check_layer_options(impl_->config, o, impl_->target);
  COMET_CHECK(ok.ok, "MoeLayer: " << ok.reason);
  const LayerOptions before = impl_->options;
  impl_->options = o;
  impl_->resolve_choices_or_restore([&] { impl_->options = before; });
}

void MoeLayer::set_tuning_table(const TuningTable& table) {
  const TuningTable before = impl_->tuning;
  impl_->tuning = table;
  impl_->resolve_choices_or_restore([&] { impl_->tuning = before; });
}

const LayerOptions& MoeLayer::options() const { return impl_->options; }
NCommChoice MoeLayer::n_comm() const { return impl_->choices.n_comm; }
PathChoice MoeLayer::path() const { return impl_->choices.path; }
Layer0ModeChoice MoeLayer::layer0_mode() const { return impl_->choices.layer0; }
Layer1CombineChoice MoeLayer::layer1_combine() const { return impl_->choices.layer1; }
bool MoeLayer::half_tiles() const { return impl_->half_tiles(); }
bool MoeLayer::split_gemms(int layer) const {
  COMET_CHECK(layer == 0 || layer == 1, "MoeLayer::split_gemms: layer " << layer << " (0 or 1)");
  return impl_->splits[layer].blocks > 0;
}

void MoeLayer::set_random_weights(uint64_t seed) {
  Impl& m = *impl_;
  const size_t H = m.config.model.hidden, Fl = m.config.ffn_per_rank();
  DeviceGuard guard;
  m.forget_weights(m.ranks.begin(), m.ranks.end());
  for (Impl::Rank& k : m.ranks) {  // seeded by the global rank: the same weights on every fabric
    COMET_CUDA_CHECK(cudaSetDevice(k.device));
    // As the other setters: a forward in flight on a non-blocking stream reads the old weights
    // to its end (the fill runs on the legacy stream, which does not wait for such streams).
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    m.allocate_weights(k);
    cuda::fill_uniform_bf16(k.w0, m.w0_elements(), seed * 64 + 2 * k.rank, 1.f / std::sqrt(float(H)));
    cuda::fill_uniform_bf16(k.w1, m.w1_elements(), seed * 64 + 2 * k.rank + 1, 1.f / std::sqrt(float(Fl)));
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    k.weights_set = true;
  }
}

void MoeLayer::set_rank_weights(int rank, const RankExpertWeights& weights) {
  Impl& m = *impl_;
  m.fabric.check_local(rank, "MoeLayer::set_rank_weights");
  Impl::Rank& k = m.ranks[size_t(rank - m.fabric.first_local_rank())];
  cuda::check_rank_weights(m.config, weights);  // refused before the rank's weights are forgotten
  DeviceGuard guard;
  m.forget_weights(&k, &k + 1);
  COMET_CUDA_CHECK(cudaSetDevice(k.device));
  m.allocate_weights(k);
  cuda::copy_rank_weights(m.config, weights, k.w0, k.w1);
  k.weights_set = true;
}

void MoeLayer::run_part(Part part, CUstream_st* stream) {
  Impl& m = *impl_;
  COMET_CHECK(m.unusable.empty(), "MoeLayer: " << m.unusable);
  m.check_heap();
  COMET_CHECK(m.have_weights(), "MoeLayer: set weights and run forward() once before run_part()");
  if (part == Part::kBarrier) {  // the forward's barrier (counts in its sequence); on one stream, stream order
    if (m.group_streams)
      m.on_groups(stream, {[&](const Impl::Rank* first, int count, cudaStream_t s) { m.barrier(first, count, 2, s); }});
    return;
  }
  COMET_CHECK(part != Part::kFusedGemms || m.gated(),
              "MoeLayer: run_part(kFusedGemms) runs the fused kernels, which fuse SwiGLU; activation "
                  << activation_name(m.config.model.activation) << " has the unfused GEMMs only (kGemms)");
  if (part == Part::kPlan) m.planned_layer1_width = m.layer1_col_width();
  COMET_CHECK(m.planned_layer1_width != 0, "MoeLayer: run_part: no plan yet; run forward() or run_part(kPlan) first");
  COMET_CHECK(m.planned_layer1_width == m.layer1_col_width(),
              "MoeLayer: run_part: the last plan has layer1 column blocks of "
                  << m.planned_layer1_width << " columns, the options now " << m.layer1_col_width()
                  << " (LayerOptions::layer1_combine changed); run forward() or run_part(kPlan) first");
  if (part == Part::kPlan) {  // one launch for every rank of a GPU, as in forward()
    m.on_groups(stream, {[&](const Impl::Rank* first, int count, cudaStream_t s) {
                  m.plans(first, count, Impl::Signals::kOff, s);
                }});
    return;
  }
  m.on_ranks(stream, {[&](const Impl::Rank& k, cudaStream_t s) {
               if (part == Part::kGemms) {
                 m.gemms(k, s, Impl::Gemm1Rows::kComputeOnly);
               } else if (part == Part::kFusedGemms) {
                 m.fused_gemms_only(k, s);
               } else {
                 m.dispatch(k, s);
                 m.combine(k, s);
               }
             }});
}

MoeLayer::~MoeLayer() = default;

const LayerConfig& MoeLayer::config() const { return impl_->config; }

void MoeLayer::set_weights(const ExpertWeights& w) {
  Impl& m = *impl_;
  const ModelShape& model = m.config.model;
  w.check(model);
  const int Epr = m.config.experts_per_rank();
  const size_t H = model.hidden, F = model.ffn, Fl = m.config.ffn_per_rank();
  DeviceGuard guard;
  m.forget_weights(m.ranks.begin(), m.ranks.end());
  for (Impl::Rank& k : m.ranks) {
    const int ep = m.config.layout.ep_index(k.rank), tp = m.config.layout.tp_index(k.rank);
    const bool gated = m.gated();  // a plain activation has no gate projection (w_gate empty)
    std::vector<float> gate(gated ? Epr * H * Fl : 0), up(Epr * H * Fl), down(Epr * Fl * H);
    for (int el = 0; el < Epr; ++el) {
      const size_t e = size_t(ep) * Epr + el;
      for (size_t h = 0; h < H; ++h)
        for (size_t f = 0; f < Fl; ++f) {
          if (gated) gate[(el * H + h) * Fl + f] = w.w_gate[(e * H + h) * F + tp * Fl + f];
          up[(el * H + h) * Fl + f] = w.w_up[(e * H + h) * F + tp * Fl + f];
        }
      std::memcpy(&down[el * Fl * H], &w.w_down[(e * F + tp * Fl) * H], Fl * H * sizeof(float));
    }
    const std::vector<uint16_t> w0 = gated ? cuda::pack_swiglu_weights(gate, up, Epr, int(H), int(Fl))
                                           : cuda::transpose_weights(up, Epr, int(H), int(Fl));
    const std::vector<uint16_t> w1 = cuda::transpose_weights(down, Epr, int(Fl), int(H));
    COMET_CUDA_CHECK(cudaSetDevice(k.device));
    m.allocate_weights(k);
    // Synchronous on every stream (a pageable copy returns before its DMA ends): as
    // cuda::copy_rank_weights.
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    COMET_CUDA_CHECK(cudaMemcpy(k.w0, w0.data(), w0.size() * 2, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(k.w1, w1.data(), w1.size() * 2, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    k.weights_set = true;
  }
}

void MoeLayer::forward(const std::vector<RankTensors>& in, CUstream_st* stream) {
  Impl& m = *impl_;
  COMET_CHECK(m.unusable.empty(), "MoeLayer: " << m.unusable);
  COMET_CHECK(m.have_weights(), "MoeLayer: set_weights(), or set_rank_weights() for every local rank, must be called "
                              "before forward()");
  const int first = m.fabric.first_local_rank(), local = m.fabric.num_local_ranks();
  COMET_CHECK(int(in.size()) == local, "MoeLayer: forward got tensors for " << in.size() << " ranks, this process drives "
                                                                            << local << " (ranks " << first << ".."
                                                                            << first + local - 1 << " of "
                                                                            << m.config.layout.world << ")");
  m.check_heap();
  m.check_current_device();
  m.tensor_check.check(in, m.fabric, stream);
  // Trace buffers first: allocating them may throw, and must not once the plans advanced epochs.
  const bool traced = m.fused_path() && m.options.trace;
  m.trace.last_forward_traced = false;  // read_trace() refuses until a traced forward is enqueued
  if (traced) m.prepare_trace(stream);
  m.forward(in, stream);
  m.trace.last_forward_traced = traced;
}

Trace MoeLayer::read_trace(CUstream_st* stream) {
  const Impl& m = *impl_;
  COMET_CHECK(m.trace.last_forward_traced, "MoeLayer::read_trace: the last forward ran without LayerOptions::trace");
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  auto download = [](const KernelTraceEvent* from, int64_t n) {
    std::vector<KernelTraceEvent> out(size_t(std::max<int64_t>(n, 0)));
    if (n > 0) COMET_CUDA_CHECK(cudaMemcpy(out.data(), from, n * sizeof(KernelTraceEvent), cudaMemcpyDeviceToHost));
    return out;
  };
  std::vector<KernelTraceRecords> kernels;
  for (const Impl::Rank& rk : m.ranks) {
    const int i = m.local_index(rk);
    int32_t num_tiles[2];
    unsigned counts[2];
    COMET_CUDA_CHECK(cudaMemcpy(num_tiles, rk.plan.num_tiles, sizeof num_tiles, cudaMemcpyDeviceToHost));
    COMET_CUDA_CHECK(cudaMemcpy(counts, m.trace.counts(i), sizeof counts, cudaMemcpyDeviceToHost));
    for (int layer = 0; layer < 2; ++layer) {
      KernelTraceRecords k;
      k.rank = rk.rank;
      k.layer = layer;
      const int64_t tiles = std::min<int64_t>(num_tiles[layer], layer == 0 ? m.trace.tiles0 : m.trace.tiles1);
      k.tiles = download(m.trace.tiles(i, layer), tiles);
      if (layer == 0) k.waits = download(m.trace.waits(i), tiles);
      k.chunk_count = counts[layer];
      k.chunks = download(m.trace.chunks(i, layer), std::min<int64_t>(counts[layer], m.trace.chunk_capacity(layer)));
      kernels.push_back(std::move(k));
    }
  }
  KernelTraceShape shape;
  shape.world = m.config.layout.world;
  shape.num_blocks = m.target.num_sms;
  shape.n_comm[0] = m.trace.n_comm[0];
  shape.n_comm[1] = m.trace.n_comm[1];
  return make_kernel_trace(shape, kernels);
}

void MoeLayer::check(CUstream_st* stream) {
  Impl& m = *impl_;
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  // Bad input first (the cause, when a timeout followed it), then the first rank's timeout in
  // rank order, but a barrier timeout only when no rank recorded anything else: a rank stuck on
  // a missing signal holds its peers in the next barrier, and with one process driving both,
  // which of their timeouts fires first is a race; the stuck rank's own record names the cause.
  std::string input, first, first_barrier;
  bool timed_out = false;
  {
    // Only the reads move the current device: the reset below forks from the caller's stream,
    // which belongs to the caller's device (on_groups).
    DeviceGuard guard;
    for (const Impl::Rank& k : m.ranks) {
      COMET_CUDA_CHECK(cudaSetDevice(k.device));
      cuda::DeviceError e[Impl::Rank::kErrorRecords];
      COMET_CUDA_CHECK(cudaMemcpy(e, k.error, sizeof e, cudaMemcpyDeviceToHost));
      if (e[1].claimed && input.empty()) input = cuda::describe(e[1]);
      if (!e[0].claimed) continue;
      timed_out = true;
      std::string& slot = e[0].role == int32_t(cuda::WaitRole::kBarrier) ? first_barrier : first;
      if (slot.empty()) slot = cuda::describe(e[0]);
    }
  }
  if (first.empty()) first = first_barrier;
  if (!input.empty()) first = input;
  if (first.empty()) return;
  // Cleared once reported, so the layer stays usable.
  m.on_ranks(stream, {[&](const Impl::Rank& k, cudaStream_t s) {
               COMET_CUDA_CHECK(cudaMemsetAsync(k.error, 0, Impl::Rank::kErrorRecords * sizeof(cuda::DeviceError), s));
             }});
  // Bad input alone leaves every counter in step (the plan refuses it on every rank alike, or,
  // for a weight, runs as usual): only a timeout needs the reset.
  if (timed_out) m.reset_epochs(stream, "a device error");
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  // A stuck signal (no bad input behind it) is a TimeoutError, as the fabrics' waits are.
  if (input.empty()) throw TimeoutError("MoeLayer: " + first);
  throw Error("MoeLayer: " + first);
}

}  // namespace comet
