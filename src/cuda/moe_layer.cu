// MoeLayer: the unfused GPU pipeline of the MoE layer, every rank's steps on one stream.
//
// Per call, for every rank r (phase by phase across ranks, so a phase's kernels see every
// rank's previous phase complete: stream order is the barrier on a single device):
//   1. publish: copy x, routing and the token count into r's symmetric regions
//   2. plan:    build_device_plan (reads every rank's routing through the peer table)
//   3. dispatch: pull each received token's row once from its owner, write it to every A row
//      it feeds (dispatch_pull_kernel)
//   4. GEMM0 (+ SwiGLU) and GEMM1 with the plan's tile lists (the grouped GEMM)
//   5. combine: pre-reduce each received token's rows (fp32, weighted, slot order), convert to
//      bf16 and store it into the owner's combine_recv slot (combine_push_kernel)
//   6. owner reduce: sum the partial rows of each own token in rank order 0..W-1 (fp32) into y
// The same reduction structure as the CPU backend; no float atomics, so it is deterministic.
#include <cuda_bf16.h>

#include <cmath>
#include <cstring>

#include "comet/layer.h"
#include "comet/workspace.h"
#include "comet/cost_model.h"
#include "cuda/check.h"
#include "cuda/comm_rows.cuh"
#include "cuda/device_info.h"
#include "cuda/device_plan.h"
#include "cuda/fused_layer.h"
#include "cuda/grouped_gemm.h"
#include "cuda/random_fill.h"
#include "fabric/fabric.h"

namespace comet {

namespace {

using cuda::DevicePlanView;

constexpr int kWarpsPerBlock = 8;
constexpr int kGrid = 132;
// The fused layer0's raster group height: its first wave then waits for the rows of this many
// M tiles instead of kRasterGroupM (docs/results/ has the measurement).
constexpr int kFusedLayer0GroupM = 4;  // blocks of the copy kernels (grid-stride loops; any size is correct)

// The unfused pipeline's copy kernels run the fused kernels' data movement (cuda/comm_rows.cuh)
// without signals, on kGrid blocks of kWarpsPerBlock warps.
__global__ void dispatch_kernel(const __grid_constant__ cuda::FusedCommArgs f) {
  __shared__ int32_t psum[cuda::kMaxWorld + 1];
  cuda::load_recv_psum(f, psum);
  const int warps = int(blockDim.x) / 32;
  cuda::dispatch_rows(f, psum, int(blockIdx.x) * warps + int(threadIdx.x) / 32, int(gridDim.x) * warps);
}

__global__ void combine_kernel(const __grid_constant__ cuda::FusedCommArgs f) {
  __shared__ int32_t psum[cuda::kMaxWorld + 1];
  cuda::load_recv_psum(f, psum);
  const int warps = int(blockDim.x) / 32;
  cuda::combine_rows(f, psum, int(blockIdx.x) * warps + int(threadIdx.x) / 32, int(gridDim.x) * warps);
}

__global__ void owner_reduce_kernel(const __grid_constant__ cuda::OwnerReduceArgs a) {
  const int warps = int(blockDim.x) / 32;
  cuda::owner_reduce_rows(a, int(blockIdx.x) * warps + int(threadIdx.x) / 32, int(gridDim.x) * warps);
}

template <class T>
T* offset_ptr(void* base, const WorkspaceRegion& r) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + r.offset_bytes);
}

LayerConfig gpu_config(LayerConfig c) {
  c.tiles = {cuda::kGemmBlockM, 128, 256};
  c.dtype = DType::kBF16;
  return c;
}

}  // namespace

struct MoeLayer::Impl {
  LayerConfig config;
  fabric::Fabric& fabric;
  WorkspaceLayout layout;
  cuda::DevicePlanLayout plan_layout;
  struct Rank {
    void* plan_buffer = nullptr;
    DevicePlanView plan{};
    void* w0 = nullptr;  // [E/EP][n_b][H] packed gate/up
    void* w1 = nullptr;  // [E/EP][H][F/TP]
    cuda::DeviceError* error = nullptr;
    const int32_t** count_table = nullptr;  // [W] peers' token_count regions
    const int32_t** id_table = nullptr;
    const float** weight_table = nullptr;
    // Epoch bookkeeping of the fused kernels, one allocation: tile base/target [MT] each,
    // column base/target [NB1] each (cuda/device_plan.h), the combine work counter, then the
    // link pacers of dispatch and combine (cuda/link_pace.h).
    uint64_t* epochs = nullptr;
  };
  std::vector<Rank> ranks;
  bool have_weights = false;
  LayerOptions options;
  TuningTable tuning;
  NCommChoice n_comm;  // resolved from options, the tuning table or the cost model
  void resolve_n_comm() {
    if (options.n_comm0 > 0 && options.n_comm1 > 0) {
      n_comm = {options.n_comm0, options.n_comm1, "options"};
      return;
    }
    const cuda::DeviceInfo info = cuda::query_device_info();
    const TuningKey key = tuning_key(config, info.name, info.num_sms, config.max_tokens_per_rank);
    GpuSpec gpu = gpu_spec("H200");  // rates of the cost model; SMs from the device
    gpu.num_sms = info.num_sms;
    if (options.link.on()) gpu.link_gbps = options.link.gbps;  // the link the copies are paced to
    const LayerCost cost = expected_layer_cost(config, config.max_tokens_per_rank, gpu);
    n_comm = choose_n_comm(&tuning, key, config, cost, gpu);
    if (n_comm.n_comm0 >= info.num_sms || n_comm.n_comm1 >= info.num_sms) {  // a table for another GPU size
      n_comm = choose_n_comm(nullptr, key, config, cost, gpu);
      n_comm.source += " (the nearest table entry asked for more blocks than this GPU has)";
    }
    if (options.n_comm0 > 0) n_comm.n_comm0 = options.n_comm0;
    if (options.n_comm1 > 0) n_comm.n_comm1 = options.n_comm1;
  }
  int layer0_group_m() const {
    if (options.layer0_group_m > 0) return options.layer0_group_m;
    return options.fused ? kFusedLayer0GroupM : cuda::kRasterGroupM;
  }
  // Tile base/target [MT] each, column base/target [NB1] each, the combine work counter (one
  // word), then one LinkPacer per layer: layer0's paces the rank's dispatch pulls (its incoming
  // link), layer1's its combine pushes (its outgoing link). Each phase's kernels zero the other
  // phase's pacer, so every phase starts from a zero pacer without a memset (the plan kernel
  // need not run: run_part(kCommunication) is paced too); reset_epochs zeroes both.
  int64_t claims_word() const { return 2 * plan_layout.max_m_tiles + 2 * plan_layout.n_blocks1; }
  int64_t epoch_words() const { return claims_word() + 1 + 2 * cuda::kLinkPacerWords; }
  unsigned* combine_claims(int r) const { return reinterpret_cast<unsigned*>(ranks[r].epochs + claims_word()); }
  cuda::LinkPacer* link_pacer(int r, int layer) const {
    return reinterpret_cast<cuda::LinkPacer*>(ranks[r].epochs + claims_word() + 1) + layer;
  }
  // GEMM arguments of rank r for layer 0 (GEMM0 + SwiGLU) or 1 (GEMM1).
  cuda::GroupedGemmArgs gemm_args(int r, int layer) const {
    const LayerConfig& c = config;
    cuda::GroupedGemmArgs g;
    g.epilogue = layer == 0 ? cuda::GemmEpilogue::kSwiGlu : cuda::GemmEpilogue::kIdentity;
    g.kernel = cuda::GemmKernel::kCooperative128x256;
    g.num_experts = c.experts_per_rank();
    g.max_rows = int(c.max_rows_per_rank());
    g.n = layer == 0 ? c.ffn_per_rank() : c.model.hidden;
    g.k = layer == 0 ? c.model.hidden : c.ffn_per_rank();
    g.a = region(r, layer == 0 ? "a_rows" : "inter");
    g.b = layer == 0 ? ranks[r].w0 : ranks[r].w1;
    g.d = region(r, layer == 0 ? "inter" : "out_rows");
    g.tiles = layer == 0 ? ranks[r].plan.tiles0 : ranks[r].plan.tiles1;
    g.num_tiles = ranks[r].plan.num_tiles + layer;
    g.error = ranks[r].error;
    g.timeout_ns = uint64_t(options.timeout_s * 1e9);
    g.rank = r;
    g.layer = layer;
    return g;
  }
  char* region(int r, const char* name) const {
    return static_cast<char*>(fabric.base(r)) + layout.region(name).offset_bytes;
  }

  // Steps 3-5, one kernel each (the GPU oracle of the fused kernels).
  void run_unfused(cudaStream_t stream) const {
    run_dispatch(stream);
    run_gemms(stream);
    run_combine(stream);
  }
  void run_dispatch(cudaStream_t stream) const {
    for (int r = 0; r < config.layout.world; ++r) {
      dispatch_kernel<<<kGrid, 32 * kWarpsPerBlock, 0, stream>>>(comm_args(r, 0, Signals::kOff));
      COMET_CUDA_CHECK_LAUNCH();
    }
  }
  void run_gemms(cudaStream_t stream) const {
    for (int r = 0; r < config.layout.world; ++r) {
      cuda::run_grouped_gemm(gemm_args(r, 0), stream);
      cuda::run_grouped_gemm(gemm_args(r, 1), stream);
    }
  }
  void run_combine(cudaStream_t stream) const {
    for (int r = 0; r < config.layout.world; ++r) {
      combine_kernel<<<kGrid, 32 * kWarpsPerBlock, 0, stream>>>(comm_args(r, 1, Signals::kOff));
      COMET_CUDA_CHECK_LAUNCH();
    }
  }

  enum class Signals { kOff, kOn };
  // Every rank's plan kernel; with signals on, also this call's epoch targets (fused kernels).
  void run_plans(Signals signals, cudaStream_t stream) const {
    const int W = config.layout.world;
    std::vector<cuda::DevicePlanArgs> args(W);
    for (int r = 0; r < W; ++r) {
      cuda::DevicePlanArgs& a = args[r];
      a.rank = r;
      a.token_counts = ranks[r].count_table;
      a.route_ids = ranks[r].id_table;
      a.route_weights = ranks[r].weight_table;
      a.plan = ranks[r].plan;
      a.error = ranks[r].error;
      a.layer0_group_m = layer0_group_m();
      if (signals == Signals::kOn) {
        uint64_t* e = ranks[r].epochs;
        const int64_t mt = plan_layout.max_m_tiles, nb = plan_layout.n_blocks1;
        a.tile_base = e;
        a.tile_target = e + mt;
        a.col_base = e + 2 * mt;
        a.col_target = e + 2 * mt + nb;
        a.combine_claims = combine_claims(r);
      }
    }
    cuda::build_device_plans(config, args.data(), W, stream);
  }

  // What the data movement of rank r's layer needs (cuda/comm_rows.cuh); with signals on, the
  // fused kernels' counters and targets.
  cuda::FusedCommArgs comm_args(int r, int layer, Signals signals) const {
    cuda::FusedCommArgs f;
    f.plan = ranks[r].plan;
    f.peers = fabric.peer_table(r);
    f.x_offset = layout.region("x").offset_bytes;
    f.combine_offset = layout.region("combine_recv").offset_bytes;
    f.a_rows = region(r, "a_rows");
    f.out_rows = region(r, "out_rows");
    f.hidden = config.model.hidden;
    f.rows_per_token = plan_layout.rows_per_token;
    f.world = config.layout.world;
    f.rank = r;
    f.t_max = config.max_tokens_per_rank;
    f.num_col_blocks = int(plan_layout.n_blocks1);
    f.col_width = cuda::gemm_out_tile_n(cuda::GemmEpilogue::kIdentity, cuda::GemmKernel::kCooperative128x256);
    f.n_comm = layer == 0 ? n_comm.n_comm0 : n_comm.n_comm1;
    f.stall = options.stall_rank == r;
    f.timeout_ns = uint64_t(options.timeout_s * 1e9);
    f.error = ranks[r].error;
    f.link = cuda::make_link_pace(options.link, link_pacer(r, layer), 1, f.timeout_ns);
    f.link_reset = link_pacer(r, 1 - layer);
    if (signals == Signals::kOn) {
      const int64_t mt = plan_layout.max_m_tiles, nb = plan_layout.n_blocks1;
      if (layer == 0) f.tile_arrivals = reinterpret_cast<uint64_t*>(region(r, "tile_arrivals"));
      else f.col_done = reinterpret_cast<uint64_t*>(region(r, "col_done"));
      if (layer == 1) f.combine_claims = combine_claims(r);
      f.col_target = ranks[r].epochs + 2 * mt + nb;
    }
    return f;
  }

  // Steps 3-5 as the two Comet kernels of every rank (cuda/fused_layer.h). On one GPU the ranks'
  // kernels run one after another: layer0 only pulls published rows and layer1 only pushes, so
  // no kernel waits on another rank's kernel.
  void run_fused(cudaStream_t stream) const {
    for (int layer = 0; layer < 2; ++layer)
      for (int r = 0; r < config.layout.world; ++r) {
        const cuda::FusedCommArgs f = comm_args(r, layer, Signals::kOn);
        cuda::GroupedGemmArgs g = gemm_args(r, layer);
        if (layer == 0) {
          g.wait_flags = f.tile_arrivals;
          g.wait_targets = ranks[r].epochs + plan_layout.max_m_tiles;
          cuda::run_fused_layer0(g, f, stream);
        } else {
          g.done_flags = f.col_done;
          cuda::run_fused_layer1(g, f, stream);
        }
      }
  }

  // After a failure the counters and bases no longer agree: zero both, on the caller's stream,
  // and wait, so that the next forward (possibly on a non-blocking stream) sees them zeroed.
  void reset_epochs(cudaStream_t stream) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      COMET_CUDA_CHECK(cudaMemsetAsync(ranks[r].epochs, 0, epoch_words() * sizeof(uint64_t), stream));
      for (const char* name : {"tile_arrivals", "col_done"}) {
        const WorkspaceRegion& reg = layout.region(name);
        COMET_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(fabric.base(int(r))) + reg.offset_bytes, 0, reg.bytes, stream));
      }
    }
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  Impl(const LayerConfig& c, fabric::Fabric& f) : config(gpu_config(c)), fabric(f), layout(config), plan_layout(config) {}
  ~Impl() {
    for (Rank& r : ranks)
      for (void* p : {r.plan_buffer, r.w0, r.w1, static_cast<void*>(r.error), static_cast<void*>(r.count_table),
                      static_cast<void*>(r.id_table), static_cast<void*>(r.weight_table),
                      static_cast<void*>(r.epochs)})
        if (p) cudaFree(p);
  }
};

Status MoeLayer::can_implement(const LayerConfig& c) {
  const Status s = c.validate();
  if (!s) return s;
  if (c.model.activation != Activation::kSwiGlu)
    return Status::failure(std::string("the CUDA backend fuses SwiGLU only; activation ") +
                           activation_name(c.model.activation) + " is not supported yet");
  if (c.model.hidden % 8 != 0 || c.ffn_per_rank() % 8 != 0)
    return Status::failure("the CUDA backend needs H and F/TP multiples of 8 (16-byte rows), got H=" +
                           std::to_string(c.model.hidden) + ", F/TP=" + std::to_string(c.ffn_per_rank()));
  if (c.model.topk > 16) return Status::failure("the CUDA backend supports topk <= 16, got " + std::to_string(c.model.topk));
  if (c.max_tokens_per_rank < 1) return Status::failure("max_tokens_per_rank must be >= 1");
  if (c.layout.world > cuda::kMaxWorld)
    return Status::failure("the CUDA backend supports at most " + std::to_string(cuda::kMaxWorld) + " ranks, got " +
                           std::to_string(c.layout.world));
  return Status::success();
}

MoeLayer::MoeLayer(const LayerConfig& config, fabric::Fabric& fabric) {
  const Status ok = can_implement(config);
  COMET_CHECK(ok.ok, "MoeLayer: " << ok.reason);
  COMET_CHECK(fabric.world() == config.layout.world,
              "MoeLayer: the fabric has " << fabric.world() << " ranks, the layout " << config.layout.world);
  for (int r = 1; r < fabric.world(); ++r)
    COMET_CHECK(fabric.device_of(r) == fabric.device_of(0),
                "MoeLayer: ranks on several GPUs are not supported yet (rank " << r << " is on GPU "
                                                                               << fabric.device_of(r) << ")");
  impl_ = std::make_unique<Impl>(config, fabric);
  Impl& m = *impl_;
  const int W = m.config.layout.world;
  m.fabric.allocate(m.layout.total_bytes());
  m.ranks.resize(W);
  std::vector<const int32_t*> counts(W), ids(W);
  std::vector<const float*> weights(W);
  for (int p = 0; p < W; ++p) {
    counts[p] = offset_ptr<const int32_t>(m.fabric.base(p), m.layout.region("token_count"));
    ids[p] = offset_ptr<const int32_t>(m.fabric.base(p), m.layout.region("route_ids"));
    weights[p] = offset_ptr<const float>(m.fabric.base(p), m.layout.region("route_weights"));
  }
  for (Impl::Rank& r : m.ranks) {
    COMET_CUDA_CHECK(cudaMalloc(&r.plan_buffer, m.plan_layout.total_bytes()));
    r.plan = m.plan_layout.view(r.plan_buffer);
    COMET_CUDA_CHECK(cudaMalloc(&r.error, sizeof(cuda::DeviceError)));
    COMET_CUDA_CHECK(cudaMemset(r.error, 0, sizeof(cuda::DeviceError)));
    COMET_CUDA_CHECK(cudaMalloc(&r.count_table, W * sizeof(void*)));
    COMET_CUDA_CHECK(cudaMalloc(&r.id_table, W * sizeof(void*)));
    COMET_CUDA_CHECK(cudaMalloc(&r.weight_table, W * sizeof(void*)));
    COMET_CUDA_CHECK(cudaMemcpy(r.count_table, counts.data(), W * sizeof(void*), cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(r.id_table, ids.data(), W * sizeof(void*), cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(r.weight_table, weights.data(), W * sizeof(void*), cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMalloc(&r.epochs, m.epoch_words() * sizeof(uint64_t)));
    COMET_CUDA_CHECK(cudaMemset(r.epochs, 0, m.epoch_words() * sizeof(uint64_t)));
  }
  m.resolve_n_comm();
}

void MoeLayer::set_options(const LayerOptions& o) {
  int device = 0, num_sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  COMET_CHECK(o.n_comm0 >= 0 && o.n_comm0 < num_sms && o.n_comm1 >= 0 && o.n_comm1 < num_sms,
              "MoeLayer: n_comm0 " << o.n_comm0 << " and n_comm1 " << o.n_comm1 << " must be in [0, " << num_sms - 1
                                   << "] (0 chooses; this GPU has " << num_sms << " SMs)");
  COMET_CHECK(o.timeout_s > 0, "MoeLayer: timeout must be positive, got " << o.timeout_s);
  COMET_CHECK(o.layer0_group_m >= 0, "MoeLayer: layer0_group_m must be >= 0 (0 chooses), got " << o.layer0_group_m);
  COMET_CHECK(o.stall_rank < impl_->config.layout.world, "MoeLayer: stall_rank " << o.stall_rank << " is not a rank");
  const Status link = o.link.validate();
  COMET_CHECK(link.ok, "MoeLayer: " << link.reason);
  impl_->options = o;
  impl_->resolve_n_comm();
}

void MoeLayer::set_tuning_table(const TuningTable& table) {
  impl_->tuning = table;
  impl_->resolve_n_comm();
}

NCommChoice MoeLayer::n_comm() const { return impl_->n_comm; }

void MoeLayer::set_random_weights(uint64_t seed) {
  Impl& m = *impl_;
  const int Epr = m.config.experts_per_rank();
  const size_t H = m.config.model.hidden, Fl = m.config.ffn_per_rank();
  const size_t n0 = size_t(Epr) * cuda::gemm_b_rows(cuda::GemmEpilogue::kSwiGlu, int(Fl)) * H, n1 = size_t(Epr) * H * Fl;
  for (int r = 0; r < m.config.layout.world; ++r) {
    Impl::Rank& rank = m.ranks[r];
    if (!rank.w0) COMET_CUDA_CHECK(cudaMalloc(&rank.w0, n0 * 2));
    if (!rank.w1) COMET_CUDA_CHECK(cudaMalloc(&rank.w1, n1 * 2));
    cuda::fill_uniform_bf16(rank.w0, n0, seed * 64 + 2 * r, 1.f / std::sqrt(float(H)));
    cuda::fill_uniform_bf16(rank.w1, n1, seed * 64 + 2 * r + 1, 1.f / std::sqrt(float(Fl)));
  }
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  m.have_weights = true;
}

void MoeLayer::run_part(Part part, CUstream_st* stream) {
  COMET_CHECK(impl_->have_weights, "MoeLayer: set weights and run forward() once before run_part()");
  if (part == Part::kGemms) {
    impl_->run_gemms(stream);
  } else if (part == Part::kPlan) {
    impl_->run_plans(Impl::Signals::kOff, stream);
  } else {
    impl_->run_dispatch(stream);
    impl_->run_combine(stream);
  }
}

MoeLayer::~MoeLayer() = default;

const LayerConfig& MoeLayer::config() const { return impl_->config; }

void MoeLayer::set_weights(const ExpertWeights& w) {
  Impl& m = *impl_;
  const ModelShape& model = m.config.model;
  w.check(model);
  const int Epr = m.config.experts_per_rank();
  const size_t H = model.hidden, F = model.ffn, Fl = m.config.ffn_per_rank();
  for (int r = 0; r < m.config.layout.world; ++r) {
    const int ep = m.config.layout.ep_index(r), tp = m.config.layout.tp_index(r);
    std::vector<float> gate(Epr * H * Fl), up(Epr * H * Fl), down(Epr * Fl * H);
    for (int el = 0; el < Epr; ++el) {
      const size_t e = size_t(ep) * Epr + el;
      for (size_t h = 0; h < H; ++h)
        for (size_t f = 0; f < Fl; ++f) {
          gate[(el * H + h) * Fl + f] = w.w_gate[(e * H + h) * F + tp * Fl + f];
          up[(el * H + h) * Fl + f] = w.w_up[(e * H + h) * F + tp * Fl + f];
        }
      std::memcpy(&down[el * Fl * H], &w.w_down[(e * F + tp * Fl) * H], Fl * H * sizeof(float));
    }
    const std::vector<uint16_t> w0 = cuda::pack_swiglu_weights(gate, up, Epr, int(H), int(Fl));
    const std::vector<uint16_t> w1 = cuda::transpose_weights(down, Epr, int(Fl), int(H));
    Impl::Rank& rank = m.ranks[r];
    if (!rank.w0) COMET_CUDA_CHECK(cudaMalloc(&rank.w0, w0.size() * 2));
    if (!rank.w1) COMET_CUDA_CHECK(cudaMalloc(&rank.w1, w1.size() * 2));
    COMET_CUDA_CHECK(cudaMemcpy(rank.w0, w0.data(), w0.size() * 2, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(rank.w1, w1.data(), w1.size() * 2, cudaMemcpyHostToDevice));
  }
  m.have_weights = true;
}

void MoeLayer::forward(const std::vector<RankTensors>& in, CUstream_st* stream) {
  Impl& m = *impl_;
  const LayerConfig& c = m.config;
  const int W = c.layout.world, H = c.model.hidden, K = c.model.topk, Tm = c.max_tokens_per_rank;
  COMET_CHECK(m.have_weights, "MoeLayer: set_weights() must be called before forward()");
  COMET_CHECK(int(in.size()) == W, "MoeLayer: forward got tensors for " << in.size() << " ranks, the layer has " << W);
  for (int r = 0; r < W; ++r)
    COMET_CHECK(in[r].x && in[r].expert_ids && in[r].weights && in[r].num_tokens && in[r].y,
                "MoeLayer: rank " << r << " has a null tensor pointer");
  auto region = [&](int r, const char* name) { return m.region(r, name); };

  // Step 1: publish.
  for (int r = 0; r < W; ++r) {
    COMET_CUDA_CHECK(cudaMemcpyAsync(region(r, "x"), in[r].x, size_t(Tm) * H * 2, cudaMemcpyDeviceToDevice, stream));
    COMET_CUDA_CHECK(cudaMemcpyAsync(region(r, "route_ids"), in[r].expert_ids, size_t(Tm) * K * 4,
                                     cudaMemcpyDeviceToDevice, stream));
    COMET_CUDA_CHECK(cudaMemcpyAsync(region(r, "route_weights"), in[r].weights, size_t(Tm) * K * 4,
                                     cudaMemcpyDeviceToDevice, stream));
    COMET_CUDA_CHECK(cudaMemcpyAsync(region(r, "token_count"), in[r].num_tokens, 4, cudaMemcpyDeviceToDevice, stream));
  }
  // Step 2: plans, every rank's in as few launches as possible.
  m.run_plans(m.options.fused ? Impl::Signals::kOn : Impl::Signals::kOff, stream);

  // Steps 3-5: dispatch, the two GEMMs, combine. A fused launch that fails on the host after the
  // plan kernels advanced the epoch bases must not leave them advanced.
  if (m.options.fused) {
    try {
      m.run_fused(stream);
    } catch (...) {
      cudaStreamSynchronize(stream);
      m.reset_epochs(stream);
      throw;
    }
  } else {
    m.run_unfused(stream);
  }
  // Step 6: owner reduce into the caller's y.
  for (int r = 0; r < W; ++r) {
    cuda::OwnerReduceArgs a;
    a.send_pos = m.ranks[r].plan.send_pos;
    a.combine_recv = region(r, "combine_recv");
    a.token_count = reinterpret_cast<const int32_t*>(region(r, "token_count"));
    a.y = in[r].y;
    a.hidden = H;
    a.world = W;
    a.t_max = Tm;
    owner_reduce_kernel<<<kGrid, 32 * kWarpsPerBlock, 0, stream>>>(a);
    COMET_CUDA_CHECK_LAUNCH();
  }
}

void MoeLayer::check(CUstream_st* stream) {
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::string first;
  for (const Impl::Rank& r : impl_->ranks) {
    cuda::DeviceError e;
    COMET_CUDA_CHECK(cudaMemcpy(&e, r.error, sizeof e, cudaMemcpyDeviceToHost));
    if (e.claimed && first.empty()) first = cuda::describe(e);
    // Cleared once reported (on the caller's stream), so the layer stays usable.
    COMET_CUDA_CHECK(cudaMemsetAsync(r.error, 0, sizeof(cuda::DeviceError), stream));
  }
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!first.empty()) {
    impl_->reset_epochs(stream);
    throw Error("MoeLayer: " + first);
  }
}

}  // namespace comet
