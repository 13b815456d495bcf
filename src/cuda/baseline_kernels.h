// cuda/baseline_kernels.h: the kernels of the baseline pipelines (cuda/baseline_moe.cu,
// docs/baselines.md), one rank per launch. Launchers take raw pointers, POD views and a stream.
//
// Buffer layouts are those of core/baseline_layout.h. Row-valued buffers are bf16 rows of H
// values moved 16 bytes at a time. A token's routing "items" are its (token, slot) pairs,
// indexed t * topk + k.
//
// Ranks without sorting: route_scan gives every item its rank among the items of the same
// expert in its block of kRouteScanTokens tokens (and every token the same among the tokens that
// select the same EP group), from per-warp bit tables of which lanes select what;
// route_prefix turns per-block counts into block offsets and per-chunk counts into chunk
// offsets. An item's rank inside (chunk c, expert e) in token order is then
//   block_base[b][e] + item_rank - chunk_prefix[c][e],   b = t / kRouteScanTokens,
// the same formula the host layout test follows (tests/unit/baseline_layout_test.cpp).
#pragma once

#include <cstdint>

#include "comet/config.h"

struct CUstream_st;

namespace comet::cuda {

inline constexpr int kRouteScanTokens = 256;  // tokens per route_scan block (8 warps)

// What a receiver needs of one routed (token, slot): its row in the A buffer and its routing
// weight. A received token carries meta_per_token of them, slot order, unused ones row = -1.
struct BaselineMeta {
  int32_t row;
  float weight;
};

// Shapes shared by the kernels of one rank (POD, by value).
struct BaselineDims {
  int world = 0, ep = 0, tp = 0;
  int num_experts = 0, experts_per_rank = 0, topk = 0;
  int hidden = 0;          // H, a multiple of 8
  int t_max = 0;
  int chunks = 0;
  int count_row_len = 0;   // core::baseline_count_row_len(config, chunks)
  int meta_per_token = 0;  // min(topk, E/EP) rounded up to even (16-byte metadata rows)
  constexpr int count_keys() const { return num_experts + ep; }  // experts, then EP groups
};

int route_scan_blocks(const BaselineDims& d);  // ceil(T_max / kRouteScanTokens)

// Reads the token count and routing; validates them (the first problem goes into count_row's
// header, core::BaselineInputError); writes per item its in-block rank (item_rank; -1 when
// masked, invalid or past the count) and, for the first slot of each EP group a token selects,
// the token's in-block rank among that group's tokens (group_rank; -1 elsewhere); the count of
// each key per block (block_counts [blocks][E + EP]); and adds the per-chunk counts into
// count_row (which must be zero on entry).
void launch_route_scan(const BaselineDims& d, const int32_t* expert_ids, const float* weights, const int32_t* num_tokens,
                       int32_t* count_row, int32_t* item_rank, int32_t* group_rank, int32_t* block_counts,
                       CUstream_st* stream);
// block_counts -> exclusive prefix over blocks (in place); chunk_prefix [chunks][E + EP] =
// exclusive prefix of count_row's chunk counts over chunks.
void launch_route_prefix(const BaselineDims& d, const int32_t* count_row, int32_t* block_counts,
                         int32_t* chunk_prefix, CUstream_st* stream);

struct BaselinePackArgs {
  BaselineDims dims;
  int num_tokens = 0;  // the validated count, read by the host
  const void* x = nullptr;
  const int32_t* expert_ids = nullptr;
  const float* weights = nullptr;
  const int32_t* item_rank = nullptr;
  const int32_t* group_rank = nullptr;
  const int32_t* block_base = nullptr;
  const int32_t* chunk_prefix = nullptr;
  const int32_t* sender_table = nullptr;  // core::BaselineLayout::write_sender_table
  void* send_rows = nullptr;              // [send rows][H]
  BaselineMeta* send_meta = nullptr;      // [send rows][meta_per_token]
  int32_t* send_pos = nullptr;            // [T_max][W]: row of token t's block for rank d, or -1
};
// Every own token into the send buffer once per destination rank, with its metadata.
void launch_pack(const BaselinePackArgs& args, CUstream_st* stream);

// Received tokens [begin, end) of `recv` into every A row their metadata names.
void launch_permute(int begin, int end, int hidden, int meta_per_token, const void* recv, const BaselineMeta* meta,
                    void* a_rows, CUstream_st* stream);
// inter[r] = act(inter0[r]) for rows [row_begin, row_end): gated activations read gate and up
// from the packed SwiGLU layout of cuda/grouped_gemm.h (kSwiGluPack gate columns, then the
// matching up columns); the others read ffn_local columns.
void launch_activation(Activation act, int row_begin, int row_end, int ffn_local, int inter0_cols,
                       const void* inter0, void* inter, CUstream_st* stream);
// For received tokens [begin, end): the fp32 weighted sum of their A rows (metadata order), as
// bf16, into their `recv` row (the combine sends it back from there).
void launch_unpermute(int begin, int end, int hidden, int meta_per_token, const void* out_rows,
                      const BaselineMeta* meta, void* recv, CUstream_st* stream);
// y[t] for own tokens [t_begin, t_end): the partial rows the combine returned (send_rows at
// send_pos[t][d]) summed over d = 0..W-1 in fp32; zero for a token no rank holds.
void launch_owner_reduce(int t_begin, int t_end, int world, int hidden, const void* send_rows,
                         const int32_t* send_pos, void* y, CUstream_st* stream);

}  // namespace comet::cuda
