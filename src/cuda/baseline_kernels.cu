// The baseline pipelines' kernels: routing scan, pack, permute, activation, un-permute, owner reduce.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/baseline_layout.h"
#include "cuda/activation.cuh"
#include "cuda/baseline_kernels.h"
#include "cuda/bf16_rows.cuh"
#include "cuda/check.h"
#include "cuda/grouped_gemm.h"

namespace comet::cuda {

namespace {

using core::BaselineInputError;
using core::kBaselineCountHeader;

constexpr int kWarps = kRouteScanTokens / 32;
constexpr int kRowThreads = 256;  // warp-per-row kernels: 8 rows per block

int row_grid(int64_t rows) {
  int device = 0, sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = (rows + kRowThreads / 32 - 1) / (kRowThreads / 32);
  return int(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t(sms) * 8)));
}

// The first input error wins the header; later ones are dropped (the host reports one).
__device__ void record_input_error(int32_t* row, BaselineInputError code, int token, int slot, int value) {
  if (atomicCAS(&row[1], 0, int32_t(code)) == 0) {
    row[2] = token;
    row[3] = slot;
    row[4] = value;
  }
}

// Lanes [lo, hi) of a warp as a bit mask (0 <= lo <= hi <= 32).
__device__ __forceinline__ uint32_t lane_range(int lo, int hi) {
  const uint32_t below_hi = hi >= 32 ? 0xffffffffu : (1u << hi) - 1;
  const uint32_t below_lo = lo >= 32 ? 0xffffffffu : (1u << lo) - 1;
  return below_hi & ~below_lo;
}

// One block = kRouteScanTokens tokens, one thread per token. table[w][key] holds a bit per lane
// of warp w whose token selects `key` (an expert, or E + an EP group), so that a token's rank
// among the block's tokens with that key is a popcount over earlier warps and lower lanes.
__global__ void route_scan_kernel(BaselineDims d, const int32_t* ids, const float* weights, const int32_t* num_tokens,
                                  int32_t* row, int32_t* item_rank, int32_t* group_rank, int32_t* block_counts) {
  extern __shared__ uint32_t table[];  // [kWarps][NK]
  const int NK = d.count_keys(), K = d.topk, E = d.num_experts, epr = d.experts_per_rank;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < kWarps * NK; i += blockDim.x) table[i] = 0;
  const int given = *num_tokens;
  const int T = given < 0 || given > d.t_max ? 0 : given;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    row[0] = given;
    if (T != given) record_input_error(row, BaselineInputError::kTokenCount, -1, -1, given);
  }
  __syncthreads();

  // Step 1: validate the token's slots; mark its experts and its groups (first slot of each).
  const int t = blockIdx.x * kRouteScanTokens + threadIdx.x;
  uint32_t valid = 0, first_of_group = 0;  // bit k: slot k (topk <= 32)
  if (t < T) {
    for (int k = 0; k < K; ++k) {
      const int e = ids[int64_t(t) * K + k];
      if (e == -1) continue;
      if (e < -1 || e >= E) {
        record_input_error(row, BaselineInputError::kExpertId, t, k, e);
        continue;
      }
      bool repeated = false, first = true;
      for (int j = 0; j < k; ++j) {
        if (!(valid >> j & 1)) continue;
        const int other = ids[int64_t(t) * K + j];
        repeated = repeated || other == e;
        first = first && other / epr != e / epr;
      }
      if (repeated) {
        record_input_error(row, BaselineInputError::kRepeatedExpert, t, k, e);
        continue;
      }
      const float w = weights[int64_t(t) * K + k];
      if (!isfinite(w)) record_input_error(row, BaselineInputError::kWeight, t, k, __float_as_int(w));
      valid |= 1u << k;
      atomicOr(&table[warp * NK + e], 1u << lane);
      if (first) {
        first_of_group |= 1u << k;
        atomicOr(&table[warp * NK + E + e / epr], 1u << lane);
      }
    }
  }
  __syncthreads();

  // Step 2: in-block ranks of the token for each of its keys.
  auto in_block_rank = [&](int key) {
    int rank = __popc(table[warp * NK + key] & ((1u << lane) - 1));
    for (int w = 0; w < warp; ++w) rank += __popc(table[w * NK + key]);
    return rank;
  };
  if (t < d.t_max) {
    for (int k = 0; k < K; ++k) {
      const int64_t item = int64_t(t) * K + k;
      const int e = valid >> k & 1 ? ids[item] : -1;
      item_rank[item] = e >= 0 ? in_block_rank(e) : -1;
      group_rank[item] = first_of_group >> k & 1 ? in_block_rank(E + e / epr) : -1;
    }
  }

  // Step 3: per-block counts of every key (route_prefix scans them over blocks).
  for (int key = threadIdx.x; key < NK; key += blockDim.x) {
    int n = 0;
    for (int w = 0; w < kWarps; ++w) n += __popc(table[w * NK + key]);
    block_counts[int64_t(blockIdx.x) * NK + key] = n;
  }

  // Step 4: per-chunk counts. A warp's 32 tokens may span several chunks (T / C < 32): each
  // chunk adds the bits of its lanes.
  const int t0 = blockIdx.x * kRouteScanTokens + warp * 32;
  if (t0 >= T) return;
  const int t_end = min(t0 + 32, T);
  const int c_first = core::chunk_of(t0, T, d.chunks), c_last = core::chunk_of(t_end - 1, T, d.chunks);
  for (int c = c_first; c <= c_last; ++c) {
    const int lo = max(t0, core::chunk_begin(T, d.chunks, c)) - t0;
    const int hi = min(t_end, core::chunk_begin(T, d.chunks, c + 1)) - t0;
    const uint32_t lanes = lane_range(lo, hi);
    for (int key = lane; key < NK; key += 32) {
      const int n = __popc(table[warp * NK + key] & lanes);
      if (n) atomicAdd(&row[kBaselineCountHeader + c * NK + key], n);
    }
  }
}

// One block; a thread per key walks blocks, then chunks (a few hundred keys x tens of blocks).
__global__ void route_prefix_kernel(BaselineDims d, int blocks, const int32_t* row, int32_t* block_counts,
                                    int32_t* chunk_prefix) {
  const int NK = d.count_keys();
  for (int key = threadIdx.x; key < NK; key += blockDim.x) {
    int run = 0;
    for (int b = 0; b < blocks; ++b) {
      const int n = block_counts[int64_t(b) * NK + key];
      block_counts[int64_t(b) * NK + key] = run;
      run += n;
    }
    run = 0;
    for (int c = 0; c < d.chunks; ++c) {
      chunk_prefix[c * NK + key] = run;
      run += row[kBaselineCountHeader + c * NK + key];
    }
  }
}

// Rank of item (token t, slot k) with key `key` among chunk c's items of that key, token order.
__device__ __forceinline__ int chunk_rank(const BaselinePackArgs& a, int t, int c, int key, int in_block) {
  const int NK = a.dims.count_keys();
  return a.block_base[int64_t(t / kRouteScanTokens) * NK + key] + in_block - a.chunk_prefix[c * NK + key];
}

// A warp per own token: for each EP group it selects (at its first slot of that group), the
// metadata of the group's slots and one copy of x per TP rank of the group.
__global__ void pack_kernel(BaselinePackArgs a) {
  const BaselineDims& d = a.dims;
  const int K = d.topk, E = d.num_experts, epr = d.experts_per_rank, W = d.world, C = d.chunks;
  const int lane = threadIdx.x % 32, vecs = d.hidden / 8;
  const int32_t* send_begin = a.sender_table;          // [C][W]
  const int32_t* a_row_from = a.sender_table + C * W;  // [C][E]
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; t < a.num_tokens; t += warps) {
    const int c = core::chunk_of(t, a.num_tokens, C);
    for (int dst = lane; dst < W; dst += 32) a.send_pos[int64_t(t) * W + dst] = -1;
    __syncwarp();
    const uint4* x = static_cast<const uint4*>(a.x) + int64_t(t) * vecs;
    for (int k = 0; k < K; ++k) {
      const int64_t item = int64_t(t) * K + k;
      if (a.group_rank[item] < 0) continue;
      const int g = a.expert_ids[item] / epr;
      const int token_rank = chunk_rank(a, t, c, E + g, a.group_rank[item]);
      // Metadata entry `lane`: the lane-th valid slot (from k on) whose expert is in group g.
      BaselineMeta meta{-1, 0.f};
      if (lane < d.meta_per_token) {
        int found = 0;
        for (int j = k; j < K; ++j) {
          const int64_t other = int64_t(t) * K + j;
          if (a.item_rank[other] < 0 || a.expert_ids[other] / epr != g) continue;
          if (found++ == lane) {
            const int e = a.expert_ids[other];
            meta.row = a_row_from[c * E + e] + chunk_rank(a, t, c, e, a.item_rank[other]);
            meta.weight = a.weights[other];
            break;
          }
        }
      }
      for (int tp = 0; tp < d.tp; ++tp) {
        const int dst = g * d.tp + tp;
        const int64_t pos = send_begin[c * W + dst] + token_rank;
        uint4* out = static_cast<uint4*>(a.send_rows) + pos * vecs;
        for (int i = lane; i < vecs; i += 32) out[i] = x[i];
        if (lane < d.meta_per_token) a.send_meta[pos * d.meta_per_token + lane] = meta;
        if (lane == 0) a.send_pos[int64_t(t) * W + dst] = int32_t(pos);
      }
    }
  }
}

// A warp per received token: one load of each 16-byte piece, a store per A row it feeds.
__global__ void permute_kernel(int begin, int end, int hidden, int meta_per_token, const uint4* recv,
                               const BaselineMeta* meta, uint4* a_rows) {
  const int lane = threadIdx.x % 32, vecs = hidden / 8;
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int j = begin + blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; j < end; j += warps) {
    const BaselineMeta* m = meta + int64_t(j) * meta_per_token;
    for (int i = lane; i < vecs; i += 32) {
      const uint4 v = recv[int64_t(j) * vecs + i];
      for (int q = 0; q < meta_per_token && m[q].row >= 0; ++q) a_rows[int64_t(m[q].row) * vecs + i] = v;
    }
  }
}

// A thread per 8 output columns of a row.
__global__ void activation_kernel(Activation act, int row_begin, int row_end, int ffn_local, int inter0_cols,
                                  const uint4* inter0, uint4* inter) {
  const int vecs = ffn_local / 8;
  const int64_t total = int64_t(row_end - row_begin) * vecs;
  const bool gated = act == Activation::kSwiGlu;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = row_begin + i / vecs;
    const int col = int(i % vecs) * 8;
    // Packed SwiGLU: output column col is gate column (col / P) * 2P + col % P, up column + P.
    const int64_t up_col = gated ? int64_t(col / kSwiGluPack) * 2 * kSwiGluPack + col % kSwiGluPack + kSwiGluPack : col;
    float up[8], gate[8] = {0, 0, 0, 0, 0, 0, 0, 0}, out[8];
    bf16x8_to_float(inter0[(r * inter0_cols + up_col) / 8], up);
    if (gated) bf16x8_to_float(inter0[(r * inter0_cols + up_col - kSwiGluPack) / 8], gate);
#pragma unroll
    for (int q = 0; q < 8; ++q) out[q] = apply_activation(act, gate[q], up[q]);
    inter[(r * ffn_local + col) / 8] = to_bf16_chunk(out);
  }
}

// A warp per received token: its A rows weighted in metadata (slot) order, fp32, one bf16 row.
__global__ void unpermute_kernel(int begin, int end, int hidden, int meta_per_token, const uint4* out_rows,
                                 const BaselineMeta* meta, uint4* recv) {
  const int lane = threadIdx.x % 32, vecs = hidden / 8;
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int j = begin + blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; j < end; j += warps) {
    const BaselineMeta* m = meta + int64_t(j) * meta_per_token;
    for (int i = lane; i < vecs; i += 32) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int q = 0; q < meta_per_token && m[q].row >= 0; ++q)
        add_bf16x8(acc, out_rows[int64_t(m[q].row) * vecs + i], m[q].weight);
      recv[int64_t(j) * vecs + i] = to_bf16_chunk(acc);
    }
  }
}

// A warp per own token: partial rows in rank order 0..W-1, fp32.
__global__ void owner_reduce_kernel(int t_begin, int t_end, int world, int hidden, const uint4* send_rows,
                                    const int32_t* send_pos, uint4* y) {
  const int lane = threadIdx.x % 32, vecs = hidden / 8;
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int t = t_begin + blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; t < t_end; t += warps) {
    for (int i = lane; i < vecs; i += 32) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int d = 0; d < world; ++d) {
        const int p = send_pos[int64_t(t) * world + d];
        if (p >= 0) add_bf16x8(acc, send_rows[int64_t(p) * vecs + i], 1.f);
      }
      y[int64_t(t) * vecs + i] = to_bf16_chunk(acc);
    }
  }
}

}  // namespace

int route_scan_blocks(const BaselineDims& d) {
  return std::max(1, (d.t_max + kRouteScanTokens - 1) / kRouteScanTokens);
}

void launch_route_scan(const BaselineDims& d, const int32_t* expert_ids, const float* weights, const int32_t* num_tokens,
                       int32_t* count_row, int32_t* item_rank, int32_t* group_rank, int32_t* block_counts,
                       CUstream_st* stream) {
  const size_t smem = size_t(kWarps) * d.count_keys() * sizeof(uint32_t);
  route_scan_kernel<<<route_scan_blocks(d), kRouteScanTokens, smem, stream>>>(
      d, expert_ids, weights, num_tokens, count_row, item_rank, group_rank, block_counts);
  COMET_CUDA_CHECK_LAUNCH();
}

void launch_route_prefix(const BaselineDims& d, const int32_t* count_row, int32_t* block_counts, int32_t* chunk_prefix,
                         CUstream_st* stream) {
  route_prefix_kernel<<<1, 1024, 0, stream>>>(d, route_scan_blocks(d), count_row, block_counts, chunk_prefix);
  COMET_CUDA_CHECK_LAUNCH();
}

void launch_pack(const BaselinePackArgs& a, CUstream_st* stream) {
  if (a.num_tokens == 0) return;
  pack_kernel<<<row_grid(a.num_tokens), kRowThreads, 0, stream>>>(a);
  COMET_CUDA_CHECK_LAUNCH();
}

void launch_permute(int begin, int end, int hidden, int meta_per_token, const void* recv, const BaselineMeta* meta,
                    void* a_rows, CUstream_st* stream) {
  if (end <= begin) return;
  permute_kernel<<<row_grid(end - begin), kRowThreads, 0, stream>>>(
      begin, end, hidden, meta_per_token, static_cast<const uint4*>(recv), meta, static_cast<uint4*>(a_rows));
  COMET_CUDA_CHECK_LAUNCH();
}

void launch_activation(Activation act, int row_begin, int row_end, int ffn_local, int inter0_cols, const void* inter0,
                       void* inter, CUstream_st* stream) {
  if (row_end <= row_begin) return;
  const int64_t threads = int64_t(row_end - row_begin) * (ffn_local / 8);
  activation_kernel<<<row_grid(threads / 32 + 1), kRowThreads, 0, stream>>>(
      act, row_begin, row_end, ffn_local, inter0_cols, static_cast<const uint4*>(inter0), static_cast<uint4*>(inter));
  COMET_CUDA_CHECK_LAUNCH();
}

void launch_unpermute(int begin, int end, int hidden, int meta_per_token, const void* out_rows,
                      const BaselineMeta* meta, void* recv, CUstream_st* stream) {
  if (end <= begin) return;
  unpermute_kernel<<<row_grid(end - begin), kRowThreads, 0, stream>>>(
      begin, end, hidden, meta_per_token, static_cast<const uint4*>(out_rows), meta, static_cast<uint4*>(recv));
  COMET_CUDA_CHECK_LAUNCH();
}

void launch_owner_reduce(int t_begin, int t_end, int world, int hidden, const void* send_rows, const int32_t* send_pos,
                         void* y, CUstream_st* stream) {
  if (t_end <= t_begin) return;
  owner_reduce_kernel<<<row_grid(t_end - t_begin), kRowThreads, 0, stream>>>(
      t_begin, t_end, world, hidden, static_cast<const uint4*>(send_rows), send_pos, static_cast<uint4*>(y));
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::cuda
