// Host-side layout of the baseline pipelines: count rows in, every buffer offset out.
#include "core/baseline_layout.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

namespace comet::core {

namespace {
int groups_of(const LayerConfig& c) { return c.layout.ep; }
int count_entries(const LayerConfig& c) { return c.model.num_experts + groups_of(c); }

void check_chunks(int chunks) {
  COMET_CHECK(chunks >= 1 && chunks <= kBaselineMaxChunks,
              "baseline: chunks must be within [1, " << kBaselineMaxChunks << "], got " << chunks);
}
}  // namespace

int baseline_count_row_len(const LayerConfig& config, int chunks) {
  check_chunks(chunks);
  const int n = kBaselineCountHeader + chunks * count_entries(config);
  return (n + 3) / 4 * 4;
}

Status baseline_rows_status(const LayerConfig& config, const int32_t* rows, int chunks) {
  const int len = baseline_count_row_len(config, chunks);
  for (int r = 0; r < config.layout.world; ++r) {
    const int32_t* row = rows + size_t(r) * len;
    std::ostringstream os;
    os << "bad input from rank " << r << ": ";
    switch (BaselineInputError(row[1])) {
      case BaselineInputError::kNone: continue;
      case BaselineInputError::kTokenCount:
        os << "num_tokens " << row[4] << " is outside [0, T_max = " << config.max_tokens_per_rank << "]";
        break;
      case BaselineInputError::kExpertId:
        os << "token " << row[2] << " slot " << row[3] << ": expert id " << row[4] << " is outside [-1, "
           << config.model.num_experts << ")";
        break;
      case BaselineInputError::kRepeatedExpert:
        os << "token " << row[2] << " selects expert " << row[4] << " twice (slot " << row[3]
           << " repeats an earlier slot)";
        break;
      case BaselineInputError::kWeight: {
        float w = 0;
        std::memcpy(&w, &row[4], sizeof w);
        os << "token " << row[2] << " slot " << row[3] << ": routing weight " << w << " is not finite";
        break;
      }
      default: os << "unknown error code " << row[1];
    }
    return Status::failure(os.str());
  }
  return Status::success();
}

BaselineCounts parse_baseline_counts(const LayerConfig& config, const int32_t* rows, int chunks) {
  const Status status = baseline_rows_status(config, rows, chunks);
  if (!status) throw Error(status.reason);
  const int W = config.layout.world, E = config.model.num_experts, G = groups_of(config), NK = E + G;
  const int len = baseline_count_row_len(config, chunks);
  BaselineCounts out;
  out.world = W;
  out.chunks = chunks;
  out.experts = E;
  out.groups = G;
  for (int r = 0; r < W; ++r) {
    const int32_t* row = rows + size_t(r) * len;
    out.num_tokens.push_back(row[0]);
    for (int c = 0; c < chunks; ++c) {
      const int32_t* counts = row + kBaselineCountHeader + size_t(c) * NK;
      out.rows.insert(out.rows.end(), counts, counts + E);
      out.tokens.insert(out.tokens.end(), counts + E, counts + NK);
    }
  }
  return out;
}

BaselineCounts count_baseline_routing(const LayerConfig& config, const std::vector<Routing>& routing, int chunks) {
  check_chunks(chunks);
  const int W = config.layout.world, E = config.model.num_experts, G = groups_of(config);
  const int epr = config.experts_per_rank();
  COMET_CHECK(int(routing.size()) == W, "baseline: routing of " << routing.size() << " ranks for W = " << W);
  BaselineCounts out;
  out.world = W;
  out.chunks = chunks;
  out.experts = E;
  out.groups = G;
  out.rows.assign(size_t(W) * chunks * E, 0);
  out.tokens.assign(size_t(W) * chunks * G, 0);
  for (int r = 0; r < W; ++r) {
    const Routing& rt = routing[r];
    out.num_tokens.push_back(rt.num_tokens);
    for (int t = 0; t < rt.num_tokens; ++t) {
      const int c = chunk_of(t, rt.num_tokens, chunks);
      std::vector<bool> group_seen(G, false);
      for (int k = 0; k < rt.topk; ++k) {
        const int e = rt.expert(t, k);
        if (e < 0) continue;
        ++out.rows[(size_t(r) * chunks + c) * E + e];
        if (!group_seen[e / epr]) ++out.tokens[(size_t(r) * chunks + c) * G + e / epr];
        group_seen[e / epr] = true;
      }
    }
  }
  return out;
}

BaselineLayout::BaselineLayout(const LayerConfig& config, const BaselineCounts& n)
    : world_(config.layout.world),
      tp_(config.layout.tp),
      chunks_(n.chunks),
      experts_(config.model.num_experts),
      experts_per_rank_(config.experts_per_rank()),
      num_tokens_(n.num_tokens),
      group_tokens_(n.tokens) {
  const int W = world_, C = chunks_, E = experts_, epr = experts_per_rank_;
  COMET_CHECK(n.world == W && n.experts == E && n.groups == config.layout.ep,
              "baseline layout: counts for W=" << n.world << ", E=" << n.experts << " do not match the config");
  // Offsets are int32 on the device; sums run in int64 and are checked once.
  auto narrow = [](int64_t v) {
    COMET_CHECK(v <= std::numeric_limits<int32_t>::max(), "baseline layout: " << v << " rows exceed int32");
    return int(v);
  };
  send_begin_.assign(size_t(W) * C * W, 0);
  recv_begin_.assign(size_t(W) * C * W, 0);
  send_total_.assign(W, 0);
  recv_chunk_.assign(size_t(W) * (C + 1), 0);
  a_chunk_.assign(size_t(W) * (C + 1), 0);
  a_begin_.assign(size_t(W) * C * epr, 0);
  a_rows_.assign(size_t(W) * C * epr, 0);
  a_row_from_.assign(size_t(W) * C * E, 0);
  for (int s = 0; s < W; ++s) {  // send: chunk, destination, token
    int64_t row = 0;
    for (int c = 0; c < C; ++c)
      for (int d = 0; d < W; ++d) {
        send_begin_[idx3(s, c, d)] = narrow(row);
        row += send_rows(s, c, d);
      }
    send_total_[s] = narrow(row);
  }
  for (int d = 0; d < W; ++d) {  // recv: chunk, source; A: chunk, local expert, source
    const int g = config.layout.ep_index(d);
    int64_t recv = 0, a = 0;
    for (int c = 0; c < C; ++c) {
      recv_chunk_[size_t(d) * (C + 1) + c] = narrow(recv);
      a_chunk_[size_t(d) * (C + 1) + c] = narrow(a);
      for (int s = 0; s < W; ++s) {
        recv_begin_[idx3(d, c, s)] = narrow(recv);
        recv += send_rows(s, c, d);
      }
      for (int el = 0; el < epr; ++el) {
        const int e = g * epr + el;
        a_begin_[(size_t(d) * C + c) * epr + el] = narrow(a);
        int64_t rows = 0;
        for (int s = 0; s < W; ++s) {
          // Every TP rank of the group computes the same table; the senders read one copy.
          a_row_from_[(size_t(s) * C + c) * E + e] = narrow(a + rows);
          rows += n.row(s, c, e);
        }
        a_rows_[(size_t(d) * C + c) * epr + el] = narrow(rows);
        a += rows;
      }
    }
    recv_chunk_[size_t(d) * (C + 1) + C] = narrow(recv);
    a_chunk_[size_t(d) * (C + 1) + C] = narrow(a);
  }
}

int BaselineLayout::send_rows(int s, int c, int d) const {
  const int groups = world_ / tp_;
  return group_tokens_[(size_t(s) * chunks_ + c) * groups + d / tp_];
}

void BaselineLayout::write_sender_table(int s, int32_t* out) const {
  for (int c = 0; c < chunks_; ++c)
    for (int d = 0; d < world_; ++d) *out++ = send_begin(s, c, d);
  for (int c = 0; c < chunks_; ++c)
    for (int e = 0; e < experts_; ++e) *out++ = a_row_from(s, c, e);
}

int64_t BaselineLayout::moved_rows(bool remote_only) const {
  int64_t rows = 0;
  for (int s = 0; s < world_; ++s)
    for (int c = 0; c < chunks_; ++c)
      for (int d = 0; d < world_; ++d)
        if (!remote_only || s != d) rows += send_rows(s, c, d);
  return rows;
}

}  // namespace comet::core
