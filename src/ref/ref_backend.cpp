// The CPU backend: the Comet protocol with ranks as threads over a host symmetric heap.
//
// One forward, per rank thread (DESIGN §4):
//   1. publish x and routing into the own symmetric regions; barrier
//   2. read every rank's routing, build the (identical) dispatch plan and this rank's schedules
//   3. layer0 "launch": comm workers pull each sent token once from its owner and copy it into
//      every local A row it feeds, then release-add the rows landed per M tile; compute workers
//      take tiles in schedule order, acquire-wait until the tile's rows are in, and compute
//      I = act(A W0) for one column block
//   4. layer1 "launch": compute workers run column-block-major and release-add col_done[j] per
//      stored tile; comm workers acquire-wait for a column block to be complete over all local
//      experts, pre-reduce each token's local rows in fp32 (weighted), and store the partial row
//      into the owner's combine_recv slot, then release-add the owner's combine_arr[rank]
//   5. owner reduce: wait for every peer's arrivals, sum partials in rank order 0..W-1; barrier
//
// NOTES: signals are never reset between calls. A consumer waits for `base + expected`, where
// base is the sum of what it consumed in earlier calls (kept per rank in RankEpochs, updated
// after the layer's workers have joined). Only a failed forward zeroes counters and bases,
// when no worker runs.
#include "ref/ref_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <tuple>

#include "comet/workspace.h"
#include "core/activation.h"
#include "ref/symmetric_heap.h"

namespace comet::ref {

namespace {

// First real failure of a forward; raising it stops every other wait (WaitPolicy::abort).
class FailureLog {
 public:
  explicit FailureLog(std::atomic<bool>* abort) : abort_(abort) {}
  void record(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!first_) first_ = error;
    abort_->store(true);
  }
  std::exception_ptr first() {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_;
  }

 private:
  std::atomic<bool>* abort_;
  std::mutex mutex_;
  std::exception_ptr first_;
};

template <class Fn>
void guarded(FailureLog& log, Fn&& fn) {
  try {
    fn();
  } catch (const Aborted&) {
    // Someone else failed first; their error is the one reported.
  } catch (...) {
    log.record(std::current_exception());
  }
}

// The CPU analogue of a kernel launch (also used for the rank threads): threads running fn(i)
// for i in [0, n), joined before returning. If a thread cannot be created
// (system limits), the failure is recorded (which aborts every wait) and the threads already
// started are still joined: never std::terminate from a joinable thread's destructor.
void launch_workers(int n, FailureLog& log, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    try {
      threads.emplace_back([&log, &fn, i] { guarded(log, [&] { fn(i); }); });
    } catch (const std::exception& e) {  // std::system_error, or std::bad_alloc for its state
      log.record(std::make_exception_ptr(
          Error(std::string("the CPU backend could not start thread ") + std::to_string(i + 1) + " of " +
                std::to_string(n) + ": " + e.what() + " (fewer ranks or workers)")));
      break;
    }
  }
  for (auto& t : threads) t.join();
}


struct CallContext {
  std::atomic<bool> abort{false};
  FailureLog log{&abort};
  WaitPolicy policy;
  bool trace = false;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
  std::mutex trace_mutex;
  std::vector<TraceEvent> events;
  std::atomic<int64_t> rows_landed{0};
  std::atomic<int64_t> tiles_waited{0};
  std::atomic<int64_t> partial_rows_sent{0};
  void stop_if_aborted() const {
    if (abort.load()) throw Aborted{};
  }
};

// Events of one worker, kept locally and merged into the call's list when the worker ends.
class Recorder {
 public:
  Recorder(CallContext& ctx, int rank, int layer, int lane) : ctx_(ctx), rank_(rank), layer_(layer), lane_(lane) {}
  ~Recorder() {
    if (local_.empty()) return;
    std::lock_guard<std::mutex> lock(ctx_.trace_mutex);
    ctx_.events.insert(ctx_.events.end(), local_.begin(), local_.end());
  }
  int64_t now() const {
    if (!ctx_.trace) return 0;
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - ctx_.origin).count();
  }
  void add(TraceKind kind, int id, int64_t begin, int64_t end) {
    if (ctx_.trace) local_.push_back(make_trace_event(rank_, layer_, lane_, kind, id, begin, end));
  }

 private:
  CallContext& ctx_;
  int rank_, layer_, lane_;
  std::vector<TraceEvent> local_;
};

// What a rank has consumed from each of its signals in earlier calls.
struct RankEpochs {
  std::vector<uint64_t> tile_base;     // [max M tiles]
  std::vector<uint64_t> col_base;      // [column blocks]
  std::vector<uint64_t> combine_base;  // [W]
  uint64_t barriers = 0;               // barriers passed
};

class ImplBase {
 public:
  virtual ~ImplBase() = default;
  virtual void set_weights(const ExpertWeights& weights) = 0;
  virtual std::vector<std::vector<float>> forward(const std::vector<std::vector<float>>& x,
                                                  const std::vector<Routing>& routing) = 0;
  virtual void set_options(const RefOptions& options) = 0;
  ForwardStats stats;
  Trace trace;
};

template <class T>
class TypedImpl final : public ImplBase {
 public:
  TypedImpl(const LayerConfig& config, const RefOptions& options)
      : config_(config),
        options_(options),
        layout_(config),
        heap_(config.layout.world, layout_.total_bytes()),
        epochs_(config.layout.world) {
    check_options(options);
    reset_signals();
  }

  static void check_options(const RefOptions& options) {
    COMET_CHECK(options.comm_workers >= 1 && options.compute_workers >= 1 &&
                    options.comm_workers <= RefOptions::kMaxWorkers && options.compute_workers <= RefOptions::kMaxWorkers,
                "the CPU backend needs between 1 and " << RefOptions::kMaxWorkers
                                                       << " comm and compute workers per rank (got "
                                                       << options.comm_workers << " and " << options.compute_workers
                                                       << ")");
    COMET_CHECK(options.comm_chunk_tokens >= 1, "comm_chunk_tokens must be >= 1");
    COMET_CHECK(options.layer0_stages >= 0, "layer0_stages must be >= 0 (0: one per ring position), got "
                                                << options.layer0_stages);
    COMET_CHECK(options.timeout.count() > 0 && options.timeout <= RefOptions::kMaxTimeout,
                "timeout must be within (0, " << RefOptions::kMaxTimeout.count() << "] ms, got "
                                              << options.timeout.count() << " ms");
  }

  void set_weights(const ExpertWeights& w) override;
  void set_options(const RefOptions& options) override {
    check_options(options);
    options_ = options;
  }
  std::vector<std::vector<float>> forward(const std::vector<std::vector<float>>& x,
                                          const std::vector<Routing>& routing) override;

 private:
  struct RankView {  // rank's symmetric regions
    T* x;
    int32_t* route_ids;
    float* route_weights;
    int32_t* token_count;
    T* a_rows;
    T* inter;
    T* out_rows;
    T* combine_recv;
    T* y;
    uint64_t* tile_arrivals;
    uint64_t* col_done;
    uint64_t* combine_arr;
    uint64_t* barrier;
  };
  RankView view(int rank) {
    auto reg = [&](const char* name) { return heap_.base(rank) + layout_.region(name).offset_bytes; };
    return {reinterpret_cast<T*>(reg("x")),
            reinterpret_cast<int32_t*>(reg("route_ids")),
            reinterpret_cast<float*>(reg("route_weights")),
            reinterpret_cast<int32_t*>(reg("token_count")),
            reinterpret_cast<T*>(reg("a_rows")),
            reinterpret_cast<T*>(reg("inter")),
            reinterpret_cast<T*>(reg("out_rows")),
            reinterpret_cast<T*>(reg("combine_recv")),
            reinterpret_cast<T*>(reg("y")),
            reinterpret_cast<uint64_t*>(reg("tile_arrivals")),
            reinterpret_cast<uint64_t*>(reg("col_done")),
            reinterpret_cast<uint64_t*>(reg("combine_arr")),
            reinterpret_cast<uint64_t*>(reg("barrier"))};
  }

  void check_inputs(const std::vector<std::vector<float>>& x, const std::vector<Routing>& routing) const;
  void reset_signals();
  void run_rank(int r, const std::vector<float>& x, const Routing& routing, CallContext& ctx,
                std::vector<float>& y);
  void barrier(int r, CallContext& ctx, const char* when);
  void run_layer0(int r, const DispatchPlan& plan, CallContext& ctx);
  void run_layer1(int r, const DispatchPlan& plan, const std::vector<Routing>& routing, CallContext& ctx);
  void owner_reduce(int r, const DispatchPlan& plan, CallContext& ctx);
  bool stalled(int r, StallStage stage) const {
    return options_.stall_rank == r && options_.stall_stage == stage;
  }
  static std::string who(int r, const char* role, int worker = -1) {
    std::ostringstream os;
    os << "rank " << r << " " << role;
    if (worker >= 0) os << " " << worker;
    return os.str();
  }

  LayerConfig config_;
  RefOptions options_;
  WorkspaceLayout layout_;
  SymmetricHeap heap_;
  std::vector<RankEpochs> epochs_;
  // Each rank's weight slice, fp32 holding values of the storage dtype:
  // gate/up [E/EP][H][F/TP], down [E/EP][F/TP][H].
  std::vector<std::vector<float>> w_gate_, w_up_, w_down_;
  bool have_weights_ = false;
};

template <class T>
void TypedImpl<T>::reset_signals() {
  heap_.zero({&layout_.region("tile_arrivals"), &layout_.region("col_done"),
              &layout_.region("combine_arr"), &layout_.region("barrier")});
  for (RankEpochs& e : epochs_) {
    e.tile_base.assign(config_.max_m_tiles_per_rank(), 0);
    e.col_base.assign(config_.num_col_blocks1(), 0);
    e.combine_base.assign(config_.layout.world, 0);
    e.barriers = 0;
  }
}

template <class T>
void TypedImpl<T>::set_weights(const ExpertWeights& w) {
  const ModelShape& m = config_.model;
  w.check(m);
  const int W = config_.layout.world, Epr = config_.experts_per_rank();
  const size_t H = m.hidden, F = m.ffn, Fl = config_.ffn_per_rank();
  const bool gated = is_gated(m.activation);
  w_gate_.assign(W, {});
  w_up_.assign(W, {});
  w_down_.assign(W, {});
  for (int r = 0; r < W; ++r) {
    const int ep = config_.layout.ep_index(r), tp = config_.layout.tp_index(r);
    if (gated) w_gate_[r].resize(Epr * H * Fl);
    w_up_[r].resize(Epr * H * Fl);
    w_down_[r].resize(Epr * Fl * H);
    // In the storage type: a weight finite in fp32 may not be (1e5 in f16), and a non-finite
    // weight would make the output NaN without a word.
    const auto stored = [&](float v, const char* name, size_t e, size_t i, size_t j) {
      const float s = round_to(config_.dtype, v);
      COMET_CHECK(std::isfinite(s), "expert " << e << ": " << name << "[" << i << "][" << j << "] = " << v << " is not "
                                              << "finite as " << dtype_name(config_.dtype));
      return s;
    };
    for (int el = 0; el < Epr; ++el) {
      const size_t e = size_t(ep) * Epr + el;
      for (size_t h = 0; h < H; ++h)
        for (size_t f = 0; f < Fl; ++f) {
          const size_t src = (e * H + h) * F + tp * Fl + f, dst = (el * H + h) * Fl + f;
          w_up_[r][dst] = stored(w.w_up[src], "w_up", e, h, tp * Fl + f);
          if (gated) w_gate_[r][dst] = stored(w.w_gate[src], "w_gate", e, h, tp * Fl + f);
        }
      for (size_t f = 0; f < Fl; ++f)
        for (size_t h = 0; h < H; ++h)
          w_down_[r][(el * Fl + f) * H + h] =
              stored(w.w_down[(e * F + tp * Fl + f) * H + h], "w_down", e, tp * Fl + f, h);
    }
  }
  have_weights_ = true;
}

template <class T>
void TypedImpl<T>::check_inputs(const std::vector<std::vector<float>>& x,
                                const std::vector<Routing>& routing) const {
  const int W = config_.layout.world;
  const size_t H = config_.model.hidden;
  COMET_CHECK(have_weights_, "set_weights() must be called before forward()");
  COMET_CHECK(int(x.size()) == W && int(routing.size()) == W,
              "forward got tokens for " << x.size() << " ranks and routing for " << routing.size()
                                        << " ranks, but the world has " << W << " ranks");
  for (int r = 0; r < W; ++r) {
    const Routing& rt = routing[r];
    COMET_CHECK(rt.topk == config_.model.topk, "rank " << r << ": routing has topk " << rt.topk
                                                       << " but the model has topk " << config_.model.topk);
    COMET_CHECK(rt.num_tokens <= config_.max_tokens_per_rank,
                "rank " << r << " has " << rt.num_tokens << " tokens, more than T_max = "
                        << config_.max_tokens_per_rank << " (too many tokens)");
    rt.check(config_.model.num_experts, r);
    COMET_CHECK(x[r].size() == size_t(rt.num_tokens) * H,
                "rank " << r << ": x holds " << x[r].size() << " values, expected num_tokens*H = "
                        << size_t(rt.num_tokens) * H);
    if (!options_.check_inputs) continue;
    for (size_t i = 0; i < x[r].size(); ++i)  // in the storage type, as the ranks hold it
      COMET_CHECK(std::isfinite(round_to(config_.dtype, x[r][i])),
                  "rank " << r << " token " << i / H << ": input x[" << i % H << "] is " << x[r][i]
                          << " (not finite as " << dtype_name(config_.dtype) << ")");
  }
}

template <class T>
std::vector<std::vector<float>> TypedImpl<T>::forward(const std::vector<std::vector<float>>& x,
                                                      const std::vector<Routing>& routing) {
  check_inputs(x, routing);
  const int W = config_.layout.world;
  CallContext ctx;
  ctx.trace = options_.trace;
  ctx.policy.timeout = options_.timeout;
  ctx.policy.abort = &ctx.abort;
  std::vector<std::vector<float>> y(W);
  launch_workers(W, ctx.log, [&](int r) { run_rank(r, x[r], routing[r], ctx, y[r]); });
  if (std::exception_ptr error = ctx.log.first()) {
    reset_signals();  // every worker has joined: safe, and the backend stays usable
    std::rethrow_exception(error);
  }
  stats = {ctx.rows_landed.load(), ctx.tiles_waited.load(), ctx.partial_rows_sent.load()};
  trace = Trace{};
  trace.world = W;
  trace.comm_lanes = options_.comm_workers;
  trace.compute_lanes = options_.compute_workers;
  trace.events = std::move(ctx.events);
  std::sort(trace.events.begin(), trace.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return std::tie(a.rank, a.layer, a.lane, a.begin_ns) < std::tie(b.rank, b.layer, b.lane, b.begin_ns);
  });
  return y;
}

template <class T>
void TypedImpl<T>::barrier(int r, CallContext& ctx, const char* when) {
  const int W = config_.layout.world;
  const uint64_t target = ++epochs_[r].barriers * uint64_t(W);
  for (int p = 0; p < W; ++p) signal_add(view(p).barrier, 1);
  wait_at_least(view(r).barrier, target, ctx.policy, who(r, "barrier"), [&] {
    return std::string("barrier (") + when + ": one arrival from each of " + std::to_string(W) + " ranks)";
  });
}

template <class T>
void TypedImpl<T>::run_rank(int r, const std::vector<float>& x, const Routing& routing,
                            CallContext& ctx, std::vector<float>& y) {
  const int W = config_.layout.world, K = config_.model.topk;
  const size_t H = config_.model.hidden;
  RankView v = view(r);

  // Step 1: publish tokens and routing where peers can read them.
  for (size_t i = 0; i < x.size(); ++i) v.x[i] = T::from_float(x[i]);
  // std::copy, not memcpy: a rank with 0 tokens has empty vectors whose data() may be null.
  std::copy(routing.expert_ids.begin(), routing.expert_ids.end(), v.route_ids);
  std::copy(routing.weights.begin(), routing.weights.end(), v.route_weights);
  *v.token_count = routing.num_tokens;
  barrier(r, ctx, "routing exchange");

  // Step 2: every rank's routing from the symmetric heap; the same plan on every rank.
  std::vector<Routing> all(W);
  for (int p = 0; p < W; ++p) {
    RankView pv = view(p);
    all[p].num_tokens = *pv.token_count;
    all[p].topk = K;
    all[p].expert_ids.assign(pv.route_ids, pv.route_ids + size_t(all[p].num_tokens) * K);
    all[p].weights.assign(pv.route_weights, pv.route_weights + size_t(all[p].num_tokens) * K);
  }
  const DispatchPlan plan(config_, all);

  // Steps 3-5.
  run_layer0(r, plan, ctx);
  ctx.stop_if_aborted();
  run_layer1(r, plan, all, ctx);
  ctx.stop_if_aborted();
  owner_reduce(r, plan, ctx);
  y.resize(size_t(routing.num_tokens) * H);
  for (size_t i = 0; i < y.size(); ++i) y[i] = v.y[i].to_float();
  barrier(r, ctx, "end of call");
}

template <class T>
void TypedImpl<T>::run_layer0(int r, const DispatchPlan& plan, CallContext& ctx) {
  const Layer0Schedule s = build_layer0_schedule(config_, plan, r, options_.layer0_stages);
  const std::vector<CommChunk> chunks = build_layer0_comm_chunks(plan, r, options_.comm_chunk_tokens);
  const int num_tiles = int(s.m_tiles.size());
  COMET_CHECK(num_tiles <= config_.max_m_tiles_per_rank(),
              "rank " << r << ": " << num_tiles << " layer0 tiles exceed the workspace bound");
  const size_t H = config_.model.hidden, Fl = config_.ffn_per_rank();
  const int bn = config_.tiles.block_n0;
  std::vector<int> tile_of_row(plan.row_extent(r));
  for (int m = 0; m < num_tiles; ++m)
    for (int row = s.m_tiles[m].row_begin; row < s.m_tiles[m].row_end; ++row) tile_of_row[row] = m;
  std::vector<uint64_t>& base = epochs_[r].tile_base;
  RankView v = view(r);
  // 64-bit counters: every worker takes one index past the end, and the item count may be
  // close to 2^31 (LayerConfig::validate bounds it by 2^31 - 1).
  std::atomic<int64_t> next_chunk{0}, next_item{0};
  const int64_t num_items = int64_t(num_tiles) * s.num_n_blocks, num_chunks = int64_t(chunks.size());
  const bool gated = is_gated(config_.model.activation);
  const float* wg = gated ? w_gate_[r].data() : nullptr;
  const float* wu = w_up_[r].data();

  auto comm_worker = [&](int worker) {
    if (stalled(r, StallStage::kLayer0Comm)) return;
    Recorder rec(ctx, r, 0, worker);
    std::vector<int> rows, landed(num_tiles, 0), touched;
    for (int64_t c; (c = next_chunk.fetch_add(1)) < num_chunks;) {
      const int64_t begin = rec.now();
      const CommChunk& chunk = chunks[c];
      const T* peer_x = view(chunk.peer).x;  // pull: read the owner's row once
      const int* tokens = plan.send_tokens(chunk.peer, r);
      int64_t copied = 0;
      for (int pos = chunk.pos_begin; pos < chunk.pos_end; ++pos) {
        rows.clear();
        plan.rows_of_sent_token(chunk.peer, r, pos, rows);
        for (int row : rows) {
          std::memcpy(v.a_rows + size_t(row) * H, peer_x + size_t(tokens[pos]) * H, H * sizeof(T));
          if (landed[tile_of_row[row]]++ == 0) touched.push_back(tile_of_row[row]);
        }
        copied += int64_t(rows.size());
      }
      for (int m : touched) {  // release: the rows above are visible to the tile's acquirer
        signal_add(&v.tile_arrivals[m], uint64_t(landed[m]));
        landed[m] = 0;
      }
      touched.clear();
      ctx.rows_landed += copied;
      rec.add(TraceKind::kCommChunk, int(c), begin, rec.now());
    }
  };

  auto compute_worker = [&](int worker) {
    Recorder rec(ctx, r, 0, options_.comm_workers + worker);
    std::vector<float> a(H), acc_g(bn), acc_u(bn);
    for (int64_t i; (i = next_item.fetch_add(1)) < num_items;) {
      const int m = s.order[i / s.num_n_blocks];
      const MTile& tile = s.m_tiles[m];
      const int64_t wait_begin = rec.now();
      if (wait_at_least(&v.tile_arrivals[m], base[m] + tile.rows(), ctx.policy,
                        who(r, "layer0 compute worker", worker), [&] {
                          std::ostringstream os;
                          os << "tile_arrivals[" << m << "] (layer0 M tile of local expert "
                             << tile.expert_local << ", rows [" << tile.row_begin << ", " << tile.row_end
                             << "), fed by ranks " << plan.ring_src(r, tile.first_source_pos) << ".."
                             << plan.ring_src(r, tile.last_source_pos) << " in ring order)";
                          return os.str();
                        })) {
        ++ctx.tiles_waited;
        rec.add(TraceKind::kWait, m, wait_begin, rec.now());
      }
      const int64_t begin = rec.now();
      const int c0 = int(i % s.num_n_blocks) * bn, nc = std::min<int>(bn, int(Fl) - c0);
      const size_t wofs = size_t(tile.expert_local) * H * Fl + c0;
      for (int row = tile.row_begin; row < tile.row_end; ++row) {
        for (size_t h = 0; h < H; ++h) a[h] = v.a_rows[size_t(row) * H + h].to_float();
        std::fill(acc_u.begin(), acc_u.end(), 0.f);
        std::fill(acc_g.begin(), acc_g.end(), 0.f);
        for (size_t h = 0; h < H; ++h) {
          const float* up = wu + wofs + h * Fl;
          for (int c = 0; c < nc; ++c) acc_u[c] += a[h] * up[c];
          if (gated) {
            const float* gate = wg + wofs + h * Fl;
            for (int c = 0; c < nc; ++c) acc_g[c] += a[h] * gate[c];
          }
        }
        T* out = v.inter + size_t(row) * Fl + c0;
        for (int c = 0; c < nc; ++c)
          out[c] = T::from_float(core::apply_activation(config_.model.activation, acc_g[c], acc_u[c]));
      }
      rec.add(TraceKind::kGemmTile, int(i), begin, rec.now());
    }
  };

  const int n_comm = options_.comm_workers;
  launch_workers(n_comm + options_.compute_workers, ctx.log, [&](int w) {
    if (w < n_comm) comm_worker(w); else compute_worker(w - n_comm);
  });
  for (int m = 0; m < num_tiles; ++m) base[m] += uint64_t(s.rows_expected(m));
}

template <class T>
void TypedImpl<T>::run_layer1(int r, const DispatchPlan& plan, const std::vector<Routing>& routing,
                              CallContext& ctx) {
  const Layer1Schedule s = build_layer1_schedule(config_, plan, r);
  const std::vector<CommChunk> chunks = build_layer1_comm_chunks(plan, r, options_.comm_chunk_tokens);
  const int num_tiles = s.tiles_per_col_block(), NB = s.num_col_blocks;
  const size_t H = config_.model.hidden, Fl = config_.ffn_per_rank(), Tm = config_.max_tokens_per_rank;
  const int bn = config_.tiles.block_n1;
  std::vector<uint64_t>& base = epochs_[r].col_base;
  RankView v = view(r);
  std::atomic<int64_t> next_comm{0}, next_tile{0};  // 64-bit: see layer0
  const int64_t num_chunks = int64_t(chunks.size()), num_comm_items = int64_t(NB) * num_chunks;
  const float* wd = w_down_[r].data();

  auto compute_worker = [&](int worker) {
    Recorder rec(ctx, r, 1, options_.comm_workers + worker);
    std::vector<float> acc(bn);
    for (int64_t i; (i = next_tile.fetch_add(1)) < s.num_tiles();) {  // < 2^31 (LayerConfig::validate)
      const int64_t begin = rec.now();
      const int j = int(i / num_tiles);  // column-block-major
      const MTile& tile = s.m_tiles[i % num_tiles];
      const int c0 = j * bn, nc = std::min<int>(bn, int(H) - c0);
      const float* w = wd + size_t(tile.expert_local) * Fl * H + c0;
      for (int row = tile.row_begin; row < tile.row_end; ++row) {
        std::fill(acc.begin(), acc.end(), 0.f);
        const T* in = v.inter + size_t(row) * Fl;
        for (size_t f = 0; f < Fl; ++f) {
          const float iv = in[f].to_float();
          for (int c = 0; c < nc; ++c) acc[c] += iv * w[f * H + c];
        }
        T* out = v.out_rows + size_t(row) * H + c0;
        for (int c = 0; c < nc; ++c) out[c] = T::from_float(acc[c]);
      }
      signal_add(&v.col_done[j], 1);
      rec.add(TraceKind::kGemmTile, int(i), begin, rec.now());
    }
  };

  auto comm_worker = [&](int worker) {
    if (stalled(r, StallStage::kLayer1Comm)) return;
    Recorder rec(ctx, r, 1, worker);
    std::vector<int> rows;
    std::vector<float> acc(bn);
    for (int64_t i; (i = next_comm.fetch_add(1)) < num_comm_items;) {
      const int j = int(i / num_chunks);
      const CommChunk& chunk = chunks[size_t(i % num_chunks)];
      const int c0 = j * bn, nc = std::min<int>(bn, int(H) - c0);
      const int64_t wait_begin = rec.now();
      if (wait_at_least(&v.col_done[j], base[j] + uint64_t(num_tiles), ctx.policy,
                    who(r, "layer1 comm worker", worker), [&] {
                      std::ostringstream os;
                      os << "col_done[" << j << "] (layer1 column block " << j << ": H columns [" << c0
                         << ", " << c0 + nc << ") of all " << num_tiles << " M tiles)";
                      return os.str();
                    }))
        rec.add(TraceKind::kWait, j, wait_begin, rec.now());
      const int64_t begin = rec.now();
      const int owner = chunk.peer;
      RankView ov = view(owner);
      const int* tokens = plan.send_tokens(owner, r);
      const Routing& owner_routing = routing[owner];
      for (int pos = chunk.pos_begin; pos < chunk.pos_end; ++pos) {
        rows.clear();
        plan.rows_of_sent_token(owner, r, pos, rows);  // slot order: a fixed summation order
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int row : rows) {
          const float weight = owner_routing.weight(tokens[pos], plan.row_source(r, row).slot);
          const T* o = v.out_rows + size_t(row) * H + c0;
          for (int c = 0; c < nc; ++c) acc[c] += weight * o[c].to_float();
        }
        T* slot = ov.combine_recv + (size_t(r) * Tm + pos) * H + c0;  // push into the owner
        for (int c = 0; c < nc; ++c) slot[c] = T::from_float(acc[c]);
      }
      signal_add(&ov.combine_arr[r], uint64_t(chunk.pos_end - chunk.pos_begin));
      ctx.partial_rows_sent += chunk.pos_end - chunk.pos_begin;
      rec.add(TraceKind::kCommChunk, int(i), begin, rec.now());
    }
  };

  const int n_comm = options_.comm_workers;
  launch_workers(n_comm + options_.compute_workers, ctx.log, [&](int w) {
    if (w < n_comm) comm_worker(w); else compute_worker(w - n_comm);
  });
  for (int j = 0; j < NB; ++j) base[j] += uint64_t(num_tiles);
}

template <class T>
void TypedImpl<T>::owner_reduce(int r, const DispatchPlan& plan, CallContext& ctx) {
  const int W = config_.layout.world, NB = config_.num_col_blocks1();
  const size_t H = config_.model.hidden, Tm = config_.max_tokens_per_rank;
  RankView v = view(r);
  std::vector<uint64_t>& base = epochs_[r].combine_base;
  Recorder rec(ctx, r, 2, 0);
  const int64_t wait_begin = rec.now();
  for (int p = 0; p < W; ++p) {
    const int64_t expected = combine_arrivals_expected(plan, r, p, NB);
    wait_at_least(&v.combine_arr[p], base[p] + uint64_t(expected), ctx.policy, who(r, "combine"), [&] {
      std::ostringstream os;
      os << "combine_arr[" << p << "] (partial rows from rank " << p << ": " << plan.send_count(r, p)
         << " tokens x " << NB << " column blocks)";
      return os.str();
    });
  }
  rec.add(TraceKind::kWait, 0, wait_begin, rec.now());
  const int64_t begin = rec.now();
  // Fixed rank order 0..W-1: the result does not depend on arrival order.
  std::vector<float> acc(H);
  for (int t = 0; t < plan.num_tokens(r); ++t) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int p = 0; p < W; ++p) {
      const int pos = plan.send_pos(r, t, p);
      if (pos < 0) continue;
      const T* partial = v.combine_recv + (size_t(p) * Tm + pos) * H;
      for (size_t c = 0; c < H; ++c) acc[c] += partial[c].to_float();
    }
    for (size_t c = 0; c < H; ++c) v.y[size_t(t) * H + c] = T::from_float(acc[c]);
  }
  for (int p = 0; p < W; ++p) base[p] += uint64_t(combine_arrivals_expected(plan, r, p, NB));
  rec.add(TraceKind::kReduce, 0, begin, rec.now());
}

}  // namespace

struct RefBackend::Impl {
  LayerConfig config;
  std::unique_ptr<ImplBase> typed;
};

RefBackend::RefBackend(const LayerConfig& config, const RefOptions& options) : impl_(new Impl) {
  config.check();
  impl_->config = config;
  switch (config.dtype) {
    case DType::kF32: impl_->typed = std::make_unique<TypedImpl<f32_t>>(config, options); break;
    case DType::kBF16: impl_->typed = std::make_unique<TypedImpl<bf16_t>>(config, options); break;
    case DType::kF16: impl_->typed = std::make_unique<TypedImpl<f16_t>>(config, options); break;
  }
}

RefBackend::~RefBackend() = default;

void RefBackend::set_weights(const ExpertWeights& weights) { impl_->typed->set_weights(weights); }

std::vector<std::vector<float>> RefBackend::forward(const std::vector<std::vector<float>>& x,
                                                    const std::vector<Routing>& routing) {
  return impl_->typed->forward(x, routing);
}

void RefBackend::set_options(const RefOptions& options) { impl_->typed->set_options(options); }

const ForwardStats& RefBackend::last_stats() const { return impl_->typed->stats; }
const Trace& RefBackend::last_trace() const { return impl_->typed->trace; }
const LayerConfig& RefBackend::config() const { return impl_->config; }

}  // namespace comet::ref
