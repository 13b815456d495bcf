// ref/ref_backend.h: the CPU backend. Each rank is a thread; ranks share a symmetric heap in
// host memory; inside a rank, every layer is a "launch" of comm workers and compute workers
// (threads standing in for the GPU's specialized thread blocks) that run the Comet protocol
// of DESIGN §4 exactly: epoch signals with acquire/release atomics, layer0 tiles waiting for
// their rows, layer1 column blocks signalled, pre-reduced and pushed to the owner, the owner
// reducing in fixed rank order, and a timeout on every wait.
//
// Thread safety: one forward() at a time per backend object. A failed forward (timeout, bad
// input) throws comet::Error; the backend resets its signals and stays usable.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comet/plan.h"
#include "comet/problem.h"
#include "comet/trace.h"

namespace comet::ref {

enum class StallStage { kNone, kLayer0Comm, kLayer1Comm };

struct RefOptions {
  static constexpr int kMaxWorkers = 1024;                           // of each kind, per rank
  static constexpr std::chrono::milliseconds kMaxTimeout{1000000000};  // 11.6 days, as the CLI's
  int comm_workers = 2;     // n_comm of the CPU backend, per rank and layer, in [1, kMaxWorkers]
  int compute_workers = 2;  // GEMM workers per rank and layer, in [1, kMaxWorkers]
  int comm_chunk_tokens = 16;
  int layer0_stages = 0;  // stages of the layer0 tile order (Layer0Schedule); 0: one per ring position
  // Every wait gives up after this long without progress (its signal unchanged), in
  // (0, kMaxTimeout]: a long forward whose producers keep working never times out.
  std::chrono::milliseconds timeout{5000};
  bool check_inputs = true;                  // report NaN/Inf in x before running
  bool trace = false;                        // record a timeline (last_trace()); off: no cost
  // Fault injection for tests: the comm workers of stall_rank do nothing at stall_stage.
  int stall_rank = -1;
  StallStage stall_stage = StallStage::kNone;
};

// Counters of one forward, for reports and tests.
struct ForwardStats {
  int64_t rows_landed = 0;       // layer0 rows written into A buffers (all ranks)
  int64_t tiles_waited = 0;      // layer0 tiles that had to wait for a signal
  int64_t partial_rows_sent = 0; // layer1 partial rows pushed, one per token per column block
};

class RefBackend {
 public:
  RefBackend(const LayerConfig& config, const RefOptions& options);
  ~RefBackend();
  RefBackend(const RefBackend&) = delete;
  RefBackend& operator=(const RefBackend&) = delete;

  // Keeps each rank's slice: experts of its EP index, columns/rows of its TP index.
  void set_weights(const ExpertWeights& weights);

  // x[r] is [T_r][H]; returns y[r] = [T_r][H] (values of the storage dtype, as float).
  // Throws comet::Error on bad input, TimeoutError when a signal never arrives.
  std::vector<std::vector<float>> forward(const std::vector<std::vector<float>>& x,
                                          const std::vector<Routing>& routing);

  // Replaces the options (worker counts, chunk size, timeout, fault injection) from the next
  // forward on; throws comet::Error for invalid ones.
  void set_options(const RefOptions& options);

  const ForwardStats& last_stats() const;
  // Events of the last forward when RefOptions::trace was on (comet/trace.h): lanes are the
  // workers of each layer launch, comm workers first.
  const Trace& last_trace() const;
  const LayerConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace comet::ref
