// core/baseline_layout.h: where every row goes in the baseline MoE pipelines (docs/baselines.md),
// computed on the host from the token counts the ranks exchange before each forward.
//
// The baselines split each rank's T_r tokens into C chunks (chunk c = tokens
// [c*T_r/C, (c+1)*T_r/C)); every buffer is chunk-major, so the chunks of one buffer never
// overlap and a chunk's work can run while another chunk's data moves.
//
// Per rank, each forward publishes one count row (int32, baseline_count_row_len() entries):
//   [0] num_tokens as given   [1] error code (BaselineInputError)   [2] token  [3] slot  [4] value
//   [kBaselineCountHeader + c*NK + e]       rows of chunk c routed to expert e (unmasked slots)
//   [kBaselineCountHeader + c*NK + E + g]   tokens of chunk c selecting >= 1 expert of EP group g
// with NK = E + EP. A token goes once to every rank of each EP group it selects (dedup per
// destination rank, DESIGN §2; every TP rank of the group gets it).
//
// Buffers of rank r (rows; H-wide bf16 unless noted), all chunk-major:
//   send   chunk, then destination rank d = 0..W-1, then token ascending: the tokens r sends to
//          d; the combine returns d's partial row for each of them to the same row
//   recv   chunk, then source rank s = 0..W-1, then the source's send order
//   A      chunk, then local expert, then source rank, then token ascending: one row per
//          (token, slot) routed to a local expert (the GEMM input, later the GEMM1 output)
// The TP ranks of one EP group receive the same tokens, so their recv and A layouts agree.
#pragma once

#include <cstdint>
#include <vector>

#include "comet/config.h"
#include "comet/routing.h"

namespace comet::core {

inline constexpr int kBaselineCountHeader = 5;
inline constexpr int kBaselineMaxChunks = 32;

enum class BaselineInputError : int32_t {
  kNone = 0,
  kTokenCount = 1,     // num_tokens outside [0, T_max]; value = the count
  kExpertId = 2,       // id outside [-1, E); token, slot, value = the id
  kRepeatedExpert = 3, // the same expert in two slots of one token; value = the expert
  kWeight = 4,         // an unmasked slot's weight is NaN or infinite; token, slot, value = its bits
};

// int32 entries of one count row for `chunks` chunks, rounded up to 4 (16-byte copies).
int baseline_count_row_len(const LayerConfig& config, int chunks);

// First token of chunk c of a rank with num_tokens tokens, and the chunk of a token (< num_tokens).
// constexpr so that device code (compiled with --expt-relaxed-constexpr) uses the same formulas.
constexpr int chunk_begin(int num_tokens, int chunks, int c) { return int(int64_t(c) * num_tokens / chunks); }
constexpr int chunk_of(int token, int num_tokens, int chunks) {
  return int((int64_t(token + 1) * chunks - 1) / num_tokens);
}

// Every rank's count row, as read back by the host.
struct BaselineCounts {
  int world = 0, chunks = 0, experts = 0, groups = 0;
  std::vector<int> num_tokens;  // [W]
  std::vector<int> rows;        // [W][C][E]
  std::vector<int> tokens;      // [W][C][EP]
  int row(int rank, int c, int e) const { return rows[(size_t(rank) * chunks + c) * experts + e]; }
  int token_count(int rank, int c, int g) const { return tokens[(size_t(rank) * chunks + c) * groups + g]; }
};

// The first problem found in the rows (a rank's recorded input error), or success.
Status baseline_rows_status(const LayerConfig& config, const int32_t* rows, int chunks);
// Parses W count rows laid out one after another (baseline_count_row_len entries each).
// Throws comet::Error describing the first rank whose row records an input error.
BaselineCounts parse_baseline_counts(const LayerConfig& config, const int32_t* rows, int chunks);
// The same counts computed from host routing (what the device publishes; tests).
BaselineCounts count_baseline_routing(const LayerConfig& config, const std::vector<Routing>& routing, int chunks);

class BaselineLayout {
 public:
  BaselineLayout() = default;
  BaselineLayout(const LayerConfig& config, const BaselineCounts& counts);

  int world() const { return world_; }
  int chunks() const { return chunks_; }
  int num_tokens(int rank) const { return num_tokens_[rank]; }

  // Sender s: its block for destination d in chunk c (rows of the send buffer).
  int send_begin(int s, int c, int d) const { return send_begin_[idx3(s, c, d)]; }
  int send_rows(int s, int c, int d) const;
  int send_total(int s) const { return send_total_[s]; }
  // Receiver d: the block from source s in chunk c, and chunk c's range of the recv buffer.
  int recv_begin(int d, int c, int s) const { return recv_begin_[idx3(d, c, s)]; }
  int recv_chunk_begin(int d, int c) const { return recv_chunk_[size_t(d) * (chunks_ + 1) + c]; }
  int recv_total(int d) const { return recv_chunk_begin(d, chunks_); }
  // Receiver d: rows of local expert el in chunk c start at a_begin and number a_rows; chunk c
  // covers [a_chunk_begin(d, c), a_chunk_begin(d, c + 1)).
  int a_begin(int d, int c, int el) const { return a_begin_[(size_t(d) * chunks_ + c) * experts_per_rank_ + el]; }
  int a_rows(int d, int c, int el) const { return a_rows_[(size_t(d) * chunks_ + c) * experts_per_rank_ + el]; }
  int a_chunk_begin(int d, int c) const { return a_chunk_[size_t(d) * (chunks_ + 1) + c]; }
  int a_total(int d) const { return a_chunk_begin(d, chunks_); }
  // A row (on every rank of expert e's group) of the first row that s sends for (chunk c, e);
  // s's rows for (c, e) follow in token order.
  int a_row_from(int s, int c, int e) const { return a_row_from_[(size_t(s) * chunks_ + c) * experts_ + e]; }

  // The table the sender s's pack kernel reads: [C][W] send_begin, then [C][E] a_row_from.
  void write_sender_table(int s, int32_t* out) const;
  static int64_t sender_table_entries(int world, int num_experts, int chunks) {
    return int64_t(chunks) * (world + num_experts);
  }

  // Rows moved by the dispatch (and again by the combine), all ranks; remote excludes s == d.
  int64_t moved_rows(bool remote_only) const;

 private:
  size_t idx3(int a, int c, int b) const { return (size_t(a) * chunks_ + c) * world_ + b; }
  int world_ = 0, tp_ = 1, chunks_ = 0, experts_ = 0, experts_per_rank_ = 0;
  std::vector<int> num_tokens_;
  std::vector<int> group_tokens_;  // [s][c][g]
  std::vector<int> send_begin_, recv_begin_;  // [rank][c][peer]
  std::vector<int> send_total_;
  std::vector<int> recv_chunk_, a_chunk_;     // [rank][C + 1]
  std::vector<int> a_begin_, a_rows_;         // [rank][c][el]
  std::vector<int> a_row_from_;               // [s][c][e]
};

}  // namespace comet::core
