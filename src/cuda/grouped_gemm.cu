// Host side of the grouped GEMM: shape rules, weight packing, the device tile-list builder.
#include <algorithm>
#include <sstream>
#include <utility>

#include "comet/dtype.h"
#include "cuda/check.h"
#include "cuda/dependent_launch.h"
#include "cuda/gemm_schedule.h"
#include "cuda/grouped_gemm.h"

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

const char* gemm_epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kIdentity: return "identity";
    case GemmEpilogue::kSwiGlu: return "swiglu";
    case GemmEpilogue::kActivation: return "activation";
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
// A plain activation has the ping-pong configuration only.
GemmKernel choose_gemm_kernel(GemmEpilogue epilogue, int n, int k, int num_experts) {
  (void)n;
  (void)k;
  (void)num_experts;
  return epilogue == GemmEpilogue::kSwiGlu ? GemmKernel::kPingpong128x128Cluster2x1 : GemmKernel::kPingpong128x128;
}

// From `comet bench gemm` on the H200 (docs/results/2026-11-30-split-tiles.md, section 3), split
// against plain schedules of the same configuration, interleaved: ping-pong GEMM1 0.4-2.6% faster
// on Mixtral (K = 14336) and Phi (K = 6400) in 14 of 15 rows where the list split; 2.0-2.7%
// slower on deepseek-v3's GEMM1 (K = 2048); ping-pong GEMM0 from 1.4% faster to 6% slower (its
// kAuto configuration, with clusters, cannot split anyway).
bool choose_gemm_split(GemmEpilogue epilogue, GemmKernel kernel, int k) {
  return epilogue == GemmEpilogue::kIdentity && kernel == GemmKernel::kPingpong128x128 && k >= 4096;
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
    os << "grouped GEMM needs E >= 1, max_rows >= 0, N >= 1, K >= 1 (got E=" << a.num_experts << ", max_rows="
       << a.max_rows << ", N=" << a.n << ", K=" << a.k << ")";
    return Status::failure(os.str());
  }
  if (a.num_experts > kMaxGemmExperts) {
    os << "grouped GEMM takes at most " << kMaxGemmExperts << " experts per launch (got E=" << a.num_experts << ")";
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
  // TMA reads A and B from 16-byte aligned addresses only; the epilogue stores D 16 bytes at a time.
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"a", a.a}, {"b", a.b}, {"d", a.d}})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      os << "grouped GEMM: " << name << " is not 16-byte aligned (TMA loads and 16-byte stores need it)";
      return Status::failure(os.str());
    }
  if ((a.wait_flags == nullptr) != (a.wait_targets == nullptr))
    return Status::failure("grouped GEMM: wait_flags and wait_targets must be given together");
  if (a.row_combine != nullptr && a.epilogue != GemmEpilogue::kIdentity)
    return Status::failure("grouped GEMM: row_combine needs the identity epilogue (GEMM1)");
  if (reinterpret_cast<uintptr_t>(a.row_combine) % 16 != 0)
    return Status::failure("grouped GEMM: row_combine is not 16-byte aligned (its entries are copied 16 bytes at once)");
  const GemmKernel kernel = resolve_gemm_kernel(a);
  if (a.epilogue == GemmEpilogue::kActivation) {
    if (is_gated(a.activation)) {
      os << "grouped GEMM: the plain-activation epilogue takes GELU, ReLU or SiLU, not " << activation_name(a.activation)
         << " (a gated activation is the SwiGLU epilogue)";
      return Status::failure(os.str());
    }
    if (kernel != GemmKernel::kPingpong128x128 || a.split.blocks != 0) {
      os << "grouped GEMM: the plain-activation epilogue is instantiated for " << gemm_kernel_name(GemmKernel::kPingpong128x128)
         << " on plain schedules only, not " << gemm_kernel_name(kernel) << (a.split.blocks != 0 ? " with a split schedule" : "");
      return Status::failure(os.str());
    }
  }
  // Clusters would need one claim per pair. The fused kernels claim: cooperative 128x256, and
  // ping-pong 128x128 for layer1 with the combine in the GEMM blocks (Layer1Combine::kGemmBlocks).
  if (a.tile_claims != nullptr && kernel != GemmKernel::kCooperative128x256 && kernel != GemmKernel::kPingpong128x128) {
    os << "grouped GEMM: claimed tiles (tile_claims) need a configuration without clusters ("
       << gemm_kernel_name(GemmKernel::kCooperative128x256) << " or " << gemm_kernel_name(GemmKernel::kPingpong128x128)
       << "), not " << gemm_kernel_name(kernel);
    return Status::failure(os.str());
  }
  if (a.split.blocks != 0 || a.split_pieces != nullptr || a.split_partials != nullptr || a.split_flags != nullptr) {
    if (a.split.blocks < 1 || a.split_pieces == nullptr || a.split_partials == nullptr || a.split_flags == nullptr)
      return Status::failure(
          "grouped GEMM: a split schedule needs split (its GemmSplit), split_pieces, split_partials and split_flags together");
    if (gemm_cluster_m(kernel) != 1) {
      os << "grouped GEMM: " << gemm_kernel_name(kernel) << " runs clusters, which cannot split tiles";
      return Status::failure(os.str());
    }
    if (a.wait_flags != nullptr || a.tile_claims != nullptr)
      return Status::failure("grouped GEMM: a split schedule cannot take wait_flags or tile_claims");
    if (a.num_blocks != 0 && a.num_blocks != a.split.blocks) {
      os << "grouped GEMM: the split schedule was built for " << a.split.blocks << " blocks, not num_blocks=" << a.num_blocks;
      return Status::failure(os.str());
    }
    const GemmSplit launch = gemm_split_for(kernel, a.k, a.split.blocks);  // what this launch runs
    if (a.split.tiles_per_block != launch.tiles_per_block || a.split.k_tiles != launch.k_tiles) {
      os << "grouped GEMM: the split schedule was built for " << a.split.tiles_per_block << " tiles per block and "
         << a.split.k_tiles << " k-tiles; " << gemm_kernel_name(kernel) << " at K=" << a.k << " runs "
         << launch.tiles_per_block << " and " << launch.k_tiles;
      return Status::failure(os.str());
    }
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

int64_t max_gemm_tiles(int max_rows, int num_experts, int num_n_blocks, GemmKernel kernel, const GemmSplit& split) {
  // Segments are padded inside max_rows, so rows bound the real tiles. The builder adds at most
  // one padding tile per expert; this bound (cluster - 1 per expert and column block) is looser
  // than needed and cheap. A split list has at most kSplitMaxParts rounds of slots after its
  // whole tiles.
  const int cluster = gemm_cluster_m(kernel);
  return (int64_t(max_rows / kGemmBlockM) + int64_t(num_experts) * (cluster - 1)) * num_n_blocks +
         int64_t(kSplitMaxParts) * split.slots();
}

GemmSplit gemm_split_for(GemmKernel kernel, int k, int num_blocks) {
  COMET_CHECK(kernel != GemmKernel::kAuto, "gemm_split_for: resolve the kernel first (resolve_gemm_kernel)");
  if (gemm_cluster_m(kernel) != 1) return {};
  if (num_blocks <= 0) {
    int device = 0;
    COMET_CUDA_CHECK(cudaGetDevice(&device));
    COMET_CUDA_CHECK(cudaDeviceGetAttribute(&num_blocks, cudaDevAttrMultiProcessorCount, device));
  }
  return GemmSplit{num_blocks, kernel == GemmKernel::kPingpong128x128 ? 2 : 1, (k + kGemmTileK - 1) / kGemmTileK};
}

int64_t gemm_split_partial_floats(GemmKernel kernel, const GemmSplit& split) {
  if (split.slots() == 0) return 0;
  return gemm_split_flags(split) * kGemmBlockM * gemm_tile_n(kernel);
}

namespace {

// One block: thread 0 takes the prefix sums over experts (E is at most a few hundred, so the
// serial scan costs nothing next to a GEMM), then every thread writes units of the list that
// cuda/gemm_schedule.h defines (and, split, the split entries).
__global__ void build_tiles_kernel(const int32_t* rows_per_expert, int num_experts, int num_n_blocks, int cluster,
                                   TileOrder order, int tile_n, GemmTile* tiles, int32_t* num_tiles, int64_t capacity,
                                   const int32_t* accepted, GemmSplit split, GemmSplitPiece* pieces,
                                   bool half_tiles) {
  begin_dependent_kernel();
  const int32_t* tile_rows = half_tiles ? rows_per_expert : nullptr;  // null: every tile whole
  extern __shared__ int32_t psum[];  // [E + 1] padded row offsets, [E + 1] grid units, [E + 1] tail units
  int32_t* unit_psum = psum + num_experts + 1;
  int32_t* tail_psum = unit_psum + num_experts + 1;
  __shared__ int64_t units;
  __shared__ GemmSplitPlan plan;
  if (threadIdx.x == 0) {
    units = gemm_schedule_prefixes(rows_per_expert, num_experts, num_n_blocks, cluster, psum, unit_psum, tail_psum);
    const bool refused = accepted != nullptr && *accepted == 0;  // a refused plan: an empty schedule
    plan = cluster == 1 ? gemm_split_plan(units, split) : GemmSplitPlan{units * cluster, 0, 1, units * cluster};
    if (refused || plan.entries > capacity) units = 0, plan = GemmSplitPlan{0, 0, 1, 0};  // past capacity: sized wrong
    *num_tiles = int32_t(plan.entries);
  }
  __syncthreads();
  if (cluster != 1 || plan.parts == 1) {  // unsplit (asked for a split: every piece whole)
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
      gemm_schedule_unit(u, tile_rows, psum, unit_psum, tail_psum, num_experts, num_n_blocks, cluster, order, tile_n,
                         tiles + u * cluster);
      if (pieces != nullptr)
        for (int r = 0; r < cluster; ++r) pieces[u * cluster + r] = GemmSplitPiece{};
    }
    return;
  }
  auto tile_of = [&](int64_t u) {
    GemmTile t;
    gemm_schedule_unit(u, tile_rows, psum, unit_psum, tail_psum, num_experts, num_n_blocks, 1, order, tile_n, &t);
    return t;
  };
  for (int64_t e = threadIdx.x; e < plan.entries; e += blockDim.x) {
    if (e < plan.whole) {
      tiles[e] = tile_of(e);
      pieces[e] = GemmSplitPiece{};
    } else {
      gemm_split_entry(e, plan, split, tile_of, tiles[e], pieces[e]);
    }
  }
}

}  // namespace

void build_gemm_tiles(const int32_t* rows_per_expert, int num_experts, int num_n_blocks, GemmKernel kernel,
                      TileOrder order, GemmTile* tiles, int32_t* num_tiles, int64_t capacity, CUstream_st* stream,
                      const int32_t* accepted, const GemmSplit& split, GemmSplitPiece* pieces, bool half_tiles) {
  // The kernel keeps three int32 words per expert (and one more) in shared memory, within the
  // 48 KB a launch has without opting in to more: up to 4095 experts, far above any model's
  // experts per rank (MoeLayer's plan stops lower).
  constexpr int kMaxTileBuildExperts = int(48 * 1024 / (3 * sizeof(int32_t))) - 1;
  COMET_CHECK(num_experts >= 1 && num_experts <= std::min(kMaxGemmExperts, kMaxTileBuildExperts) && num_n_blocks >= 1,
              "build_gemm_tiles: E=" << num_experts << " (1.." << std::min(kMaxGemmExperts, kMaxTileBuildExperts)
                                     << "), n blocks=" << num_n_blocks);
  COMET_CHECK(kernel != GemmKernel::kAuto, "build_gemm_tiles: resolve the kernel first (resolve_gemm_kernel)");
  COMET_CHECK(gemm_cluster_m(kernel) <= 2, "build_gemm_tiles: clusters of 1 or 2 blocks");
  COMET_CHECK(split.blocks == 0 || gemm_cluster_m(kernel) == 1,
              "build_gemm_tiles: " << gemm_kernel_name(kernel) << " runs clusters, which cannot split tiles");
  COMET_CHECK(split.blocks >= 0 && (split.tiles_per_block == 1 || split.tiles_per_block == 2) && split.k_tiles >= 0,
              "build_gemm_tiles: bad split (blocks " << split.blocks << ", tiles per block " << split.tiles_per_block
                                                      << ", k-tiles " << split.k_tiles << ")");
  COMET_CHECK(split.blocks == 0 || pieces != nullptr, "build_gemm_tiles: a split needs `pieces`");
  const size_t smem = size_t(3 * (num_experts + 1)) * sizeof(int32_t);
  launch_kernel(build_tiles_kernel, dim3(1), dim3(512), smem, stream, LaunchAttributes(), rows_per_expert, num_experts, num_n_blocks,
                gemm_cluster_m(kernel), order, gemm_tile_n(kernel), tiles, num_tiles, capacity, accepted, split, pieces,
                half_tiles);
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
