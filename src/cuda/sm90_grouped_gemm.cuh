// cuda/sm90_grouped_gemm.cuh: the persistent, warp-specialized grouped GEMM kernel (Hopper).
//
// Structure of one 384-thread block (one block per SM, persistent):
//   warpgroup 0, warp 0   producer: picks the block's next tile (static: b, b+G, ...; or claimed
//                         from a counter in schedule order, so blocks may join late; with
//                         clusters of kClusterM blocks, static by cluster: the blocks of a
//                         cluster run consecutive schedule entries together) and hands
//                         its index to the consumers through a two-slot queue in shared memory;
//                         for each tile, optionally acquire-wait on the
//                         tile's signal, then TMA-load the A and B k-tiles into a ring of
//                         shared-memory stages (CUTLASS's PipelineTmaAsync); in a cluster whose
//                         tiles share B, each block loads 1/kClusterM of the B k-tile and
//                         multicasts it to all, so a stage is full when every block's share
//                         arrived and free when every block's consumers released it (the
//                         pipeline counts both; tiles that do not share B load it whole)
//   warpgroup 0, warp 1   idle, or a helper the caller passes to run_block (with
//                         kHelperSmemBytes of shared memory set aside from the stages; the
//                         fused layer0's bulk copies, cuda/dispatch_bulk.cuh); warps 2-3 leave
//   warpgroups 1 and 2    consumers, cooperative: both run wgmma on every tile (64 rows each of
//                         the 128-row tile; the second skips a tile whose rows all lie past the
//                         expert's end) through CUTLASS's sm90 TMA/GMMA mainloop collective,
//                         then the epilogue: registers -> padded shared memory -> coalesced
//                         16-byte bf16 stores (each warpgroup its own 64 rows; with row_combine,
//                         a row whose entry names a destination goes there, weighted, instead
//                         of to D), and optionally a release-add of the tile's column-block
//                         signal.
//   With trace pointers set (core/kernel_trace.h), consumer thread 0 records each tile and the
//   producer's elected thread each wait; null pointers cost a test per tile and nothing else.
//
// Measured (H200, docs/results/): storing bf16 pairs straight from the accumulator fragment
// cost about 10 us per 128x256 tile (eight rows per warp store instruction); staging through
// shared memory makes the stores full 512-byte warp transactions.
// The collective supplies the mainloop (smem layouts, TMA atoms, wgmma issue and pipeline
// waits); the kernel owns the persistent loop: which tile next, when to wait, when to signal.
//
// Assumptions: A's expert segments start at multiples of kTileM (the schedule guarantees
// it), so a tile's rows belong to one expert; rows past an expert's end inside its last tile
// are padding: not part of the output (computed and stored as padding rows, or, where a whole
// cooperative warpgroup's rows lie there, left as they were). K and N tails are zero-filled by TMA.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "cuda/activation.cuh"
#include "cuda/bf16_rows.cuh"
#include "cuda/bulk_copy.cuh"
#include "cuda/dependent_launch.h"
#include "cuda/grouped_gemm.h"
#include "cuda/signal.cuh"
#include "cuda/trace_record.cuh"

namespace comet::cuda::sm90 {

using namespace cute;

// kHelperSmemBytes: shared memory set aside (out of the mainloop's stages) for a helper that a
// warp of the producer warpgroup runs beside the GEMM (run_block); 0 for none.
// kHelperRegs: registers per producer-warpgroup thread for helpers in its warps 1-3 (the
// consumers get the rest of the register file); 0: 40, and the helper (if any) in warp 1 only.
template <GemmEpilogue kEpilogue, int kTileM_, int kTileN_, int kTileK_, int kClusterM_ = 1, bool kPingpong_ = false,
          int kHelperSmemBytes_ = 0, int kHelperRegs_ = 0>
struct GroupedGemmKernel {
  static constexpr int kClusterM = kClusterM_;  // blocks per cluster, along M (they share B)
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 blocks");
  // Cooperative: both consumer warpgroups share each tile (64 rows each). Ping-pong: each
  // warpgroup runs whole tiles, alternating with the other; their mainloops take turns on the
  // tensor cores (and their epilogues take turns on the staging buffer), so one warpgroup's
  // epilogue runs while the other's wgmma keep the tensor cores busy.
  static constexpr bool kPingpong = kPingpong_;
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;  // columns of B per tile
  static constexpr int kTileK = kTileK_;
  static constexpr int kOutN = kEpilogue == GemmEpilogue::kSwiGlu ? kTileN / 2 : kTileN;
  static_assert(kEpilogue != GemmEpilogue::kSwiGlu || kTileN % (2 * kSwiGluPack) == 0,
                "a SwiGLU tile must hold whole gate/up pairs");
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;                  // two consumer warpgroups
  static constexpr int kMmaThreads = kPingpong ? 128 : 256;     // threads that run one tile
  static constexpr int kRowsPerWarpGroup = kPingpong ? kTileM : kTileM / 2;  // rows each stores
  // Epilogue staging: kStageCols output columns per pass, rows padded by 8 bf16 (16 bytes) so
  // that the fragment's 8-row store pattern hits 32 distinct banks.
  static constexpr int kStageCols = kOutN < 128 ? kOutN : 128;
  static constexpr int kStageLd = kStageCols + 8;
  static constexpr int kPasses = kOutN / kStageCols;
  static_assert(kOutN % kStageCols == 0, "output tile must be whole staging passes");
  static constexpr int kStageBytes = kTileM * kStageLd * 2;
  static constexpr int kHelperRegs = kHelperRegs_;
  // Registers per thread at launch (one block per SM): setmaxnreg only moves registers between
  // the block's warpgroups, so the producer's and the consumers' counts must fit in this many per
  // thread. Asking for more makes the consumers' increase wait forever (a hang, not an error:
  // measured with 160 producer and 176 consumer registers).
  static constexpr uint32_t kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr uint32_t kProducerRegs = kHelperRegs > 0 ? kHelperRegs : 40;
  static constexpr uint32_t kConsumerRegs =
      kHelperRegs > 0 ? ((kLaunchRegs * kThreads - 128 * kHelperRegs) / kConsumerThreads) / 8 * 8 : 232;
  static_assert(kHelperRegs % 8 == 0 && kConsumerRegs <= 256, "setmaxnreg takes multiples of 8 up to 256");
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kLaunchRegs * kThreads,
                "the warpgroups' registers must fit the block's allocation at launch");
  static constexpr int kHelperSmemBytes = kHelperSmemBytes_;

  using Element = cutlass::bfloat16_t;
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, Int<kTileK>>;
  using ClusterShape = Shape<Int<kClusterM>, _1, _1>;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, 8,     // A: [M][K], K contiguous
      Element, cutlass::layout::ColumnMajor, 8,  // B: [N][K], K contiguous
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kStageBytes + 256 + kHelperSmemBytes>,
      std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>>::CollectiveOp;

  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  using StrideA = typename Mainloop::StrideA;
  using StrideB = typename Mainloop::StrideB;
  static_assert(size(TiledMma{}) == kMmaThreads, "unexpected warpgroups per tile");

  // Producer -> consumers: the index of each tile the block runs, -1 when it has no more.
  static constexpr int kQueueSlots = 2;
  using TileQueue = cutlass::PipelineAsync<kQueueSlots>;
  using QueueState = cutlass::PipelineState<kQueueSlots>;
  // Ping-pong turns: two stages (mainloop, epilogue) passed between the two warpgroups.
  using MathOrder = cutlass::OrderedSequenceBarrier<2, 2>;

  struct GemmStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    alignas(16) typename TileQueue::SharedStorage queue;
    alignas(16) typename MathOrder::SharedStorage math_order;
    int32_t queued_tile[kQueueSlots];
    alignas(16) __nv_bfloat16 stage[kTileM * kStageLd];  // epilogue staging
  };
  // The helper's memory exists only in the configurations that set it aside.
  struct GemmAndHelperStorage : GemmStorage {
    alignas(128) char helper[kHelperSmemBytes > 0 ? kHelperSmemBytes : 1];
  };
  using SharedStorage = std::conditional_t<(kHelperSmemBytes > 0), GemmAndHelperStorage, GemmStorage>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448, "shared storage exceeds the 227 KiB an sm90 block may use");

  struct Params {
    typename Mainloop::Params mainloop;
    int max_rows, n, n_b, k, num_experts, k_tiles;
    __nv_bfloat16* d;
    const GemmTile* tiles;
    const int32_t* num_tiles;
    const uint64_t* wait_flags;
    const uint64_t* wait_targets;
    uint64_t* done_flags;
    Activation activation;  // kActivation only
    const RowCombine* row_combine;
    const GemmSplitPiece* split_pieces;
    float* split_partials;
    uint64_t* split_flags;
    int split_flag_count;  // the workspace's slots for this grid (gemm_split_flags)
    unsigned* tile_claims;
    int claim_blocks;  // blocks that claim tiles in this launch (make_params)
    uint64_t* tile_end_ns;
    KernelTraceEvent* trace_tiles;
    KernelTraceEvent* trace_waits;
    DeviceError* error;
    uint64_t timeout_ns;
    int rank, layer;
  };

  // claim_blocks: the blocks of the launch that will claim tiles (with args.tile_claims); the
  // counter's reset depends on it being exact, so every launcher passes it.
  static Params make_params(const GroupedGemmArgs& args, int claim_blocks) {
    Params p{};
    p.claim_blocks = claim_blocks;
    const int n_b = gemm_b_rows(kEpilogue, args.n);
    auto* a = reinterpret_cast<const typename Mainloop::InternalElementA*>(args.a);
    auto* b = reinterpret_cast<const typename Mainloop::InternalElementB*>(args.b);
    // A as one (M, K, 1) tensor; B as (N, K, E) with the expert as the batch mode.
    Tensor ta = make_tensor(a, make_layout(make_shape(args.max_rows, args.k, 1),
                                           StrideA{int64_t(args.k), _1{}, int64_t(args.max_rows) * args.k}));
    Tensor tb = make_tensor(b, make_layout(make_shape(n_b, args.k, args.num_experts),
                                           StrideB{int64_t(args.k), _1{}, int64_t(n_b) * args.k}));
    p.mainloop.tma_load_a = make_tma_copy_A_sm90(typename Mainloop::GmemTiledCopyA{}, ta,
                                                 typename Mainloop::SmemLayoutA{}(_, _, 0), TileShape{}, ClusterShape{});
    p.mainloop.tma_load_b = make_tma_copy_B_sm90(typename Mainloop::GmemTiledCopyB{}, tb,
                                                 typename Mainloop::SmemLayoutB{}(_, _, 0), TileShape{}, ClusterShape{});
    p.mainloop.tma_transaction_bytes = Mainloop::TmaTransactionBytes;
    p.mainloop.tma_transaction_bytes_mk = Mainloop::TmaTransactionBytesMK;
    p.mainloop.tma_transaction_bytes_nk = Mainloop::TmaTransactionBytesNK;
    p.max_rows = args.max_rows;
    p.n = args.n;
    p.n_b = n_b;
    p.k = args.k;
    p.num_experts = args.num_experts;
    p.k_tiles = (args.k + kTileK - 1) / kTileK;
    p.d = reinterpret_cast<__nv_bfloat16*>(args.d);
    p.tiles = args.tiles;
    p.num_tiles = args.num_tiles;
    p.wait_flags = args.wait_flags;
    p.wait_targets = args.wait_targets;
    p.done_flags = args.done_flags;
    p.activation = args.activation;
    p.row_combine = args.row_combine;
    p.split_pieces = args.split_pieces;
    p.split_partials = args.split_partials;
    p.split_flags = args.split_flags;
    p.split_flag_count = int(gemm_split_flags(args.split));
    p.tile_claims = args.tile_claims;
    p.tile_end_ns = args.tile_end_ns;
    p.trace_tiles = args.trace_tiles;
    p.trace_waits = args.trace_waits;
    p.error = args.error;
    p.timeout_ns = args.timeout_ns;
    p.rank = args.rank;
    p.layer = args.layer;
    return p;
  }

  // The GEMM part of a persistent block: `gemm_block` of `num_gemm_blocks` GEMM blocks (static
  // tiles), or any block claiming tiles from p.tile_claims (then both are ignored, and a block
  // may enter at any time, e.g. a fused kernel's communication block once its copies are done).
  // Fused kernels call this from the blocks they give to the GEMM; all 384 threads must enter. The
  // consumer threads call after_tiles() when their tiles are done: work placed there compiles
  // in the consumers' register budget, not the producer's 40 (code after run_block returns
  // could be reached from the producer path as far as ptxas can tell).
  struct NoWork {
    __device__ void operator()() const {}
  };
  // Warp 1 of the producer warpgroup runs helper(shared.helper) with the producer's 40
  // registers while the GEMM runs (the other idle warps leave); it must not wait on the GEMM.
  struct NoHelper {
    __device__ void operator()(char*) const {}
  };
  // kSplitTiles = false compiles the split roles out: every entry is a whole tile and no piece is
  // read (with the split roles compiled in, the ping-pong GEMM0 ran 1.6-5.2% slower on plain
  // schedules, docs/results/2026-11-30-split-tiles.md, section 4). Split schedules launch their own
  // instantiation (one translation unit each, sm90_grouped_gemm_*_split.cu); the fused kernels,
  // whose schedules the layer's plan builds unsplit, take false.
  template <bool kSplitTiles, class AfterTiles = NoWork, class Helper = NoHelper>
  static __device__ void run_block(const Params& p, int gemm_block, int num_gemm_blocks, char* smem,
                                   const AfterTiles& after_tiles = {}, const Helper& helper = {}) {
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem);
    const int thread_idx = int(threadIdx.x);
    // Read from lane 0 so that ptxas knows them uniform in each warp: a branch on a warpgroup
    // index it must treat as divergent (the half-tile skip below) moved the pipeline state out of
    // uniform registers for the whole mainloop: 8-18% more instructions in every cooperative
    // kernel (docs/results/2026-12-01-uniform-warpgroup-index.md).
    const int warp_group = __shfl_sync(~0u, thread_idx / 128, 0);
    const int warp_in_group = __shfl_sync(~0u, (thread_idx / 32) % 4, 0);

    if (thread_idx == 0) Mainloop::prefetch_tma_descriptors(p.mainloop);

    typename Pipeline::Params pipe_params;
    pipe_params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pipe_params.is_leader = (thread_idx % 128) == 0 && warp_group == 0;
    pipe_params.num_consumers = kMmaThreads;
    pipe_params.num_producers = 1;
    pipe_params.transaction_bytes = p.mainloop.tma_transaction_bytes;
    Pipeline pipeline(shared.pipeline, pipe_params, ClusterShape{});
    typename TileQueue::Params queue_params;
    queue_params.role = warp_group == 0 ? TileQueue::ThreadCategory::Producer : TileQueue::ThreadCategory::Consumer;
    queue_params.producer_arv_count = 1;
    queue_params.consumer_arv_count = kConsumerThreads;  // both warpgroups read every entry
    TileQueue queue(shared.queue, queue_params);
    // Every thread constructs it (warp 0 initializes the barriers); only consumers use it.
    MathOrder math_order(shared.math_order, typename MathOrder::Params{uint32_t(warp_group == 2 ? 1 : 0), 128});
    // Barriers initialized before anyone waits on them; in a cluster, also before a peer block
    // multicasts into this block's stages or arrives on its barriers.
    if constexpr (kClusterM > 1) cute::cluster_sync();
    else __syncthreads();

    int num_tiles = *p.num_tiles;
    if constexpr (kClusterM > 1) {
      // Every block reads the same count, so all of them run nothing together: a block whose
      // partner had no tile would wait for its B half forever.
      if (num_tiles % kClusterM != 0) {
        if (thread_idx == 0 && gemm_block == 0)
          record_timeout(p.error, WaitSite{p.rank, p.layer, WaitRole::kBadSchedule, -1}, uint64_t(kClusterM),
                         uint64_t(num_tiles));
        num_tiles = 0;
      }
    }

    if (warp_group == 0) {
      // Step 1 (producer): the other three warps give their registers away and leave.
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if constexpr (!std::is_same_v<Helper, NoHelper>) {
        if constexpr (kHelperRegs > 0) {
          if (warp_in_group != 0) helper(nullptr);
        } else {
          static_assert(kHelperSmemBytes > 0, "a helper needs shared memory set aside");
          if (warp_in_group == 1) helper(shared.helper);
        }
      }
      if (warp_in_group != 0) return;
      produce<kSplitTiles>(p, shared, pipeline, queue, gemm_block, num_gemm_blocks, num_tiles);
      return;
    }

    // Step 2 (consumers): mainloop through the collective, then our epilogue. Both warpgroups
    // read every queue entry; in ping-pong, warpgroup w runs entries w, w + 2, ... and its
    // pipeline reads skip the other's entries (as many stages as that entry has k-tiles).
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    const int consumer = warp_group - 1;
    const int mma_thread = kPingpong ? thread_idx % 128 : thread_idx - 128;  // index in the tile's MMA
    Mainloop mainloop;
    PipelineState read_state;
    TiledMma tiled_mma;
    QueueState queue_state;
    for (int entry = 0;; ++entry) {
      queue.consumer_wait(queue_state);
      const int t = shared.queued_tile[queue_state.index()];
      queue.consumer_release(queue_state);
      ++queue_state;
      if (t < 0) break;
      if (kPingpong && entry % 2 != consumer) {  // the other warpgroup's: skip its stages
        read_state.advance(entry_piece<kSplitTiles>(p, t).k_count);
        continue;
      }
      const GemmTile tile = p.tiles[t];
      const GemmSplitPiece piece = entry_piece<kSplitTiles>(p, t);
      const GemmSplitRole role = piece.role;
      const int k_count = piece.k_count;
      if (role == GemmSplitRole::kIdle) {
        if constexpr (kPingpong) {  // keep the turns: the other warpgroup waits for them
          math_order.wait();
          math_order.arrive();
          math_order.wait();
          math_order.arrive();
        }
        continue;
      }
      // Padding tiles exist only in cluster schedules (and under a split list's idle pieces);
      // tested for every kernel, so that such a schedule run by the wrong configuration never
      // stores at a negative row. A kPartial entry stores no output either: its sum goes to the
      // split workspace.
      const bool stores = !gemm_tile_is_padding(tile) && role != GemmSplitRole::kPartial;
      // Cooperative: the second warpgroup's 64 rows of an expert's last M tile may all lie past
      // the expert's rows. It then computes and stores nothing: the first warpgroup has the
      // tensor cores alone (an expert with 1032 rows runs 8 full tiles and a half one).
      if (!kPingpong && consumer == 1 && gemm_tile_rows(tile) <= kRowsPerWarpGroup) {
        // Release each stage once it is full, as the MMAs would: releasing before the producer
        // filled it could let a stage be refilled while the other warpgroup still reads it.
        // In a cluster the warpgroup's four warps meet after each wait: there CUTLASS's
        // PipelineTmaAsync takes a stage's release from one thread per destination block (two
        // threads in warps 0 and 1 of the warpgroup), and with no wgmma here to keep the warps in
        // step, warp 2 or 3 could fall behind, see a stage refilled twice before it polls, and
        // then wait on the barrier's parity for a fill that never comes (seen: warp 3 of one
        // block spinning after the rest of the grid had left, docs/gemm.md). Without clusters
        // every consumer thread arrives, so no stage is refilled before every warp has seen it.
        for (int k = 0; k < k_count; ++k, ++read_state) {
          pipeline.consumer_wait(read_state);
          if constexpr (kClusterM > 1) cutlass::arch::NamedBarrier::sync(128, 2 + consumer);
          pipeline.consumer_release(read_state);
        }
        // The named barriers the first warpgroup meets below (its sums are its own: the finishing
        // piece adds no partial to these rows and stores none of them).
        if (role == GemmSplitRole::kPartial) cutlass::arch::NamedBarrier::sync(kMmaThreads, 1);
        if (stores && role == GemmSplitRole::kFinish) cutlass::arch::NamedBarrier::sync(kMmaThreads, 1);
        if (stores && (p.done_flags != nullptr || p.tile_end_ns != nullptr || p.trace_tiles != nullptr))
          cutlass::arch::NamedBarrier::sync(kMmaThreads, 1);
        continue;  // (a branch around the MMAs instead made ptxas serialize every wgmma, C7518)
      }
      // The tile's trace record opens in memory (no register kept across the mainloop).
      if (p.trace_tiles != nullptr && mma_thread == 0 && stores) p.trace_tiles[t].begin_ns = globaltimer_ns();
      Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
      // Cooperative: the staging rows are the warpgroup's own, free since its last epilogue, so
      // the rows' destinations load while the mainloop runs (ping-pong: in its epilogue turn).
      if constexpr (!kPingpong)
        if (stores && has_row_combine(p)) load_row_combine(p, tile, mma_thread, shared.stage);
      if constexpr (kPingpong) math_order.wait();  // this warpgroup's turn on the tensor cores
      mainloop.mma(pipeline, read_state, accum, k_count, mma_thread, shared.tensors, p.mainloop);
      if constexpr (kPingpong) math_order.arrive();
      mainloop.mma_tail(pipeline, read_state, k_count);
      read_state.advance(k_count);
      // A partial goes out before the epilogue turn (it needs no staging buffer), so a finishing
      // entry that holds the turn while it waits never blocks a partial it waits for.
      if (role == GemmSplitRole::kPartial) {
        write_partial(p, piece.partial, accum, mma_thread);
        cutlass::arch::NamedBarrier::sync(kMmaThreads, kPingpong ? 2 + consumer : 1);
        if (mma_thread == 0) {
          __threadfence();
          red_release_gpu(p.split_flags + piece.partial, 1);
        }
      }
      if constexpr (kPingpong) math_order.wait();  // this warpgroup's turn on the staging buffer
      if (stores) {  // (a padding tile was computed only to keep the cluster's B multicast in step)
        if (role == GemmSplitRole::kFinish) add_partials(p, piece, accum, mma_thread, consumer);
        store_tile(p, tile, tiled_mma, accum, mma_thread, consumer, shared.stage);
        if (p.done_flags != nullptr || p.tile_end_ns != nullptr || p.trace_tiles != nullptr) {
          // Every thread of the tile has stored; one publishes (release) for the whole tile.
          cutlass::arch::NamedBarrier::sync(kMmaThreads, kPingpong ? 2 + consumer : 1);
          if (mma_thread == 0) {
            __threadfence();
            if (p.done_flags != nullptr) red_release_gpu(p.done_flags + tile.n_block, 1);
            if (p.tile_end_ns != nullptr) p.tile_end_ns[t] = globaltimer_ns();
            if (p.trace_tiles != nullptr)
              close_trace_event(p.trace_tiles + t, globaltimer_ns(), t, 1, TraceKind::kGemmTile, p.layer, p.rank);
          }
        }
      }
      if constexpr (kPingpong) math_order.arrive();
    }
    after_tiles();
  }

  template <bool kSplitTiles>
  static __device__ void produce(const Params& p, SharedStorage& shared, Pipeline& pipeline, TileQueue& queue,
                                 int gemm_block, int num_gemm_blocks, int num_tiles) {
    Tensor mA = p.mainloop.tma_load_a.get_tma_tensor(make_shape(p.max_rows, p.k, 1));
    Tensor mB = p.mainloop.tma_load_b.get_tma_tensor(make_shape(p.n_b, p.k, p.num_experts));
    Tensor gA = local_tile(mA, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});  // (BM,BK,m,k,l)
    Tensor gB = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});  // (BN,BK,n,k,l)
    Tensor sA = make_tensor(make_smem_ptr(shared.tensors.smem_A.data()), typename Mainloop::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared.tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});
    // In a cluster, block r of the cluster loads slice r of each B k-tile and multicasts it to
    // every block of the cluster (mask: all of them) when the cluster's tiles share their column
    // block; when they do not (an odd expert's last M tile, build_gemm_tiles), each block loads
    // both slices for itself (mask: itself). A is always this block's own.
    const int cluster_rank = gemm_block % kClusterM;
    const uint16_t multicast_b = uint16_t((1u << kClusterM) - 1), own_b = uint16_t(1u << cluster_rank);
    auto tma_a = p.mainloop.tma_load_a.get_slice(0);
    auto tma_b = p.mainloop.tma_load_b.get_slice(cluster_rank);
    auto tma_b_other = p.mainloop.tma_load_b.get_slice(kClusterM > 1 ? 1 - cluster_rank : 0);
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBsB = tma_b.partition_D(sB);
    Tensor tBsB_other = tma_b_other.partition_D(sB);
    PipelineState write_state = cutlass::make_producer_start_state<Pipeline>();
    const bool leader = cute::elect_one_sync();
    const int lane = int(threadIdx.x) % 32;
    QueueState queue_state = cutlass::make_producer_start_state<TileQueue>();
    for (int i = 0;; ++i) {
      // Claimed tiles: one atomic per tile, taken only when the previous tile's loads are all
      // issued, so a block never holds more than the tile it is about to load. Every block
      // stops at its first claim past the end, so the launch's claims end at num_tiles +
      // claim_blocks: the block holding the last one resets the counter for the next launch.
      // Static: cluster unit u of U runs entries u, u + U, ... of kClusterM tiles each.
      const int units = num_gemm_blocks / kClusterM;
      int t = (gemm_block / kClusterM + i * units) * kClusterM + cluster_rank;
      if (kClusterM == 1 && p.tile_claims != nullptr) {
        unsigned claim = 0;
        if (lane == 0) {
          claim = atomicAdd(p.tile_claims, 1u);
          if (claim == unsigned(num_tiles + p.claim_blocks - 1)) atomicExch(p.tile_claims, 0u);
        }
        t = int(__shfl_sync(~0u, claim, 0));
      }
      if (t >= num_tiles) t = -1;
      queue.producer_acquire(queue_state);
      if (lane == 0) {
        shared.queued_tile[queue_state.index()] = t;
        queue.producer_commit(queue_state);  // mbarrier arrive: release of the slot's store
      }
      ++queue_state;
      if (t < 0) break;
      const GemmTile tile = p.tiles[t];
      const GemmSplitPiece piece = entry_piece<kSplitTiles>(p, t);
      if constexpr (kSplitTiles) {
        if (leader && piece.role == GemmSplitRole::kIdle && p.split_pieces[t].role != GemmSplitRole::kIdle)
          record_timeout(p.error, WaitSite{p.rank, p.layer, WaitRole::kBadSchedule, t}, 0, uint64_t(p.split_pieces[t].role));
      }
      const int k_begin = piece.k_begin, k_count = piece.k_count;
      if (leader && p.wait_flags != nullptr && !gemm_tile_is_padding(tile)) {
        const WaitSite site{p.rank, p.layer, WaitRole::kGemmTileInput, tile.signal};
        const uint64_t wait_begin = p.trace_waits != nullptr ? globaltimer_ns() : 0;
        wait_at_least(p.wait_flags + tile.signal, p.wait_targets[tile.signal], p.timeout_ns, p.error, site);
        fence_proxy_async_global();  // rows written by generic stores, read by TMA below
        if (p.trace_waits != nullptr)
          store_trace_event(p.trace_waits + t, wait_begin, globaltimer_ns(), tile.signal, 1, TraceKind::kWait, p.layer,
                            p.rank);
      }
      __syncwarp();
      // The tile's A rows from its first row, which need not start a 128-row block: the second
      // half of an M tile cut in two starts 64 rows in (the device plan's layer1 lists). The
      // TMA coordinates are offset; the box (and the OOB zero fill past max_rows) is as ever.
      const int a_row = gemm_tile_a_row(tile);
      Tensor tAgA = tma_a.partition_S(domain_offset(make_coord(a_row % kTileM, 0, 0), gA(_, _, a_row / kTileM, _, 0)));
      // (TMA,TMA_M,TMA_K,k)
      Tensor tBgB = tma_b.partition_S(gB(_, _, tile.n_block, _, tile.expert));  // (TMA,TMA_N,TMA_K,k)
      Tensor tBgB_other = tma_b_other.partition_S(gB(_, _, tile.n_block, _, tile.expert));
      // Entries 2u and 2u + 1 are a cluster's pair: t ^ 1 is the partner's entry.
      bool share_b = true;
      if constexpr (kClusterM > 1) {
        const GemmTile partner = p.tiles[t ^ 1];
        share_b = partner.n_block == tile.n_block && partner.expert == tile.expert;
      }
      const uint16_t mask_b = kClusterM == 1 ? uint16_t(0) : share_b ? multicast_b : own_b;
      if (leader) {
        for (int k = k_begin; k < k_begin + k_count; ++k) {
          pipeline.producer_acquire(write_state);
          auto* barrier = pipeline.producer_get_barrier(write_state);
          const int stage = write_state.index();
          copy(p.mainloop.tma_load_a.with(*barrier, 0), tAgA(_, _, _, k), tAsA(_, _, _, stage));
          copy(p.mainloop.tma_load_b.with(*barrier, mask_b), tBgB(_, _, _, k), tBsB(_, _, _, stage));
          if (!share_b)  // the other slice too: the stage expects the whole B k-tile
            copy(p.mainloop.tma_load_b.with(*barrier, own_b), tBgB_other(_, _, _, k), tBsB_other(_, _, _, stage));
          ++write_state;
        }
      }
      __syncwarp();
    }
    if (leader) pipeline.producer_tail(write_state);
  }

  // What this launch runs of entry t: the whole tile (plain kernels: no split state is read), or
  // its piece with k_begin and k_count filled in; a split piece whose workspace slots the launch
  // lacks (a schedule built for a larger grid) or whose k range is not inside K becomes kIdle
  // (the producer records kBadSchedule), so no flag or partial is touched out of bounds and the
  // mainloop never waits for stages the producer does not load. Producer and consumers decide
  // alike, so their stage counts agree.
  template <bool kSplitTiles>
  static __device__ GemmSplitPiece entry_piece(const Params& p, int t) {
    GemmSplitPiece whole;
    whole.k_count = p.k_tiles;
    if constexpr (!kSplitTiles) {
      return whole;
    } else {
      GemmSplitPiece piece = p.split_pieces[t];
      if (piece.role == GemmSplitRole::kWhole) return whole;
      if (piece.role == GemmSplitRole::kIdle) {
        piece.k_count = 0;
        return piece;
      }
      const int end = piece.partial + (piece.role == GemmSplitRole::kFinish ? int(piece.partials) : 1);
      const bool k_range = piece.k_begin >= 0 && piece.k_count >= 1 && piece.k_begin + piece.k_count <= p.k_tiles;
      if (piece.partial < 0 || piece.partials < 0 || end > p.split_flag_count || !k_range) {
        piece.role = GemmSplitRole::kIdle;
        piece.k_count = 0;
      }
      return piece;
    }
  }

  // Split workspace slot: the tile's fp32 accumulators in fragment order, 16 bytes per thread
  // per step (consecutive threads, consecutive 16 bytes: whole-line stores). The kFinish entry
  // runs the same TiledMma with the same thread indices, so it reads back its own fragment.
  static constexpr int kPartialFloats = kTileM * kTileN;
  template <class Accum>
  static __device__ void write_partial(const Params& p, int slot, const Accum& accum, int mma_thread) {
    float4* out = reinterpret_cast<float4*>(p.split_partials + int64_t(slot) * kPartialFloats) + mma_thread;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); i += 4)
      __stcg(out + (i / 4) * kMmaThreads, make_float4(accum(i), accum(i + 1), accum(i + 2), accum(i + 3)));
  }
  // Adds the tile's other parts (slots [partial, partial + partials), written by kPartial
  // entries that each release-added 1 to their flag) in slot order, after this entry's own
  // k-tiles, then clears the flags for the next launch (nothing else touches them in this one).
  // One thread acquires, the named barrier passes the ordering on; reads bypass L1 (other SMs
  // wrote them).
  template <class Accum>
  static __device__ void add_partials(const Params& p, const GemmSplitPiece& piece, Accum& accum, int mma_thread,
                                      int consumer) {
    if (mma_thread == 0) {
      for (int j = 0; j < piece.partials; ++j) {
        const int slot = piece.partial + j;
        // Cleared only once seen set: a flag that a late partial sets after a timeout stays set
        // (the error record says so; the caller zeroes the flags before the next launch).
        if (wait_at_least(p.split_flags + slot, 1, p.timeout_ns, p.error, WaitSite{p.rank, p.layer, WaitRole::kSplitPartial, slot}))
          p.split_flags[slot] = 0;
      }
    }
    cutlass::arch::NamedBarrier::sync(kMmaThreads, kPingpong ? 2 + consumer : 1);
    for (int j = 0; j < piece.partials; ++j) {
      const float4* in = reinterpret_cast<const float4*>(p.split_partials + int64_t(piece.partial + j) * kPartialFloats) + mma_thread;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); i += 4) {
        const float4 v = __ldcg(in + (i / 4) * kMmaThreads);
        accum(i) += v.x;
        accum(i + 1) += v.y;
        accum(i + 2) += v.z;
        accum(i + 3) += v.w;
      }
    }
  }

  // Whether the epilogue puts rows where p.row_combine says (GEMM1 only: can_implement refuses
  // row_combine with another epilogue, and this lets those instantiations drop the code).
  static __device__ __forceinline__ bool has_row_combine(const Params& p) {
    return kEpilogue == GemmEpilogue::kIdentity && p.row_combine != nullptr;
  }
  // With p.row_combine: the RowCombine entry of each row this warpgroup stores, copied
  // asynchronously (cp.async, no registers held) into the row's 16 padding bytes of the staging
  // buffer, which the fragment never writes. store_tile waits for it before its first barrier.
  static __device__ void load_row_combine(const Params& p, const GemmTile& tile, int mma_thread, __nv_bfloat16* stage) {
    const int row0 = (mma_thread / 128) * kRowsPerWarpGroup;
    for (int r = row0 + mma_thread % 128; r < row0 + kRowsPerWarpGroup; r += 128)
      if (tile.m_row + r < p.max_rows) copy_async_16(stage + r * kStageLd + kStageCols, p.row_combine + tile.m_row + r);
    copy_async_commit();
  }

  // Registers -> bf16 in shared memory -> coalesced global stores. The accumulator fragment of
  // a wgmma warpgroup holds, per thread, column pairs (c, c+1) in groups of 8 columns; with B
  // packed as alternating blocks of kSwiGluPack gate and kSwiGluPack up columns, the up value
  // of gate column c sits kSwiGluPack columns later in the same thread's fragment, at a fixed
  // index distance. Each warpgroup stages and stores only its own rows (cooperative: its 64 of
  // the tile; ping-pong: all of its tile, in its epilogue turn), so it synchronizes with itself
  // alone (named barrier 2 + consumer warpgroup).
  template <class Accum>
  static __device__ void store_tile(const Params& p, const GemmTile& tile, const TiledMma& tiled_mma,
                                    const Accum& accum, int mma_thread, int consumer, __nv_bfloat16* stage) {
    static_assert(decltype(size<2>(accum))::value == 1, "one MMA atom across the tile's N expected");
    static_assert(decltype(size<0>(accum))::value == kTileN / 2, "((2,2,N/8), M, 1) accumulator expected");
    auto thr_mma = tiled_mma.get_slice(mma_thread);
    Tensor coord = thr_mma.partition_C(make_identity_tensor(take<0, 2>(TileShape{})));
    const int wg_thread = mma_thread % 128;
    const int row0 = (mma_thread / 128) * kRowsPerWarpGroup;  // this warpgroup's rows
    const int col0 = tile.n_block * kOutN;
    const bool row_combine = has_row_combine(p);
    if constexpr (kPingpong)
      if (row_combine) load_row_combine(p, tile, mma_thread, stage);
    CUTLASS_PRAGMA_UNROLL
    for (int pass = 0; pass < kPasses; ++pass) {
      // Step 1: fragment -> shared memory (columns [pass*kStageCols, +kStageCols) of the output).
      // Flat fragment index i = v0 + 2*v1 + 4*g (+ 4*kGroups per MMA_M slice): column
      // base + v0 + 8*g with the thread's base + v0 < 8. So which half (gate/up) and which
      // pass a value belongs to follow from i alone, and the unrolled loop keeps no dead branch
      // (deciding from the runtime coordinate made the SwiGLU kernel spill registers).
      constexpr int kGroups = kTileN / 8;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); i += 2) {
        const int g = (i / 4) % kGroups;
        int c_static;  // output column of the pair, less the thread's offset inside 8 columns
        if constexpr (kEpilogue != GemmEpilogue::kSwiGlu) {
          c_static = 8 * g;
        } else {
          if ((8 * g / kSwiGluPack) % 2 != 0) continue;  // an up column: read as a partner below
          c_static = (8 * g / (2 * kSwiGluPack)) * kSwiGluPack + (8 * g) % kSwiGluPack;
        }
        if (c_static / kStageCols != pass) continue;
        const int r = get<0>(coord(i));
        const int c = c_static % kStageCols + get<1>(coord(i)) % 8;
        float v0 = accum(i), v1 = accum(i + 1);
        if constexpr (kEpilogue == GemmEpilogue::kSwiGlu) {
          const int j = partner_index(i);
          v0 = __fdividef(v0, 1.f + __expf(-v0)) * accum(j);
          v1 = __fdividef(v1, 1.f + __expf(-v1)) * accum(j + 1);
        }
        if constexpr (kEpilogue == GemmEpilogue::kActivation) {
          v0 = apply_activation(p.activation, 0.f, v0);
          v1 = apply_activation(p.activation, 0.f, v1);
        }
        *reinterpret_cast<__nv_bfloat162*>(stage + r * kStageLd + c) = __floats2bfloat162_rn(v0, v1);
      }
      if (pass == 0 && row_combine) copy_async_wait_all();
      cutlass::arch::NamedBarrier::sync(128, 2 + consumer);
      // Step 2: shared memory -> global, 16 bytes per thread, consecutive threads along a row.
      constexpr int kChunksPerRow = kStageCols / 8;
      constexpr int kChunks = kRowsPerWarpGroup * kChunksPerRow;
      CUTLASS_PRAGMA_UNROLL
      for (int chunk = wg_thread; chunk < kChunks; chunk += 128) {
        const int r = row0 + chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * 8;
        const int gcol = col0 + pass * kStageCols + c;
        if (tile.m_row + r < p.max_rows && gcol < p.n) {
          uint4 out = *reinterpret_cast<const uint4*>(stage + r * kStageLd + c);
          uint4* dst = reinterpret_cast<uint4*>(p.d + int64_t(tile.m_row + r) * p.n + gcol);
          if (row_combine) {
            // The token's only row here goes to its owner's slot, weighted. Selects, not a
            // branch per chunk: the unrolled chunks' shared loads and global stores then issue
            // back to back (a branch per chunk made GEMM1's tiles about 10% longer, qwen3).
            const RowCombine to = *reinterpret_cast<const RowCombine*>(stage + r * kStageLd + kStageCols);
            float acc[8] = {};
            fma_chunk(acc, to.weight, out);
            const uint4 weighted = to_bf16_chunk(acc);
            const bool to_owner = to.dst != nullptr;
            out = to_owner ? weighted : out;
            dst = to_owner ? static_cast<uint4*>(to.dst) + gcol / 8 : dst;
          }
          *dst = out;
        }
      }
      cutlass::arch::NamedBarrier::sync(128, 2 + consumer);  // stage free for the next pass
    }
  }

  // Index of the up value paired with gate index i. The fragment is ((2,2,N/8), MMA_M, 1): the
  // column-group mode (N/8 groups, stride 4 in the flat index) is the only one that moves
  // columns by 8, so kSwiGluPack columns later is i + 4 * kSwiGluPack / 8, in the same slice.
  static __device__ __forceinline__ int partner_index(int i) { return i + 4 * (kSwiGluPack / 8); }
};

template <class Kernel, bool kSplitTiles>
__global__ void __launch_bounds__(Kernel::kThreads, 1) grouped_gemm_kernel(const __grid_constant__ typename Kernel::Params p) {
  begin_dependent_kernel();
  extern __shared__ __align__(128) char smem[];
  Kernel::template run_block<kSplitTiles>(p, int(blockIdx.x), int(gridDim.x), smem);
}

}  // namespace comet::cuda::sm90
