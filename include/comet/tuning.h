// comet/tuning.h: how many thread blocks communicate (n_comm) in each fused kernel, from a
// tuning table measured by `comet tune`, or from the analytic cost model when no entry is near;
// which forward path (fused kernels or unfused pipeline) the table measured faster; and how the
// fused kernels move rows (layer0 mode, layer1 combine).
//
// Lookup (DESIGN §5): an entry applies only to the same GPU (name and SM count), the same expert
// shape (H, F, E, topk) and the same layout (W, EP, TP) on the same number of GPUs; among
// those, the nearest in tokens per rank wins, with distance |log2(tokens / entry tokens)|. An entry further than
// kMaxTuningDistance (a factor of 2 in tokens) is not used: the cost model decides instead,
// and the choice says so. Ties go to the entry with fewer tokens (the cheaper guess).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comet/config.h"
#include "comet/cost_model.h"
#include "comet/layer0_mode.h"
#include "comet/layer1_combine.h"

namespace comet {

inline constexpr double kMaxTuningDistance = 1.0;

struct TuningKey {
  // Device name as the driver reports it, e.g. "NVIDIA H200"; as valid UTF-8 from tuning_key
  // (bytes that are not become U+FFFD, as the table's writer would make them), so that a key
  // equals the one read back from the table it was saved in.
  std::string gpu;
  int num_sms = 0;
  int hidden = 0, ffn = 0, num_experts = 0, topk = 0;
  int world = 0, ep = 0, tp = 0;
  // GPUs the W ranks run on: 1 for virtual ranks on one GPU (Loopback: the ranks take turns and
  // communication is a local copy), W for one rank per GPU (Local, Nccl), a divisor between for
  // the Local fabric with several ranks per GPU. The same layout has different optima on each,
  // so their entries never stand in for each other.
  int gpus = 1;
  int tokens_per_rank = 0;
  // Everything but tokens_per_rank equal.
  bool same_workload_class(const TuningKey& other) const;
  std::string describe() const;
};

TuningKey tuning_key(const LayerConfig& config, const std::string& gpu, int num_sms, int tokens_per_rank, int gpus = 1);

// `text` with what is not well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code
// points past U+10FFFF) replaced by U+FFFD: one per maximal ill-formed subpart (a sequence cut
// short or broken after a valid prefix is one; a byte that cannot begin a sequence is one), as
// nlohmann's writer (io::json_text) replaces them.
std::string valid_utf8(const std::string& text);

struct TuningEntry {
  TuningKey key;
  int n_comm0 = 0, n_comm1 = 0;
  double latency_us = 0;  // fused forward latency measured with these values
  // The unfused pipeline's forward on the same workload, measured in the same run (0: not
  // measured, as in tables written before it was recorded).
  double unfused_us = 0;
  Layer0Mode layer0{};  // how layer0 moved rows in the fused forward measured (optional in the JSON)
  // Who ran layer1's combine in both forwards measured (optional in the JSON).
  Layer1Combine layer1_combine = Layer1Combine::kCommBlocks;
  // Whether the fused forward measured faster than the unfused one (false when either is missing).
  bool fused_faster() const { return latency_us > 0 && unfused_us > 0 && latency_us < unfused_us; }
};

class TuningTable {
 public:
  void add(const TuningEntry& entry);  // replaces an entry with an equal key
  const std::vector<TuningEntry>& entries() const { return entries_; }
  // The nearest applicable entry and its distance, or nothing. The entry points into the table:
  // valid until the next add().
  struct Match {
    const TuningEntry* entry;
    double distance;
  };
  std::optional<Match> nearest(const TuningKey& key) const;

 private:
  std::vector<TuningEntry> entries_;
};

struct NCommChoice {
  int n_comm0 = 0, n_comm1 = 0;
  std::string source;  // "tuning table: ..." or "cost model: ..."
};

// Analytic n_comm for one layer: the smallest n in [1, num_sms / 2] minimizing
// max(t_gemm(n), t_comm(n)), with t_gemm = flop / (rate * (num_sms - n) / num_sms) and
// t_comm = bytes / min(link_gbps, n * per_block_gbps).
int analytic_n_comm(double flop, double bytes, int num_sms, double tflops, double link_gbps, double per_block_gbps);

// Per-rank n_comm for a workload: table entry if one is near, else the cost model on `gpu`:
// layer0 max(min(32, SMs / 2), analytic_n_comm), layer1 min(2, SMs / 2) (floors measured on the H200, src/core/tuning.cpp).
NCommChoice choose_n_comm(const TuningTable* table, const TuningKey& key, const LayerConfig& config,
                          const LayerCost& cost, const GpuSpec& gpu);

// Which forward LayerOptions' ForwardPath::kTuned runs (comet/layer.h): the fused kernels when
// the nearest entry (as for n_comm: within kMaxTuningDistance) measured them faster than the
// unfused pipeline, else the unfused pipeline; `source` says which entry decided, or why none did.
struct PathChoice {
  bool fused = false;
  std::string source;
};
PathChoice choose_path(const TuningTable* table, const TuningKey& key);

// How the fused layer0 moves rows when LayerOptions leaves it unset: the nearest entry's mode
// (within kMaxTuningDistance), else kCommBlocks / kRing; `source` says which.
struct Layer0ModeChoice {
  Layer0Mode mode;
  std::string source;
};
Layer0ModeChoice choose_layer0_mode(const TuningTable* table, const TuningKey& key);

// Who runs layer1's combine when LayerOptions leaves it unset: the nearest entry's (within
// kMaxTuningDistance), else kCommBlocks; `source` says which.
struct Layer1CombineChoice {
  Layer1Combine combine = Layer1Combine::kCommBlocks;
  std::string source;
};
Layer1CombineChoice choose_layer1_combine(const TuningTable* table, const TuningKey& key);

// `comet tune`: every (workload, candidate) measured once. The table keeps each
// workload's fastest candidate; the fixed_* fields name the single candidate (n_comm pair,
// layer0 mode, layer1 combine) whose summed latency over all workloads is lowest (the comparison
// docs/results/ reports), among candidates measured everywhere.
// An entry's unfused_us is the unfused time measured in its winning pair's own row (timed in the
// same interleaved loop as that fused time, so the two are a paired comparison).
struct TuneSample {
  TuningKey key;
  int n_comm0 = 0, n_comm1 = 0;
  double latency_us = 0;  // the fused forward
  double unfused_us = 0;  // the unfused forward measured beside it (0: not measured)
  Layer0Mode layer0{};
  Layer1Combine layer1_combine = Layer1Combine::kCommBlocks;
};
struct TuneSummary {
  TuningTable table;
  // The best single candidate (n_comm pair, layer0 mode, layer1 combine) measured on every
  // workload.
  int fixed_n_comm0 = 0, fixed_n_comm1 = 0;
  Layer0Mode fixed_layer0;
  Layer1Combine fixed_layer1_combine = Layer1Combine::kCommBlocks;
  double tuned_total_us = 0;  // sum over workloads of the table's choice
  double fixed_total_us = 0;  // sum over workloads of the best fixed pair
  // The forward path (ForwardPath::kTuned) over the workloads whose entry has an unfused time:
  // how many, and the sums of the path's time, of always unfused and of always fused.
  int path_workloads = 0;
  double path_total_us = 0, unfused_total_us = 0, fused_total_us = 0;
};
// Throws comet::Error if `samples` is empty or no candidate was measured on every workload.
TuneSummary summarize_tuning(const std::vector<TuneSample>& samples);

}  // namespace comet
