// `comet bench layer`: fused vs unfused vs compute-only vs communication-only, one GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "bench/layer_bench.h"
#include "bench/timing.h"
#include "comet/layer.h"
#include "comet/routing.h"
#include "cuda/check.h"
#include "cuda/random_fill.h"
#include "fabric/fabric.h"

namespace comet::bench {

namespace {

// Device inputs of every rank at full size, without host copies of x.
struct Inputs {
  std::vector<void*> owned;
  std::vector<RankTensors> tensors;
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

std::unique_ptr<Inputs> make_inputs(const LayerConfig& c, int tokens, uint64_t seed) {
  auto in = std::make_unique<Inputs>();
  const int W = c.layout.world, H = c.model.hidden, K = c.model.topk, Tm = c.max_tokens_per_rank;
  for (int r = 0; r < W; ++r) {
    const Routing rt = generate_routing(RoutingSpec{}, tokens, c.model.routed_experts(), K, seed, r);
    RankTensors t;
    void* x = in->alloc(size_t(Tm) * H * 2);
    cuda::fill_uniform_bf16(x, size_t(Tm) * H, seed * 1000 + r, 1.f);
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

}  // namespace

std::vector<LayerBenchRow> run_layer_bench(const LayerBenchOptions& o, const LayerProgress& progress) {
  const std::vector<std::string> models = o.models.empty() ? ModelPresets::names() : o.models;
  std::vector<LayerBenchRow> rows;
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int combos = int(o.n_comm0.size() * o.n_comm1.size() * o.layer0_group_m.size());
  const int total = int(models.size() * o.tokens.size()) * combos;
  int done = 0;
  for (const std::string& name : models)
    for (int tokens : o.tokens) {
      LayerConfig c;
      c.model = ModelPresets::get(name);
      c.layout = {o.ep * o.tp, o.ep, o.tp};
      c.max_tokens_per_rank = tokens;
      auto fabric = fabric::make_loopback_fabric(c.layout.world);
      MoeLayer layer(c, *fabric);
      layer.set_random_weights(o.seed);
      const std::unique_ptr<Inputs> in = make_inputs(c, tokens, o.seed);
      // The unfused output once per workload: every fused variant must equal it bitwise.
      const LayerOptions unfused;
      layer.set_options(unfused);
      layer.forward(in->tensors, stream);
      layer.check(stream);
      const std::vector<uint16_t> want = download_all_y(c, *in, tokens);
      for (int n0 : o.n_comm0)
        for (int n1 : o.n_comm1)
          for (int group : o.layer0_group_m) {
            if (progress) progress(done, total, name + " T=" + std::to_string(tokens));
            LayerOptions fused;
            fused.fused = true;
            fused.n_comm0 = n0;
            fused.n_comm1 = n1;
            fused.layer0_group_m = group;
            layer.set_options(fused);
            LayerBenchRow row;
            row.model = name;
            row.tokens = tokens;
            row.world = c.layout.world;
            row.ep = o.ep;
            row.tp = o.tp;
            row.n_comm0 = layer.n_comm().n_comm0;
            row.n_comm1 = layer.n_comm().n_comm1;
            row.layer0_group_m = group;
            row.n_comm_source = layer.n_comm().source;
            layer.forward(in->tensors, stream);
            layer.check(stream);
            row.fused_equals_unfused = download_all_y(c, *in, tokens) == want;

            const std::vector<Variant> variants = {
                {"fused", [&](cudaStream_t st) { layer.set_options(fused); layer.forward(in->tensors, st); }},
                {"unfused", [&](cudaStream_t st) { layer.set_options(unfused); layer.forward(in->tensors, st); }},
                {"compute-only", [&](cudaStream_t st) { layer.run_part(MoeLayer::Part::kGemms, st); }},
                {"comm-only", [&](cudaStream_t st) { layer.run_part(MoeLayer::Part::kCommunication, st); }},
                {"plan", [&](cudaStream_t st) { layer.run_part(MoeLayer::Part::kPlan, st); }},
            };
            const std::vector<double> us = time_interleaved(variants, stream, o.iters, o.warmup_ms);
            layer.check(stream);
            row.fused_us = us[0];
            row.unfused_us = us[1];
            row.compute_us = us[2];
            row.comm_us = us[3];
            row.plan_us = us[4];
            // GEMM FLOP of all ranks: every (token, slot) row through the expert's F/TP slice, per TP rank.
            row.flop = double(c.layout.world) * tokens * c.model.topk * double(c.model.flops_per_row());
            rows.push_back(row);
            ++done;
          }
    }
  if (progress) progress(done, total, "done");
  cudaStreamDestroy(stream);
  return rows;
}

}  // namespace comet::bench
