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
  }
  return "?";
}

int gemm_tile_n(GemmKernel kernel) {
  (void)kernel;  // every configuration so far is 256 columns wide
  return 256;
}

GemmKernel choose_gemm_kernel(GemmEpilogue epilogue, int n, int k) {
  (void)epilogue;
  (void)n;
  (void)k;
  return GemmKernel::kCooperative128x256;
}

GemmKernel resolve_gemm_kernel(const GroupedGemmArgs& a) {
  return a.kernel == GemmKernel::kAuto ? choose_gemm_kernel(a.epilogue, a.n, a.k) : a.kernel;
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
  return Status::success();
}

std::vector<int> expert_row_offsets(const std::vector<int>& rows) {
  std::vector<int> offsets(rows.size() + 1, 0);
  for (size_t e = 0; e < rows.size(); ++e)
    offsets[e + 1] = offsets[e] + (rows[e] + kGemmBlockM - 1) / kGemmBlockM * kGemmBlockM;
  return offsets;
}

int64_t max_gemm_tiles(int max_rows, int num_experts, int num_n_blocks) {
  (void)num_experts;  // segments are padded inside max_rows, so rows bound the tiles
  return int64_t(max_rows / kGemmBlockM) * num_n_blocks;
}

namespace {

// One block: prefix sums over experts (padded to the tile height), then every thread writes
// tiles. E is at most a few hundred, so the serial scan costs nothing next to a GEMM.
__global__ void build_tiles_kernel(const int32_t* rows_per_expert, int num_experts, int num_n_blocks,
                                   TileOrder order, GemmTile* tiles, int32_t* num_tiles, int64_t capacity) {
  extern __shared__ int32_t psum[];  // [E + 1] padded row offsets, then [E + 1] tile offsets
  int32_t* tile_psum = psum + num_experts + 1;
  if (threadIdx.x == 0) {
    psum[0] = 0;
    tile_psum[0] = 0;
    for (int e = 0; e < num_experts; ++e) {
      const int m_tiles = (rows_per_expert[e] + kGemmBlockM - 1) / kGemmBlockM;
      psum[e + 1] = psum[e] + m_tiles * kGemmBlockM;
      tile_psum[e + 1] = tile_psum[e] + m_tiles;
    }
    const int64_t total = int64_t(tile_psum[num_experts]) * num_n_blocks;
    *num_tiles = int32_t(total <= capacity ? total : 0);
  }
  __syncthreads();
  const int m_total = tile_psum[num_experts];
  const int64_t total = int64_t(m_total) * num_n_blocks;
  if (total > capacity) return;  // *num_tiles = 0: nothing runs; the caller sized it wrong
  for (int64_t i = threadIdx.x; i < total; i += blockDim.x) {
    int m, n;
    raster_tile(order, default_raster_group(order), i, m_total, num_n_blocks, m, n);
    int e = 0;  // expert of global M tile m (binary search over tile prefix sums)
    int lo = 0, hi = num_experts - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (tile_psum[mid] <= m) lo = mid; else hi = mid - 1;
    }
    e = lo;
    const int m_row = psum[e] + (m - tile_psum[e]) * kGemmBlockM;
    tiles[i] = GemmTile{m_row, n, e, m_row / kGemmBlockM};
  }
}

}  // namespace

void build_gemm_tiles(const int32_t* rows_per_expert, int num_experts, int num_n_blocks, TileOrder order,
                      GemmTile* tiles, int32_t* num_tiles, int64_t capacity, CUstream_st* stream) {
  COMET_CHECK(num_experts >= 1 && num_n_blocks >= 1, "build_gemm_tiles: E=" << num_experts << ", n blocks=" << num_n_blocks);
  const size_t smem = size_t(2 * (num_experts + 1)) * sizeof(int32_t);
  build_tiles_kernel<<<1, 512, smem, stream>>>(rows_per_expert, num_experts, num_n_blocks, order, tiles,
                                               num_tiles, capacity);
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
