// GPU tests of the Hopper grouped GEMM (label `gpu`): numerics against a double-precision
// CPU oracle (sampled) and a naive GPU reference (every element), the device tile builder,
// signal waits, timeouts and column-block signals.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "comet/config.h"
#include "comet/dtype.h"
#include "comet/routing.h"
#include "core/activation.h"
#include "cuda/activation.cuh"
#include "cuda/gemm_schedule.h"
#include "cuda/grouped_gemm.h"
#include "cuda/signal.cuh"
#include "gpu_test_util.h"

namespace comet::cuda {
namespace {

using testing::DeviceBuffer;

struct GemmCase {
  std::string name;
  GemmEpilogue epilogue;
  int k, n;
  std::vector<int> rows;  // per expert
  uint64_t seed;
  GemmKernel kernel = GemmKernel::kCooperative128x256;
  Activation activation = Activation::kGelu;  // GemmEpilogue::kActivation only
  std::string describe() const {
    std::ostringstream os;
    os << name << " kernel=" << gemm_kernel_name(kernel) << " epilogue=" << gemm_epilogue_name(epilogue)
       << (epilogue == GemmEpilogue::kActivation ? std::string(" ") + activation_name(activation) : "") << " K=" << k
       << " N=" << n << " E=" << rows.size() << " rows=[";
    for (size_t e = 0; e < rows.size() && e < 12; ++e) os << (e ? "," : "") << rows[e];
    if (rows.size() > 12) os << ",...";
    os << "] seed=" << seed;
    return os.str();
  }
};

// Reference on the GPU: one warp per output element, lanes splitting K (coalesced reads of the
// A row and the B row), fp32 partial sums reduced across the warp. Reads the same packed B
// layout as the kernel.
__device__ float warp_dot(const __nv_bfloat16* x, const __nv_bfloat16* y, int k) {
  float acc = 0;
  for (int i = threadIdx.x % 32; i < k; i += 32) acc += __bfloat162float(x[i]) * __bfloat162float(y[i]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

__global__ void reference_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d, const int* row_expert,
                                 int rows, int n, int k, int n_b, GemmEpilogue epilogue, Activation act) {
  const int row = blockIdx.y;
  const int col = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows || col >= n) return;
  const int e = row_expert[row];
  if (e < 0) return;
  const __nv_bfloat16* arow = a + size_t(row) * k;
  float out;
  if (epilogue != GemmEpilogue::kSwiGlu) {
    out = warp_dot(arow, b + (size_t(e) * n_b + col) * k, k);
    if (epilogue == GemmEpilogue::kActivation) out = apply_activation(act, 0.f, out);
  } else {
    const int block = col / kSwiGluPack, within = col % kSwiGluPack;
    const __nv_bfloat16* g = b + (size_t(e) * n_b + size_t(block) * 2 * kSwiGluPack + within) * k;
    const float ga = warp_dot(arow, g, k), ua = warp_dot(arow, g + size_t(kSwiGluPack) * k, k);
    out = ga / (1.f + expf(-ga)) * ua;
  }
  if (threadIdx.x % 32 == 0) d[size_t(row) * n + col] = out;
}

struct GemmProblem {
  GemmCase c;
  std::vector<int> offsets;            // padded expert offsets
  int max_rows = 0;
  std::vector<float> a_vals;           // [max_rows][k] (padding rows random too)
  std::vector<float> w0, w1;           // x W convention [E][k][n]: gate/up or the plain weight
  std::vector<uint16_t> a_bits, b_bits;
  std::vector<int> row_expert;         // -1 for padding rows
};

GemmProblem make_gemm_problem(const GemmCase& c) {
  GemmProblem p{c};
  const int E = int(c.rows.size());
  p.offsets = expert_row_offsets(c.rows);
  p.max_rows = std::max(kGemmBlockM, p.offsets.back());
  Rng rng(c.seed);
  // Values are small integers times a power of two: products and short sums are exact in
  // fp32, so the reference and the kernel differ only by summation order on long K.
  auto value = [&](double scale) { return float(std::round(rng.normal() * 2.0) * scale); };
  p.a_vals.resize(size_t(p.max_rows) * c.k);
  for (float& v : p.a_vals) v = value(0.25);
  const double wscale = 1.0 / std::sqrt(double(c.k));
  p.w0.resize(size_t(E) * c.k * c.n);
  for (float& v : p.w0) v = round_to(DType::kBF16, value(wscale));
  p.w1.resize(size_t(E) * c.k * c.n);
  for (float& v : p.w1) v = round_to(DType::kBF16, value(wscale));
  p.a_bits.resize(p.a_vals.size());
  for (size_t i = 0; i < p.a_vals.size(); ++i) p.a_bits[i] = float_to_bf16_bits(p.a_vals[i]);
  p.b_bits = c.epilogue == GemmEpilogue::kSwiGlu ? pack_swiglu_weights(p.w0, p.w1, E, c.k, c.n)
                                                 : transpose_weights(p.w0, E, c.k, c.n);
  p.row_expert.assign(p.max_rows, -1);
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < c.rows[e]; ++r) p.row_expert[p.offsets[e] + r] = e;
  return p;
}

// Double-precision oracle for one output element (x W convention weights).
double oracle_element(const GemmProblem& p, int row, int col) {
  const int e = p.row_expert[row];
  const size_t per = size_t(p.c.k) * p.c.n;
  double g = 0, u = 0;
  for (int i = 0; i < p.c.k; ++i) {
    const double x = p.a_vals[size_t(row) * p.c.k + i];
    g += x * p.w0[e * per + size_t(i) * p.c.n + col];
    u += x * p.w1[e * per + size_t(i) * p.c.n + col];
  }
  if (p.c.epilogue == GemmEpilogue::kIdentity) return g;
  if (p.c.epilogue == GemmEpilogue::kActivation) return core::apply_activation<double>(p.c.activation, 0.0, g);
  return g / (1.0 + std::exp(-g)) * u;
}

// A problem on the device: operands, a poisoned output, a zeroed error record, and the schedule
// for the case's kernel in `order` (built on the default stream; with `split`, a split schedule
// and its workspace). args() holds what every test shares; each adds its waits, signals or claims.
struct DeviceGemm {
  DeviceBuffer<uint16_t> a, b, d;
  DeviceBuffer<int32_t> rows;
  int num_n_blocks = 0;
  GemmSplit split;
  int64_t capacity = 0;
  DeviceBuffer<GemmTile> tiles;
  DeviceBuffer<int32_t> num_tiles{1};
  DeviceBuffer<DeviceError> error{1};
  DeviceBuffer<GemmSplitPiece> split_pieces;
  DeviceBuffer<float> split_partials;
  DeviceBuffer<uint64_t> split_flags;

  DeviceGemm(const GemmProblem& p, TileOrder order, const GemmSplit& split_ = {})
      : a(p.a_bits), b(p.b_bits), d(size_t(p.max_rows) * p.c.n),
        rows(std::vector<int32_t>(p.c.rows.begin(), p.c.rows.end())),
        num_n_blocks(gemm_num_n_blocks(p.c.epilogue, p.c.n, p.c.kernel)),
        split(split_),
        capacity(max_gemm_tiles(p.max_rows, int(p.c.rows.size()), num_n_blocks, p.c.kernel, split)),
        tiles(capacity),
        split_pieces(split_.blocks > 0 ? capacity : 0),
        split_partials(size_t(gemm_split_partial_floats(p.c.kernel, split))),
        split_flags(size_t(gemm_split_flags(split))) {
    d.poison();
    error.zero();
    split_partials.poison();
    split_flags.zero();
    build_gemm_tiles(rows.get(), int(p.c.rows.size()), num_n_blocks, p.c.kernel, order, tiles.get(), num_tiles.get(),
                     capacity, nullptr, nullptr, split, split_pieces.get());
  }
  GroupedGemmArgs args(const GemmProblem& p) const {
    GroupedGemmArgs g;
    g.epilogue = p.c.epilogue;
    g.kernel = p.c.kernel;
    g.num_experts = int(p.c.rows.size());
    g.max_rows = p.max_rows;
    g.n = p.c.n;
    g.k = p.c.k;
    g.a = a.get();
    g.b = b.get();
    g.d = d.get();
    g.tiles = tiles.get();
    g.num_tiles = num_tiles.get();
    g.error = error.get();
    if (split.blocks > 0) {
      g.split_pieces = split_pieces.get();
      g.split_partials = split_partials.get();
      g.split_flags = split_flags.get();
      g.split = split;
      g.num_blocks = split.blocks;
    }
    return g;
  }
};

// The output's expert rows, the rest (rows past an expert's end in its last M tile) zeroed: those
// are not part of the output. The cooperative kernels leave them as they were when a consumer
// warpgroup's 64 rows all lie there; the ping-pong ones store products of A's padding rows.
std::vector<uint16_t> expert_rows_only(const GemmProblem& p, std::vector<uint16_t> d) {
  for (int row = 0; row < p.max_rows; ++row)
    if (p.row_expert[row] < 0) std::fill_n(d.begin() + int64_t(row) * p.c.n, p.c.n, uint16_t(0));
  return d;
}

struct GemmRun {
  std::vector<uint16_t> d;        // expert_rows_only of the output
  std::vector<uint16_t> raw_d;    // the whole output buffer (poisoned before the launch)
  std::vector<uint16_t> first_d;  // claimed or split: the first of the two launches' outputs (expert rows)
  std::vector<float> reference;
  DeviceError error;
  int num_tiles = 0;
  unsigned claims = 0;  // the claim counter after the runs (claimed tiles only)
};

// How the tiles are handed out: static (block b runs b, b+G, ...) or claimed from a counter;
// num_blocks 0 is one block per SM; split: a split schedule for that grid.
struct TileDealing {
  bool claimed = false;
  int num_blocks = 0;
  bool split = false;
};

struct SignalSetup {
  std::vector<uint64_t> flags, targets;  // per signal (= global M tile)
};

GemmRun run_case(const GemmProblem& p, TileOrder order, const SignalSetup* signals = nullptr,
                 uint64_t timeout_ns = 2'000'000'000ull, TileDealing dealing = {}) {
  const GemmCase& c = p.c;
  DeviceGemm g(p, order, dealing.split ? gemm_split_for(c.kernel, c.k, dealing.num_blocks) : GemmSplit{});
  GroupedGemmArgs args = g.args(p);
  args.timeout_ns = timeout_ns;
  DeviceBuffer<uint64_t> flags, targets;
  if (signals) {
    flags = DeviceBuffer<uint64_t>(signals->flags);
    targets = DeviceBuffer<uint64_t>(signals->targets);
    args.wait_flags = flags.get();
    args.wait_targets = targets.get();
  }
  DeviceBuffer<unsigned> claims(1);
  claims.zero();
  if (dealing.claimed) args.tile_claims = claims.get();
  if (!dealing.split) args.num_blocks = dealing.num_blocks;
  args.activation = c.activation;
  GemmRun out;
  run_grouped_gemm(args, nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  if (dealing.claimed || dealing.split) {  // again on the same counter or flags: the output comes from this launch
    out.first_d = expert_rows_only(p, g.d.download());
    g.d.poison();
    run_grouped_gemm(args, nullptr);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
  out.claims = claims.download()[0];
  out.raw_d = g.d.download();
  out.d = expert_rows_only(p, out.raw_d);
  out.error = g.error.download()[0];
  out.num_tiles = g.num_tiles.download()[0];
  DeviceBuffer<float> ref(size_t(p.max_rows) * c.n);
  DeviceBuffer<int32_t> row_expert(std::vector<int32_t>(p.row_expert.begin(), p.row_expert.end()));
  dim3 grid((c.n + 7) / 8, p.max_rows);  // 8 warps, one output element each
  reference_kernel<<<grid, 256>>>(reinterpret_cast<const __nv_bfloat16*>(g.a.get()),
                                  reinterpret_cast<const __nv_bfloat16*>(g.b.get()), ref.get(), row_expert.get(),
                                  p.max_rows, c.n, c.k, gemm_b_rows(c.epilogue, c.n), c.epilogue, c.activation);
  COMET_CUDA_CHECK_LAUNCH();
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  out.reference = ref.download();
  return out;
}

// Every real row fully written and close to the GPU reference; sampled elements close to the
// fp64 oracle. bf16 output: one rounding (2^-9 relative) plus fp32 summation-order noise, so a
// per-element bound of 1e-2 * |ref| + 1e-2 * rms(ref) and a relative L2 bound of 5e-3.
void check_run(const GemmProblem& p, const GemmRun& run) {
  const GemmCase& c = p.c;
  double diff2 = 0, ref2 = 0, sum2 = 0;
  int64_t count = 0;
  for (int row = 0; row < p.max_rows; ++row) {
    if (p.row_expert[row] < 0) continue;
    for (int col = 0; col < c.n; ++col) sum2 += double(run.reference[size_t(row) * c.n + col]) * run.reference[size_t(row) * c.n + col], ++count;
  }
  const double rms = count ? std::sqrt(sum2 / count) : 0;
  int64_t bad = 0;
  for (int row = 0; row < p.max_rows; ++row) {
    if (p.row_expert[row] < 0) continue;
    for (int col = 0; col < c.n; ++col) {
      const float got = bf16_bits_to_float(run.d[size_t(row) * c.n + col]);
      const float want = run.reference[size_t(row) * c.n + col];
      if (!std::isfinite(got) || std::abs(got - want) > 1e-2 * std::abs(want) + 1e-2 * rms) {
        if (bad++ < 5) ADD_FAILURE() << "row " << row << " (expert " << p.row_expert[row] << ") col " << col
                                     << ": got " << got << ", reference " << want;
      }
      diff2 += double(got - want) * (got - want);
      ref2 += double(want) * want;
    }
  }
  EXPECT_EQ(bad, 0) << "elements outside tolerance";
  if (ref2 > 0) EXPECT_LT(std::sqrt(diff2 / ref2), 5e-3);
  // The kernel and the GPU reference against the fp64 oracle, on samples from every expert.
  Rng rng(c.seed ^ 0x5a5a);
  for (int e = 0; e < int(c.rows.size()); ++e) {
    for (int s = 0; s < std::min(c.rows[e], 8); ++s) {
      const int row = p.offsets[e] + rng.uniform_int(c.rows[e]);
      const int col = rng.uniform_int(c.n);
      const double want = oracle_element(p, row, col);
      const float got = bf16_bits_to_float(run.d[size_t(row) * c.n + col]);
      EXPECT_NEAR(got, want, 1e-2 * std::abs(want) + 1e-2 * rms) << "oracle sample row " << row << " col " << col;
      // The reference (fp32, unrounded) is checked too, so that it cannot drift with the kernel.
      EXPECT_NEAR(run.reference[size_t(row) * c.n + col], want, 1e-3 * std::abs(want) + 1e-3 * rms)
          << "reference sample row " << row << " col " << col;
    }
  }
}

// run_case with the checks every plain run gets: no device error, then check_run.
GemmRun run_checked(const GemmProblem& p, TileOrder order) {
  GemmRun run = run_case(p, order);
  EXPECT_EQ(run.error.claimed, 0) << describe(run.error);
  check_run(p, run);
  return run;
}

// Per-rank expert shapes of a preset at EP=8 (TP=1), rows from uniform routing of T tokens on
// each of 8 ranks, scaled down in rows so the naive reference stays quick.
std::vector<int> preset_rows(const ModelShape& m, int tokens_per_rank, uint64_t seed) {
  const int W = 8, epr = m.num_experts / W;
  std::vector<int> rows(epr, 0);
  for (int r = 0; r < W; ++r) {
    const Routing rt = generate_routing(RoutingSpec{}, tokens_per_rank, m.num_experts, m.topk, seed, r);
    for (int32_t e : rt.expert_ids)
      if (e >= 0 && e < epr) ++rows[e];
  }
  return rows;
}

constexpr auto& kKernels = kGemmKernels;  // every configuration

class GroupedGemmPresetTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GroupedGemmPresetTest, MatchesReferenceForBothLayers) {
  COMET_REQUIRE_GPU();
  const ModelShape& m = ModelPresets::get(GetParam());
  const int tokens = 512 / m.topk;  // about 512 rows per rank: the naive reference stays quick
  std::vector<int> rows = preset_rows(m, tokens, 11);
  // At most 8 experts: each keeps the preset's H x F shape, and generating 32 experts' weights on
  // the host cost about 100 s of device-machine time per run.
  if (rows.size() > 8) rows.resize(8);
  // One problem per layer (generating the weights dominates), run by every configuration; each
  // checked against the references and, bit for bit, against the first.
  for (auto [epilogue, k, n] : {std::tuple{GemmEpilogue::kSwiGlu, m.hidden, m.ffn},
                                std::tuple{GemmEpilogue::kIdentity, m.ffn, m.hidden}}) {
    GemmProblem p = make_gemm_problem(GemmCase{GetParam(), epilogue, k, n, rows, 1234 + uint64_t(k)});
    const TileOrder order = epilogue == GemmEpilogue::kSwiGlu ? TileOrder::kRowMajor : TileOrder::kColumnBlockMajor;
    std::vector<uint16_t> first;
    for (GemmKernel kernel : kKernels) {
      p.c.kernel = kernel;
      SCOPED_TRACE(p.c.describe());
      const GemmRun run = run_checked(p, order);
      if (first.empty()) first = run.d;
      else EXPECT_EQ(run.d, first) << "output differs from " << gemm_kernel_name(kKernels[0]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GroupedGemmPresetTest,
                         ::testing::Values("mixtral-8x7b", "qwen2-moe-2.7b", "phi-3.5-moe", "qwen3-30b-a3b",
                                           "deepseek-v3"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace_if(s.begin(), s.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return s;
                         });

// Every kernel configuration computes each tile with the same k order, so their outputs are
// equal bit for bit (on the experts' rows: see expert_rows_only).
TEST(GroupedGemm, SkewedZeroAndPartialExperts) {
  COMET_REQUIRE_GPU();
  for (auto epilogue : {GemmEpilogue::kSwiGlu, GemmEpilogue::kIdentity}) {
    std::vector<std::vector<uint16_t>> outputs;
    for (GemmKernel kernel : kKernels) {
      // Empty experts, one-row experts, a tile-multiple, and one expert holding most rows; M tiles
      // per expert 0, 1, 6, 0, 1, 2, 1, 0: clusters of two need padding tiles for three experts.
      const GemmCase c{"skewed", epilogue, 512, 384, {0, 1, 700, 0, 128, 129, 3, 0}, 77, kernel};
      SCOPED_TRACE(c.describe());
      const GemmProblem p = make_gemm_problem(c);
      const GemmRun run = run_checked(p, TileOrder::kRowMajor);
      outputs.push_back(run.d);
    }
    for (size_t i = 1; i < outputs.size(); ++i)
      EXPECT_EQ(outputs[i], outputs[0]) << gemm_kernel_name(kKernels[i]) << " differs from " << gemm_kernel_name(kKernels[0]);
  }
}

// An expert's last M tile with at most 64 rows: the cooperative kernels' second consumer
// warpgroup computes and stores nothing (the tile takes about half the time), and the rows it
// would have stored keep the poison; with 65 rows or more both warpgroups compute and store, as
// the ping-pong kernels always do. The experts' rows match the references in every case,
// static and claimed, and on a split schedule.
TEST(GroupedGemm, CooperativeSkipsRowsPastTheExpert) {
  COMET_REQUIRE_GPU();
  // Last M tiles of 60, 1, 64, 65 and 128 rows (and a one-row expert).
  const std::vector<int> rows = {700, 129, 64, 65, 128, 1};
  for (GemmKernel kernel : kKernels)
  for (auto epilogue : {GemmEpilogue::kSwiGlu, GemmEpilogue::kIdentity}) {
    const GemmCase c{"rows past the expert", epilogue, 2120, 384, rows, 29, kernel};
    SCOPED_TRACE(c.describe());
    const GemmProblem p = make_gemm_problem(c);
    const bool cooperative = kernel == GemmKernel::kCooperative128x256 || kernel == GemmKernel::kCooperative128x256Cluster2x1;
    auto check_skipped_rows = [&](const GemmRun& run) {
      for (int e = 0; e < int(rows.size()); ++e) {
        const int last_tile = p.offsets[e + 1] - kGemmBlockM, end = p.offsets[e] + rows[e];
        const bool skipped = cooperative && end - last_tile <= kGemmBlockM / 2;
        for (int row = std::max(end, last_tile + kGemmBlockM / 2); row < p.offsets[e + 1]; ++row)
          for (int col = 0; col < c.n; col += 97)
            ASSERT_EQ(run.raw_d[size_t(row) * c.n + col] == 0xffff, skipped)
                << "expert " << e << " row " << row << (skipped ? " was stored" : " was not stored");
      }
    };
    check_skipped_rows(run_checked(p, TileOrder::kColumnBlockMajor));
    if (cooperative && gemm_cluster_m(kernel) == 1) {
      // 7 blocks: both epilogues' lists cut tiles with at most 64 rows into split pieces.
      constexpr int kSplitBlocks = 7;
      std::vector<GemmSplitPiece> pieces;
      const std::vector<GemmTile> list =
          gemm_schedule_host(rows, gemm_num_n_blocks(epilogue, c.n, kernel), 1, TileOrder::kColumnBlockMajor,
                             gemm_tile_n(kernel), gemm_split_for(kernel, c.k, kSplitBlocks), &pieces);
      bool split_half_tile = false;
      for (size_t i = 0; i < list.size(); ++i)
        split_half_tile |= pieces[i].role != GemmSplitRole::kWhole && pieces[i].role != GemmSplitRole::kIdle &&
                           gemm_tile_rows(list[i]) <= kGemmBlockM / 2;
      EXPECT_TRUE(split_half_tile) << "no split piece of a tile with at most 64 rows; choose another grid";
      for (TileDealing dealing : {TileDealing{true, 0, false}, TileDealing{false, kSplitBlocks, true}}) {
        const GemmRun other = run_case(p, TileOrder::kColumnBlockMajor, nullptr, 2'000'000'000ull, dealing);
        EXPECT_EQ(other.error.claimed, 0) << describe(other.error);
        check_run(p, other);
        check_skipped_rows(other);
      }
    }
  }
}

// The device builder writes exactly the list cuda/gemm_schedule.h defines (whose properties the
// CPU suite checks, tests/unit/gemm_schedule_test.cpp), for every kernel's cluster size, both
// orders, an even and an odd number of column blocks, one and two column groups, on skewed
// experts.
TEST(GroupedGemm, DeviceScheduleIsTheHostOne) {
  COMET_REQUIRE_GPU();
  // M tiles per expert 0, 1, 6, 0, 1, 2, 1, 0, 16, 4: three experts with an odd count.
  const std::vector<int> expert_rows = {0, 1, 700, 0, 128, 129, 3, 0, 2000, 385};
  const int E = int(expert_rows.size());
  const int max_rows = expert_row_offsets(expert_rows).back();
  DeviceBuffer<int32_t> rows(std::vector<int32_t>(expert_rows.begin(), expert_rows.end()));
  for (GemmKernel kernel : kKernels)
  for (TileOrder order : {TileOrder::kRowMajor, TileOrder::kColumnBlockMajor})
  for (int nb : {4, 5, 10})  // 10: two column groups at either width (4 of 256 columns, 8 of 128)
  for (int split_blocks : {0, 7}) {  // 7 blocks: 31 M tiles x 4, 5 or 10 column blocks split
    if (split_blocks > 0 && gemm_cluster_m(kernel) != 1) continue;
    SCOPED_TRACE(std::string(gemm_kernel_name(kernel)) + (order == TileOrder::kRowMajor ? " row-major" : " column-major") +
                 " column blocks " + std::to_string(nb) + " split blocks " + std::to_string(split_blocks));
    const GemmSplit split = split_blocks > 0 ? gemm_split_for(kernel, 64 * 96, split_blocks) : GemmSplit{};  // 96 k-tiles: up to 6 parts
    const int64_t capacity = max_gemm_tiles(max_rows, E, nb, kernel, split);
    DeviceBuffer<GemmTile> tiles(capacity);
    DeviceBuffer<GemmSplitPiece> pieces(split_blocks > 0 ? capacity : 0);
    DeviceBuffer<int32_t> num_tiles(1);
    build_gemm_tiles(rows.get(), E, nb, kernel, order, tiles.get(), num_tiles.get(), capacity, nullptr, nullptr, split,
                     pieces.get());
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<GemmSplitPiece> want_pieces;
    const std::vector<GemmTile> want =
        gemm_schedule_host(expert_rows, nb, gemm_cluster_m(kernel), order, gemm_tile_n(kernel), split, &want_pieces);
    if (split_blocks > 0) ASSERT_GT(want.size(), size_t(31 * nb)) << "the case does not split";
    const int n = num_tiles.download()[0];
    ASSERT_EQ(size_t(n), want.size());
    ASSERT_LE(n, capacity);
    const std::vector<GemmTile> got = tiles.download();
    const std::vector<GemmSplitPiece> got_pieces = pieces.download();
    for (int t = 0; t < n; ++t) {
      ASSERT_EQ(got[t].m_row, want[t].m_row) << "entry " << t;
      ASSERT_EQ(got[t].n_block, want[t].n_block) << "entry " << t;
      ASSERT_EQ(got[t].expert, want[t].expert) << "entry " << t;
      ASSERT_EQ(got[t].signal, want[t].signal) << "entry " << t;
      ASSERT_EQ(got[t].rows, want[t].rows) << "entry " << t;
      if (split_blocks == 0) continue;
      const GemmSplitPiece &g = got_pieces[t], &w = want_pieces[t];
      ASSERT_EQ(g.role, w.role) << "entry " << t;
      ASSERT_EQ(g.k_begin, w.k_begin) << "entry " << t;
      ASSERT_EQ(g.k_count, w.k_count) << "entry " << t;
      ASSERT_EQ(g.partial, w.partial) << "entry " << t;
      ASSERT_EQ(g.partials, w.partials) << "entry " << t;
    }
  }
}

// Claimed tiles (GroupedGemmArgs::tile_claims) give the same output as static ones, bit for bit,
// on the full grid and on 3 blocks, and leave the counter at zero for the next launch (a
// second launch on the same counter runs every tile again). Both configurations that claim:
// cooperative 128x256 (the fused kernels) and ping-pong 128x128 (layer1 with the combine in the
// GEMM blocks).
TEST(GroupedGemm, ClaimedTilesMatchStaticTilesBitwise) {
  COMET_REQUIRE_GPU();
  for (auto kernel : {GemmKernel::kCooperative128x256, GemmKernel::kPingpong128x128}) {
    for (auto epilogue : {GemmEpilogue::kSwiGlu, GemmEpilogue::kIdentity}) {
      const GemmCase c{"claimed", epilogue, 512, 768, {0, 1, 700, 0, 128, 129, 300, 0}, 91, kernel};
      SCOPED_TRACE(c.describe());
      const GemmProblem p = make_gemm_problem(c);
      const GemmRun fixed = run_checked(p, TileOrder::kRowMajor);
      for (int blocks : {0, 3}) {
        SCOPED_TRACE("blocks " + std::to_string(blocks));
        const GemmRun claimed = run_case(p, TileOrder::kRowMajor, nullptr, 2'000'000'000ull, {true, blocks});
        EXPECT_EQ(claimed.error.claimed, 0) << describe(claimed.error);
        EXPECT_EQ(claimed.num_tiles, fixed.num_tiles);
        EXPECT_EQ(claimed.claims, 0u) << "the launch left its claim counter at " << claimed.claims;
        EXPECT_EQ(claimed.d, fixed.d) << "claimed tiles changed the output";
      }
    }
  }
}

// A last M tile of 65-127 rows cut in two half tiles, rows [0, 64) and [64, rows) of it (the
// device plan's layer1 lists, layer1_cut_m_tiles): the second half's A rows start 64 rows into
// the M tile. The cooperative kernel computes every element with the same k order either way,
// so the output equals the whole tiles' bit for bit. Claimed, as the layer claims them.
TEST(GroupedGemm, MTilesCutInHalvesMatchWholeTilesBitwise) {
  COMET_REQUIRE_GPU();
  for (auto epilogue : {GemmEpilogue::kIdentity, GemmEpilogue::kSwiGlu}) {
    // Last M tiles of 72, 65, 127 and 44 rows (the last a half tile already), an empty expert,
    // and an expert of whole tiles only.
    const GemmCase c{"cut", epilogue, 512, 512, {200, 0, 65, 255, 256, 44}, 23, GemmKernel::kCooperative128x256};
    SCOPED_TRACE(c.describe());
    const GemmProblem p = make_gemm_problem(c);
    const GemmRun want = run_checked(p, TileOrder::kColumnBlockMajor);
    const int nb = gemm_num_n_blocks(epilogue, c.n, c.kernel);
    std::vector<GemmTile> list;
    int cut = 0;
    for (int n = 0; n < nb; ++n)
      for (int e = 0; e < int(c.rows.size()); ++e)
        for (int m_row = p.offsets[e]; m_row < p.offsets[e] + c.rows[e]; m_row += kGemmBlockM) {
          const int end = p.offsets[e] + c.rows[e], m = m_row / kGemmBlockM;
          if (end - m_row > kGemmBlockM / 2 && end - m_row < kGemmBlockM) {
            list.push_back(make_gemm_tile(m_row, n, e, m_row + kGemmBlockM / 2, m));
            list.push_back(make_gemm_tile(m_row + kGemmBlockM / 2, n, e, end, m));
            ++cut;
          } else {
            list.push_back(make_gemm_tile(m_row, n, e, end, m));
          }
        }
    ASSERT_EQ(cut, 3 * nb);
    DeviceGemm g(p, TileOrder::kColumnBlockMajor);
    DeviceBuffer<GemmTile> tiles(list);
    DeviceBuffer<int32_t> num_tiles(std::vector<int32_t>{int32_t(list.size())});
    DeviceBuffer<unsigned> claims(1);
    claims.zero();
    GroupedGemmArgs args = g.args(p);
    args.tiles = tiles.get();
    args.num_tiles = num_tiles.get();
    args.tile_claims = claims.get();
    run_grouped_gemm(args, nullptr);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(g.error.download()[0].claimed, 0) << describe(g.error.download()[0]);
    const std::vector<uint16_t> raw = g.d.download();
    EXPECT_EQ(expert_rows_only(p, raw), want.d) << "the halves' output differs from the whole tiles'";
  }
}

// Split schedules on small grids, where a few hundred rows make several waves: on the grids
// where the list splits (at least one per configuration and epilogue), the output matches the
// references, and a second launch on the same flags gives the same output bit for bit (the first
// left every flag zero). K = 2120 (34 k-tiles, the last a zero-filled tail) cuts unequal k ranges.
TEST(GroupedGemm, SplitTilesMatchTheReferenceAndRepeat) {
  COMET_REQUIRE_GPU();
  for (GemmKernel kernel : {GemmKernel::kPingpong128x128, GemmKernel::kCooperative128x256})
  for (auto epilogue : {GemmEpilogue::kSwiGlu, GemmEpilogue::kIdentity}) {
    const GemmCase c{"split", epilogue, 2120, 640, {300, 0, 517, 129, 1}, 17, kernel};
    const GemmProblem p = make_gemm_problem(c);
    int split_grids = 0;
    for (int blocks : {3, 4, 7}) {
      SCOPED_TRACE(c.describe() + " blocks " + std::to_string(blocks));
      const GemmSplit split = gemm_split_for(kernel, c.k, blocks);
      const int nb = gemm_num_n_blocks(epilogue, c.n, kernel);
      std::vector<GemmSplitPiece> pieces;
      const std::vector<GemmTile> list =
          gemm_schedule_host(c.rows, nb, 1, TileOrder::kColumnBlockMajor, gemm_tile_n(kernel), split, &pieces);
      if (std::none_of(pieces.begin(), pieces.end(), [](const GemmSplitPiece& q) { return q.role == GemmSplitRole::kFinish; }))
        continue;
      ++split_grids;
      const GemmRun run = run_case(p, TileOrder::kColumnBlockMajor, nullptr, 2'000'000'000ull, {false, blocks, true});
      EXPECT_EQ(run.error.claimed, 0) << describe(run.error);
      EXPECT_EQ(run.num_tiles, int(list.size()));
      check_run(p, run);
      EXPECT_EQ(run.first_d, run.d) << "a second launch gave another output";
    }
    EXPECT_GE(split_grids, 1) << c.describe() << ": no grid splits; choose other rows";
  }
}

// A split list launched without its pieces and workspace runs on the plain kernel: each piece as
// its whole tile, idle pieces as padding, so the output is the unsplit list's, bit for bit.
TEST(GroupedGemm, SplitListOnThePlainKernelGivesTheUnsplitOutput) {
  COMET_REQUIRE_GPU();
  const GemmCase c{"split", GemmEpilogue::kIdentity, 2120, 640, {300, 0, 517, 129, 1}, 17, GemmKernel::kPingpong128x128};
  const GemmProblem p = make_gemm_problem(c);
  DeviceGemm g(p, TileOrder::kColumnBlockMajor, gemm_split_for(c.kernel, c.k, 3));
  GroupedGemmArgs args = g.args(p);
  args.split_pieces = nullptr;
  args.split_partials = nullptr;
  args.split_flags = nullptr;
  args.split = GemmSplit{};
  run_grouped_gemm(args, nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(g.error.download()[0].claimed, 0);
  EXPECT_GT(g.num_tiles.download()[0], 11 * 5) << "the list is not split";
  EXPECT_EQ(expert_rows_only(p, g.d.download()), run_case(p, TileOrder::kColumnBlockMajor).d);
}

TEST(GroupedGemm, KAndNTailsAreZeroFilled) {
  COMET_REQUIRE_GPU();
  // K = 200 and N = 200 are not multiples of the 64 / 128 / 256 tile sizes.
  for (GemmKernel kernel : kKernels)
  for (auto epilogue : {GemmEpilogue::kSwiGlu, GemmEpilogue::kIdentity}) {
    const GemmCase c{"tails", epilogue, 200, 200, {5, 130, 0, 64}, 5, kernel};
    SCOPED_TRACE(c.describe());
    run_checked(make_gemm_problem(c), TileOrder::kColumnBlockMajor);
  }
}

// The plain-activation epilogue (GELU, ReLU, SiLU on x W, no gate): skewed experts, an empty
// one, partial M tiles and an N that is not a multiple of the tile width, against the GPU
// reference and the fp64 oracle; kAuto resolves to the one configuration it has.
TEST(GroupedGemm, PlainActivationEpilogue) {
  COMET_REQUIRE_GPU();
  EXPECT_EQ(choose_gemm_kernel(GemmEpilogue::kActivation, 392, 512, 5), GemmKernel::kPingpong128x128);
  uint64_t seed = 31;
  for (Activation act : {Activation::kGelu, Activation::kRelu, Activation::kSilu}) {
    GemmCase c{"plain", GemmEpilogue::kActivation, 512, 392, {300, 0, 517, 129, 1}, seed++, GemmKernel::kPingpong128x128};
    c.activation = act;
    SCOPED_TRACE(c.describe());
    run_checked(make_gemm_problem(c), TileOrder::kRowMajor);
  }
}

// Host only (can_implement): a shape it accepts, every pointer at one 16-byte aligned dummy
// that nothing reads.
GroupedGemmArgs host_only_args() {
  alignas(16) static int dummy[4] = {};
  GroupedGemmArgs a;
  a.num_experts = 2;
  a.max_rows = 256;
  a.n = 256;
  a.k = 256;
  a.a = a.b = dummy;
  a.d = dummy;
  a.tiles = reinterpret_cast<const GemmTile*>(dummy);
  a.num_tiles = dummy;
  a.error = reinterpret_cast<DeviceError*>(dummy);
  return a;
}

// Host only: what the plain-activation epilogue refuses, by name.
TEST(GroupedGemm, CanImplementPlainActivation) {
  GroupedGemmArgs a = host_only_args();
  a.epilogue = GemmEpilogue::kActivation;
  a.activation = Activation::kRelu;
  EXPECT_TRUE(can_implement(a).ok) << can_implement(a).reason;  // kAuto: ping-pong
  a.kernel = GemmKernel::kPingpong128x128;
  EXPECT_TRUE(can_implement(a).ok) << can_implement(a).reason;
  for (GemmKernel kernel : {GemmKernel::kCooperative128x256, GemmKernel::kCooperative128x256Cluster2x1,
                            GemmKernel::kPingpong128x128Cluster2x1}) {
    a.kernel = kernel;
    const Status s = can_implement(a);
    EXPECT_FALSE(s.ok) << gemm_kernel_name(kernel);
    EXPECT_NE(s.reason.find("plain-activation epilogue is instantiated for pingpong-128x128"), std::string::npos) << s.reason;
  }
  a.kernel = GemmKernel::kPingpong128x128;
  a.activation = Activation::kSwiGlu;
  const Status s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("not swiglu"), std::string::npos) << s.reason;
}

TEST(GroupedGemm, AllExpertsEmptyRunsNothing) {
  COMET_REQUIRE_GPU();
  for (GemmKernel kernel : kKernels) {
    const GemmCase c{"empty", GemmEpilogue::kIdentity, 256, 256, {0, 0, 0, 0}, 1, kernel};
    SCOPED_TRACE(c.describe());
    const GemmProblem p = make_gemm_problem(c);
    const GemmRun run = run_case(p, TileOrder::kRowMajor);
    EXPECT_EQ(run.num_tiles, 0);
    EXPECT_EQ(run.error.claimed, 0);
  }
}

// A cluster configuration given a schedule built for another configuration with an odd tile
// count runs no tile, records the error, and finishes (a block whose partner had no tile would
// otherwise wait for its B half forever); a cluster schedule's padding tile run by a
// configuration without clusters stores nothing (it would store at a negative row).
TEST(GroupedGemm, ScheduleOfAnotherConfigurationIsRefusedOrHarmless) {
  COMET_REQUIRE_GPU();
  GemmProblem p = make_gemm_problem(GemmCase{"mismatch", GemmEpilogue::kIdentity, 256, 256, {300}, 6});
  {
    DeviceGemm g(p, TileOrder::kRowMajor);  // cooperative: 3 M tiles x 1 column block
    GroupedGemmArgs args = g.args(p);
    args.kernel = GemmKernel::kCooperative128x256Cluster2x1;
    run_grouped_gemm(args, nullptr);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    const DeviceError err = g.error.download()[0];
    ASSERT_EQ(err.claimed, 1);
    EXPECT_EQ(err.role, int(WaitRole::kBadSchedule));
    EXPECT_EQ(err.observed, 3u);
    EXPECT_NE(describe(err).find("3 tiles are not whole clusters of 2"), std::string::npos) << describe(err);
    for (uint16_t v : g.d.download()) ASSERT_EQ(v, 0xffff) << "a tile ran";
  }
  {
    p.c.kernel = GemmKernel::kCooperative128x256Cluster2x1;
    DeviceGemm g(p, TileOrder::kRowMajor);  // pairs (0, 1) and (2, padding)
    p.c.kernel = GemmKernel::kCooperative128x256;
    GroupedGemmArgs args = g.args(p);
    const GemmRun want = run_case(p, TileOrder::kRowMajor);
    run_grouped_gemm(args, nullptr);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(g.error.download()[0].claimed, 0);
    EXPECT_EQ(expert_rows_only(p, g.d.download()), want.d) << "a real tile is missing";
    const std::vector<uint16_t> raw = g.d.download();
    // The last M tile (rows 256-383) holds 44 rows: its second warpgroup's 64 rows are skipped,
    // and its first warpgroup's (up to row 319) are stored as the plain schedule stores them.
    for (int row = 320; row < p.max_rows; ++row)
      ASSERT_EQ(raw[size_t(row) * p.c.n], 0xffff) << "row " << row << " past the expert's end was stored";
    EXPECT_TRUE(std::equal(raw.begin(), raw.begin() + size_t(320) * p.c.n, want.raw_d.begin()))
        << "rows 0-319 differ from the plain schedule's";
  }
}

TEST(GroupedGemm, CanImplementRefusesBadShapes) {
  GroupedGemmArgs a = host_only_args();
  // TMA needs 16-byte aligned operands.
  a.b = static_cast<const char*>(a.a) + 8;
  Status s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("b is not 16-byte aligned"), std::string::npos) << s.reason;
  a.b = a.a;
  a.k = 100;  // not a multiple of 8
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("K=100"), std::string::npos) << s.reason;
  a.k = 256;
  a.n = 20;
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("N=20"), std::string::npos) << s.reason;
  a.n = 256;
  a.max_rows = 100;
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  a.max_rows = 256;
  EXPECT_TRUE(can_implement(a).ok) << can_implement(a).reason;
  // Claimed tiles without clusters only (clusters run a fixed pairing of tiles); whole
  // clusters of blocks.
  unsigned counter = 0;
  a.tile_claims = &counter;
  for (GemmKernel kernel : {GemmKernel::kCooperative128x256, GemmKernel::kPingpong128x128}) {
    a.kernel = kernel;
    EXPECT_TRUE(can_implement(a).ok) << gemm_kernel_name(kernel) << ": " << can_implement(a).reason;
  }
  for (GemmKernel kernel : {GemmKernel::kCooperative128x256Cluster2x1, GemmKernel::kPingpong128x128Cluster2x1}) {
    a.kernel = kernel;
    s = can_implement(a);
    EXPECT_FALSE(s.ok) << gemm_kernel_name(kernel);
    EXPECT_NE(s.reason.find("claimed tiles"), std::string::npos) << s.reason;
  }
  a.kernel = GemmKernel::kCooperative128x256Cluster2x1;
  a.tile_claims = nullptr;
  a.num_blocks = 7;
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("num_blocks=7"), std::string::npos) << s.reason;
  a.num_blocks = 8;
  EXPECT_TRUE(can_implement(a).ok) << can_implement(a).reason;
  // Split schedules: the whole workspace, no clusters, no waits or claims, their own grid.
  float partials = 0;
  uint64_t flags = 0;
  a.kernel = GemmKernel::kPingpong128x128;
  a.num_blocks = 0;
  GemmSplitPiece piece;
  a.split_partials = &partials;
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("together"), std::string::npos) << s.reason;
  a.split_flags = &flags;
  a.split_pieces = &piece;
  a.split = GemmSplit{132, 2, 4};  // K = 256: 4 k-tiles
  EXPECT_TRUE(can_implement(a).ok) << can_implement(a).reason;
  a.split.k_tiles = 5;  // built for another K
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("5 k-tiles"), std::string::npos) << s.reason;
  a.split = GemmSplit{132, 1, 4};  // built for the cooperative configuration
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("1 tiles per block"), std::string::npos) << s.reason;
  a.split = GemmSplit{132, 2, 4};
  a.num_blocks = 66;
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("built for 132 blocks"), std::string::npos) << s.reason;
  a.num_blocks = 0;
  a.tile_claims = &counter;
  a.kernel = GemmKernel::kCooperative128x256;
  EXPECT_FALSE(can_implement(a).ok);
  a.tile_claims = nullptr;
  a.kernel = GemmKernel::kPingpong128x128Cluster2x1;
  s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("cannot split"), std::string::npos) << s.reason;
}

TEST(GroupedGemm, DescribesAScheduleOfAnotherConfiguration) {  // host only
  DeviceError e;
  e.claimed = 1;
  e.rank = 2;
  e.layer = 0;
  e.role = int(WaitRole::kBadSchedule);
  e.expected = 2;
  e.observed = 7;
  EXPECT_EQ(describe(e),
            "rank 2 layer0 grouped GEMM: 7 tiles are not whole clusters of 2 (a schedule built for another kernel "
            "configuration); no tile ran");
}

// kAuto splits GEMM1 on ping-pong at long K only (where it measured faster).
TEST(GroupedGemm, AutoSplitsLongKGemm1Only) {  // host only
  EXPECT_TRUE(choose_gemm_split(GemmEpilogue::kIdentity, GemmKernel::kPingpong128x128, 14336));
  EXPECT_TRUE(choose_gemm_split(GemmEpilogue::kIdentity, GemmKernel::kPingpong128x128, 6400));
  EXPECT_FALSE(choose_gemm_split(GemmEpilogue::kIdentity, GemmKernel::kPingpong128x128, 2048));
  EXPECT_FALSE(choose_gemm_split(GemmEpilogue::kSwiGlu, GemmKernel::kPingpong128x128, 14336));
  EXPECT_FALSE(choose_gemm_split(GemmEpilogue::kIdentity, GemmKernel::kPingpong128x128Cluster2x1, 14336));
  const GemmKernel gemm1 = choose_gemm_kernel(GemmEpilogue::kIdentity, 4096, 14336, 1);
  EXPECT_TRUE(choose_gemm_split(GemmEpilogue::kIdentity, gemm1, 14336)) << gemm_kernel_name(gemm1);
}

TEST(GroupedGemm, DescribesASplitPiecePastTheWorkspace) {  // host only
  DeviceError e;
  e.claimed = 1;
  e.role = int(WaitRole::kBadSchedule);
  e.signal = 40;
  e.expected = 0;
  e.observed = uint64_t(GemmSplitRole::kPartial);
  EXPECT_EQ(describe(e),
            "grouped GEMM: entry 40 is a split piece whose workspace slots lie past this launch's (a schedule built "
            "for a larger grid); it ran nothing");
}

TEST(GroupedGemm, MissingSignalTimesOutAndNamesIt) {
  COMET_REQUIRE_GPU();
  // With clusters, the late tile's partner (M tile 0) stalls with it: their B arrives together.
  for (GemmKernel kernel : kKernels) {
    const GemmCase c{"missing", GemmEpilogue::kIdentity, 256, 256, {200, 100}, 3, kernel};
    SCOPED_TRACE(c.describe());
    const GemmProblem p = make_gemm_problem(c);
    const int signals = p.max_rows / kGemmBlockM;
    SignalSetup s{std::vector<uint64_t>(signals, 7), std::vector<uint64_t>(signals, 7)};
    s.targets[1] = 8;  // M tile 1 (rows 128..255 of expert 0) never gets its data
    const GemmRun run = run_case(p, TileOrder::kRowMajor, &s, 50'000'000ull);
    ASSERT_EQ(run.error.claimed, 1);
    EXPECT_EQ(run.error.signal, 1);
    EXPECT_EQ(run.error.expected, 8u);
    EXPECT_EQ(run.error.observed, 7u);
    EXPECT_EQ(run.error.role, int(WaitRole::kGemmTileInput));
    EXPECT_NE(describe(run.error).find("signal 1 >= 8, observed 7"), std::string::npos) << describe(run.error);
  }
}

// A flag released late by another stream delays only the tiles that wait on it.
__global__ void release_after(uint64_t* flag, uint64_t delay_ns, uint64_t* released_at) {
  const uint64_t start = globaltimer_ns();
  while (globaltimer_ns() - start < delay_ns) __nanosleep(1000);
  *released_at = globaltimer_ns();
  red_release_gpu(flag, 1);
}

TEST(GroupedGemm, LateSignalDelaysOnlyItsTiles) {
  COMET_REQUIRE_GPU();
  for (GemmKernel kernel : kKernels) {
    const GemmCase c{"late", GemmEpilogue::kIdentity, 512, 512, {256, 256, 256, 256}, 9, kernel};
    SCOPED_TRACE(c.describe());
    const GemmProblem p = make_gemm_problem(c);
    const int signals = p.max_rows / kGemmBlockM, late = 5;
    std::vector<uint64_t> flags(signals, 1), targets(signals, 1);
    flags[late] = 0;
    DeviceGemm g(p, TileOrder::kRowMajor);
    const int nb = g.num_n_blocks;
    DeviceBuffer<uint64_t> dflags(flags), dtargets(targets), ends(g.capacity), released(1);
    ends.zero();
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    // Load the releasing kernel's module now: with lazy loading, a first launch while the GEMM
    // runs would wait for the GEMM, which waits for it.
    cudaFuncAttributes attributes;
    COMET_CUDA_CHECK(cudaFuncGetAttributes(&attributes, release_after));
    cudaStream_t gemm_stream, signal_stream;
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&gemm_stream, cudaStreamNonBlocking));
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&signal_stream, cudaStreamNonBlocking));
    GroupedGemmArgs args = g.args(p);
    args.wait_flags = dflags.get();
    args.wait_targets = dtargets.get();
    args.tile_end_ns = ends.get();
    args.num_blocks = 16;  // leave SMs free for the releasing kernel
    run_grouped_gemm(args, gemm_stream);
    release_after<<<1, 1, 0, signal_stream>>>(dflags.get() + late, 20'000'000ull, released.get());
    COMET_CUDA_CHECK_LAUNCH();
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    const DeviceError err = g.error.download()[0];
    EXPECT_EQ(err.claimed, 0) << describe(err);
    const std::vector<GemmTile> tile_list = g.tiles.download();
    const std::vector<uint64_t> end = ends.download();
    const uint64_t released_at = released.download()[0];
    const int n_tiles = g.num_tiles.download()[0];
    int early = 0, waited = 0;
    for (int t = 0; t < n_tiles; ++t) {
      if (tile_list[t].signal == late) {
        EXPECT_GE(end[t], released_at) << "tile " << t << " finished before its signal";
        ++waited;
      } else if (end[t] < released_at) {
        ++early;
      }
    }
    EXPECT_EQ(waited, nb);
    // Blocks run their tiles in order, so only tiles queued behind a late tile on the same
    // block (or cluster) may finish after the release; most others must not wait for it.
    EXPECT_GE(early, n_tiles / 2) << "independent tiles were held back by the late signal";
    cudaStreamDestroy(gemm_stream);
    cudaStreamDestroy(signal_stream);
  }
}

TEST(GroupedGemm, DoneFlagsCountTilesPerColumnBlock) {
  COMET_REQUIRE_GPU();
  for (GemmKernel kernel : kKernels) {
    const GemmCase c{"done", GemmEpilogue::kIdentity, 256, 768, {300, 0, 129}, 4, kernel};
    SCOPED_TRACE(c.describe());
    const GemmProblem p = make_gemm_problem(c);
    DeviceGemm g(p, TileOrder::kColumnBlockMajor);
    DeviceBuffer<uint64_t> done(g.num_n_blocks);
    done.zero();
    GroupedGemmArgs args = g.args(p);
    args.done_flags = done.get();
    for (int call = 1; call <= 3; ++call) {  // epoch counters: never reset between calls
      run_grouped_gemm(args, nullptr);
      COMET_CUDA_CHECK(cudaDeviceSynchronize());
      const int m_tiles = (300 + 127) / 128 + (129 + 127) / 128;
      for (uint64_t v : done.download()) EXPECT_EQ(v, uint64_t(call) * m_tiles);
    }
  }
}

}  // namespace
}  // namespace comet::cuda
