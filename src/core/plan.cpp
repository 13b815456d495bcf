// Dispatch plan: counts, dedup send lists and the expert-sorted row layout of every rank.
#include "comet/plan.h"

#include <sstream>

namespace comet {

DispatchPlan::DispatchPlan(const LayerConfig& config, const std::vector<Routing>& routing) {
  config.check();
  world_ = config.layout.world;
  tp_ = config.layout.tp;
  experts_per_rank_ = config.experts_per_rank();
  topk_ = config.model.topk;
  num_experts_ = config.model.num_experts;
  row_align_ = config.tiles.block_m;
  const int W = world_;
  const int Epr = experts_per_rank_;
  COMET_CHECK(int(routing.size()) == W, "routing given for " << routing.size()
                                            << " ranks, but the world has " << W << " ranks");
  num_tokens_.resize(W);
  for (int r = 0; r < W; ++r) {
    const Routing& rt = routing[r];
    COMET_CHECK(rt.topk == topk_, "rank " << r << ": routing has topk " << rt.topk
                                          << " but the model has topk " << topk_);
    COMET_CHECK(rt.num_tokens <= config.max_tokens_per_rank,
                "rank " << r << " has " << rt.num_tokens << " tokens, more than T_max = "
                        << config.max_tokens_per_rank << " (too many tokens)");
    rt.check(num_experts_, r);
    num_tokens_[r] = rt.num_tokens;
    expert_ids_.push_back(rt.expert_ids);
  }

  // Step 1: counts per (src, dst, local expert) and the dedup send lists.
  counts_.assign(size_t(W) * W * Epr, 0);
  std::vector<std::vector<int>> lists(size_t(W) * W);
  std::vector<char> to_dst(W);
  send_pos_.resize(W);
  for (int src = 0; src < W; ++src) {
    const Routing& rt = routing[src];
    send_pos_[src].assign(size_t(rt.num_tokens) * W, -1);
    for (int t = 0; t < rt.num_tokens; ++t) {
      std::fill(to_dst.begin(), to_dst.end(), 0);
      for (int k = 0; k < topk_; ++k) {
        const int e = rt.expert(t, k);
        if (e < 0) continue;
        const int ep_idx = e / Epr;
        for (int tp_idx = 0; tp_idx < tp_; ++tp_idx) {
          const int dst = ep_idx * tp_ + tp_idx;
          ++counts_[(size_t(src) * W + dst) * Epr + e % Epr];
          to_dst[dst] = 1;
        }
      }
      for (int dst = 0; dst < W; ++dst) {
        if (!to_dst[dst]) continue;
        std::vector<int>& list = lists[pair(src, dst)];
        send_pos_[src][size_t(t) * W + dst] = int(list.size());
        list.push_back(t);
      }
    }
  }
  send_psum_.assign(size_t(W) * W + 1, 0);
  for (size_t p = 0; p < lists.size(); ++p) send_psum_[p + 1] = send_psum_[p] + int(lists[p].size());
  send_tokens_.reserve(send_psum_.back());
  for (const auto& list : lists) send_tokens_.insert(send_tokens_.end(), list.begin(), list.end());

  // Step 2: expert segments on every destination, each starting on a tile boundary.
  expert_psum_.assign(W, std::vector<int>(Epr + 1, 0));
  real_rows_.assign(W, 0);
  for (int dst = 0; dst < W; ++dst)
    for (int e = 0; e < Epr; ++e) {
      const int rows = expert_rows(dst, e);
      real_rows_[dst] += rows;
      expert_psum_[dst][e + 1] = expert_psum_[dst][e] + (rows + row_align_ - 1) / row_align_ * row_align_;
    }

  // Step 3: place every (token, slot): per destination, sources in ring order, each source's
  // sent tokens ascending, so each expert's cursor walks its rows in the documented order.
  row_sources_.resize(W);
  slot_row_.resize(W);
  for (int src = 0; src < W; ++src) slot_row_[src].assign(size_t(num_tokens_[src]) * topk_ * tp_, -1);
  std::vector<int> cursor(Epr);
  for (int dst = 0; dst < W; ++dst) {
    row_sources_[dst].assign(row_extent(dst), RowSource{-1, -1, -1});
    for (int e = 0; e < Epr; ++e) cursor[e] = expert_psum_[dst][e];
    const int dst_ep = dst / tp_;
    const int dst_tp = dst % tp_;
    for (int pos = 0; pos < W; ++pos) {
      const int src = ring_src(dst, pos);
      const Routing& rt = routing[src];
      const int* tokens = send_tokens(src, dst);
      for (int i = 0; i < send_count(src, dst); ++i) {
        const int t = tokens[i];
        for (int k = 0; k < topk_; ++k) {
          const int e = rt.expert(t, k);
          if (e < 0 || e / Epr != dst_ep) continue;
          const int row = cursor[e % Epr]++;
          row_sources_[dst][row] = {src, t, k};
          slot_row_[src][(size_t(t) * topk_ + k) * tp_ + dst_tp] = row;
        }
      }
    }
  }
}

int DispatchPlan::slot_row(int src, int token, int slot, int dst) const {
  // Every TP rank of the expert's EP group holds the slot; other ranks do not.
  const int e = expert_ids_[src][size_t(token) * topk_ + slot];
  if (e < 0 || e / experts_per_rank_ != dst / tp_) return -1;
  return slot_row_[src][(size_t(token) * topk_ + slot) * tp_ + dst % tp_];
}

void DispatchPlan::rows_of_sent_token(int src, int dst, int pos, std::vector<int>& rows) const {
  const int t = send_tokens(src, dst)[pos];
  for (int k = 0; k < topk_; ++k) {
    const int row = slot_row(src, t, k, dst);
    if (row >= 0) rows.push_back(row);
  }
}

void check_plan_layer(const LayerConfig& config, const DispatchPlan& plan, const char* what) {
  COMET_CHECK(config.layout.world == plan.world() && config.layout.tp == plan.tp() &&
                  config.model.num_experts == plan.num_experts() && config.experts_per_rank() == plan.experts_per_rank() &&
                  config.model.topk == plan.topk(),
              what << ": the config (W=" << config.layout.world << ", TP=" << config.layout.tp
                   << ", E=" << config.model.num_experts << ", E/EP=" << config.experts_per_rank()
                   << ", topk=" << config.model.topk << ") is not the plan's (W=" << plan.world() << ", TP="
                   << plan.tp() << ", E=" << plan.num_experts() << ", E/EP=" << plan.experts_per_rank()
                   << ", topk=" << plan.topk() << ")");
}

int64_t DispatchPlan::total_rows() const {
  int64_t total = 0;
  for (int d = 0; d < world_; ++d) total += rows_on_rank(d);
  return total;
}

}  // namespace comet
