// BaselineMoe: the sequential (Megatron-style) and chunk-pipelined (FasterMoE/Tutel-style) MoE
// layers of DESIGN §6 on GPUs (include/comet/baseline.h, docs/baselines.md).
//
// One forward, the local ranks' work driven from this host thread:
//   1. route (device, per rank): route_scan + route_prefix count rows per chunk, expert and EP
//      group, and rank every (token, slot) for the permutation (cuda/baseline_kernels.h)
//   2. count exchange: every rank's count row to every rank (an all-gather through the
//      all-to-all seam), copied to the host; the ONE host synchronization of the call
//   3. host layout (core/baseline_layout.h) of every rank, staged with the all-to-all segment
//      lists and the cuBLAS pointer arrays, one host-to-device copy per GPU
//   4. pack (per rank): each own token into the send buffer once per destination rank, with
//      the A rows and routing weights it feeds there
//   5. per chunk: dispatch all-to-all -> permute -> GEMM0 -> activation -> GEMM1 -> un-permute
//      (weighted sum of the token's local experts, fp32) -> combine all-to-all -> owner reduce
//      (sum over ranks in rank order, fp32) into y
// Sequential: step 5 chunk after chunk on one stream per GPU. Pipelined: dispatches, combines
// and owner reduces on a communication stream, the rest on a compute stream; events order chunk
// c's compute after its dispatch and its combine after its compute, and the communication stream
// issues dispatch c+1 before waiting for compute c.
//
// Where the work runs: the local ranks are grouped into lanes, one per GPU (Loopback: one lane
// with every rank; Local: one lane per GPU; Nccl: the process's rank). A lane's main stream is
// the caller's stream when that is on the lane's GPU, else an internal stream forked from the
// caller's stream and joined back into it with events. The all-to-alls (cuda::AllToAllPlan):
// copy kernels, each lane pushing what its ranks send, when this process drives every rank;
// fabric.all_to_all_v (NCCL) when it drives one. With several lanes every all-to-all ends with
// each lane's stream waiting for every lane's part (exchange()), so that what follows on any
// GPU sees all the bytes, and no lane overwrites rows a peer still reads.
// Pitfall: on one GPU the ranks' kernels share the device; a "rank's" step is a launch per rank.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "comet/baseline.h"
#include "core/baseline_layout.h"
#include "cuda/baseline_kernels.h"
#include "cuda/check.h"
#include "cuda/cublas_experts.h"
#include "cuda/random_fill.h"
#include "cuda/rank_copy.h"
#include "cuda/rank_weights.h"
#include "cuda/tensor_checks.h"
#include "fabric/fabric.h"
#include "fabric/fabric_util.h"

namespace comet {

namespace {

using core::kBaselineMaxChunks;
using cuda::BaselineMeta;

constexpr int64_t kAlign = 256;
int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int rows_per_token(const LayerConfig& c) { return std::min(c.model.topk, c.experts_per_rank()); }
int meta_per_token(const LayerConfig& c) { return (rows_per_token(c) + 1) / 2 * 2; }
int64_t max_send_rows(const LayerConfig& c) {
  return int64_t(c.max_tokens_per_rank) * std::min(c.layout.ep, c.model.topk) * c.layout.tp;
}
int64_t max_recv_rows(const LayerConfig& c) { return int64_t(c.layout.world) * c.max_tokens_per_rank; }
int64_t max_a_rows(const LayerConfig& c) { return max_recv_rows(c) * rows_per_token(c); }

// Symmetric heap of one rank; every region starts at a multiple of 256 bytes. With Tm = T_max,
// K = topk, H, Fl = F/TP, N0 = GEMM0 output columns (cuda::gemm0_weight_rows), MPT =
// meta_per_token, S = Tm * min(EP, K) * TP, R = W * Tm, A = R * min(K, E/EP), NB = blocks of
// route_scan, NK = E + EP, L = count row length for kBaselineMaxChunks chunks:
//   send          bf16 [S][H]      own tokens in send order; the combine returns partial rows here
//   send_meta     meta [S][MPT]    A rows and weights each sent token feeds on its destination
//   recv          bf16 [R][H]      received tokens; after the un-permute, the partial rows
//   recv_meta     meta [R][MPT]
//   a_rows        bf16 [A][H]      expert-sorted GEMM0 input, then the GEMM1 output
//   inter0        bf16 [A][N0]     GEMM0 output (SwiGLU: gate and up packed)
//   inter         bf16 [A][Fl]     activation output, GEMM1 input
//   count_row     i32  [L]         this rank's counts (core/baseline_layout.h)
//   count_table   i32  [W][L]      every rank's count row (rows packed at the current length)
//   item_rank     i32  [Tm][K]     route_scan's in-block ranks
//   group_rank    i32  [Tm][K]
//   block_base    i32  [NB][NK]
//   chunk_prefix  i32  [kBaselineMaxChunks][NK]
//   send_pos      i32  [Tm][W]     row of own token t's block for rank d in send, or -1
struct HeapLayout {
  int64_t send = 0, send_meta = 0, recv = 0, recv_meta = 0, a_rows = 0, inter0 = 0, inter = 0, count_row = 0,
          count_table = 0, item_rank = 0, group_rank = 0, block_base = 0, chunk_prefix = 0, send_pos = 0, total = 0;
  explicit HeapLayout(const LayerConfig& c) {
    const int64_t H = c.model.hidden, Tm = c.max_tokens_per_rank, K = c.model.topk, W = c.layout.world;
    const int64_t NK = c.model.num_experts + c.layout.ep, L = core::baseline_count_row_len(c, kBaselineMaxChunks);
    const int64_t NB = (Tm + cuda::kRouteScanTokens - 1) / cuda::kRouteScanTokens;
    const int64_t meta = int64_t(meta_per_token(c)) * sizeof(BaselineMeta);
    int64_t at = 0;
    auto take = [&](int64_t bytes) {
      const int64_t offset = at;
      at += align_up(std::max<int64_t>(bytes, 1));
      return offset;
    };
    send = take(max_send_rows(c) * H * 2);
    send_meta = take(max_send_rows(c) * meta);
    recv = take(max_recv_rows(c) * H * 2);
    recv_meta = take(max_recv_rows(c) * meta);
    a_rows = take(max_a_rows(c) * H * 2);
    inter0 = take(max_a_rows(c) * cuda::gemm0_weight_rows(c) * 2);
    inter = take(max_a_rows(c) * c.ffn_per_rank() * 2);
    count_row = take(L * 4);
    count_table = take(W * L * 4);
    item_rank = take(Tm * K * 4);
    group_rank = take(Tm * K * 4);
    block_base = take(NB * NK * 4);
    chunk_prefix = take(kBaselineMaxChunks * NK * 4);
    send_pos = take(Tm * W * 4);
    total = at;
  }
};

// Host staging of one forward (pinned) and its device copy: every rank's sender table, the
// all-to-all segment lists, the cuBLAS pointer arrays; each section at its worst-case size.
struct StagingLayout {
  int64_t table_entries = 0;  // per rank
  int64_t tables = 0, segments = 0, segment_bytes = 0, pointers = 0, pointer_entries = 0, total = 0;
  explicit StagingLayout(const LayerConfig& c) {
    const int64_t W = c.layout.world;
    table_entries = core::BaselineLayout::sender_table_entries(int(W), c.model.num_experts, kBaselineMaxChunks);
    tables = 0;
    segments = align_up(W * table_entries * 4);
    // Dispatch: rows and metadata per (source, destination); combine: rows.
    segment_bytes = 3 * W * W * kBaselineMaxChunks * int64_t(sizeof(cuda::CopySegment));
    pointers = segments + align_up(segment_bytes);
    // Two GEMMs per (rank, chunk), B/A/C per expert.
    pointer_entries = 2 * W * kBaselineMaxChunks * 3 * int64_t(c.experts_per_rank());
    total = pointers + align_up(pointer_entries * int64_t(sizeof(void*)));
  }
};

void check_options(const BaselineOptions& o) {
  COMET_CHECK(o.chunks >= 1 && o.chunks <= kBaselineMaxChunks,
              "BaselineMoe: chunks must be within [1, " << kBaselineMaxChunks << "], got " << o.chunks);
  COMET_CHECK(o.gemm == BaselineGemm::kPerExpertLoop || o.gemm == BaselineGemm::kGroupedBatched,
              "BaselineMoe: unknown GEMM variant " << int(o.gemm));
  const Status link = o.link.validate();
  COMET_CHECK(link.ok, "BaselineMoe: " << link.reason);
}

// Longest single pacing wait of an all-to-all (cuda/link_pace.h); the baselines have no timeout.
constexpr uint64_t kMaxPaceWaitNs = 5'000'000'000ull;

}  // namespace

const char* baseline_gemm_name(BaselineGemm gemm) {
  switch (gemm) {
    case BaselineGemm::kPerExpertLoop: return "cublas-loop";
    case BaselineGemm::kGroupedBatched: return "cublas-grouped";
  }
  return "?";
}

std::string BaselineOptions::describe() const {
  std::string s = chunks == 1 && !pipelined ? "sequential"
                                            : "chunked C=" + std::to_string(chunks) +
                                                  (pipelined ? " (pipelined)" : " (one stream)");
  return s + ", " + baseline_gemm_name(gemm) + (link.on() ? ", " + link.describe() : "");
}

BaselineOptions sequential_baseline(BaselineGemm gemm) { return BaselineOptions{1, false, gemm}; }
BaselineOptions chunked_baseline(int chunks, BaselineGemm gemm) { return BaselineOptions{chunks, true, gemm}; }

namespace {

// The local ranks of one GPU and what runs there (see the file header).
struct Lane {
  int device = 0;
  std::vector<int> ranks;                  // local ranks on this GPU, ascending
  cudaStream_t own = nullptr;              // main stream when the caller's stream is elsewhere
  cudaStream_t comm = nullptr, compute = nullptr;  // the pipelined schedule
  cudaStream_t main = nullptr;             // during a call: the caller's stream or `own`
  std::unique_ptr<cuda::CublasExperts> cublas;
  char* upload = nullptr;                  // device copy of the staging
  void* gather_segments = nullptr;         // device copy of the count exchanges' segment lists
  std::vector<cudaEvent_t> dispatched, computed;  // [kBaselineMaxChunks]
  cudaEvent_t fork = nullptr, joined = nullptr, pipe_fork = nullptr, comm_done = nullptr, compute_done = nullptr,
              staged = nullptr, exchanged = nullptr, finished = nullptr;
};

}  // namespace

struct BaselineMoe::Impl {
  LayerConfig config;
  fabric::Fabric& fabric;
  BaselineOptions options;
  HeapLayout heap;
  StagingLayout staging_layout;
  cuda::BaselineDims dims;
  int n0 = 0;  // GEMM0 output columns
  int first = 0, num_local = 0;  // the local ranks [first, first + num_local)
  std::vector<Lane> lanes;
  int caller = 0;                // during a call: the lane of the caller's stream
  std::vector<void*> peers;      // [W] every rank's heap as this process addresses it
  std::vector<void*> w0, w1;     // [W], local ranks only
  std::vector<char> weights_set;  // [W]: rank r's weights are installed (local ranks only)
  bool have_weights() const {
    for (int r = first; r < first + num_local; ++r)
      if (!weights_set[size_t(r)]) return false;
    return true;
  }
  // Rank r's weight buffers on the current device (the rank's), allocated once: w0
  // [E/EP][n0][H], w1 [E/EP][H][F/TP], as element counts.
  size_t w0_elements() const { return size_t(config.experts_per_rank()) * n0 * config.model.hidden; }
  size_t w1_elements() const { return size_t(config.experts_per_rank()) * config.model.hidden * config.ffn_per_rank(); }
  void allocate_weights(int r) {
    if (!w0[r]) COMET_CUDA_CHECK(cudaMalloc(&w0[r], w0_elements() * 2));
    if (!w1[r]) COMET_CUDA_CHECK(cudaMalloc(&w1[r], w1_elements() * 2));
  }
  void weights_installed(int r) {
    weights_set[size_t(r)] = 1;
    have_layout = false;  // grouped pointer arrays name the weights
  }
  // Before a setter writes ranks [from, to): one that throws half way leaves forward() refusing
  // to run rather than running a mix of old and new weights (as MoeLayer's setters).
  void forget_weights(int from, int to) {
    for (int r = from; r < to; ++r) weights_set[size_t(r)] = 0;
  }
  uint64_t heap_generation = 0;  // the fabric's, after this layer's allocate()
  cuda::RankTensorCheck tensor_check{{"BaselineMoe", true, "rows move 16 bytes at a time"}};
  // A second layer built on this fabric reallocated the heap under this one, or the fabric lost it.
  void check_heap() const { fabric.check_heap_generation(heap_generation, "BaselineMoe"); }

  char* staging = nullptr;       // pinned, staging_layout.total
  cuda::LinkPacer* pacer = nullptr;  // link emulation (one GPU): every all-to-all's, zeroed by each
  int32_t* host_rows = nullptr;  // pinned [W][L]
  cuda::AllToAllPlan gather;     // the count exchange, one per chunk count
  cudaEvent_t last_finished = nullptr;  // the end of the last call, on its caller's stream

  // The last forward's plan.
  bool have_layout = false;
  core::BaselineLayout layout;
  cuda::AllToAllPlan a2a;
  std::vector<int> dispatch_id, combine_id;                // [chunk]
  std::vector<cuda::ExpertGemmShapes> shapes0, shapes1;    // [rank][chunk], local ranks
  std::vector<int64_t> pointers0, pointers1;               // [rank][chunk], offsets in pointer entries
  BaselineTraffic traffic;

  Impl(const LayerConfig& c, fabric::Fabric& f)
      : config(c), fabric(f), heap(config), staging_layout(config), weights_set(size_t(c.layout.world), 0) {}
  ~Impl() {
    // Work still in flight on the internal streams uses everything below; the cuBLAS handles
    // name the lanes' streams.
    int saved = -1;
    cudaGetDevice(&saved);
    try {
      drain_last_call();
    } catch (...) {
    }
    for (Lane& l : lanes) {
      cudaSetDevice(l.device);
      for (cudaStream_t s : {l.own, l.comm, l.compute}) {
        if (!s) continue;
        try {  // bounded on the Nccl fabric (a peer that is gone); then the streams are idle
          fabric.wait(s, "waiting for the baseline's last work before freeing its buffers");
        } catch (...) {
        }
      }
      l.cublas.reset();
      if (l.upload) cudaFree(l.upload);
      if (l.gather_segments) cudaFree(l.gather_segments);
      for (cudaEvent_t e : l.dispatched) if (e) cudaEventDestroy(e);
      for (cudaEvent_t e : l.computed) if (e) cudaEventDestroy(e);
      for (cudaEvent_t e : {l.fork, l.joined, l.pipe_fork, l.comm_done, l.compute_done, l.staged, l.exchanged,
                            l.finished})
        if (e) cudaEventDestroy(e);
      for (cudaStream_t s : {l.own, l.comm, l.compute}) if (s) cudaStreamDestroy(s);
    }
    for (void* p : w0) if (p) cudaFree(p);
    for (void* p : w1) if (p) cudaFree(p);
    if (pacer) cudaFree(pacer);
    if (staging) cudaFreeHost(staging);
    if (host_rows) cudaFreeHost(host_rows);
    if (saved >= 0) cudaSetDevice(saved);
  }

  // Local rank r's heap (offset into it), and any rank's heap as this process addresses it
  // (for the all-to-all transfers; on the Nccl fabric a peer's is an LSA mapping).
  char* at(int r, int64_t offset) const { return static_cast<char*>(fabric.base(r)) + offset; }
  template <class T>
  T* at(int r, int64_t offset) const { return reinterpret_cast<T*>(at(r, offset)); }
  char* addr(int r, int64_t offset) const {
    return fabric.is_local(r) ? at(r, offset) : static_cast<char*>(peers[r]) + offset;
  }
  const RankTensors& tensors(const std::vector<RankTensors>& in, int r) const { return in[r - first]; }
  int64_t row_bytes() const { return int64_t(config.model.hidden) * 2; }
  int64_t meta_bytes() const { return int64_t(dims.meta_per_token) * sizeof(BaselineMeta); }
  static void use(const Lane& l) { COMET_CUDA_CHECK(cudaSetDevice(l.device)); }

  // The lanes, their streams, events, cuBLAS handles and staging copies; the all-to-all mode.
  void make_lanes() {
    first = fabric.first_local_rank();
    num_local = fabric.num_local_ranks();
    std::vector<int> issuer(config.layout.world, 0);
    for (int r = first; r < first + num_local; ++r) {
      const int device = fabric.device_of(r);
      auto it = std::find_if(lanes.begin(), lanes.end(), [&](const Lane& l) { return l.device == device; });
      if (it == lanes.end()) it = lanes.insert(lanes.end(), Lane{device});
      it->ranks.push_back(r);
      issuer[r] = int(it - lanes.begin());
    }
    for (Lane& l : lanes) {
      use(l);
      COMET_CUDA_CHECK(cudaMalloc(&l.upload, staging_layout.total));
      for (cudaStream_t* s : {&l.own, &l.comm, &l.compute})
        COMET_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
      for (auto* events : {&l.dispatched, &l.computed}) {
        events->assign(kBaselineMaxChunks, nullptr);
        for (cudaEvent_t& e : *events) COMET_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      }
      for (cudaEvent_t* e : {&l.fork, &l.joined, &l.pipe_fork, &l.comm_done, &l.compute_done, &l.staged,
                             &l.exchanged, &l.finished})
        COMET_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
      l.cublas = std::make_unique<cuda::CublasExperts>();
    }
    if (num_local < config.layout.world) {
      // Other processes drive the other ranks: NCCL moves the bytes, in stream order on both sides.
      COMET_CHECK(lanes.size() == 1, "BaselineMoe: a process that drives only some ranks must drive them on one GPU ("
                                         << fabric.name() << " fabric, " << lanes.size() << " GPUs)");
      gather.use_fabric(fabric);
      a2a.use_fabric(fabric);
    } else {
      gather.set_issuers(issuer);
      a2a.set_issuers(issuer);
    }
  }

  // An all-to-all moves every rank's bytes in one launch: on one GPU it stands for W ranks'
  // turns, so its pacing adds W latencies (docs/link_emulation.md).
  cuda::LinkPace link_pace() const {
    return cuda::make_link_pace(options.link, pacer, config.layout.world, kMaxPaceWaitNs);
  }

  void apply_options(const BaselineOptions& o) {
    check_options(o);
    options = o;
    dims.chunks = o.chunks;
    dims.count_row_len = core::baseline_count_row_len(config, o.chunks);
    have_layout = false;
    options_agreed = false;
  }
  // The chunk count sets the count exchange's row length and, with the schedule, the order of
  // the all-to-alls: ranks of several processes that disagree on them would post NCCL transfers
  // of different sizes or in a different order. The next forward (collective) compares them
  // first, so a disagreement is an error that names both options rather than a hang or rows
  // read at the wrong length. One process drives every rank with the same options.
  bool options_agreed = false;
  void agree_options() {
    if (options_agreed) return;
    if (fabric.num_local_ranks() < config.layout.world)
      fabric.agree(uint64_t(options.chunks) * 2 + (options.pipelined ? 1 : 0), "the BaselineOptions (chunks, schedule)",
                   options.describe());
    options_agreed = true;
  }

  // The count exchange of every chunk count (all-to-all id = chunks - 1): rank r's row into slot
  // r of every rank's table, rows packed at that count's length. Staged once, so that changing
  // options costs nothing inside a timed loop.
  void stage_count_exchanges() {
    const int W = config.layout.world;
    gather.clear();
    for (int chunks = 1; chunks <= kBaselineMaxChunks; ++chunks) {
      const int id = gather.add();
      const int64_t bytes = int64_t(core::baseline_count_row_len(config, chunks)) * 4;
      for (int r = 0; r < W; ++r)
        for (int q = 0; q < W; ++q)
          gather.add_transfer(id, {r, q, addr(r, heap.count_row), addr(q, heap.count_table) + r * bytes, bytes});
    }
    std::vector<char> host(gather.staged_bytes());
    std::vector<void*> device(lanes.size(), nullptr);
    for (size_t i = 0; i < lanes.size() && !host.empty(); ++i) {
      use(lanes[i]);
      COMET_CUDA_CHECK(cudaMalloc(&lanes[i].gather_segments, host.size()));
      device[i] = lanes[i].gather_segments;
    }
    gather.stage(host.data(), device.data());
    for (Lane& l : lanes)
      if (l.gather_segments) {
        use(l);
        COMET_CUDA_CHECK(cudaMemcpy(l.gather_segments, host.data(), host.size(), cudaMemcpyHostToDevice));
      }
    // Landed (with the constructor's memsets) before a forward on any stream: these run on the
    // legacy stream, which a caller's non-blocking stream does not wait for.
    for (const Lane& l : lanes) {
      use(l);
      COMET_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }

  // A call's start: each lane's main stream (the caller's, or its own stream forked from it).
  void begin(cudaStream_t stream) {
    // The special handles (legacy and per-thread default streams) name the current device's.
    int device = 0;
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
      COMET_CUDA_CHECK(cudaGetDevice(&device));
    else
      COMET_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
    auto it = std::find_if(lanes.begin(), lanes.end(), [&](const Lane& l) { return l.device == device; });
    COMET_CHECK(it != lanes.end(), "BaselineMoe: the stream is on GPU " << device << ", which runs none of this "
                                                                          "process's ranks (the first runs on GPU "
                                                                       << lanes[0].device << ")");
    caller = int(it - lanes.begin());
    Lane& home = lanes[caller];
    home.main = stream;
    use(home);  // every operation on a lane's stream runs with its GPU current (the null stream)
    // A previous call on another stream may still read the upload buffers and the heaps.
    if (last_finished) COMET_CUDA_CHECK(cudaStreamWaitEvent(stream, last_finished, 0));
    if (lanes.size() == 1) return;
    COMET_CUDA_CHECK(cudaEventRecord(home.fork, stream));
    for (Lane& l : lanes)
      if (&l != &home) {
        l.main = l.own;
        COMET_CUDA_CHECK(cudaStreamWaitEvent(l.own, home.fork, 0));
      }
  }

  // A bounded wait for the last call's work, the part on the caller's stream included (on the
  // Nccl fabric the all-to-alls run there): the lanes' own streams wait for its end, then the
  // fabric waits for them. A peer that is gone makes that wait time out (on the Nccl fabric it
  // then aborts the communicator, ending the kernels that wait for the peer) where a device
  // synchronization or cudaFree would wait forever. Before every such call.
  void drain_last_call() {
    if (!last_finished) return;
    fabric::detail::DeviceGuard guard;
    for (Lane& l : lanes) {
      if (!l.own) continue;
      COMET_CUDA_CHECK(cudaSetDevice(l.device));
      COMET_CUDA_CHECK(cudaStreamWaitEvent(l.own, last_finished, 0));
      fabric.wait(l.own, "waiting for the baseline's last call to end");
    }
  }

  // A call's end: the other lanes joined into the caller's stream.
  void end(cudaStream_t stream) {
    Lane& home = lanes[caller];
    use(home);
    for (Lane& l : lanes)
      if (&l != &home) {
        COMET_CUDA_CHECK(cudaEventRecord(l.joined, l.own));
        COMET_CUDA_CHECK(cudaStreamWaitEvent(stream, l.joined, 0));
      }
    COMET_CUDA_CHECK(cudaEventRecord(home.finished, stream));
    last_finished = home.finished;
  }

  // Runs all-to-all `id` of `plan`, each lane's part on its stream `which`; with several lanes
  // every lane's stream then waits for every lane's part.
  void exchange(const cuda::AllToAllPlan& plan, int id, cudaStream_t Lane::*which) {
    for (size_t i = 0; i < lanes.size(); ++i) {
      use(lanes[i]);
      plan.run(id, int(i), lanes[i].*which, link_pace());
    }
    if (lanes.size() == 1) return;
    for (const Lane& l : lanes) {
      use(l);
      COMET_CUDA_CHECK(cudaEventRecord(l.exchanged, l.*which));
    }
    for (const Lane& l : lanes) {
      use(l);
      for (const Lane& o : lanes)
        if (&o != &l) COMET_CUDA_CHECK(cudaStreamWaitEvent(l.*which, o.exchanged, 0));
    }
  }

  // Steps 1-2: counts on the device, exchanged, read back (the host synchronization).
  void route(const std::vector<RankTensors>& in) {
    for (const Lane& l : lanes) {
      use(l);
      for (int r : l.ranks) {
        int32_t* row = at<int32_t>(r, heap.count_row);
        const RankTensors& t = tensors(in, r);
        COMET_CUDA_CHECK(cudaMemsetAsync(row, 0, size_t(dims.count_row_len) * 4, l.main));
        cuda::launch_route_scan(dims, t.expert_ids, t.weights, t.num_tokens, row, at<int32_t>(r, heap.item_rank),
                                at<int32_t>(r, heap.group_rank), at<int32_t>(r, heap.block_base), l.main);
        cuda::launch_route_prefix(dims, row, at<int32_t>(r, heap.block_base), at<int32_t>(r, heap.chunk_prefix),
                                  l.main);
      }
    }
    exchange(gather, options.chunks - 1, &Lane::main);
    // Every rank now holds every row; one local rank's table is what this process reads.
    const Lane& home = lanes[caller];
    use(home);
    COMET_CUDA_CHECK(cudaMemcpyAsync(host_rows, at(home.ranks[0], heap.count_table),
                                     size_t(config.layout.world) * dims.count_row_len * 4, cudaMemcpyDeviceToHost,
                                     home.main));
    // Bounded on the Nccl fabric: a peer that never sends its counts fails the call by name.
    fabric.wait(home.main, "waiting for the baseline's exchange of token counts");
  }

  // Step 3: the layout, the all-to-alls and the GEMM shapes of this call, staged and uploaded.
  // Every process lays out every rank (the same layout everywhere) and adds every pair's
  // transfers (the traffic counts all of them; the fabric needs the same calls everywhere).
  void plan() {
    const int W = config.layout.world, C = options.chunks, epr = config.experts_per_rank();
    const int H = config.model.hidden, Fl = config.ffn_per_rank();
    const core::BaselineCounts counts = core::parse_baseline_counts(config, host_rows, C);  // throws on bad input
    layout = core::BaselineLayout(config, counts);
    have_layout = false;
    for (int r = 0; r < W; ++r)
      COMET_CHECK(layout.send_total(r) <= max_send_rows(config) && layout.recv_total(r) <= max_recv_rows(config) &&
                      layout.a_total(r) <= max_a_rows(config),
                  "BaselineMoe: rank " << r << " needs more rows than its buffers hold (send "
                                       << layout.send_total(r) << ", recv " << layout.recv_total(r) << ", A "
                                       << layout.a_total(r) << ")");
    for (const Lane& l : lanes) {
      use(l);
      COMET_CUDA_CHECK(cudaEventSynchronize(l.staged));  // the previous upload has read the staging
    }
    const StagingLayout& s = staging_layout;
    for (int r = first; r < first + num_local; ++r)
      layout.write_sender_table(r, reinterpret_cast<int32_t*>(staging + s.tables) + r * s.table_entries);

    a2a.clear();
    dispatch_id.assign(C, -1);
    combine_id.assign(C, -1);
    for (int c = 0; c < C; ++c) {
      dispatch_id[c] = a2a.add();
      combine_id[c] = a2a.add();
      for (int src = 0; src < W; ++src)
        for (int dst = 0; dst < W; ++dst) {
          const int64_t rows = layout.send_rows(src, c, dst), sent = layout.send_begin(src, c, dst),
                        got = layout.recv_begin(dst, c, src);
          a2a.add_transfer(dispatch_id[c], {src, dst, addr(src, heap.send) + sent * row_bytes(),
                                            addr(dst, heap.recv) + got * row_bytes(), rows * row_bytes()});
          a2a.add_transfer(dispatch_id[c], {src, dst, addr(src, heap.send_meta) + sent * meta_bytes(),
                                            addr(dst, heap.recv_meta) + got * meta_bytes(), rows * meta_bytes()});
          a2a.add_transfer(combine_id[c], {dst, src, addr(dst, heap.recv) + got * row_bytes(),
                                           addr(src, heap.send) + sent * row_bytes(), rows * row_bytes()});
        }
    }
    COMET_CHECK(a2a.staged_bytes() <= s.segment_bytes, "BaselineMoe: segment lists overflow their staging");
    std::vector<void*> segments;
    for (const Lane& l : lanes) segments.push_back(l.upload + s.segments);
    a2a.stage(staging + s.segments, segments.data());

    shapes0.assign(size_t(W) * C, {});
    shapes1.assign(size_t(W) * C, {});
    pointers0.assign(size_t(W) * C, -1);
    pointers1.assign(size_t(W) * C, -1);
    void** pointers = reinterpret_cast<void**>(staging + s.pointers);
    int64_t used = 0;
    for (int d = first; d < first + num_local; ++d)
      for (int c = 0; c < C; ++c) {
        const size_t i = size_t(d) * C + c;
        cuda::ExpertGemmShapes& g0 = shapes0[i];
        for (int el = 0; el < epr; ++el) {
          g0.rows.push_back(layout.a_rows(d, c, el));
          g0.offsets.push_back(layout.a_begin(d, c, el));
        }
        g0.n = n0;
        g0.k = H;
        shapes1[i] = g0;
        shapes1[i].n = H;
        shapes1[i].k = Fl;
        if (options.gemm != BaselineGemm::kGroupedBatched) continue;
        pointers0[i] = used;
        cuda::CublasExperts::grouped_pointers(g0, at(d, heap.a_rows), w0[d], at(d, heap.inter0), pointers + used);
        used += 3 * cuda::CublasExperts::grouped_groups(g0);
        pointers1[i] = used;
        cuda::CublasExperts::grouped_pointers(shapes1[i], at(d, heap.inter), w1[d], at(d, heap.a_rows),
                                              pointers + used);
        used += 3 * cuda::CublasExperts::grouped_groups(shapes1[i]);
      }
    COMET_CHECK(used <= s.pointer_entries, "BaselineMoe: GEMM pointer arrays overflow their staging");
    for (const Lane& l : lanes) {
      use(l);
      COMET_CUDA_CHECK(
          cudaMemcpyAsync(l.upload, staging, s.segments + a2a.staged_bytes(), cudaMemcpyHostToDevice, l.main));
      if (used)
        COMET_CUDA_CHECK(cudaMemcpyAsync(l.upload + s.pointers, staging + s.pointers, used * sizeof(void*),
                                         cudaMemcpyHostToDevice, l.main));
      COMET_CUDA_CHECK(cudaEventRecord(l.staged, l.main));
    }

    traffic = {};
    for (int c = 0; c < C; ++c) {
      traffic.dispatch_bytes += a2a.bytes(dispatch_id[c], false);
      traffic.dispatch_remote_bytes += a2a.bytes(dispatch_id[c], true);
      traffic.combine_bytes += a2a.bytes(combine_id[c], false);
      traffic.combine_remote_bytes += a2a.bytes(combine_id[c], true);
    }
    have_layout = true;
  }

  // Step 4.
  void pack(const std::vector<RankTensors>& in) const {
    for (const Lane& l : lanes) {
      use(l);
      for (int r : l.ranks) {
        const RankTensors& t = tensors(in, r);
        cuda::BaselinePackArgs a;
        a.dims = dims;
        a.num_tokens = layout.num_tokens(r);
        a.x = t.x;
        a.expert_ids = t.expert_ids;
        a.weights = t.weights;
        a.item_rank = at<int32_t>(r, heap.item_rank);
        a.group_rank = at<int32_t>(r, heap.group_rank);
        a.block_base = at<int32_t>(r, heap.block_base);
        a.chunk_prefix = at<int32_t>(r, heap.chunk_prefix);
        a.sender_table =
            reinterpret_cast<const int32_t*>(l.upload + staging_layout.tables) + r * staging_layout.table_entries;
        a.send_rows = at(r, heap.send);
        a.send_meta = at<BaselineMeta>(r, heap.send_meta);
        a.send_pos = at<int32_t>(r, heap.send_pos);
        cuda::launch_pack(a, l.main);
      }
    }
  }

  // Step 5, one piece each; every lane's part, on its stream `which`.
  void dispatch(int c, cudaStream_t Lane::*which) { exchange(a2a, dispatch_id[c], which); }
  void combine(int c, cudaStream_t Lane::*which) { exchange(a2a, combine_id[c], which); }

  void gemm(int which, const Lane& l, int d, int c, cudaStream_t stream) {
    const size_t i = size_t(d) * layout.chunks() + c;
    const cuda::ExpertGemmShapes& s = which == 0 ? shapes0[i] : shapes1[i];
    if (options.gemm == BaselineGemm::kGroupedBatched) {
      void* const* device = reinterpret_cast<void* const*>(l.upload + staging_layout.pointers) +
                            (which == 0 ? pointers0[i] : pointers1[i]);
      l.cublas->grouped(s, device, stream);
    } else if (which == 0) {
      l.cublas->per_expert_loop(s, at(d, heap.a_rows), w0[d], at(d, heap.inter0), stream);
    } else {
      l.cublas->per_expert_loop(s, at(d, heap.inter), w1[d], at(d, heap.a_rows), stream);
    }
  }

  // Permute .. un-permute of chunk c for lane l's ranks, on `stream` (of l's GPU, current).
  void compute_chunk(int c, const Lane& l, cudaStream_t stream) {
    const int H = config.model.hidden, mpt = dims.meta_per_token;
    for (int d : l.ranks) {
      const int j0 = layout.recv_chunk_begin(d, c), j1 = layout.recv_chunk_begin(d, c + 1);
      if (j0 == j1) continue;
      const BaselineMeta* meta = at<BaselineMeta>(d, heap.recv_meta);
      cuda::launch_permute(j0, j1, H, mpt, at(d, heap.recv), meta, at(d, heap.a_rows), stream);
      gemm(0, l, d, c, stream);
      cuda::launch_activation(config.model.activation, layout.a_chunk_begin(d, c), layout.a_chunk_begin(d, c + 1),
                              config.ffn_per_rank(), n0, at(d, heap.inter0), at(d, heap.inter), stream);
      gemm(1, l, d, c, stream);
      cuda::launch_unpermute(j0, j1, H, mpt, at(d, heap.a_rows), meta, at(d, heap.recv), stream);
    }
  }

  void reduce_chunk(int c, const std::vector<RankTensors>& in, const Lane& l, cudaStream_t stream) const {
    const int W = config.layout.world, C = layout.chunks();
    for (int r : l.ranks) {
      const int T = layout.num_tokens(r);
      cuda::launch_owner_reduce(core::chunk_begin(T, C, c), core::chunk_begin(T, C, c + 1), W, config.model.hidden,
                                at(r, heap.send), at<int32_t>(r, heap.send_pos), tensors(in, r).y, stream);
    }
  }

  void run_sequential(const std::vector<RankTensors>& in) {
    for (int c = 0; c < layout.chunks(); ++c) {
      dispatch(c, &Lane::main);
      for (const Lane& l : lanes) {
        use(l);
        compute_chunk(c, l, l.main);
      }
      combine(c, &Lane::main);
      for (const Lane& l : lanes) {
        use(l);
        reduce_chunk(c, in, l, l.main);
      }
    }
  }

  // Every lane records its event `events[c]` on its stream `which`.
  void record(std::vector<cudaEvent_t> Lane::*events, int c, cudaStream_t Lane::*which) const {
    for (const Lane& l : lanes) {
      use(l);
      COMET_CUDA_CHECK(cudaEventRecord((l.*events)[c], l.*which));
    }
  }

  void run_pipelined(const std::vector<RankTensors>& in) {
    const int C = layout.chunks();
    for (const Lane& l : lanes) {
      use(l);
      COMET_CUDA_CHECK(cudaEventRecord(l.pipe_fork, l.main));
      COMET_CUDA_CHECK(cudaStreamWaitEvent(l.comm, l.pipe_fork, 0));
      COMET_CUDA_CHECK(cudaStreamWaitEvent(l.compute, l.pipe_fork, 0));
    }
    dispatch(0, &Lane::comm);
    record(&Lane::dispatched, 0, &Lane::comm);
    for (int c = 0; c < C; ++c) {
      for (const Lane& l : lanes) {
        use(l);
        COMET_CUDA_CHECK(cudaStreamWaitEvent(l.compute, l.dispatched[c], 0));
        compute_chunk(c, l, l.compute);
        COMET_CUDA_CHECK(cudaEventRecord(l.computed[c], l.compute));
      }
      if (c + 1 < C) {  // issued before the wait below, so it overlaps chunk c's GEMMs
        dispatch(c + 1, &Lane::comm);
        record(&Lane::dispatched, c + 1, &Lane::comm);
      }
      for (const Lane& l : lanes) {
        use(l);
        COMET_CUDA_CHECK(cudaStreamWaitEvent(l.comm, l.computed[c], 0));
      }
      combine(c, &Lane::comm);
      for (const Lane& l : lanes) {
        use(l);
        reduce_chunk(c, in, l, l.comm);
      }
    }
    for (const Lane& l : lanes) {
      use(l);
      COMET_CUDA_CHECK(cudaEventRecord(l.comm_done, l.comm));
      COMET_CUDA_CHECK(cudaEventRecord(l.compute_done, l.compute));
      COMET_CUDA_CHECK(cudaStreamWaitEvent(l.main, l.comm_done, 0));
      COMET_CUDA_CHECK(cudaStreamWaitEvent(l.main, l.compute_done, 0));
    }
  }
};

Status BaselineMoe::can_implement(const LayerConfig& c) {
  if (c.dtype != DType::kBF16)
    return Status::failure(std::string("the baselines run bf16 only, got ") + dtype_name(c.dtype));
  const Status s = c.validate();
  if (!s) return s;
  const int Fl = c.ffn_per_rank();
  if (c.model.hidden % 8 != 0 || Fl % 8 != 0)
    return Status::failure("the baselines need H and F/TP multiples of 8 (16-byte rows), got H=" +
                           std::to_string(c.model.hidden) + ", F/TP=" + std::to_string(Fl));
  if (c.model.topk > 32)
    return Status::failure("the baselines support topk <= 32, got " + std::to_string(c.model.topk));
  // In int64 so that the sum cannot wrap, whatever bounds validate() puts on E and EP.
  const int64_t routing_table_entries = int64_t(c.model.num_experts) + c.layout.ep;
  if (routing_table_entries > 1536)
    return Status::failure("the baselines support E + EP <= 1536 (shared-memory routing tables), got " +
                           std::to_string(routing_table_entries));
  if (c.max_tokens_per_rank < 1) return Status::failure("max_tokens_per_rank must be >= 1");
  if (max_a_rows(c) > (int64_t(1) << 31) - 1 || max_send_rows(c) > (int64_t(1) << 31) - 1)
    return Status::failure("a rank's buffers would hold more than 2^31 - 1 rows (" + std::to_string(max_a_rows(c)) +
                           "): fewer tokens per rank");
  return Status::success();
}

int64_t BaselineMoe::device_bytes(const LayerConfig& c) {
  const int64_t W = c.layout.world, H = c.model.hidden, Fl = c.ffn_per_rank();
  const int64_t weights = int64_t(c.experts_per_rank()) * (cuda::gemm0_weight_rows(c) + Fl) * H * 2;
  const int64_t cublas_workspace = int64_t(64) << 20;
  const int64_t count_exchanges = kBaselineMaxChunks * W * W * int64_t(sizeof(cuda::CopySegment));
  return W * (HeapLayout(c).total + weights) + StagingLayout(c).total + cublas_workspace + count_exchanges +
         int64_t(sizeof(cuda::LinkPacer));
}

BaselineMoe::BaselineMoe(const LayerConfig& config, fabric::Fabric& fabric, const BaselineOptions& options) {
  const Status ok = can_implement(config);
  COMET_CHECK(ok.ok, "BaselineMoe: " << ok.reason);
  check_options(options);
  COMET_CHECK(fabric.world() == config.layout.world,
              "BaselineMoe: the fabric has " << fabric.world() << " ranks, the layout " << config.layout.world);
  fabric::detail::DeviceGuard guard;
  impl_ = std::make_unique<Impl>(config, fabric);
  Impl& m = *impl_;
  const LayerConfig& c = m.config;
  const int W = c.layout.world;
  m.n0 = cuda::gemm0_weight_rows(c);
  m.dims.world = W;
  m.dims.ep = c.layout.ep;
  m.dims.tp = c.layout.tp;
  m.dims.num_experts = c.model.num_experts;
  m.dims.experts_per_rank = c.experts_per_rank();
  m.dims.topk = c.model.topk;
  m.dims.hidden = c.model.hidden;
  m.dims.t_max = c.max_tokens_per_rank;
  m.dims.meta_per_token = meta_per_token(c);
  m.fabric.agree(config_fingerprint(m.config), "the BaselineMoe's config", m.config.describe());  // collective
  m.fabric.allocate(m.heap.total);  // Nccl: collective
  m.heap_generation = m.fabric.heap_generation();
  m.peers = m.fabric.peer_table_host(m.fabric.first_local_rank());
  m.w0.assign(W, nullptr);
  m.w1.assign(W, nullptr);
  // Portable: every lane's GPU copies from them.
  COMET_CUDA_CHECK(cudaHostAlloc(&m.staging, m.staging_layout.total, cudaHostAllocPortable));
  COMET_CUDA_CHECK(cudaHostAlloc(&m.host_rows, size_t(W) * core::baseline_count_row_len(c, kBaselineMaxChunks) * 4,
                                 cudaHostAllocPortable));
  m.make_lanes();
  m.use(m.lanes[0]);
  COMET_CUDA_CHECK(cudaMalloc(&m.pacer, sizeof(cuda::LinkPacer)));
  COMET_CUDA_CHECK(cudaMemset(m.pacer, 0, sizeof(cuda::LinkPacer)));
  m.stage_count_exchanges();
  m.apply_options(options);
}

BaselineMoe::~BaselineMoe() = default;

void BaselineMoe::set_options(const BaselineOptions& options) { impl_->apply_options(options); }
const BaselineOptions& BaselineMoe::options() const { return impl_->options; }
const LayerConfig& BaselineMoe::config() const { return impl_->config; }
BaselineTraffic BaselineMoe::last_traffic() const { return impl_->traffic; }

void BaselineMoe::set_weights(const ExpertWeights& weights) {
  Impl& m = *impl_;
  weights.check(m.config.model);
  m.drain_last_call();
  fabric::detail::DeviceGuard guard;
  m.forget_weights(m.first, m.first + m.num_local);
  for (int r = m.first; r < m.first + m.num_local; ++r) {
    const cuda::RankWeights w = cuda::slice_rank_weights(m.config, weights, r);
    COMET_CUDA_CHECK(cudaSetDevice(m.fabric.device_of(r)));
    m.allocate_weights(r);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());  // synchronous on every stream, as MoeLayer::set_weights
    COMET_CUDA_CHECK(cudaMemcpy(m.w0[r], w.w0.data(), w.w0.size() * 2, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaMemcpy(m.w1[r], w.w1.data(), w.w1.size() * 2, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    m.weights_installed(r);
  }
}

void BaselineMoe::set_rank_weights(int rank, const RankExpertWeights& weights) {
  Impl& m = *impl_;
  m.fabric.check_local(rank, "BaselineMoe::set_rank_weights");
  cuda::check_rank_weights(m.config, weights);
  m.drain_last_call();
  fabric::detail::DeviceGuard guard;
  m.forget_weights(rank, rank + 1);
  COMET_CUDA_CHECK(cudaSetDevice(m.fabric.device_of(rank)));
  m.allocate_weights(rank);
  cuda::copy_rank_weights(m.config, weights, m.w0[rank], m.w1[rank]);
  m.weights_installed(rank);
}

// The streams and scales of MoeLayer::set_random_weights, over the same layouts: rank r's
// weights depend on (seed, r) only, so every fabric gives a rank the same weights.
void BaselineMoe::set_random_weights(uint64_t seed) {
  Impl& m = *impl_;
  fabric::detail::DeviceGuard guard;
  const size_t H = m.config.model.hidden, Fl = m.config.ffn_per_rank();
  m.drain_last_call();
  m.forget_weights(m.first, m.first + m.num_local);
  for (int r = m.first; r < m.first + m.num_local; ++r) {
    COMET_CUDA_CHECK(cudaSetDevice(m.fabric.device_of(r)));
    m.allocate_weights(r);
    cuda::fill_uniform_bf16(m.w0[r], m.w0_elements(), seed * 64 + 2 * r, 1.f / std::sqrt(float(H)));
    cuda::fill_uniform_bf16(m.w1[r], m.w1_elements(), seed * 64 + 2 * r + 1, 1.f / std::sqrt(float(Fl)));
  }
  for (const Lane& l : m.lanes) {
    Impl::use(l);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
  for (int r = m.first; r < m.first + m.num_local; ++r) m.weights_installed(r);
}

void BaselineMoe::forward(const std::vector<RankTensors>& in, CUstream_st* stream) {
  Impl& m = *impl_;
  COMET_CHECK(m.have_weights(), "BaselineMoe: set_weights(), set_random_weights() or set_rank_weights() for every local "
                              "rank must be called before forward()");
  COMET_CHECK(int(in.size()) == m.num_local,
              "BaselineMoe: forward got tensors for " << in.size() << " ranks, this process drives " << m.num_local
                                                      << " (ranks " << m.first << ".." << m.first + m.num_local - 1
                                                      << " of " << m.config.layout.world << " on the "
                                                      << m.fabric.name() << " fabric): one RankTensors per local rank");
  COMET_CHECK(!m.options.link.on() || (m.lanes.size() == 1 && m.num_local == m.config.layout.world),
              "BaselineMoe: link emulation stands for a node on one GPU; it needs every rank on one GPU (the "
              "loopback fabric), not the " << m.fabric.name() << " fabric's real links");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  COMET_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  COMET_CHECK(capture == cudaStreamCaptureStatusNone,
              "BaselineMoe: forward() cannot be captured in a CUDA graph: it reads the ranks' token counts on "
              "the host once per call (docs/baselines.md); MoeLayer's forward can be captured");
  m.tensor_check.check(in, m.fabric, stream);
  m.check_heap();
  m.agree_options();  // collective on a multi-process fabric, once after each set_options
  fabric::detail::DeviceGuard guard;
  m.begin(stream);
  m.route(in);
  m.plan();
  m.pack(in);
  if (m.options.pipelined) m.run_pipelined(in);
  else m.run_sequential(in);
  m.end(stream);
}

void BaselineMoe::run_part(Part part, CUstream_st* stream) {
  Impl& m = *impl_;
  m.check_heap();
  COMET_CHECK(m.have_layout,
              "BaselineMoe: run forward() once (after the last set_options or set_weights) before run_part()");
  fabric::detail::DeviceGuard guard;
  m.begin(stream);
  for (int c = 0; c < m.layout.chunks(); ++c) {
    if (part == Part::kCompute) {
      for (const Lane& l : m.lanes) {
        Impl::use(l);
        m.compute_chunk(c, l, l.main);
      }
    } else {
      m.dispatch(c, &Lane::main);
      m.combine(c, &Lane::main);
    }
  }
  m.end(stream);
}

}  // namespace comet
