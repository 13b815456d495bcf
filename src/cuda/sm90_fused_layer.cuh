// cuda/sm90_fused_layer.cuh: the fused Comet kernels (cuda/fused_layer.h), one template for
// both layers; each translation unit instantiates one.
//
// NOTES (memory ordering):
// - layer0: every lane fences its row stores (__threadfence), the warp synchronizes, then lane
//   0 release-adds to the tile counter; the GEMM producer's acquire plus fence.proxy.async make
//   the rows visible to its TMA loads.
// - layer1: the GEMM's two consumer warpgroups store the tile, meet at a named barrier, and one
//   thread fences and release-adds to col_done; lane 0 of a comm warp acquires it, the warp
//   synchronizes, and every lane then reads the tile's rows with ordinary loads.
#pragma once

#include <cuda_bf16.h>

#include "cuda/check.h"
#include "cuda/fused_layer.h"
#include "cuda/sm90_grouped_gemm.cuh"

namespace comet::cuda::sm90 {

__device__ __forceinline__ int fused_ring_pos(const int32_t* recv_psum, int world, int slot) {
  int pos = 0;
  while (pos + 1 < world && recv_psum[pos + 1] <= slot) ++pos;
  return pos;
}

// Layer0 communication: received tokens in ring order, one warp per token.
__device__ inline void layer0_comm(const FusedCommArgs& f) {
  if (f.stall) return;
  const int warps_per_block = blockDim.x / 32, lane = threadIdx.x % 32, chunks = f.hidden / 8;
  const int first = blockIdx.x * warps_per_block + threadIdx.x / 32, stride = f.n_comm * warps_per_block;
  const int total = f.plan.recv_psum[f.world];
  uint4* a_rows = static_cast<uint4*>(f.a_rows);
  for (int slot = first; slot < total; slot += stride) {
    const int src = (f.rank + fused_ring_pos(f.plan.recv_psum, f.world, slot)) % f.world;
    const uint4* x = reinterpret_cast<const uint4*>(static_cast<const char*>(f.peers[src]) + f.x_offset) +
                     int64_t(f.plan.recv_token[slot]) * chunks;
    const int32_t* rows = f.plan.recv_rows + int64_t(slot) * f.rows_per_token;
    for (int c = lane; c < chunks; c += 32) {
      const uint4 v = x[c];  // read once over the link, written to every row it feeds
      for (int j = 0; j < f.rows_per_token && rows[j] >= 0; ++j) a_rows[int64_t(rows[j]) * chunks + c] = v;
    }
    __threadfence();
    __syncwarp();
    if (lane == 0)
      for (int j = 0; j < f.rows_per_token && rows[j] >= 0; ++j)
        red_release_gpu(f.tile_arrivals + rows[j] / kGemmBlockM, 1);
  }
}

// Layer1 communication: (column block, received token) items, column-block-major.
__device__ inline void layer1_comm(const FusedCommArgs& f) {
  if (f.stall) return;
  const int warps_per_block = blockDim.x / 32, lane = threadIdx.x % 32, chunks = f.hidden / 8;
  const int first = blockIdx.x * warps_per_block + threadIdx.x / 32, stride = f.n_comm * warps_per_block;
  const int total = f.plan.recv_psum[f.world];
  const int64_t items = int64_t(total) * f.num_col_blocks;
  const uint4* out_rows = static_cast<const uint4*>(f.out_rows);
  for (int64_t i = first; i < items; i += stride) {
    const int j = int(i / total), slot = int(i % total);
    if (lane == 0) {
      const WaitSite site{f.rank, 1, WaitRole::kCommColumnBlock, j};
      wait_at_least(f.col_done + j, f.col_target[j], f.timeout_ns, f.error, site);
    }
    __syncwarp();
    const int pos = fused_ring_pos(f.plan.recv_psum, f.world, slot);
    const int owner = (f.rank + pos) % f.world, position = slot - f.plan.recv_psum[pos];
    uint4* dst = reinterpret_cast<uint4*>(static_cast<char*>(f.peers[owner]) + f.combine_offset) +
                 (int64_t(f.rank) * f.t_max + position) * chunks;
    const int32_t* rows = f.plan.recv_rows + int64_t(slot) * f.rows_per_token;
    const float* weights = f.plan.recv_weight + int64_t(slot) * f.rows_per_token;
    const int c_begin = j * f.col_width / 8, c_end = min(chunks, (j + 1) * f.col_width / 8);
    for (int c = c_begin + lane; c < c_end; c += 32) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int r = 0; r < f.rows_per_token && rows[r] >= 0; ++r) {
        const uint4 v = out_rows[int64_t(rows[r]) * chunks + c];
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
        for (int q = 0; q < 4; ++q) {
          const float2 x = __bfloat1622float2(h[q]);
          acc[2 * q] += weights[r] * x.x;
          acc[2 * q + 1] += weights[r] * x.y;
        }
      }
      uint4 out;
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
      for (int q = 0; q < 4; ++q) o[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
      dst[c] = out;
    }
  }
}

template <class Gemm, int kLayer>
__global__ void __launch_bounds__(Gemm::kThreads, 1)
    fused_layer_kernel(const __grid_constant__ typename Gemm::Params g, const __grid_constant__ FusedCommArgs f) {
  extern __shared__ __align__(128) char smem[];
  if (int(blockIdx.x) < f.n_comm) {
    if constexpr (kLayer == 0) layer0_comm(f); else layer1_comm(f);
    return;
  }
  Gemm::run_block(g, int(blockIdx.x) - f.n_comm, int(gridDim.x) - f.n_comm, smem);
}

// Cooperative launch on one block per SM: every block must be resident, since GEMM blocks wait
// for comm blocks (and the reverse in layer1).
template <class Gemm, int kLayer>
void launch_fused_layer(const GroupedGemmArgs& gemm, const FusedCommArgs& comm, cudaStream_t stream) {
  const Status ok = can_implement(gemm);
  COMET_CHECK(ok.ok, "fused layer" << kLayer << ": " << ok.reason);
  int device = 0, num_sms = 0, per_sm = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  auto* kernel = fused_layer_kernel<Gemm, kLayer>;
  COMET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Gemm::kSmemBytes));
  COMET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Gemm::kThreads, Gemm::kSmemBytes));
  COMET_CHECK(per_sm >= 1, "fused layer" << kLayer << ": a block does not fit on an SM");
  COMET_CHECK(comm.n_comm >= 1 && comm.n_comm < num_sms,
              "fused layer" << kLayer << ": n_comm " << comm.n_comm << " must be in [1, " << num_sms - 1 << "]");
  const typename Gemm::Params params = Gemm::make_params(gemm);
  FusedCommArgs f = comm;
  void* args[] = {const_cast<typename Gemm::Params*>(&params), &f};
  COMET_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(num_sms), dim3(Gemm::kThreads),
                                               args, Gemm::kSmemBytes, stream));
}

}  // namespace comet::cuda::sm90
