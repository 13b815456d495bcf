// `comet bench layer`: fused vs unfused vs compute-only vs communication-only, and the two
// baselines; W virtual ranks on one GPU, or the ranks over several GPUs (local and nccl fabrics).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <sstream>

#include "bench/layer_bench.h"
#include "bench/timing.h"
#include "comet/baseline.h"
#include "comet/cost_model.h"
#include "comet/dtype.h"
#include "comet/layer.h"
#include "comet/routing.h"
#include "core/process_env.h"
#include "cuda/check.h"
#include "cuda/device_info.h"
#include "cuda/random_fill.h"
#include "fabric/fabric.h"
#include "fabric/fabric_util.h"
#include "io/trace_writers.h"
#include "ref/oracle.h"

namespace comet::bench {

namespace {

constexpr int kLockstepWarmupRounds = 10;

// Several processes (nccl fabric) must run the same sequence of forwards: no time-based
// warm-up there, a fixed number of rounds instead, and every variant starts after a barrier of
// the ranks (`align`, timing.h: otherwise a forward would count the time its rank waits for a
// peer still busy with the previous variant, a part without a barrier).
std::vector<double> time_variants(const LayerBenchOptions& o, const std::vector<Variant>& variants, cudaStream_t stream,
                                  int iters, double warmup_ms, const Align& align) {
  if (o.fabric == "nccl") return time_interleaved(variants, stream, iters, 0, kLockstepWarmupRounds, align);
  return time_interleaved(variants, stream, iters, warmup_ms);
}

// Device inputs at full size of the ranks this process drives, each on its device, without
// host copies of x.
struct Inputs {
  std::vector<void*> owned;
  std::vector<RankTensors> tensors;
  std::vector<Routing> routing;  // host copy of every rank's (local or not), for the bytes and the bound
  ~Inputs() {
    for (void* p : owned) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    COMET_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    owned.push_back(p);
    return p;
  }
};

// The routing from `routing_seed`, the tokens' values from `x_seed`.
std::unique_ptr<Inputs> make_inputs(const LayerConfig& c, const fabric::Fabric& f, int tokens, const RoutingSpec& spec,
                                    uint64_t routing_seed, uint64_t x_seed) {
  auto in = std::make_unique<Inputs>();
  const int H = c.model.hidden, K = c.model.topk, Tm = c.max_tokens_per_rank;
  fabric::detail::DeviceGuard guard;  // the caller's device again on return, or on a throw
  for (int r = 0; r < c.layout.world; ++r) {
    const Routing rt = generate_routing(spec, tokens, c.model.routed_experts(), K, routing_seed, r);
    in->routing.push_back(rt);
    if (!f.is_local(r)) continue;
    COMET_CUDA_CHECK(cudaSetDevice(f.device_of(r)));
    RankTensors t;
    void* x = in->alloc(size_t(Tm) * H * 2);
    cuda::fill_uniform_bf16(x, size_t(Tm) * H, x_seed * 1000 + r, 1.f);
    auto* ids = static_cast<int32_t*>(in->alloc(size_t(Tm) * K * 4));
    auto* w = static_cast<float*>(in->alloc(size_t(Tm) * K * 4));
    auto* count = static_cast<int32_t*>(in->alloc(4));
    COMET_CUDA_CHECK(cudaMemcpy(ids, rt.expert_ids.data(), rt.expert_ids.size() * 4, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(w, rt.weights.data(), rt.weights.size() * 4, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(count, &rt.num_tokens, 4, cudaMemcpyHostToDevice));
    t.x = x;
    t.expert_ids = ids;
    t.weights = w;
    t.num_tokens = count;
    t.y = in->alloc(size_t(Tm) * H * 2);
    in->tensors.push_back(t);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());  // this rank's device: its copies have landed
  }
  return in;
}

std::vector<uint16_t> download_all_y(const LayerConfig& c, const Inputs& in, int tokens) {
  std::vector<uint16_t> out;
  const size_t n = size_t(tokens) * c.model.hidden;
  for (const RankTensors& t : in.tensors) {
    std::vector<uint16_t> y(n);
    COMET_CUDA_CHECK(cudaMemcpy(y.data(), t.y, n * 2, cudaMemcpyDeviceToHost));
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

// Every rank's y rows filled with 0xffff (bf16 NaN) before a checked forward: y still holds the
// previous forward's output, which a forward that wrote nothing would pass off as its own.
void poison_all_y(const LayerConfig& c, const Inputs& in, int tokens) {
  const std::vector<uint16_t> nan(size_t(tokens) * c.model.hidden, 0xffff);
  // A copy from pageable memory returns before its DMA has landed, and it runs on the legacy
  // stream, which the bench's non-blocking stream does not wait for: without the sync the poison
  // could land after a short forward wrote y (qwen2 at W = 1, T = 1024 after another workload).
  // Each on its rank's device (the local fabric spreads the ranks over GPUs).
  fabric::detail::DeviceGuard guard;
  for (const RankTensors& t : in.tensors) {
    cudaPointerAttributes where{};
    COMET_CUDA_CHECK(cudaPointerGetAttributes(&where, t.y));
    COMET_CUDA_CHECK(cudaSetDevice(where.device));
    COMET_CUDA_CHECK(cudaMemcpy(t.y, nan.data(), nan.size() * 2, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

// Every rank's y rows after one forward of `layer` with its current options into poisoned y
// and a poisoned workspace (LayerOptions::poison_workspace: a row the forward should have moved
// but did not is NaN, not the previous forward's, which the same inputs make equal), checked
// for device errors (the comparisons of fused, unfused and traced forwards read this).
std::vector<uint16_t> checked_forward(MoeLayer& layer, const LayerConfig& c, const Inputs& in, int tokens,
                                      cudaStream_t stream) {
  const LayerOptions options = layer.options();
  LayerOptions poisoned = options;
  poisoned.poison_workspace = true;
  layer.set_options(poisoned);
  poison_all_y(c, in, tokens);
  layer.forward(in.tensors, stream);
  layer.check(stream);
  layer.set_options(options);
  return download_all_y(c, in, tokens);
}

// got against want (bf16 bits, every rank's [T][hidden] rows concatenated) with the oracle's comparison.
ref::Comparison compare_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int hidden) {
  std::vector<std::vector<float>> g(1);
  std::vector<std::vector<double>> w(1);
  for (uint16_t b : got) g[0].push_back(bf16_bits_to_float(b));
  for (uint16_t b : want) w[0].push_back(bf16_bits_to_float(b));
  return ref::compare_outputs(g, w, hidden);
}

BaselineOptions with_link(BaselineOptions options, const LinkEmulation& link) {
  options.link = link;
  return options;
}

// The cost model's rates for this GPU (H200's when the name matches none), the link rate
// replaced by the emulated one when on; the name says which.
GpuSpec bound_spec(const LinkEmulation& link) {
  const std::string device = cuda::query_device_info().name;
  const GpuSpec* known = find_gpu_spec(device);
  GpuSpec gpu = known ? *known : gpu_spec("H200");
  if (!known) gpu.name += " rates (device " + device + ")";
  if (link.on()) {
    gpu.link_gbps = link.gbps;
    gpu.name += ", emulated link";
  }
  return gpu;
}

// The baselines of one workload on their own fabric, with MoeLayer's weights (same seed).
struct Baselines {
  std::unique_ptr<fabric::Fabric> fabric;
  std::unique_ptr<BaselineMoe> layer;
  BaselineGemm gemm = BaselineGemm::kPerExpertLoop;
};

// Verifies every baseline variant against `want` (Comet's unfused output on the same inputs)
// before anything of it is timed, and picks the faster cuBLAS variant with a short timing.
// Leaves `b.layer` empty (and says why in the row) when the device has too little memory left.
// `layer_fabric` (the Comet layer's) decides with the other ranks: with one process per rank,
// each sees only its own GPU's free memory, and making the baselines' fabric is collective.
void prepare_baselines(const LayerConfig& c, const LayerBenchOptions& o, const Inputs& in, int tokens,
                       const std::vector<uint16_t>& want, cudaStream_t stream, const Align& align,
                       fabric::Fabric& layer_fabric, LayerBenchRow& row, Baselines& b) {
  size_t free_bytes = 0, total_bytes = 0;
  COMET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // device_bytes counts every rank; each GPU holds its ranks' share.
  const int64_t need = BaselineMoe::device_bytes(c) / layer_fabric.gpus();
  const bool fits_here = double(need) <= 0.9 * double(free_bytes);
  const bool fits_everywhere = layer_fabric.min_max(fits_here, "whether the baselines fit in GPU memory").first == 1;
  if (!fits_everywhere) {
    std::ostringstream os;
    os.precision(1);
    os << std::fixed << "baselines not run: they need " << need / double(1 << 30) << " GiB, "
       << free_bytes / double(1 << 30) << " GiB free next to the Comet layer"
       << (fits_here ? " here, less on another rank's GPU" : "");
    row.baseline_note = os.str();
    return;
  }
  b.fabric = fabric::make_fabric(o.fabric, c.layout.world);
  b.layer = std::make_unique<BaselineMoe>(c, *b.fabric);
  b.layer->set_random_weights(o.seed);
  row.baselines_match = true;
  auto check = [&](const BaselineOptions& options) {
    b.layer->set_options(with_link(options, o.link));
    poison_all_y(c, in, tokens);
    b.layer->forward(in.tensors, stream);
    b.fabric->wait(stream, "waiting for a baseline forward");
    const ref::Comparison cmp = compare_bf16(download_all_y(c, in, tokens), want, c.model.hidden);
    row.baseline_rel_l2 = std::max(row.baseline_rel_l2, cmp.non_finite ? INFINITY : cmp.rel_l2);
    row.baselines_match = row.baselines_match && cmp.within(ref::tolerance_for(DType::kBF16));
  };
  const BaselineGemm kinds[] = {BaselineGemm::kPerExpertLoop, BaselineGemm::kGroupedBatched};
  for (BaselineGemm gemm : kinds) check(sequential_baseline(gemm));
  const BaselineTraffic traffic = b.layer->last_traffic();
  row.baseline_remote_bytes = traffic.dispatch_remote_bytes + traffic.combine_remote_bytes;
  std::vector<Variant> gemms;
  for (BaselineGemm gemm : kinds)
    gemms.push_back({baseline_gemm_name(gemm), [&b, &in, &o, gemm](cudaStream_t st) {
                       b.layer->set_options(with_link(sequential_baseline(gemm), o.link));
                       b.layer->forward(in.tensors, st);
                     }});
  const std::vector<double> us = time_variants(o, gemms, stream, std::max(3, o.iters / 4), o.warmup_ms / 4, align);
  b.gemm = us[1] < us[0] ? BaselineGemm::kGroupedBatched : BaselineGemm::kPerExpertLoop;
  row.baseline_gemm = baseline_gemm_name(b.gemm);
  for (int chunks : o.chunks) check(chunked_baseline(chunks, b.gemm));
}

// One more fused forward of the row with its timeline recorded (after the timing, on a warm
// GPU); its output must still equal the unfused one.
void trace_row(MoeLayer& layer, LayerOptions options, const Inputs& in, const LayerConfig& c, const LayerBenchOptions& o,
               bool several_rows, const std::vector<uint16_t>& want, LayerBenchRow& row, size_t row_index,
               std::set<std::string>& trace_paths, cudaStream_t stream) {
  options.trace = true;
  layer.set_options(options);
  row.fused_equals_unfused = row.fused_equals_unfused && checked_forward(layer, c, in, row.tokens, stream) == want;
  Trace t = layer.read_trace(stream);
  options.trace = false;
  layer.set_options(options);
  const cuda::DeviceInfo info = cuda::query_device_info();
  std::ostringstream title;
  title << "comet bench layer: " << row.model << ", " << row.tokens << " tokens per rank, W " << row.world << " = EP "
        << row.ep << " x TP " << row.tp << ", fused kernels, n_comm " << row.n_comm0 << "/" << row.n_comm1 << ", "
        << info.name << " (" << info.num_sms << " SMs), "
        << o.fabric << " fabric: "
        << (row.ranks_per_gpu == row.world ? "the ranks' kernels run one after another"
            : row.ranks_per_gpu > 1 ? std::to_string(row.ranks_per_gpu) + " ranks per GPU, one after another on each"
                                    : std::string("one GPU per rank"));
  t.title = title.str();
  // With one process per rank each writes its own rank's timeline, "-rank<r>" before ".json".
  const bool per_process = o.fabric == "nccl";
  std::string suffix;
  if (several_rows) {
    // The routing as a file name: "zipf:1.2 mask:0.1" -> "zipf1.2-mask0.1".
    std::string routing;
    for (char ch : row.routing) {
      if (ch == ' ') routing += '-';
      else if (ch != ':') routing += ch;
    }
    suffix += "-" + row.model + "-ep" + std::to_string(row.ep) + "-tp" + std::to_string(row.tp) + "-" + routing +
              "-t" + std::to_string(row.tokens) + "-n" + std::to_string(row.n_comm0) + "-" +
              std::to_string(row.n_comm1) + "-g" + std::to_string(row.layer0_group_m) + "-s" +
              std::to_string(row.layer0_stages) + "-u" + unfused_gemms_name(row.unfused_gemms) +
              "-c" + layer0_copies_name(row.layer0.copies) +
              "-o" + dispatch_order_name(row.layer0.order) + "-e" + on_off(row.epilogue_combine) + "-l" +
              layer1_combine_name(row.layer1_combine) + "-k" + (row.split_gemms == "-" ? "none" : row.split_gemms);
  }
  if (per_process) suffix += io::trace_rank_suffix(row.rank);
  row.trace_path = unique_trace_path(io::trace_path_with_suffix(o.trace_path, suffix), row_index, trace_paths);
  io::TimelineOptions svg;
  svg.ranks = per_process ? std::vector<int>{row.rank} : o.trace_ranks;
  io::write_trace_files(t, row.trace_path, svg);
  row.trace_events = int64_t(t.events.size());
  row.trace_dropped = t.dropped_events;
  for (int l = 0; l < 2; ++l) row.timeline[l] = core::timeline_overlap(t, row.rank, l);
}

}  // namespace

void run_layer_bench(const LayerBenchOptions& o, const LayerProgress& progress, std::vector<LayerBenchRow>& rows) {
  const std::vector<std::string> models = o.models.empty() ? ModelPresets::names() : o.models;
  if (o.fabric == "nccl")  // the stream below must live on this rank's GPU (comet/layer.h)
    if (const std::optional<ProcessEnv> env = read_process_env())
      fabric::detail::set_local_rank_device(env->local_rank);
  const OwnedStream owned_stream;
  const cudaStream_t stream = owned_stream.stream;
  std::set<std::string> trace_paths;  // the trace files this run wrote (unique_trace_path)
  // Workloads: layout-major, then model, tokens per rank and routing.
  struct Workload {
    int ep, tp;
    std::string name;
    int tokens;
    RoutingSpec routing;
  };
  std::vector<Workload> workloads;
  const std::vector<std::pair<int, int>> layouts =
      o.layouts.empty() ? std::vector<std::pair<int, int>>{{o.ep, o.tp}} : o.layouts;
  for (const auto& [ep, tp] : layouts)
    for (const std::string& name : models)
      for (int tokens : o.tokens)
        for (const RoutingSpec& routing : o.routings) workloads.push_back({ep, tp, name, tokens, routing});
  const int combos = int(o.n_comm0.size() * o.n_comm1.size() * o.layer0_group_m.size() * o.layer0_stages.size() *
                         o.unfused_gemms.size() * o.layer0_copies.size() * o.dispatch_orders.size() *
                         o.epilogue_combine.size() * o.layer1_combine.size() * o.split_gemms.size());
  const int total = int(workloads.size()) * combos;
  int done = 0;
  for (const Workload& w : workloads) {
    const std::string& name = w.name;
    const int tokens = w.tokens;
    const std::string label = name + " T=" + std::to_string(tokens) + " EPxTP=" + std::to_string(w.ep) + "x" +
                              std::to_string(w.tp) + " routing " + w.routing.describe();
    // Named before the layer is built, so that a workload the GPU cannot hold is the one shown.
    if (progress) progress(done, total, label);
    LayerConfig c;
    c.model = ModelPresets::get(name);
    c.layout = {w.ep * w.tp, w.ep, w.tp};
    c.max_tokens_per_rank = tokens;
    auto fabric = fabric::make_fabric(o.fabric, c.layout.world);
    MoeLayer layer(c, *fabric);
    layer.set_random_weights(o.seed);
    layer.set_tuning_table(o.tuning);
    LayerOptions tuned;  // the default path, as the table decides it for this workload
    tuned.link = o.link;
    layer.set_options(tuned);
    const PathChoice tuned_path = layer.path();
    const std::unique_ptr<Inputs> in = make_inputs(c, *fabric, tokens, w.routing, o.seed, o.seed);
    // The timed forwards alternate between `in` and a second input set in other memory: the
    // same routing (so both time one workload, the one the bytes and the bound describe), the
    // tokens' values of the next seed. Consecutive forwards, of any variant, take the two in
    // turn (one counter for all), so no forward finds its inputs left in L2 by the one before.
    // Every check uses `in`.
    const std::unique_ptr<Inputs> alt = make_inputs(c, *fabric, tokens, w.routing, o.seed, o.seed + 1);
    const std::vector<const Inputs*> rotation{in.get(), alt.get()};
    size_t forwards = 0;  // timed forwards of the workload so far, every variant's
    // Bytes between ranks and the lower bound, from the same routing on the host.
    const DispatchPlan plan(c, in->routing);
    const double remote_bytes = total_link_bytes(c, plan);
    const GpuSpec gpu = bound_spec(o.link);
    const LayerCost cost = layer_cost(c, plan, gpu);
    // The unfused output once per workload: every fused variant must equal it bitwise. Unsplit:
    // split GEMMs (LayerOptions::split_gemms) round their tiles' sums differently.
    LayerOptions unfused;
    unfused.path = ForwardPath::kUnfused;  // not kTuned: a --tuning table could choose fused
    unfused.link = o.link;
    unfused.split_gemms = false;
    layer.set_options(unfused);
    const std::vector<uint16_t> want = checked_forward(layer, c, *in, tokens, stream);
    // Every comparison of the workload is against this output: a non-finite value in it (the
    // poison of a row never written, or an overflow) would make them all meaningless.
    // Agreed over the processes first (with one per rank each sees its own): all stop together.
    const uint64_t non_finite = uint64_t(
        std::count_if(want.begin(), want.end(), [](uint16_t b) { return !std::isfinite(bf16_bits_to_float(b)); }));
    const uint64_t most = fabric->min_max(non_finite, "the unfused reference output's non-finite values").second;
    COMET_CHECK(most == 0, "comet bench layer: the unfused forward of " << name << " at " << tokens
                               << " tokens per rank wrote non-finite values (" << most
                               << " on the worst rank); the bench stops rather than compare against them");
    // The baselines once per workload, verified against the same output; every row of the
    // sweep starts from their fields.
    LayerBenchRow baseline_row;
    Baselines base;
    const Align align = [&layer](cudaStream_t st) { layer.run_part(MoeLayer::Part::kBarrier, st); };
    if (o.baselines)
      prepare_baselines(c, o, *in, tokens, want, stream, align, *fabric, baseline_row, base);
    for (int n0 : o.n_comm0)
      for (int n1 : o.n_comm1)
        for (int group : o.layer0_group_m)
        for (int stages : o.layer0_stages)
        for (UnfusedGemms unfused_gemms : o.unfused_gemms)
        for (std::optional<Layer0Copies> copies0 : o.layer0_copies)
        for (std::optional<DispatchOrder> order0 : o.dispatch_orders)
        for (bool epilogue_combine : o.epilogue_combine)
        for (std::optional<bool> split_gemms : o.split_gemms)
        for (std::optional<Layer1Combine> combine1 : o.layer1_combine) {
          if ((copies0 == Layer0Copies::kGemmBlocks && n0 != o.n_comm0.front()) ||  // n_comm0 unused
              (combine1 == Layer1Combine::kGemmBlocks && n1 != o.n_comm1.front())) {  // n_comm1 unused
            ++done;
            continue;
          }
          if (progress) progress(done, total, label);
          LayerOptions fused;
          fused.link = o.link;
          fused.path = ForwardPath::kFused;
          fused.unfused_gemms = unfused_gemms;  // compute-only runs the unfused GEMMs under either
          fused.epilogue_combine = epilogue_combine;
          fused.layer1_combine = combine1;
          LayerOptions unfused_row = unfused;  // timed with the row's split (unset: the layer's default)
          unfused_row.split_gemms = split_gemms;
          fused.split_gemms = split_gemms;  // compute-only runs the unfused GEMMs under either
          unfused_row.unfused_gemms = unfused_gemms;
          unfused_row.epilogue_combine = epilogue_combine;
          unfused_row.layer1_combine = combine1;
          fused.n_comm0 = n0;
          fused.n_comm1 = n1;
          fused.layer0_group_m = group;
          fused.layer0_stages = stages;
          fused.layer0_copies = copies0;
          fused.dispatch_order = order0;
          layer.set_options(fused);
          LayerBenchRow row = baseline_row;
          row.model = name;
          row.fabric = o.fabric;
          row.rank = fabric->first_local_rank();
          row.tokens = tokens;
          row.world = c.layout.world;
          row.ep = w.ep;
          row.tp = w.tp;
          row.routing = w.routing.describe();
          row.n_comm0 = layer.n_comm().n_comm0;
          row.n_comm1 = layer.n_comm().n_comm1;
          row.layer0_group_m = group;
          row.layer0_stages = stages;
          row.unfused_gemms = unfused_gemms;
          row.layer0 = layer.layer0_mode().mode;
          row.epilogue_combine = epilogue_combine;
          row.layer1_combine = layer.layer1_combine().combine;
          row.half_tiles = layer.half_tiles();
          row.n_comm_source = layer.n_comm().source;
          row.tuned_fused = tuned_path.fused;
          row.path_source = tuned_path.source;
          row.fused_equals_unfused = checked_forward(layer, c, *in, tokens, stream) == want;
          if (unfused_gemms != unfused.unfused_gemms || epilogue_combine != unfused.epilogue_combine ||
              combine1 != unfused.layer1_combine) {
            // this row's unfused forward gives the same output too
            LayerOptions unsplit = unfused_row;
            unsplit.split_gemms = false;
            layer.set_options(unsplit);
            row.fused_equals_unfused = row.fused_equals_unfused && checked_forward(layer, c, *in, tokens, stream) == want;
          }
          layer.set_options(unfused_row);
          row.split_gemms.clear();
          for (int l = 0; l < 2; ++l)
            if (layer.split_gemms(l)) row.split_gemms += std::to_string(l);
          if (row.split_gemms.empty()) {
            row.split_gemms = "-";
          } else {  // the split unfused forward: deterministic, within bf16 rounding of the unsplit one
            const std::vector<uint16_t> split = checked_forward(layer, c, *in, tokens, stream);
            const ref::Comparison cmp = compare_bf16(split, want, c.model.hidden);
            row.split_within_tolerance = cmp.within(ref::tolerance_for(DType::kBF16)) &&
                                         checked_forward(layer, c, *in, tokens, stream) == split;
          }

          std::vector<Variant> variants = {
              {"fused",
               [&](cudaStream_t st) {
                 layer.set_options(fused);
                 layer.forward(rotation[forwards++ % rotation.size()]->tensors, st);
               }},
              {"unfused",
               [&](cudaStream_t st) {
                 layer.set_options(unfused_row);
                 layer.forward(rotation[forwards++ % rotation.size()]->tensors, st);
               }},
              {"compute-only", [&](cudaStream_t st) { layer.run_part(MoeLayer::Part::kGemms, st); }},
              {"comm-only", [&](cudaStream_t st) { layer.run_part(MoeLayer::Part::kCommunication, st); }},
              // The plan of the fused forward (its tile order: --group-m0, --stages0), which
              // the fused GEMMs below then run on; compute-only and comm-only follow the
              // unfused forward, so they run on its plan.
              {"plan",
               [&](cudaStream_t st) {
                 layer.set_options(fused);
                 layer.run_part(MoeLayer::Part::kPlan, st);
               }},
              {"fused-gemms",  // the fused kernels of this row's options (n_comm, who copies)
               [&](cudaStream_t st) { layer.run_part(MoeLayer::Part::kFusedGemms, st); }},
          };
          const size_t first_baseline = variants.size();
          if (base.layer) {
            variants.push_back({"sequential", [&](cudaStream_t st) {
                                  base.layer->set_options(with_link(sequential_baseline(base.gemm), o.link));
                                  base.layer->forward(rotation[forwards++ % rotation.size()]->tensors, st);
                                }});
            for (int chunks : o.chunks)
              variants.push_back({"chunked", [&, chunks](cudaStream_t st) {
                                    base.layer->set_options(with_link(chunked_baseline(chunks, base.gemm), o.link));
                                    base.layer->forward(rotation[forwards++ % rotation.size()]->tensors, st);
                                  }});
          }
          const std::vector<double> us = time_variants(o, variants, stream, o.iters, o.warmup_ms, align);
          layer.check(stream);
          row.fused_us = us[0];
          row.unfused_us = us[1];
          row.compute_us = us[2];
          row.comm_us = us[3];
          row.plan_us = us[4];
          row.fused_gemms_us = us[5];
          if (base.layer) {
            row.sequential_us = us[first_baseline];
            for (size_t i = 0; i < o.chunks.size(); ++i)
              if (row.chunked_chunks == 0 || us[first_baseline + 1 + i] < row.chunked_us) {
                row.chunked_us = us[first_baseline + 1 + i];
                row.chunked_chunks = o.chunks[i];
              }
          }
          row.ranks_per_gpu = c.layout.world / fabric->gpus();
          if (!o.trace_path.empty())
            trace_row(layer, fused, *in, c, o, total > 1, want, row, rows.size(), trace_paths, stream);
          // GEMM FLOP of all ranks: every (token, slot) row through the expert's F/TP slice, per TP rank.
          // The rows the plan holds (masked slots have none; each of an expert's TP ranks holds
          // a row of F/TP), as the cost model counts them: over every rank of the layer.
          row.flop = double(plan.total_rows()) * double(c.model.flops_per_row()) / c.layout.tp;
          row.link = o.link;
          row.remote_bytes = remote_bytes;
          row.lower_bound_us = row.ranks_per_gpu > 1 ? cost.serial_lower_bound_us * row.ranks_per_gpu / c.layout.world
                                                     : cost.lower_bound_us;
          row.bound_by = cost.bound_by;
          row.bound_gpu = gpu.name;
          row.bound_link_gbps = gpu.link_gbps;
          rows.push_back(row);
          ++done;
        }
  }
  if (progress) progress(done, total, "done");
}

}  // namespace comet::bench
