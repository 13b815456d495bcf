// `comet bench gemm`: per preset and tokens per rank, the expert GEMMs of rank 0 at EP ranks
// (uniform routing), timed interleaved against cuBLAS and checked against its output.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>

#include "cuda/cublas_experts.h"
#include "bench/gemm_bench.h"
#include "bench/timing.h"
#include "comet/config.h"
#include "comet/routing.h"
#include "cuda/gemm_schedule.h"
#include "cuda/grouped_gemm.h"
#include "cuda/random_fill.h"

namespace comet::bench {

using cuda::CublasExperts;
using cuda::ExpertGemmShapes;

// The configurations timed with split schedules too (the last wave cut along K).
constexpr cuda::GemmKernel kSplitKernels[] = {cuda::GemmKernel::kCooperative128x256, cuda::GemmKernel::kPingpong128x128};

namespace {

template <class T>
struct Device {
  T* ptr = nullptr;
  explicit Device(size_t n) { COMET_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  ~Device() { cudaFree(ptr); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
};

// Deterministic pseudo-random bf16 in [-scale, scale): a hash of (stream, index), so two
// layouts of the same logical weight can be filled with identical values.
__device__ __forceinline__ float hash_value(uint64_t stream, uint64_t index, float scale) {
  uint64_t z = (stream * 0x9e3779b97f4a7c15ull) ^ (index + 0x632be59bd9b4e019ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float(z >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f) * scale;
}

// Logical gate/up weight (e, col, k) in the [E][2F][H] concat layout cuBLAS uses (gate rows
// [0,F), up rows [F,2F)) and in our packed layout (grouped_gemm.h), from the same hash.
__global__ void fill_w0_kernel(__nv_bfloat16* concat, __nv_bfloat16* packed, int num_experts, int f, int h,
                               int packed_rows, uint64_t stream, float scale) {
  const size_t total = size_t(num_experts) * 2 * f * h;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const int k = int(i % h);
    const size_t row = i / h;
    const int e = int(row / (2 * f)), r = int(row % (2 * f));
    const bool up = r >= f;
    const int col = up ? r - f : r;
    const __nv_bfloat16 v = __float2bfloat16(hash_value(stream, i, scale));
    concat[i] = v;
    const int block = col / comet::cuda::kSwiGluPack, within = col % comet::cuda::kSwiGluPack;
    const size_t prow = size_t(e) * packed_rows + size_t(block) * 2 * comet::cuda::kSwiGluPack +
                        (up ? comet::cuda::kSwiGluPack : 0) + within;
    packed[prow * h + k] = v;
  }
}

void fill(__nv_bfloat16* p, size_t n, uint64_t stream, float scale) { cuda::fill_uniform_bf16(p, n, stream, scale); }

std::vector<int> rank0_rows(const ModelShape& m, int ep, int tokens, uint64_t seed) {
  const int epr = m.num_experts / ep;
  std::vector<int> rows(epr, 0);
  for (int r = 0; r < ep; ++r) {
    const Routing rt = generate_routing(RoutingSpec{}, tokens, m.routed_experts(), m.topk, seed, r);
    for (int32_t e : rt.expert_ids)
      if (e >= 0 && e < epr) ++rows[e];
  }
  return rows;
}

float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void run_gemm_bench(const GemmBenchOptions& o, const Progress& progress, std::vector<GemmBenchRow>& rows_out) {
  std::vector<std::string> models = o.models.empty() ? ModelPresets::names() : o.models;
  const OwnedStream owned_stream;
  const cudaStream_t stream = owned_stream.stream;
  CublasExperts cublas;
  const int total = int(models.size() * o.tokens.size());
  int done = 0;
  for (const std::string& name : models) {
    const ModelShape& m = ModelPresets::get(name);
    COMET_CHECK(m.num_experts % o.ep == 0, name << ": " << m.num_experts << " experts are not divisible by EP=" << o.ep);
    for (int tokens : o.tokens) {
      if (progress) progress(done, total, name + " T=" + std::to_string(tokens));
      // The workload's two rows, handed to `rows_out` once verified: a workload that throws
      // leaves only the finished ones there.
      std::vector<GemmBenchRow> out;
      const int E = m.num_experts / o.ep, H = m.hidden, F = m.ffn;
      const std::vector<int> rows = rank0_rows(m, o.ep, tokens, o.seed);
      const std::vector<int> offsets = cuda::expert_row_offsets(rows);
      const int max_rows = std::max(cuda::kGemmBlockM, offsets.back());
      int total_rows = 0;
      for (int r : rows) total_rows += r;
      const int packed_rows = cuda::gemm_b_rows(cuda::GemmEpilogue::kSwiGlu, F);
      Device<__nv_bfloat16> a(size_t(max_rows) * H), w0_concat(size_t(E) * 2 * F * H), w0_packed(size_t(E) * packed_rows * H),
          w1(size_t(E) * H * F), inter(size_t(max_rows) * F), out1(size_t(max_rows) * H),
          c0(size_t(max_rows) * 2 * F), c1(size_t(max_rows) * H);
      COMET_CUDA_CHECK(cudaMemset(w0_packed.ptr, 0, size_t(E) * packed_rows * H * 2));
      fill(a.ptr, size_t(max_rows) * H, 1, 1.f);
      fill(inter.ptr, size_t(max_rows) * F, 2, 1.f);
      fill(w1.ptr, size_t(E) * H * F, 3, 1.f / std::sqrt(float(F)));
      fill_w0_kernel<<<1024, 256>>>(w0_concat.ptr, w0_packed.ptr, E, F, H, packed_rows, 4, 1.f / std::sqrt(float(H)));
      COMET_CUDA_CHECK_LAUNCH();

      // Device schedules (built once; in a layer they come from the metadata kernel), one per
      // kernel configuration since their tile widths differ.
      Device<int32_t> d_rows(E);
      COMET_CUDA_CHECK(cudaMemcpy(d_rows.ptr, rows.data(), E * sizeof(int32_t), cudaMemcpyHostToDevice));
      Device<cuda::DeviceError> error(1);
      Device<unsigned> claims(1);  // claimed tiles: zero once, every launch leaves it zero
      COMET_CUDA_CHECK(cudaMemset(claims.ptr, 0, sizeof(unsigned)));
      COMET_CUDA_CHECK(cudaMemset(error.ptr, 0, sizeof(cuda::DeviceError)));
      // The copy and memsets above ran on the legacy stream; the schedules are built on `stream`.
      COMET_CUDA_CHECK(cudaDeviceSynchronize());
      struct Schedule {
        std::unique_ptr<Device<cuda::GemmTile>> tiles;
        std::unique_ptr<Device<int32_t>> count;
        cuda::GemmSplit split;
        std::unique_ptr<Device<cuda::GemmSplitPiece>> pieces;
        std::unique_ptr<Device<float>> partials;
        std::unique_ptr<Device<uint64_t>> flags;
        bool split_used = false;  // the builder split it (gemm_split_plan)
      };
      auto schedule = [&](cuda::GemmEpilogue epi, int n, int k, cuda::GemmKernel kernel, cuda::TileOrder order,
                          bool split) {
        const int nb = cuda::gemm_num_n_blocks(epi, n, kernel);
        Schedule s;
        if (split) s.split = cuda::gemm_split_for(kernel, k);
        const int64_t cap = cuda::max_gemm_tiles(max_rows, E, nb, kernel, s.split);
        s.tiles = std::make_unique<Device<cuda::GemmTile>>(cap);
        s.count = std::make_unique<Device<int32_t>>(1);
        if (split) s.pieces = std::make_unique<Device<cuda::GemmSplitPiece>>(cap);
        cuda::build_gemm_tiles(d_rows.ptr, E, nb, kernel, order, s.tiles->ptr, s.count->ptr, cap, stream, nullptr, s.split,
                               split ? s.pieces->ptr : nullptr);
        if (split) {
          s.partials = std::make_unique<Device<float>>(cuda::gemm_split_partial_floats(kernel, s.split));
          s.flags = std::make_unique<Device<uint64_t>>(cuda::gemm_split_flags(s.split));
          COMET_CUDA_CHECK(cudaMemsetAsync(s.flags->ptr, 0, cuda::gemm_split_flags(s.split) * sizeof(uint64_t), stream));
          // The builder's decision, from the plan it runs (cuda/gemm_schedule.h).
          const int64_t tiles = int64_t(cuda::gemm_schedule_host(rows, nb, 1, order, cuda::gemm_tile_n(kernel)).size());
          s.split_used = cuda::gemm_split_plan(tiles, s.split).parts > 1;
        }
        return s;
      };
      auto make_args = [&](cuda::GemmEpilogue epi, cuda::GemmKernel kernel, int n, int k, const void* in,
                           const void* w, void* out, const Schedule& s) {
        cuda::GroupedGemmArgs g;
        g.epilogue = epi;
        g.kernel = kernel;
        g.num_experts = E;
        g.max_rows = max_rows;
        g.n = n;
        g.k = k;
        g.a = in;
        g.b = w;
        g.d = out;
        g.tiles = s.tiles->ptr;
        g.num_tiles = s.count->ptr;
        g.error = error.ptr;
        if (s.split.blocks > 0) {
          g.split_pieces = s.pieces->ptr;
          g.split_partials = s.partials->ptr;
          g.split_flags = s.flags->ptr;
          g.split = s.split;
        }
        return g;
      };
      const auto kSwiGlu = cuda::GemmEpilogue::kSwiGlu, kIdentity = cuda::GemmEpilogue::kIdentity;
      // GEMM0's output is GEMM1's input buffer: both are timed separately on fixed inputs. Every
      // configuration runs with its own schedule (the cooperative one also with claimed tiles);
      // "comet" is the one kAuto chooses.
      // Then the split schedules of the configurations that can split (args index kConfigs + i).
      constexpr int kConfigs = int(std::size(cuda::kGemmKernels)), kSplits = int(std::size(kSplitKernels));
      std::vector<Schedule> schedules0, schedules1;
      std::vector<cuda::GroupedGemmArgs> args0, args1;
      auto add_config = [&](cuda::GemmKernel kernel, bool split) {
        schedules0.push_back(schedule(kSwiGlu, F, H, kernel, cuda::TileOrder::kRowMajor, split));
        schedules1.push_back(schedule(kIdentity, H, F, kernel, cuda::TileOrder::kColumnBlockMajor, split));
        args0.push_back(make_args(kSwiGlu, kernel, F, H, a.ptr, w0_packed.ptr, inter.ptr, schedules0.back()));
        args1.push_back(make_args(kIdentity, kernel, H, F, inter.ptr, w1.ptr, out1.ptr, schedules1.back()));
      };
      for (cuda::GemmKernel kernel : cuda::kGemmKernels) add_config(kernel, false);
      for (cuda::GemmKernel kernel : kSplitKernels) add_config(kernel, true);
      const cuda::GroupedGemmArgs& g0 = args0[0];  // cooperative: the reference for the others
      const cuda::GroupedGemmArgs& g1 = args1[0];

      ExpertGemmShapes s0{rows, offsets, 2 * F, H}, s1{rows, offsets, H, F};
      struct Gemm {
        const char* name;
        const std::vector<cuda::GroupedGemmArgs>& configs;
        const std::vector<Schedule>& schedules;
        ExpertGemmShapes shapes;
        const void* a;
        const void* b;
        void* c;
      };
      for (const Gemm& g : {Gemm{"gemm0+swiglu", args0, schedules0, s0, a.ptr, w0_concat.ptr, c0.ptr},
                            Gemm{"gemm1", args1, schedules1, s1, inter.ptr, w1.ptr, c1.ptr}}) {
        cublas.prepare_grouped(g.shapes, g.a, g.b, g.c);
        cuda::GroupedGemmArgs claimed = g.configs[0];
        claimed.tile_claims = claims.ptr;
        std::vector<Variant> variants;
        for (int i = 0; i < kConfigs; ++i)
          variants.push_back({cuda::gemm_kernel_name(cuda::kGemmKernels[i]),
                              [&, i](cudaStream_t st) { cuda::run_grouped_gemm(g.configs[i], st); }});
        for (int i = kConfigs; i < kConfigs + kSplits; ++i)
          variants.push_back({std::string(cuda::gemm_kernel_name(g.configs[i].kernel)) + "+split",
                              [&, i](cudaStream_t st) { cuda::run_grouped_gemm(g.configs[i], st); }});
        variants.push_back({"comet-claimed", [&](cudaStream_t st) { cuda::run_grouped_gemm(claimed, st); }});
        variants.push_back({"cublas-loop", [&](cudaStream_t st) { cublas.per_expert_loop(g.shapes, g.a, g.b, g.c, st); }});
        variants.push_back({"cublas-grouped", [&](cudaStream_t st) { cublas.grouped(st); }});
        const std::vector<double> us = time_interleaved(variants, stream, o.iters, o.warmup_ms);
        const cuda::GroupedGemmArgs& first = g.configs[0];
        const cuda::GemmKernel chosen = cuda::choose_gemm_kernel(first.epilogue, first.n, first.k, E);
        GemmBenchRow row;
        row.model = name;
        row.gemm = g.name;
        row.tokens = tokens;
        row.experts = E;
        row.rows = total_rows;
        row.n = first.n;
        row.k = first.k;
        row.flop = 2.0 * total_rows * double(g.shapes.n) * g.shapes.k;
        row.kernel = cuda::gemm_kernel_name(chosen);
        for (int i = 0; i < kConfigs; ++i) {
          row.config_us.push_back(us[i]);
          if (cuda::kGemmKernels[i] == chosen) row.ours_us = us[i];
        }
        // kAuto's schedule is split where choose_gemm_split asks and the plan splits.
        const bool auto_split = cuda::choose_gemm_split(first.epilogue, chosen, first.k);
        for (int i = 0; i < kSplits; ++i) {
          row.split_us.push_back(us[kConfigs + i]);
          row.split_used.push_back(g.schedules[kConfigs + i].split_used);
          if (auto_split && kSplitKernels[i] == chosen && row.split_used.back()) {
            row.ours_us = us[kConfigs + i];
            row.kernel += "+split";
          }
        }
        row.claimed_us = us[kConfigs + kSplits];
        row.cublas_loop_us = us[kConfigs + kSplits + 1];
        row.cublas_grouped_us = us[kConfigs + kSplits + 2];
        out.push_back(row);
      }

      // Verify: run once more, both sides into outputs filled with bf16 NaN (the timed runs left
      // their results there), and compare sampled elements with cuBLAS's output.
      auto poison = [&](void* p, size_t elements) { COMET_CUDA_CHECK(cudaMemsetAsync(p, 0xff, elements * 2, stream)); };
      poison(inter.ptr, size_t(max_rows) * F);
      poison(c0.ptr, size_t(max_rows) * 2 * F);
      cuda::run_grouped_gemm(g0, stream);
      cublas.per_expert_loop(s0, a.ptr, w0_concat.ptr, c0.ptr, stream);
      sync_or_name_hang(stream, name + " T=" + std::to_string(tokens) + " gemm0+swiglu against cuBLAS");
      // Rows past an expert's end are not part of the output (the cooperative kernels leave them
      // unwritten when a consumer warpgroup's 64 rows all lie there): compared as zeros.
      std::vector<bool> expert_row(size_t(max_rows), false);
      for (size_t e = 0; e < rows.size(); ++e)
        std::fill_n(expert_row.begin() + offsets[e], rows[e], true);
      auto expert_rows_only = [&](std::vector<uint16_t> v) {
        const size_t cols = v.size() / size_t(max_rows);
        for (size_t r = 0; r < size_t(max_rows); ++r)
          if (!expert_row[r]) std::fill_n(v.begin() + r * cols, cols, uint16_t(0));
        return v;
      };
      std::vector<uint16_t> ours0(size_t(max_rows) * F), ref0(size_t(max_rows) * 2 * F);
      COMET_CUDA_CHECK(cudaMemcpy(ours0.data(), inter.ptr, ours0.size() * 2, cudaMemcpyDeviceToHost));
      ours0 = expert_rows_only(std::move(ours0));
      COMET_CUDA_CHECK(cudaMemcpy(ref0.data(), c0.ptr, ref0.size() * 2, cudaMemcpyDeviceToHost));
      poison(out1.ptr, size_t(max_rows) * H);
      poison(c1.ptr, size_t(max_rows) * H);
      cuda::run_grouped_gemm(g1, stream);
      cublas.per_expert_loop(s1, inter.ptr, w1.ptr, c1.ptr, stream);
      sync_or_name_hang(stream, name + " T=" + std::to_string(tokens) + " gemm1 against cuBLAS");
      std::vector<uint16_t> ours1(size_t(max_rows) * H), ref1(size_t(max_rows) * H);
      COMET_CUDA_CHECK(cudaMemcpy(ours1.data(), out1.ptr, ours1.size() * 2, cudaMemcpyDeviceToHost));
      ours1 = expert_rows_only(std::move(ours1));
      COMET_CUDA_CHECK(cudaMemcpy(ref1.data(), c1.ptr, ref1.size() * 2, cudaMemcpyDeviceToHost));
      // The timed claimed-tile launches and the other configurations must reproduce those
      // outputs bit for bit (the same k order per element): each runs into a poisoned output
      // (GEMM1 after GEMM0 rewrote its input `inter`), compared on the experts' rows.
      auto run_poisoned = [&](const cuda::GroupedGemmArgs& args, size_t elements) {
        poison(args.d, elements);
        cuda::run_grouped_gemm(args, stream);
        std::vector<uint16_t> got(elements);
        const std::string what = std::string(cuda::gemm_kernel_name(args.kernel)) + " on " + name + " T=" +
                                 std::to_string(tokens) + (args.epilogue == kSwiGlu ? " gemm0+swiglu" : " gemm1");
        copy_to_host_or_name_hang(got.data(), args.d, got.size() * 2, stream, what);
        return expert_rows_only(std::move(got));
      };
      auto same_output = [&](const cuda::GroupedGemmArgs& args, const std::vector<uint16_t>& want) {
        return run_poisoned(args, want.size()) == want;
      };
      cuda::GroupedGemmArgs claimed0_args = g0, claimed1_args = g1;
      claimed0_args.tile_claims = claimed1_args.tile_claims = claims.ptr;
      const bool claimed0 = total_rows == 0 || same_output(claimed0_args, ours0);
      const bool claimed1 = total_rows == 0 || same_output(claimed1_args, ours1);
      // Configurations whose output is not the cooperative one's. GEMM1's checks read `inter`, so
      // GEMM0's cooperative output is restored after GEMM0's checks. A split schedule's output
      // differs by the fp32 rounding of its split tiles' sums (bitwise when it did not split):
      // every element within 2^-7 of its magnitude plus 1% of the output's rms (two bf16
      // roundings apart at most, and cancelling sums), and repeatable bit for bit (run twice).
      auto close_output = [&](const cuda::GroupedGemmArgs& args, const std::vector<uint16_t>& want, double& max_diff) {
        const std::vector<uint16_t> got = run_poisoned(args, want.size());
        double sum2 = 0;  // an element's scale floor: 1% of the output's rms (cancelling sums)
        size_t finite = 0;
        for (uint16_t w : want)
          if (std::isfinite(bf16_to_float(w))) sum2 += double(bf16_to_float(w)) * bf16_to_float(w), ++finite;
        const double floor = 1e-2 * std::sqrt(sum2 / std::max<size_t>(finite, 1)) + 1e-30;
        bool ok = true;
        for (size_t i = 0; i < got.size(); ++i) {
          const double x = bf16_to_float(got[i]), y = bf16_to_float(want[i]);
          if (std::isnan(y)) continue;  // rows past the experts' ends inside no tile
          const double d = std::abs(x - y) / (std::max(std::abs(x), std::abs(y)) + floor);
          if (!(d <= 1.0 / 128)) ok = false;
          if (std::isfinite(d)) max_diff = std::max(max_diff, d);
        }
        return ok && same_output(args, got);
      };
      double split_diff0 = 0, split_diff1 = 0;
      auto differing = [&](const std::vector<cuda::GroupedGemmArgs>& configs, const std::vector<Schedule>& schedules,
                           const std::vector<uint16_t>& want, double& split_diff) {
        std::string names;
        for (int i = 1; i < kConfigs + kSplits && total_rows > 0; ++i) {
          const bool split = i >= kConfigs && schedules[i].split_used;
          if (split ? !close_output(configs[i], want, split_diff) : !same_output(configs[i], want))
            names += (names.empty() ? "" : ",") + std::string(cuda::gemm_kernel_name(configs[i].kernel)) + (i >= kConfigs ? "+split" : "");
        }
        return names;
      };
      std::string differs0 = differing(args0, schedules0, ours0, split_diff0);
      if (total_rows > 0 && !same_output(g0, ours0)) differs0 += " (cooperative not repeatable)";
      const std::string differs1 = differing(args1, schedules1, ours1, split_diff1);
      cuda::DeviceError err;
      COMET_CUDA_CHECK(cudaMemcpy(&err, error.ptr, sizeof err, cudaMemcpyDeviceToHost));
      Rng rng(o.seed + tokens);
      double err0 = 0, err1 = 0, scale0 = 0, scale1 = 0;
      // A sampled element's error: infinite when either side is not finite (the poison left in
      // place, or an overflow), which std::max would otherwise pass over as a NaN.
      auto sample_err = [](float got, float want) {
        return std::isfinite(got) && std::isfinite(want) ? double(std::abs(got - want)) : double(INFINITY);
      };
      for (int sample = 0; sample < 4096 && total_rows > 0; ++sample) {
        int e = rng.uniform_int(E);
        while (rows[e] == 0) e = (e + 1) % E;
        const int row = offsets[e] + rng.uniform_int(rows[e]);
        const int c = rng.uniform_int(F);
        const float g = bf16_to_float(ref0[size_t(row) * 2 * F + c]), u = bf16_to_float(ref0[size_t(row) * 2 * F + F + c]);
        const float want0 = g / (1.f + std::exp(-g)) * u;
        err0 = std::max(err0, sample_err(bf16_to_float(ours0[size_t(row) * F + c]), want0));
        scale0 = std::max(scale0, double(std::abs(want0)));
        const int c1i = rng.uniform_int(H);
        const float want1 = bf16_to_float(ref1[size_t(row) * H + c1i]);
        err1 = std::max(err1, sample_err(bf16_to_float(ours1[size_t(row) * H + c1i]), want1));
        scale1 = std::max(scale1, double(std::abs(want1)));
      }
      // Error relative to the largest magnitude seen: bf16 outputs of both sides (2^-8 each)
      // plus the SwiGLU recomputed from cuBLAS's rounded gate/up values.
      GemmBenchRow& r0 = out[out.size() - 2];
      GemmBenchRow& r1 = out[out.size() - 1];
      r0.max_rel_err = scale0 > 0 ? err0 / scale0 : err0;
      r1.max_rel_err = scale1 > 0 ? err1 / scale1 : err1;
      r0.claimed_matches = claimed0;
      r1.claimed_matches = claimed1;
      r0.configs_differ = differs0;
      r1.configs_differ = differs1;
      r0.split_max_rel_diff = split_diff0;
      r1.split_max_rel_diff = split_diff1;
      r0.verified = !err.claimed && r0.max_rel_err < 3e-2 && claimed0 && differs0.empty();
      r1.verified = !err.claimed && r1.max_rel_err < 3e-2 && claimed1 && differs1.empty();
      rows_out.insert(rows_out.end(), out.begin(), out.end());
      ++done;
    }
  }
  if (progress) progress(done, total, "done");
}

}  // namespace comet::bench
