// comet/cost_model.h: per-GPU rates and the lower bound of an MoE layer's forward.
//
// lower bound = max(t_compute, t_comm, t_weights) for the busiest rank, where
//   t_compute = FLOP of its expert GEMMs / dense bf16 rate,
//   t_comm    = (dispatch + combine bytes over its busiest link direction) / link bandwidth,
//   t_weights = bytes of its expert weights / HBM bandwidth (weights are read at least once).
// Overlap can at best hide the smaller terms behind the largest one (DESIGN §6).
// serial_lower_bound_us is the bound of the same forward when the W ranks take turns on one GPU
// (the Loopback fabric: each rank's kernels run alone, one rank after another): the sum over
// ranks of each rank's max(t_compute, t_comm, t_weights), with t_comm the rank's own busier link
// direction.
#pragma once

#include <string>
#include <vector>

#include "comet/config.h"
#include "comet/plan.h"

namespace comet {

struct GpuSpec {
  std::string name;
  int num_sms = 0;
  double bf16_tflops = 0;        // dense bf16 tensor-core rate used by the bound
  double hbm_gbps = 0;           // HBM bandwidth, GB/s
  double link_gbps = 0;          // NVLink bandwidth per direction per GPU, GB/s
  double copy_gbps_per_block = 0;  // what one communication block moves (cost model of n_comm)
  std::string source;            // where the numbers come from
};

const std::vector<GpuSpec>& gpu_specs();
const GpuSpec& gpu_spec(const std::string& name);  // throws comet::Error listing names
// The spec whose name appears in a CUDA device name ("NVIDIA H200" -> H200), or nullptr.
const GpuSpec* find_gpu_spec(const std::string& device_name);

struct LayerCost {
  double flops_max_rank = 0;       // FLOP of the busiest rank
  double link_bytes_max_rank = 0;  // bytes of the busiest rank's busiest link direction
  double weight_bytes_per_rank = 0;
  double t_compute_us = 0;
  double t_comm_us = 0;
  double t_weights_us = 0;
  double lower_bound_us = 0;
  std::string bound_by;  // "compute", "comm" or "weights"
  double serial_lower_bound_us = 0;  // ranks one after another on one GPU (see above)
};

// Bytes rank src sends to rank dst in one forward (dispatch src->dst plus the combine rows
// dst->src travel the other way; this counts src->dst only). Zero for src == dst. Throws
// comet::Error unless config has the plan's layout and experts (check_plan_layer: W, TP, E, E/EP,
// topk; the bytes are config's H) and src, dst are in [0, W).
// layer_cost and total_link_bytes check the layer the same way.
double link_bytes(const LayerConfig& config, const DispatchPlan& plan, int src, int dst);

LayerCost layer_cost(const LayerConfig& config, const DispatchPlan& plan, const GpuSpec& gpu);

// Bytes that cross any link in one forward: dispatch plus combine rows between different ranks,
// summed over all ranks (the sum of link_bytes over every ordered pair). Each byte leaves one
// rank and enters another, so every rank's outgoing (or incoming) direction carries 1/W of it
// on average.
double total_link_bytes(const LayerConfig& config, const DispatchPlan& plan);

// The same bound for `tokens_per_rank` tokens on every rank under uniform routing, in
// expectation (no plan needed): an EP group receives its routed experts' share of every rank's
// T * topk rows (E / EP of the R routed experts: 1/EP without padding experts; a group of
// padding experts none), and a token reaches a given EP group (each of its TP ranks) unless all
// its topk distinct experts miss the group's routed ones. serial_lower_bound_us sums the ranks'
// bounds (W * lower_bound_us without padding). Throws comet::Error for a config validate()
// refuses or a negative token count.
LayerCost expected_layer_cost(const LayerConfig& config, int tokens_per_rank, const GpuSpec& gpu);

}  // namespace comet
