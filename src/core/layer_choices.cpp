// MoeLayer's choices from options, a tuning table and the GPU (comet/layer_choices.h).
#include "comet/layer_choices.h"

#include <cmath>
#include <sstream>

#include "comet/cost_model.h"

namespace comet {

namespace {

// Why layer1's combine cannot run in the GEMM blocks under link emulation: an option asking for
// it is refused with this, a table entry falls back to communication blocks.
constexpr const char* kGemmCombineUnpaced = "it cannot be paced to an emulated link (link emulation is on)";

// Why layer0's copies cannot run in the GEMM blocks (empty: they can): they cannot be paced, and
// a token row must fit their ring. An option asking for them is refused with it; a table entry
// asking for them falls back to communication blocks and says it.
std::string gemm_block_copies_refusal(const LinkEmulation& link, const LayerTarget& target) {
  if (link.on()) return "they cannot be paced to an emulated link (link emulation is on)";
  return target.copy_ring_refusal;
}

}  // namespace

LayerChoices resolve_layer_choices(const LayerConfig& config, const LayerOptions& options, const TuningTable& table,
                                   const LayerTarget& target) {
  LayerChoices c;
  const bool gated = is_gated(config.model.activation);
  const bool tuned_path = options.path == ForwardPath::kTuned;
  const bool n_comm_given = options.n_comm0 > 0 && options.n_comm1 > 0;
  const bool mode_given = options.layer0_copies && options.dispatch_order;
  const bool combine_given = options.layer1_combine.has_value();
  if (!tuned_path) c.path = {options.path == ForwardPath::kFused, "options"};
  if (tuned_path && !gated)
    c.path = {false, std::string("unfused: the fused kernels fuse SwiGLU, the activation is ") +
                         activation_name(config.model.activation)};
  if (n_comm_given) c.n_comm = {options.n_comm0, options.n_comm1, "options"};
  if (mode_given) c.layer0 = {{*options.layer0_copies, *options.dispatch_order}, "options"};
  if (combine_given) c.layer1 = {*options.layer1_combine, "options"};
  if (!tuned_path && n_comm_given && mode_given && combine_given) return c;  // nothing to look up
  const TuningKey key = tuning_key(config, target.gpu, target.num_sms, config.max_tokens_per_rank, target.gpus);
  if (tuned_path && gated) c.path = choose_path(&table, key);
  if (!mode_given) {
    c.layer0 = choose_layer0_mode(&table, key);
    const std::string refusal = gemm_block_copies_refusal(options.link, target);
    if (c.layer0.mode.copies == Layer0Copies::kGemmBlocks && !refusal.empty()) {
      c.layer0.mode.copies = Layer0Copies::kCommBlocks;
      c.layer0.source += " (communication blocks: " + refusal + ")";
    }
    if (options.layer0_copies) c.layer0.mode.copies = *options.layer0_copies;
    if (options.dispatch_order) c.layer0.mode.order = *options.dispatch_order;
  }
  if (!combine_given) {
    c.layer1 = choose_layer1_combine(&table, key);
    if (c.layer1.combine == Layer1Combine::kGemmBlocks && options.link.on()) {
      c.layer1.combine = Layer1Combine::kCommBlocks;
      c.layer1.source += " (communication blocks: " + std::string(kGemmCombineUnpaced) + ")";
    }
  }
  if (n_comm_given) return c;
  GpuSpec gpu = gpu_spec("H200");  // rates of the cost model; SMs from the target
  gpu.num_sms = target.num_sms;
  if (options.link.on()) gpu.link_gbps = options.link.gbps;  // the link the copies are paced to
  const LayerCost cost = expected_layer_cost(config, config.max_tokens_per_rank, gpu);
  c.n_comm = choose_n_comm(&table, key, config, cost, gpu);
  if (c.n_comm.n_comm0 >= target.num_sms || c.n_comm.n_comm1 >= target.num_sms) {  // a table for another GPU size
    c.n_comm = choose_n_comm(nullptr, key, config, cost, gpu);
    c.n_comm.source += " (the nearest table entry asked for more blocks than this GPU has)";
  }
  if (options.n_comm0 > 0) c.n_comm.n_comm0 = options.n_comm0;
  if (options.n_comm1 > 0) c.n_comm.n_comm1 = options.n_comm1;
  return c;
}

Status check_layer_options(const LayerConfig& config, const LayerOptions& o, const LayerTarget& target) {
  std::ostringstream why;
  const int num_sms = target.num_sms;
  if (o.n_comm0 < 0 || o.n_comm0 >= num_sms || o.n_comm1 < 0 || o.n_comm1 >= num_sms)
    why << "n_comm0 " << o.n_comm0 << " and n_comm1 " << o.n_comm1 << " must be in [0, " << num_sms - 1
        << "] (0 chooses; this GPU has " << num_sms << " SMs)";
  // Device waits count nanoseconds in 64 bits; the bounds keep the conversion exact enough.
  else if (!std::isfinite(o.timeout_s) || o.timeout_s < 1e-6 || o.timeout_s > 1e6)
    why << "timeout_s must be within [1e-6, 1e6] seconds, got " << o.timeout_s;
  else if (o.layer0_group_m < 0)
    why << "layer0_group_m must be >= 0 (0 chooses), got " << o.layer0_group_m;
  else if (o.layer0_stages < 0)
    why << "layer0_stages must be >= 0 (0 chooses), got " << o.layer0_stages;
  else if (o.stall_rank >= config.layout.world)
    why << "stall_rank " << o.stall_rank << " is not a rank";
  else if (o.fail_before_launch < -1)
    why << "fail_before_launch must be >= -1 (-1: never), got " << o.fail_before_launch;
  else if (o.path == ForwardPath::kFused && !is_gated(config.model.activation))
    why << "the fused kernels fuse SwiGLU; activation " << activation_name(config.model.activation)
        << " runs on the unfused pipeline (ForwardPath::kUnfused, or kTuned, the default)";
  else if (o.trace && o.path != ForwardPath::kFused)
    why << "LayerOptions::trace records the fused kernels; set path to ForwardPath::kFused too";
  else if (o.trace_chunk_capacity < 0 || o.trace_chunk_capacity >= (int64_t(1) << 31))
    why << "trace_chunk_capacity must be in [0, 2^31), got " << o.trace_chunk_capacity;
  if (!why.str().empty()) return Status::failure(why.str());
  const Status link = o.link.validate();
  if (!link) return link;
  // The emulated link stands in for the links of a node whose ranks share one GPU; ranks on GPUs
  // of their own have real links, and pacing them too would time neither.
  if (o.link.on() && target.real_links)
    return Status::failure("link emulation stands for a node on one GPU; it needs every rank on one GPU (the "
                           "loopback fabric), not the " + target.fabric + " fabric's real links");
  if (o.layer0_copies == Layer0Copies::kGemmBlocks) {
    const std::string refusal = gemm_block_copies_refusal(o.link, target);
    if (!refusal.empty())
      return Status::failure("layer0 copies in the GEMM blocks: " + refusal + "; use Layer0Copies::kCommBlocks");
  }
  if (o.layer1_combine == Layer1Combine::kGemmBlocks && o.link.on())
    return Status::failure(std::string("layer1's combine in the GEMM blocks: ") + kGemmCombineUnpaced +
                           "; use Layer1Combine::kCommBlocks");
  return Status::success();
}

}  // namespace comet
