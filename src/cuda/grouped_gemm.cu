// Host side of the grouped GEMM: shape rules, weight packing, the device tile-list builder.
#include <algorithm>
#include <sstream>

#include "comet/dtype.h"
#include "cuda/check.h"
#include "cuda/grouped_gemm.h"
#include "cuda/tile_raster.cuh"

namespace comet::cuda {

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::kAuto: return "auto";
    case GemmKernel::kCooperative128x256: return "cooperative-128x256";
    case GemmKernel::kCooperative128x256Cluster2x1: return "cooperative-128x256-cluster2x1";
    case GemmKernel::kPingpong128x128: return "pingpong-128x128";
    case GemmKernel::kPingpong128x128Cluster2x1: return "pingpong-128x128-cluster2x1";
  }
  return "?";
}

int gemm_tile_n(GemmKernel kernel) {
  COMET_CHECK(kernel != GemmKernel::kAuto, "gemm_tile_n: resolve the kernel first (resolve_gemm_kernel)");
  return kernel == GemmKernel::kPingpong128x128 || kernel == GemmKernel::kPingpong128x128Cluster2x1 ? 128 : 256;
}

int gemm_cluster_m(GemmKernel kernel) {
  return kernel == GemmKernel::kCooperative128x256Cluster2x1 || kernel == GemmKernel::kPingpong128x128Cluster2x1 ? 2 : 1;
}

// From `comet bench gemm` on the H200 (docs/results/2026-11-30-gemm-configurations.md), all
// four configurations timed interleaved on the 30 preset shapes, clusters pairing column blocks
// of an odd expert's last M tile:
// - GEMM0 + SwiGLU: ping-pong with 2x1 clusters was fastest on 14 of 15 shapes (the 15th,
//   deepseek-v3 at 4096 tokens per rank, 1.5% behind cooperative);
// - GEMM1: ping-pong was fastest or within 0.6% of the fastest on all 15.
GemmKernel choose_gemm_kernel(GemmEpilogue epilogue, int n, int k, int num_experts) {
  (void)n;
  (void)k;
  (void)num_experts;
  return epilogue == GemmEpilogue::kSwiGlu ? GemmKernel::kPingpong128x128Cluster2x1 : GemmKernel::kPingpong128x128;
}

GemmKernel resolve_gemm_kernel(const GroupedGemmArgs& a) {
  return a.kernel == GemmKernel::kAuto ? choose_gemm_kernel(a.epilogue, a.n, a.k, a.num_experts) : a.kernel;
}

int gemm_b_rows(GemmEpilogue epilogue, int n) {
  if (epilogue == GemmEpilogue::kSwiGlu) return 2 * ((n + kSwiGluPack - 1) / kSwiGluPack) * kSwiGluPack;
  return n;
}

int gemm_out_tile_n(GemmEpilogue epilogue, GemmKernel kernel) {
  const int tile_n = gemm_tile_n(kernel);
  return epilogue == GemmEpilogue::kSwiGlu ? tile_n / 2 : tile_n;
}

int gemm_num_n_blocks(GemmEpilogue epilogue, int n, GemmKernel kernel) {
  const int out_n = gemm_out_tile_n(epilogue, kernel);
  return (n + out_n - 1) / out_n;
}

Status can_implement(const GroupedGemmArgs& a) {
  std::ostringstream os;
  if (a.num_experts < 1 || a.max_rows < 0 || a.n < 1 || a.k < 1) {
    os << "grouped GEMM needs E >= 1, N >= 1, K >= 1 (got E=" << a.num_experts << ", N=" << a.n << ", K=" << a.k << ")";
    return Status::failure(os.str());
  }
  // TMA: every global stride must be a multiple of 16 bytes; bf16 pairs are stored at once.
  if (a.k % 8 != 0) {
    os << "K=" << a.k << " is not a multiple of 8 (TMA needs 16-byte row strides)";
    return Status::failure(os.str());
  }
  if (a.n % 8 != 0) {
    os << "N=" << a.n << " is not a multiple of 8 (TMA needs 16-byte row strides)";
    return Status::failure(os.str());
  }
  if (a.max_rows % kGemmBlockM != 0) {
    os << "max_rows=" << a.max_rows << " is not a multiple of the tile height " << kGemmBlockM;
    return Status::failure(os.str());
  }
  if (!a.a || !a.b || !a.d || !a.tiles || !a.num_tiles || !a.error) return Status::failure("grouped GEMM: a null pointer among a, b, d, tiles, num_tiles, error");
  if ((a.wait_flags == nullptr) != (a.wait_targets == nullptr))
    return Status::failure("grouped GEMM: wait_flags and wait_targets must be given together");
  const GemmKernel kernel = resolve_gemm_kernel(a);
  // Clusters would need one claim per pair; ping-pong could claim, but only the cooperative
  // configuration (the fused kernels') is tested with claims.
  if (a.tile_claims != nullptr && kernel != GemmKernel::kCooperative128x256) {
    os << "grouped GEMM: claimed tiles (tile_claims) need " << gemm_kernel_name(GemmKernel::kCooperative128x256)
       << ", not " << gemm_kernel_name(kernel);
    return Status::failure(os.str());
  }
  if (a.num_blocks != 0 && a.num_blocks % gemm_cluster_m(kernel) != 0) {
    os << "grouped GEMM: num_blocks=" << a.num_blocks << " is not a multiple of the cluster size "
       << gemm_cluster_m(kernel) << " of " << gemm_kernel_name(kernel);
    return Status::failure(os.str());
  }
  return Status::success();
}

std::vector<int> expert_row_offsets(const std::vector<int>& rows) {
  std::vector<int> offsets(rows.size() + 1, 0);
  for (size_t e = 0; e < rows.size(); ++e)
    offsets[e + 1] = offsets[e] + (rows[e] + kGemmBlockM - 1) / kGemmBlockM * kGemmBlockM;
  return offsets;
}

int64_t max_gemm_tiles(int max_rows, int num_experts, int num_n_blocks, GemmKernel kernel) {
  // Segments are padded inside max_rows, so rows bound the real tiles. The builder adds at most
  // one padding tile per expert; this bound (cluster - 1 per expert and column block) is looser
  // than needed and cheap.
  const int cluster = gemm_cluster_m(kernel);
  return (int64_t(max_rows / kGemmBlockM) + int64_t(num_experts) * (cluster - 1)) * num_n_blocks;
}

namespace {

// Index e of the range holding v, for prefix sums psum[0..n] with psum[0] = 0 <= v < psum[n]:
// the largest e with psum[e] <= v (empty ranges before it are skipped).
__device__ int find_range(const int32_t* psum, int n, int64_t v) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (psum[mid] <= v) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One block: prefix sums over experts (padded to the tile height), then every thread writes
// tiles. E is at most a few hundred, so the serial scan costs nothing next to a GEMM.
// With clusters of two (`cluster` = 2) the list has two parts:
// - each expert's M tiles in pairs, rastered like single tiles: a pair shares its column block,
//   so its two blocks split the B loads and multicast them;
// - then, per expert with an odd M tile count, its last M tile's column blocks in pairs (n, n+1):
//   two tiles with different B, which each block loads for itself; with an odd number of column
//   blocks the last one is paired with a padding tile.
// Padding therefore costs at most one tile per odd expert, not one per column block.
__global__ void build_tiles_kernel(const int32_t* rows_per_expert, int num_experts, int num_n_blocks, int cluster,
                                   TileOrder order, GemmTile* tiles, int32_t* num_tiles, int64_t capacity,
                                   const int32_t* accepted) {
  extern __shared__ int32_t psum[];  // [E + 1] padded row offsets, [E + 1] M pairs, [E + 1] tail pairs
  int32_t* unit_psum = psum + num_experts + 1;
  int32_t* tail_psum = unit_psum + num_experts + 1;
  const int tail_units = cluster == 1 ? 0 : (num_n_blocks + 1) / 2;  // per expert with an odd M tile count
  if (threadIdx.x == 0) {
    psum[0] = unit_psum[0] = tail_psum[0] = 0;
    for (int e = 0; e < num_experts; ++e) {
      const int m_tiles = (rows_per_expert[e] + kGemmBlockM - 1) / kGemmBlockM;
      psum[e + 1] = psum[e] + m_tiles * kGemmBlockM;
      unit_psum[e + 1] = unit_psum[e] + m_tiles / cluster;
      tail_psum[e + 1] = tail_psum[e] + (m_tiles % cluster != 0 ? tail_units : 0);
    }
    const int64_t total = (int64_t(unit_psum[num_experts]) * num_n_blocks + tail_psum[num_experts]) * cluster;
    const bool refused = accepted != nullptr && *accepted == 0;
    if (refused) unit_psum[num_experts] = tail_psum[num_experts] = 0;  // an empty schedule
    *num_tiles = int32_t(!refused && total <= capacity ? total : 0);
  }
  __syncthreads();
  const int units_m = unit_psum[num_experts];
  const int64_t grid_units = int64_t(units_m) * num_n_blocks, units = grid_units + tail_psum[num_experts];
  if (units * cluster > capacity) return;  // *num_tiles = 0: nothing runs; the caller sized it wrong
  // A row-major group keeps kRasterGroupM M tiles whatever the cluster.
  const int group = order == TileOrder::kRowMajor ? (kRasterGroupM + cluster - 1) / cluster : default_raster_group(order);
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    GemmTile* unit = tiles + u * cluster;
    if (u < grid_units) {
      int mu, n;
      raster_tile(order, group, u, units_m, num_n_blocks, mu, n);
      const int e = find_range(unit_psum, num_experts, mu);
      const int first_row = psum[e] + (mu - unit_psum[e]) * cluster * kGemmBlockM;
      for (int r = 0; r < cluster; ++r) {
        const int m_row = first_row + r * kGemmBlockM;
        unit[r] = GemmTile{m_row, n, e, m_row / kGemmBlockM};
      }
    } else {
      const int64_t v = u - grid_units;
      const int e = find_range(tail_psum, num_experts, v);
      const int m_row = psum[e + 1] - kGemmBlockM, n = 2 * int(v - tail_psum[e]);
      unit[0] = GemmTile{m_row, n, e, m_row / kGemmBlockM};
      unit[1] = n + 1 < num_n_blocks ? GemmTile{m_row, n + 1, e, m_row / kGemmBlockM}
                                     : GemmTile{~m_row, n, e, m_row / kGemmBlockM};
    }
  }
}

}  // namespace

void build_gemm_tiles(const int32_t* rows_per_expert, int num_experts, int num_n_blocks, GemmKernel kernel,
                      TileOrder order, GemmTile* tiles, int32_t* num_tiles, int64_t capacity, CUstream_st* stream,
                      const int32_t* accepted) {
  COMET_CHECK(num_experts >= 1 && num_n_blocks >= 1, "build_gemm_tiles: E=" << num_experts << ", n blocks=" << num_n_blocks);
  COMET_CHECK(kernel != GemmKernel::kAuto, "build_gemm_tiles: resolve the kernel first (resolve_gemm_kernel)");
  COMET_CHECK(gemm_cluster_m(kernel) <= 2, "build_gemm_tiles: clusters of 1 or 2 blocks");
  const size_t smem = size_t(3 * (num_experts + 1)) * sizeof(int32_t);
  build_tiles_kernel<<<1, 512, smem, stream>>>(rows_per_expert, num_experts, num_n_blocks, gemm_cluster_m(kernel),
                                               order, tiles, num_tiles, capacity, accepted);
  COMET_CUDA_CHECK_LAUNCH();
}

std::vector<uint16_t> pack_swiglu_weights(const std::vector<float>& gate, const std::vector<float>& up,
                                          int num_experts, int k, int n) {
  const size_t per = size_t(k) * n;
  COMET_CHECK(gate.size() == per * num_experts && up.size() == per * num_experts,
              "pack_swiglu_weights: expected " << per * num_experts << " values per projection");
  const int n_b = gemm_b_rows(GemmEpilogue::kSwiGlu, n);
  std::vector<uint16_t> out(size_t(num_experts) * n_b * k, 0);  // zero rows pad the last block
  for (int e = 0; e < num_experts; ++e)
    for (int col = 0; col < n; ++col) {
      const int block = col / kSwiGluPack, within = col % kSwiGluPack;
      const size_t gate_row = size_t(e) * n_b + size_t(block) * 2 * kSwiGluPack + within;
      const size_t up_row = gate_row + kSwiGluPack;
      for (int kk = 0; kk < k; ++kk) {
        out[gate_row * k + kk] = float_to_bf16_bits(gate[e * per + size_t(kk) * n + col]);
        out[up_row * k + kk] = float_to_bf16_bits(up[e * per + size_t(kk) * n + col]);
      }
    }
  return out;
}

std::vector<uint16_t> transpose_weights(const std::vector<float>& w, int num_experts, int k, int n) {
  const size_t per = size_t(k) * n;
  COMET_CHECK(w.size() == per * num_experts, "transpose_weights: expected " << per * num_experts << " values");
  std::vector<uint16_t> out(w.size());
  for (int e = 0; e < num_experts; ++e)
    for (int kk = 0; kk < k; ++kk)
      for (int col = 0; col < n; ++col)
        out[e * per + size_t(col) * k + kk] = float_to_bf16_bits(w[e * per + size_t(kk) * n + col]);
  return out;
}

}  // namespace comet::cuda
