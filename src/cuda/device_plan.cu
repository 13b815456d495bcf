// The dispatch plan of one rank from every rank's routing, in two kernels.
//
// Counting kernel, one 1024-thread block per rank (passes loop over the sources in ring order,
// tokens in chunks of 1024, one per thread):
//   1. count rows per (ring position, local expert) and received tokens per ring position,
//      keeping the running counts at the start of every chunk (chunk_row_base, chunk_slot_base)
//   2. expert segment offsets (padded to 128 rows) and per-source row bases, added to the
//      chunk bases
//   4. send positions of the own tokens to every destination (block scans)
//   5. M tiles, their last ring position, the layer0 order (stable counting sort), and both
//      GEMM tile lists
// Placing kernel, one block per (rank, ring position, chunk), all in parallel:
//   3. place every received token and (token, slot) of the chunk: block scan for the slot;
//      warp ballots per expert for the row (rank among earlier tokens with that expert), on top
//      of the chunk's bases
// Pass 3 is the expensive one (a ballot round per distinct expert in a warp): one block per
// chunk instead of one per rank makes it W * T_max / 1024 times wider.
//
// NOTES: the order rules are those of comet::DispatchPlan (include/comet/plan.h): inside an
// expert, sources in ring order, then tokens ascending; a token's rows in slot order.
// Determinism comes from scans and ballots (no atomics decide an order).
#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "cuda/check.h"
#include "cuda/device_plan.h"
#include "cuda/signal.cuh"
#include "cuda/tile_raster.cuh"

namespace comet::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTopk = 16;
using BlockScan = cub::BlockScan<int, kThreads>;

struct PlanShape {
  int world, tp, experts_per_rank, num_experts, topk, t_max, rows_per_token;
  int chunks;  // token chunks of kThreads per source: ceil(t_max / kThreads)
  int64_t max_rows, max_m_tiles;
  int n_blocks0, n_blocks1;
};

__device__ void record_input_error(DeviceError* error, int rank, WaitRole role, int src, uint64_t bound,
                                   uint64_t value) {
  record_timeout(error, WaitSite{rank, -1, role, src}, bound, value);
}

// Shared memory of the counting kernel: cnt[W][Epr], base[W][Epr], recv_cnt[W], tile_psum[Epr + 1],
// last_cnt[W + 1].
struct Smem {
  int* cnt;
  int* base;
  int* recv_cnt;
  int* tile_psum;
  int* last_cnt;
  __device__ Smem(int* p, const PlanShape& s) {
    const int W = s.world, E = s.experts_per_rank;
    cnt = p;
    base = cnt + W * E;
    recv_cnt = base + W * E;
    tile_psum = recv_cnt + W;
    last_cnt = tile_psum + E + 1;
  }
  static size_t bytes(const PlanShape& s) {
    const int W = s.world, E = s.experts_per_rank;
    return sizeof(int) * size_t(2 * W * E + W + E + 1 + W + 1);
  }
};

// Up to kPlanBatch ranks' plans in one launch, one block each (virtual ranks on one GPU plan
// concurrently instead of one 1-block kernel after another).
constexpr int kPlanBatch = 8;
struct PlanBatch {
  DevicePlanArgs ranks[kPlanBatch];
};

__global__ void __launch_bounds__(kThreads, 1) device_plan_kernel(PlanShape s, const __grid_constant__ PlanBatch batch) {
  DevicePlanArgs a = batch.ranks[blockIdx.x];
  extern __shared__ int smem_raw[];
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int bad_rows, repeated;
  Smem sm(smem_raw, s);
  const int tid = threadIdx.x;
  const int W = s.world, E = s.experts_per_rank, K = s.topk;
  const int r = a.rank, my_ep = r / s.tp;
  DevicePlanView& plan = a.plan;
  auto token_count = [&](int src) {
    const int t = *a.token_counts[src];
    if (t < 0 || t > s.t_max) {
      if (tid == 0) record_input_error(a.error, r, WaitRole::kBadTokenCount, src, s.t_max, uint64_t(t));
      return 0;  // treated as empty: nothing is read past T_max
    }
    return t;
  };
  // Local expert of slot k of token t of src, or -1 (masked, another group, or bad id).
  auto local_expert = [&](const int32_t* ids, int src, int t, int k) {
    const int e = ids[size_t(t) * K + k];
    if (e < -1 || e >= s.num_experts) {
      record_input_error(a.error, r, WaitRole::kBadExpertId, src, s.num_experts, uint64_t(uint32_t(e)));
      return -1;
    }
    return (e >= 0 && e / E == my_ep) ? e % E : -1;
  };

  // Pass 1: rows per (ring position, local expert), tokens per ring position; the running
  // counts at the start of each chunk are the chunk's bases (made absolute in pass 2).
  for (int i = tid; i < W * E; i += kThreads) sm.cnt[i] = 0;
  for (int i = tid; i < W; i += kThreads) sm.recv_cnt[i] = 0;
  if (tid == 0) repeated = 0;
  __syncthreads();
  for (int pos = 0; pos < W; ++pos) {
    const int src = (r + pos) % W, T = token_count(src);
    const int32_t* ids = a.route_ids[src];
    for (int ch = 0; ch < s.chunks; ++ch) {
      for (int e = tid; e < E; e += kThreads) plan.chunk_row_base[(int64_t(pos) * s.chunks + ch) * E + e] = sm.cnt[pos * E + e];
      if (tid == 0) plan.chunk_slot_base[pos * s.chunks + ch] = sm.recv_cnt[pos];
      __syncthreads();  // the snapshot before this chunk's counts
      const int t = ch * kThreads + tid;
      if (t < T) {
        bool mine = false;
        for (int k = 0; k < K; ++k) {
          const int e = local_expert(ids, src, t, k);
          if (e < 0) continue;
          atomicAdd(&sm.cnt[pos * E + e], 1);
          mine = true;
        }
        if (mine) atomicAdd(&sm.recv_cnt[pos], 1);
        // Every rank checks every token (not only its own experts), so all refuse together.
        for (int k = 1; k < K; ++k) {
          const int e = ids[size_t(t) * K + k];
          for (int j = 0; j < k && e >= 0; ++j)
            if (ids[size_t(t) * K + j] == e) {
              record_input_error(a.error, r, WaitRole::kRepeatedExpert, src, uint64_t(s.num_experts), uint64_t(e));
              repeated = 1;
            }
        }
      }
      __syncthreads();
    }
  }
  __syncthreads();

  // Pass 2: padded expert offsets, row base of each (ring position, expert), recv prefix sums.
  if (tid == 0) {
    int offset = 0, tiles = 0, rows = 0;
    for (int e = 0; e < E; ++e) {
      int n = 0;
      for (int pos = 0; pos < W; ++pos) n += sm.cnt[pos * E + e];
      plan.expert_rows[e] = n;
      plan.expert_offset[e] = offset;
      sm.tile_psum[e] = tiles;
      int b = offset;
      for (int pos = 0; pos < W; ++pos) {
        sm.base[pos * E + e] = b;
        b += sm.cnt[pos * E + e];
      }
      offset += (n + kGemmBlockM - 1) / kGemmBlockM * kGemmBlockM;
      tiles += (n + kGemmBlockM - 1) / kGemmBlockM;
      rows += n;
    }
    plan.expert_offset[E] = offset;
    sm.tile_psum[E] = tiles;
    plan.counts[0] = tiles;
    plan.counts[1] = rows;
    plan.counts[2] = 1;
    plan.recv_psum[0] = 0;
    for (int pos = 0; pos < W; ++pos) {
      plan.recv_count[pos] = sm.recv_cnt[pos];
      plan.recv_psum[pos + 1] = plan.recv_psum[pos] + sm.recv_cnt[pos];
    }
    // Rows beyond the buffers, or an expert repeated within a token (which breaks the row
    // placement below): refuse the whole plan.
    bad_rows = offset > s.max_rows || repeated;
    if (offset > s.max_rows)
      record_input_error(a.error, r, WaitRole::kRowOverflow, r, uint64_t(s.max_rows), uint64_t(offset));
    if (bad_rows) {
      plan.counts[0] = 0;
      plan.counts[2] = 0;  // the placing kernel writes nothing
      plan.num_tiles[0] = plan.num_tiles[1] = 0;
      for (int pos = 0; pos <= W; ++pos) plan.recv_psum[pos] = 0;  // nothing to dispatch or combine
    }
  }
  __syncthreads();
  if (bad_rows) {
    // No later kernel may follow stale indices: the own tokens are sent nowhere.
    const int T = token_count(r);
    for (int64_t i = tid; i < int64_t(T) * W; i += kThreads) plan.send_pos[i] = -1;
    return;
  }

  // Chunk bases made absolute: the source's row base per expert, the source's first slot.
  for (int64_t i = tid; i < int64_t(W) * s.chunks * E; i += kThreads) {
    const int pos = int(i / (int64_t(s.chunks) * E)), e = int(i % E);
    plan.chunk_row_base[i] += sm.base[pos * E + e];
  }
  for (int i = tid; i < W * s.chunks; i += kThreads) plan.chunk_slot_base[i] += plan.recv_psum[i / s.chunks];

  // Pass 4: positions of the own tokens in the send list to every destination.
  {
    const int T = token_count(r);
    const int32_t* ids = a.route_ids[r];
    for (int d = 0; d < W; ++d) {
      const int d_ep = d / s.tp;
      int running = 0;  // identical in every thread (block-wide totals)
      for (int chunk = 0; chunk < T; chunk += kThreads) {
        const int t = chunk + tid;
        int flag = 0;
        if (t < T)
          for (int k = 0; k < K; ++k) {
            const int e = ids[size_t(t) * K + k];
            if (e >= 0 && e < s.num_experts && e / E == d_ep) flag = 1;
          }
        int p, total;
        BlockScan(scan_storage).ExclusiveSum(flag, p, total);
        if (t < T) plan.send_pos[size_t(t) * W + d] = flag ? running + p : -1;
        running += total;
        __syncthreads();  // scan storage reused
      }
    }
  }

  // Pass 5: M tiles (expert-major), last ring position, layer0 order, GEMM tile lists.
  for (int e = tid; e < E; e += kThreads) {
    const int rows = plan.expert_rows[e], offset = plan.expert_offset[e];
    for (int i = 0; i * kGemmBlockM < rows; ++i) {
      const int m = sm.tile_psum[e] + i;
      const int n = min(kGemmBlockM, rows - i * kGemmBlockM);
      const int last_row = offset + i * kGemmBlockM + n - 1;
      int last = 0;
      for (int pos = W - 1; pos >= 0; --pos)
        if (sm.cnt[pos * E + e] > 0 && sm.base[pos * E + e] <= last_row) {
          last = pos;
          break;
        }
      plan.m_tile_row[m] = offset + i * kGemmBlockM;
      plan.m_tile_rows[m] = n;
      plan.m_tile_last[m] = last;
    }
  }
  __syncthreads();
  const int num_m = sm.tile_psum[E];
  if (tid == 0) {
    // Stable counting sort by last ring position: tiles fed only by the own rank first.
    for (int pos = 0; pos <= W; ++pos) sm.last_cnt[pos] = 0;
    for (int m = 0; m < num_m; ++m) ++sm.last_cnt[plan.m_tile_last[m] + 1];
    for (int pos = 0; pos < W; ++pos) sm.last_cnt[pos + 1] += sm.last_cnt[pos];
    for (int m = 0; m < num_m; ++m) plan.layer0_order[sm.last_cnt[plan.m_tile_last[m]]++] = m;
    plan.num_tiles[0] = num_m * s.n_blocks0;
    plan.num_tiles[1] = num_m * s.n_blocks1;
  }
  __syncthreads();
  auto expert_of = [&](int m) {  // largest e with tile_psum[e] <= m
    int lo = 0, hi = E - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (sm.tile_psum[mid] <= m) lo = mid; else hi = mid - 1;
    }
    return lo;
  };
  for (int64_t i = tid; i < int64_t(num_m) * s.n_blocks0; i += kThreads) {
    int q, n;
    raster_tile(TileOrder::kRowMajor, a.layer0_group_m, i, num_m, s.n_blocks0, q, n);
    const int m = plan.layer0_order[q];
    plan.tiles0[i] = GemmTile{plan.m_tile_row[m], n, expert_of(m), m};
  }
  for (int64_t i = tid; i < int64_t(num_m) * s.n_blocks1; i += kThreads) {
    int m, n;
    raster_tile(TileOrder::kColumnBlockMajor, kRasterGroupN, i, num_m, s.n_blocks1, m, n);
    plan.tiles1[i] = GemmTile{plan.m_tile_row[m], n, expert_of(m), m};
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
      a.col_target[j] = a.col_base[j] + uint64_t(num_m);
      a.col_base[j] = a.col_target[j];
    }
  }
}

// Pass 3 for chunk blockIdx.x of ring position blockIdx.y of rank batch.ranks[blockIdx.z]: the
// chunk's tokens get consecutive slots from chunk_slot_base (block scan), each (token, slot)
// its row: the expert's chunk base, plus the earlier warps' count, plus its rank in the warp.
__global__ void __launch_bounds__(kThreads, 1) device_plan_place_kernel(PlanShape s,
                                                                          const __grid_constant__ PlanBatch batch) {
  const DevicePlanArgs& a = batch.ranks[blockIdx.z];
  const DevicePlanView& plan = a.plan;
  const int ch = int(blockIdx.x), pos = int(blockIdx.y);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int W = s.world, E = s.experts_per_rank, K = s.topk, R = s.rows_per_token;
  const int r = a.rank, my_ep = r / s.tp, src = (r + pos) % W;
  if (plan.counts[2] == 0) return;  // a refused plan places nothing (the counting kernel said why)
  const int T_published = *a.token_counts[src];
  const int T = T_published < 0 || T_published > s.t_max ? 0 : T_published;
  if (ch * kThreads >= T) return;
  extern __shared__ int smem_raw[];
  int* warp_cnt = smem_raw;                 // [kWarps][E]
  int* chunk_base = warp_cnt + kWarps * E;  // [E]
  __shared__ typename BlockScan::TempStorage scan_storage;
  const int32_t* ids = a.route_ids[src];
  const float* weights = a.route_weights[src];
  for (int e = tid; e < E; e += kThreads) chunk_base[e] = plan.chunk_row_base[(int64_t(pos) * s.chunks + ch) * E + e];
  const int t = ch * kThreads + tid;
  int lk[kMaxTopk];
  unsigned pending = 0;  // bit k: slot k still needs its rank within the warp
  for (int k = 0; k < K; ++k) {
    const int e = t < T ? ids[size_t(t) * K + k] : -1;  // bad ids were reported by the counting kernel
    lk[k] = (e >= 0 && e < s.num_experts && e / E == my_ep) ? e % E : -1;
    if (lk[k] >= 0) pending |= 1u << k;
  }
  const int mine = pending != 0;
  int p, total;
  BlockScan(scan_storage).ExclusiveSum(mine, p, total);
  // Rank of each slot among this warp's earlier tokens with the same expert.
  for (int e = lane; e < E; e += 32) warp_cnt[warp * E + e] = 0;
  __syncwarp();
  int wrank[kMaxTopk];
  while (true) {
    const unsigned any = __ballot_sync(0xffffffffu, pending != 0);
    if (any == 0) break;
    const int leader = __ffs(any) - 1;
    const int my_first = pending ? lk[__ffs(pending) - 1] : -1;
    const int e_lead = __shfl_sync(0xffffffffu, my_first, leader);
    int kk = -1;
    for (int k = 0; k < K; ++k)
      if ((pending >> k & 1u) && lk[k] == e_lead) kk = k;
    const unsigned holders = __ballot_sync(0xffffffffu, kk >= 0);
    if (kk >= 0) {
      wrank[kk] = __popc(holders & ((1u << lane) - 1u));
      pending &= ~(1u << kk);
    }
    if (lane == leader) warp_cnt[warp * E + e_lead] = __popc(holders);
  }
  __syncthreads();
  // Per expert: exclusive scan over warps on top of the chunk's base.
  for (int e = tid; e < E; e += kThreads) {
    int acc = chunk_base[e];
    for (int w = 0; w < kWarps; ++w) {
      const int c = warp_cnt[w * E + e];
      warp_cnt[w * E + e] = acc;
      acc += c;
    }
  }
  __syncthreads();
  if (mine) {
    const int slot = plan.chunk_slot_base[pos * s.chunks + ch] + p;
    plan.recv_token[slot] = t;
    int j = 0;
    for (int k = 0; k < K && j < R; ++k) {
      if (lk[k] < 0) continue;
      plan.recv_rows[size_t(slot) * R + j] = warp_cnt[warp * E + lk[k]] + wrank[k];
      plan.recv_weight[size_t(slot) * R + j] = weights[size_t(t) * K + k];
      ++j;
    }
    for (; j < R; ++j) {
      plan.recv_rows[size_t(slot) * R + j] = -1;
      plan.recv_weight[size_t(slot) * R + j] = 0.f;
    }
  }
}

PlanShape plan_shape(const LayerConfig& c) {
  const DevicePlanLayout layout(c);
  PlanShape s;
  s.world = c.layout.world;
  s.tp = c.layout.tp;
  s.experts_per_rank = c.experts_per_rank();
  s.num_experts = c.model.num_experts;
  s.topk = c.model.topk;
  s.t_max = c.max_tokens_per_rank;
  s.rows_per_token = layout.rows_per_token;
  s.max_rows = layout.max_rows;
  s.max_m_tiles = layout.max_m_tiles;
  s.n_blocks0 = int(layout.n_blocks0);
  s.n_blocks1 = int(layout.n_blocks1);
  s.chunks = (s.t_max + kThreads - 1) / kThreads;
  return s;
}

}  // namespace

DevicePlanLayout::DevicePlanLayout(const LayerConfig& c) {
  c.check();
  COMET_CHECK(c.tiles.block_m == kGemmBlockM, "the CUDA backend needs tiles.block_m = " << kGemmBlockM << ", got "
                                                                                        << c.tiles.block_m);
  COMET_CHECK(c.model.topk <= kMaxTopk, "the CUDA backend supports topk <= " << kMaxTopk << ", got " << c.model.topk);
  const int64_t W = c.layout.world, Tm = c.max_tokens_per_rank, E = c.experts_per_rank();
  const int64_t chunks = (Tm + kThreads - 1) / kThreads;
  rows_per_token = std::min<int>(c.model.topk, int(E));
  max_rows = c.max_rows_per_rank();
  max_m_tiles = c.max_m_tiles_per_rank();
  n_blocks0 = gemm_num_n_blocks(GemmEpilogue::kSwiGlu, c.ffn_per_rank(), GemmKernel::kCooperative128x256);
  n_blocks1 = gemm_num_n_blocks(GemmEpilogue::kIdentity, c.model.hidden, GemmKernel::kCooperative128x256);
  const int64_t K = rows_per_token;
  const int64_t sizes[] = {E * 4, (E + 1) * 4, W * 4, (W + 1) * 4, W * Tm * 4, W * Tm * K * 4, W * Tm * K * 4,
                           Tm * W * 4, max_m_tiles * 4, max_m_tiles * 4, max_m_tiles * 4, max_m_tiles * 4, 3 * 4,
                           max_m_tiles * n_blocks0 * int64_t(sizeof(GemmTile)),
                           max_m_tiles * n_blocks1 * int64_t(sizeof(GemmTile)), 2 * 4, W * chunks * E * 4,
                           W * chunks * 4};
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
          reinterpret_cast<int32_t*>(at(15)), reinterpret_cast<int32_t*>(at(16)), reinterpret_cast<int32_t*>(at(17))};
}

void build_device_plans(const LayerConfig& config, const DevicePlanArgs* args, int count, CUstream_st* stream) {
  const PlanShape s = plan_shape(config);
  for (int i = 0; i < count; ++i) {
    const DevicePlanArgs& a = args[i];
    COMET_CHECK(a.rank >= 0 && a.rank < s.world, "build_device_plan: rank " << a.rank << " outside [0, " << s.world << ")");
    COMET_CHECK(a.token_counts && a.route_ids && a.route_weights && a.error,
                "build_device_plan: a null routing or error pointer");
    COMET_CHECK(a.layer0_group_m >= 1, "build_device_plan: layer0_group_m " << a.layer0_group_m << " must be >= 1");
  }
  const size_t smem = Smem::bytes(s);
  COMET_CHECK(smem <= 200 * 1024, "build_device_plan: " << smem << " bytes of shared memory for W=" << s.world
                                                        << " and E/EP=" << s.experts_per_rank << " is too much");
  const size_t place_smem = sizeof(int) * size_t(kWarps + 1) * s.experts_per_rank;
  COMET_CUDA_CHECK(cudaFuncSetAttribute(device_plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  COMET_CUDA_CHECK(
      cudaFuncSetAttribute(device_plan_place_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(place_smem)));
  for (int first = 0; first < count; first += kPlanBatch) {
    PlanBatch batch{};
    const int n = std::min(kPlanBatch, count - first);
    std::copy(args + first, args + first + n, batch.ranks);
    device_plan_kernel<<<n, kThreads, smem, stream>>>(s, batch);
    COMET_CUDA_CHECK_LAUNCH();
    device_plan_place_kernel<<<dim3(s.chunks, s.world, n), kThreads, place_smem, stream>>>(s, batch);
    COMET_CUDA_CHECK_LAUNCH();
  }
}

void build_device_plan(const LayerConfig& config, const DevicePlanArgs& args, CUstream_st* stream) {
  build_device_plans(config, &args, 1, stream);
}

}  // namespace comet::cuda
