// Cost model: per-GPU rates and the max(compute, comm, weights) lower bound.
#include "comet/cost_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace comet {

const std::vector<GpuSpec>& gpu_specs() {
  // One row per GPU. Rates are what the bound divides by; where we measured a sustained
  // rate on the machine it is used (an unreachable datasheet peak would make every bound loose).
  // copy_gbps_per_block: a probe on the H200 (2026-11-29, DESIGN §8) moved about 14 GB/s per
  // block with one 16-byte load in flight per thread; it is the cost model's n_comm guess until
  // `comet tune` measures the real kernels (then the tuning table decides).
  static const std::vector<GpuSpec> specs = {
      // Dense bf16 8192^3 GEMM measured 785 TFLOP/s (cuBLAS, 2026-11-29, DESIGN §8); HBM3e
      // 4.8 TB/s datasheet; NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction.
      {"H200", 132, 785.0, 4800.0, 450.0, 14.0, "measured bf16 GEMM rate; HBM and NVLink datasheet"},
      // SXM H100: 989 TFLOP/s datasheet dense bf16, scaled by the same 0.79 measured/peak ratio
      // as the H200 (same chip and clocks); 3.35 TB/s HBM3; NVLink 4 as above.
      {"H100", 132, 785.0, 3350.0, 450.0, 14.0, "H200's measured GEMM rate (same chip); datasheet memory"},
      // H800: an H100 with NVLink cut to 400 GB/s bidirectional (200 per direction); the paper's GPU.
      {"H800", 132, 785.0, 3350.0, 200.0, 14.0, "as H100, NVLink 200 GB/s per direction"},
  };
  return specs;
}

const GpuSpec& gpu_spec(const std::string& name) {
  for (const auto& g : gpu_specs())
    if (g.name == name) return g;
  std::ostringstream os;
  os << "unknown GPU '" << name << "' (known:";
  for (const auto& g : gpu_specs()) os << " " << g.name;
  os << ")";
  throw Error(os.str());
}

const GpuSpec* find_gpu_spec(const std::string& device_name) {
  for (const auto& g : gpu_specs())
    if (device_name.find(g.name) != std::string::npos) return &g;
  return nullptr;
}

namespace {

// link_bytes without its checks, for loops over [0, W) once the caller has checked the layer.
double link_bytes_of_layer(const LayerConfig& config, const DispatchPlan& plan, int src, int dst) {
  if (src == dst) return 0.0;
  // Dispatch: src's tokens sent to dst (once per destination). Combine: dst's tokens that src
  // holds return to dst as one pre-reduced row each. Both cross src->dst.
  const double row_bytes = double(config.model.hidden) * dtype_bytes(config.dtype);
  return (double(plan.send_count(src, dst)) + plan.send_count(dst, src)) * row_bytes;
}

}  // namespace

double link_bytes(const LayerConfig& config, const DispatchPlan& plan, int src, int dst) {
  // The plan's send lists are W x W: a rank outside [0, W) would read past them.
  check_plan_layer(config, plan, "link_bytes");
  COMET_CHECK(src >= 0 && src < plan.world() && dst >= 0 && dst < plan.world(),
              "link_bytes: src " << src << " or dst " << dst << " outside [0, W=" << plan.world() << ")");
  return link_bytes_of_layer(config, plan, src, dst);
}

namespace {

double compute_us(double flops, const GpuSpec& gpu) { return flops / (gpu.bf16_tflops * 1e12) * 1e6; }
double link_us(double bytes, const GpuSpec& gpu) { return bytes / (gpu.link_gbps * 1e9) * 1e6; }
double hbm_us(double bytes, const GpuSpec& gpu) { return bytes / (gpu.hbm_gbps * 1e9) * 1e6; }
double weight_bytes_per_rank(const LayerConfig& config) {
  return double(config.experts_per_rank()) * config.model.weights_per_expert() / config.layout.tp *
         dtype_bytes(config.dtype);
}

// The three terms of c (flops_max_rank, link_bytes_max_rank and weight_bytes_per_rank set) in
// us, their maximum and which one it is.
void finish_cost(LayerCost& c, const GpuSpec& gpu) {
  c.t_compute_us = compute_us(c.flops_max_rank, gpu);
  c.t_comm_us = link_us(c.link_bytes_max_rank, gpu);
  c.t_weights_us = hbm_us(c.weight_bytes_per_rank, gpu);
  c.lower_bound_us = std::max({c.t_compute_us, c.t_comm_us, c.t_weights_us});
  c.bound_by = c.lower_bound_us == c.t_compute_us ? "compute" : c.lower_bound_us == c.t_comm_us ? "comm" : "weights";
}

}  // namespace

LayerCost layer_cost(const LayerConfig& config, const DispatchPlan& plan, const GpuSpec& gpu) {
  check_plan_layer(config, plan, "layer_cost");
  const int W = config.layout.world;
  LayerCost c;
  c.weight_bytes_per_rank = weight_bytes_per_rank(config);
  const double flops_per_row = double(config.model.flops_per_row()) / config.layout.tp;
  const double t_weights_us = hbm_us(c.weight_bytes_per_rank, gpu);
  for (int r = 0; r < W; ++r) {
    const double flops = plan.rows_on_rank(r) * flops_per_row;
    c.flops_max_rank = std::max(c.flops_max_rank, flops);
    double out = 0, in = 0;
    for (int p = 0; p < W; ++p) {
      out += link_bytes_of_layer(config, plan, r, p);
      in += link_bytes_of_layer(config, plan, p, r);
    }
    c.link_bytes_max_rank = std::max({c.link_bytes_max_rank, out, in});
    c.serial_lower_bound_us += std::max({compute_us(flops, gpu), link_us(std::max(out, in), gpu), t_weights_us});
  }
  finish_cost(c, gpu);
  return c;
}

double total_link_bytes(const LayerConfig& config, const DispatchPlan& plan) {
  check_plan_layer(config, plan, "total_link_bytes");
  double bytes = 0;
  for (int src = 0; src < config.layout.world; ++src)
    for (int dst = 0; dst < config.layout.world; ++dst) bytes += link_bytes_of_layer(config, plan, src, dst);
  return bytes;
}

LayerCost expected_layer_cost(const LayerConfig& config, int tokens_per_rank, const GpuSpec& gpu) {
  const Status valid = config.validate();
  COMET_CHECK(valid, "expected_layer_cost: " << valid.reason);
  COMET_CHECK(tokens_per_rank >= 0, "expected_layer_cost: tokens_per_rank " << tokens_per_rank << " is negative");
  const int EP = config.layout.ep, TP = config.layout.tp;
  const double W = config.layout.world, T = tokens_per_rank, K = config.model.topk;
  const double row_bytes = double(config.model.hidden) * dtype_bytes(config.dtype);
  const double flops_per_row = double(config.model.flops_per_row()) / TP;
  // Routing draws from the routed experts only, ids [0, R): the padding experts after them (a
  // preset padded so that EP divides E) get no rows, so an EP group's share of the rows is its
  // routed experts' share, not 1/EP, and the groups at the end may hold fewer or none.
  const int R = config.model.routed_experts(), per_group = config.experts_per_rank();
  LayerCost c;
  c.weight_bytes_per_rank = weight_bytes_per_rank(config);
  const double t_weights_us = hbm_us(c.weight_bytes_per_rank, gpu);
  for (int g = 0; g < EP; ++g) {
    const int routed = std::clamp(R - g * per_group, 0, per_group);
    // Every rank's T * topk rows spread over the R experts; each of the group's TP ranks holds
    // its rows (an F/TP slice each).
    const double flops = W * T * K * routed / R * flops_per_row;
    // Tokens a rank sends to one rank of the group (dispatch), and receives back as partials
    // (combine): a token draws topk distinct experts and misses the group's `routed` with
    // probability prod_i (R - routed - i) / (R - i) (sampling without replacement).
    double p_miss = 1.0;
    for (int i = 0; i < config.model.topk; ++i) p_miss *= std::max(0.0, double(R - routed - i) / (R - i));
    const double link = 2.0 * T * (1.0 - p_miss) * (W - 1) * row_bytes;  // dispatch out + combine out
    c.flops_max_rank = std::max(c.flops_max_rank, flops);
    c.link_bytes_max_rank = std::max(c.link_bytes_max_rank, link);
    c.serial_lower_bound_us += TP * std::max({compute_us(flops, gpu), link_us(link, gpu), t_weights_us});
  }
  finish_cost(c, gpu);
  return c;
}

}  // namespace comet
