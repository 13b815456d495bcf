// tools/cmd_plan.cpp: `comet plan`, the dispatch plan and the two tile schedules of one rank,
// at full size (building them is cheap; nothing is computed).
//
//   comet plan --model mixtral-8x7b --ep 8 --tokens 4096
//   comet plan --model deepseek-v3 --ep 4 --tp 2 --tokens 512 --rank 5 --max-lines 10
//   comet plan --model qwen3-30b-a3b --ep 8 --routing zipf:1.2 --json > plan.json
//
// What to look for: the dedup saving (tokens sent once per destination rank, not once per
// expert), how uneven rows per expert are under skewed routing, and in the layer0 run order
// that tiles fed only by the rank itself (source ring position 0) come first.
#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "comet/plan.h"
#include "io/json_text.h"
#include "report.h"

namespace comet::tools {
namespace {

constexpr int kMatrixMaxWorld = 16;  // above this, matrices are summarized

std::string source_ranks(const DispatchPlan& plan, int rank, const MTile& t) {
  if (t.rows() == 0) return "-";
  const int a = plan.ring_src(rank, t.first_source_pos);
  const int b = plan.ring_src(rank, t.last_source_pos);
  if (t.first_source_pos == t.last_source_pos) return strf("pos %d (rank %d)", t.first_source_pos, a);
  return strf("pos %d..%d (ranks %d..%d)", t.first_source_pos, t.last_source_pos, a, b);
}

void print_count_matrix(std::ostream& os, const std::string& title, int world,
                        const std::function<double(int, int)>& cell) {
  if (world <= kMatrixMaxWorld) {
    os << title << ":\n";
    print_matrix(os, world, "  ", cell, [](double v) { return strf("%.0f", v); });
    return;
  }
  std::vector<int64_t> values;
  for (int s = 0; s < world; ++s)
    for (int d = 0; d < world; ++d) values.push_back(int64_t(cell(s, d)));
  const IntSummary s = summarize(values);
  os << strf("%s: min %lld, mean %.1f, max %lld over %lld pairs\n", title.c_str(),
             static_cast<long long>(s.min), s.mean(), static_cast<long long>(s.max),
             static_cast<long long>(s.count));
}

struct PlanFacts {
  int64_t slots = 0, masked = 0, rows = 0, sent_tokens = 0, sent_rows = 0;
  int64_t local_tokens = 0, local_rows = 0;  // src == dst: no link traffic
  std::vector<int64_t> triples;              // count(src, dst, e) for every triple
  int64_t empty_experts = 0;                 // (rank, local expert) pairs without rows
  // Received tokens (all ranks) with a single row on their rank: the GPU backend's GEMM1
  // epilogue stores those into their owner's slot (LayerOptions::epilogue_combine).
  int64_t single_row_tokens = 0;
};

PlanFacts plan_facts(const DispatchPlan& plan, const std::vector<Routing>& routing) {
  PlanFacts f;
  const int W = plan.world();
  for (const auto& r : routing) {
    f.slots += int64_t(r.expert_ids.size());
    f.masked += std::count(r.expert_ids.begin(), r.expert_ids.end(), -1);
  }
  f.rows = plan.total_rows();
  for (int s = 0; s < W; ++s)
    for (int d = 0; d < W; ++d) {
      int64_t rows = 0;
      for (int e = 0; e < plan.experts_per_rank(); ++e) {
        rows += plan.count(s, d, e);
        f.triples.push_back(plan.count(s, d, e));
      }
      (s == d ? f.local_tokens : f.sent_tokens) += plan.send_count(s, d);
      (s == d ? f.local_rows : f.sent_rows) += rows;
      std::vector<int> token_rows;
      for (int i = 0; i < plan.send_count(s, d); ++i) {
        token_rows.clear();
        plan.rows_of_sent_token(s, d, i, token_rows);
        f.single_row_tokens += token_rows.size() == 1;
      }
    }
  for (int d = 0; d < W; ++d)
    for (int e = 0; e < plan.experts_per_rank(); ++e) f.empty_experts += plan.expert_rows(d, e) == 0;
  return f;
}

nlohmann::json chunks_json(const std::vector<CommChunk>& chunks) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : chunks) out.push_back({c.peer, c.pos_begin, c.pos_end});
  return out;
}

void print_chunks(std::ostream& os, const DispatchPlan& plan, int rank,
                  const std::vector<CommChunk>& chunks, bool pull, int max_lines) {
  // Per-peer totals first: the listing is long, the totals are what one usually wants.
  std::vector<int64_t> per_peer_chunks(size_t(plan.world()), 0), per_peer_tokens(size_t(plan.world()), 0);
  for (const auto& c : chunks) {
    per_peer_chunks[size_t(c.peer)] += 1;
    per_peer_tokens[size_t(c.peer)] += c.pos_end - c.pos_begin;
  }
  std::string totals;
  for (int p = 0; p < plan.world(); ++p) {
    const int peer = plan.ring_src(rank, p);
    if (!per_peer_chunks[size_t(peer)]) continue;
    totals += strf("%srank %d: %lld (%lld tokens)", totals.empty() ? "" : ", ", peer,
                   static_cast<long long>(per_peer_chunks[size_t(peer)]),
                   static_cast<long long>(per_peer_tokens[size_t(peer)]));
  }
  os << "  chunks per peer in ring order: " << (totals.empty() ? "none" : totals) << "\n";
  CappedListing listing(os, max_lines, "    ", "chunks");
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    // Both layers walk the dispatch send list peer -> rank: layer0 pulls those tokens, layer1
    // returns one pre-reduced row for each of the same tokens to its owner.
    listing.line(strf("%4zu  %s rank %-3d positions [%d, %d) of the send list %d -> %d", i,
                      pull ? "from" : "to  ", c.peer, c.pos_begin, c.pos_end, c.peer, rank));
  }
  listing.finish();
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "print the dispatch plan and the tile schedules of one rank (full size, no compute)");
  add_workload_options(*cmd, o.workload, TileConfig{});
  cmd->add_option("--rank", o.rank, "rank whose schedules are printed")->capture_default_str()->group("Output");
  cmd->add_option("--max-lines", o.max_lines, "cap of every listing")->capture_default_str()->group("Output");
  cmd->add_option("--chunk-tokens", o.chunk_tokens, "tokens per communication chunk")
      ->capture_default_str()
      ->group("Workload");
  cmd->add_option("--stages0", o.layer0_stages,
                  "stages of the layer0 tile order (0: one per ring position, as the CPU backend; the fused GPU "
                  "kernels default to one per 4 sources)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str()
      ->group("Workload");
  cmd->add_flag("--json", o.json, "print one JSON object (complete listings) instead of text")
      ->group("Output");
  return cmd;
}

int plan_command(const PlanOptions& o) {
  const Workload w = build_workload(o.workload, TileConfig{});
  const LayerConfig& c = w.config;
  const int W = c.layout.world;
  if (o.rank < 0 || o.rank >= W)
    throw UsageError("--rank " + std::to_string(o.rank) + " is outside the world of W = " +
                     std::to_string(W) + " ranks (0.." + std::to_string(W - 1) + ")");
  if (o.max_lines < 0) throw UsageError("--max-lines must not be negative");
  if (o.chunk_tokens < 1)
    throw UsageError("--chunk-tokens must be positive, not " + std::to_string(o.chunk_tokens));

  const std::vector<Routing> routing = generate_all_routing(w);
  const DispatchPlan plan(c, routing);
  const int R = o.rank;
  const Layer0Schedule s0 = build_layer0_schedule(c, plan, R, o.layer0_stages);
  const Layer1Schedule s1 = build_layer1_schedule(c, plan, R);
  const auto chunks0 = build_layer0_comm_chunks(plan, R, o.chunk_tokens);
  const auto chunks1 = build_layer1_comm_chunks(plan, R, o.chunk_tokens);
  const PlanFacts f = plan_facts(plan, routing);
  const int epr = plan.experts_per_rank();
  const int first_expert = c.layout.ep_index(R) * epr;

  if (o.json) {
    nlohmann::json j;
    j["command"] = "plan";
    j["config"] = config_json(c, w.tokens_per_rank, w.routing, w.seed);
    j["rank"] = R;
    j["chunk_tokens"] = o.chunk_tokens;
    j["slots"] = f.slots;
    j["masked_slots"] = f.masked;
    j["total_rows"] = f.rows;
    j["single_row_tokens"] = f.single_row_tokens;
    nlohmann::json counts = nlohmann::json::array(), send = nlohmann::json::array(),
                   rows = nlohmann::json::array();
    for (int s = 0; s < W; ++s) {
      nlohmann::json cs = nlohmann::json::array();
      std::vector<int> sr, rr;
      for (int d = 0; d < W; ++d) {
        std::vector<int> ce;
        int sum = 0;
        for (int e = 0; e < epr; ++e) {
          ce.push_back(plan.count(s, d, e));
          sum += plan.count(s, d, e);
        }
        cs.push_back(ce);
        sr.push_back(plan.send_count(s, d));
        rr.push_back(sum);
      }
      counts.push_back(cs);
      send.push_back(sr);
      rows.push_back(rr);
    }
    j["counts"] = counts;       // [src][dst][local expert]
    j["send_tokens"] = send;    // [src][dst], dedup
    j["send_rows"] = rows;      // [src][dst], one per expert slot
    j["rows_per_expert"] = rows_per_expert_json(plan);
    j["rows_per_rank"] = rows_per_rank_json(plan);
    nlohmann::json tiles = nlohmann::json::array();
    for (size_t i = 0; i < s0.m_tiles.size(); ++i) {
      const MTile& t = s0.m_tiles[i];
      tiles.push_back({{"expert", first_expert + t.expert_local},
                       {"expert_local", t.expert_local},
                       {"row_begin", t.row_begin},
                       {"row_end", t.row_end},
                       {"first_source_pos", t.first_source_pos},
                       {"last_source_pos", t.last_source_pos},
                       {"rows_expected", s0.rows_expected(int(i))}});
    }
    j["layer0"] = {{"num_n_blocks", s0.num_n_blocks}, {"stages", s0.stages}, {"m_tiles", tiles}, {"order", s0.order}};
    j["layer1"] = {{"num_col_blocks", s1.num_col_blocks},
                   {"tiles_per_col_block", s1.tiles_per_col_block()},
                   {"num_tiles", s1.num_tiles()}};
    j["layer0_comm_chunks"] = chunks_json(chunks0);  // [peer, pos_begin, pos_end], pulled
    j["layer1_comm_chunks"] = chunks_json(chunks1);  // [peer, pos_begin, pos_end], pushed
    std::vector<int64_t> arrivals;
    for (int p = 0; p < W; ++p) arrivals.push_back(combine_arrivals_expected(plan, R, p, s1.num_col_blocks));
    j["combine_arrivals_expected"] = arrivals;  // [peer]
    // Names that are not UTF-8 are replaced (U+FFFD) rather than failing the report.
    std::cout << io::json_text(j, 2) << "\n";
    return kExitOk;
  }

  std::ostream& os = std::cout;
  os << "comet plan: " << config_header(c, w.tokens_per_rank, w.routing, w.seed) << "\n";

  // Dispatch.
  const int64_t unique_sent = f.sent_tokens;
  os << strf("dispatch: %lld slots (%lld masked) -> %lld A rows; over links %lld tokens carry "
             "%lld rows (dedup per destination rank saves %.1f%% of dispatch traffic); local "
             "%lld tokens, %lld rows\n",
             static_cast<long long>(f.slots), static_cast<long long>(f.masked),
             static_cast<long long>(f.rows), static_cast<long long>(unique_sent),
             static_cast<long long>(f.sent_rows),
             f.sent_rows ? 100.0 * double(f.sent_rows - unique_sent) / double(f.sent_rows) : 0.0,
             static_cast<long long>(f.local_tokens), static_cast<long long>(f.local_rows));
  {
    const IntSummary s = summarize(f.triples);
    const int64_t nonzero = std::count_if(f.triples.begin(), f.triples.end(), [](int64_t v) { return v > 0; });
    os << strf("rows per (src, dst, local expert): %lld triples, %lld non-empty, min %lld, mean "
               "%.1f, max %lld; %lld (rank, local expert) pairs have no rows\n",
               static_cast<long long>(s.count), static_cast<long long>(nonzero),
               static_cast<long long>(s.min), s.mean(), static_cast<long long>(s.max),
               static_cast<long long>(f.empty_experts));
  }
  {
    const int64_t received = f.sent_tokens + f.local_tokens;
    os << strf("combine: %lld received tokens, %lld (%.1f%%) with a single row on their rank (the GPU "
               "backend's GEMM1 epilogue stores those into their owner's slot; the combine sums the other "
               "%lld tokens' %lld rows)\n",
               static_cast<long long>(received), static_cast<long long>(f.single_row_tokens),
               received ? 100.0 * double(f.single_row_tokens) / double(received) : 0.0,
               static_cast<long long>(received - f.single_row_tokens),
               static_cast<long long>(f.rows - f.single_row_tokens));
  }
  print_count_matrix(os, "tokens sent src -> dst (dedup: once per destination rank; diagonal = own tokens, no link)", W,
                     [&](int s, int d) { return double(plan.send_count(s, d)); });
  print_count_matrix(os, "rows src -> dst (no dedup: one per expert slot)", W, [&](int s, int d) {
    int64_t rows = 0;
    for (int e = 0; e < epr; ++e) rows += plan.count(s, d, e);
    return double(rows);
  });
  print_rows_per_expert(os, c, plan, o.max_lines);
  print_rows_per_rank(os, plan);

  // Layer0 schedule of rank R.
  os << strf("rank %d layer0 schedule: %zu M tiles (block_m %d) x %d N blocks (block_n0 %d of "
             "F/TP %d), run in %d stage%s of ring positions; a tile runs when its counter has risen "
             "by its row count\n",
             R, s0.m_tiles.size(), c.tiles.block_m, s0.num_n_blocks, c.tiles.block_n0,
             c.ffn_per_rank(), s0.stages, s0.stages == 1 ? "" : "s");
  os << "     run  tile  expert  rows              sources                       expects\n";
  {
    CappedListing listing(os, o.max_lines, "  ", "tiles");
    for (size_t i = 0; i < s0.order.size(); ++i) {
      const int id = s0.order[i];
      const MTile& t = s0.m_tiles[size_t(id)];
      listing.line(strf("%6zu %5d  %6d  [%6d, %6d)  %-28s  %d", i, id, first_expert + t.expert_local,
                        t.row_begin, t.row_end, source_ranks(plan, R, t).c_str(),
                        s0.rows_expected(id)));
    }
    listing.finish();
  }

  // Layer1 schedule of rank R.
  os << strf("rank %d layer1 schedule: %d column blocks (block_n1 %d of H %d) x %d M tiles = %lld "
             "tiles; a column block is complete after %d tile stores\n",
             R, s1.num_col_blocks, c.tiles.block_n1, c.model.hidden, s1.tiles_per_col_block(),
             static_cast<long long>(s1.num_tiles()), s1.tiles_per_col_block());
  if (s1.tiles_per_col_block() > 0) {
    os << strf("  run order: column block 0: M tiles 0..%d (expert-major), then column block 1: "
               "M tiles 0..%d, ... column block %d: M tiles 0..%d; the combine of block j "
               "overlaps the GEMM of block j+1\n",
               s1.tiles_per_col_block() - 1, s1.tiles_per_col_block() - 1, s1.num_col_blocks - 1,
               s1.tiles_per_col_block() - 1);
  } else {
    os << "  run order: nothing to compute (no rows on this rank)\n";
  }

  // Communication of rank R.
  os << strf("rank %d layer0 comm chunks (pulled, %d tokens each, own rows first): %zu chunks\n", R,
             o.chunk_tokens, chunks0.size());
  print_chunks(os, plan, R, chunks0, /*pull=*/true, o.max_lines);
  os << strf("rank %d layer1 comm chunks (pushed to the owners, once per column block, %d "
             "tokens each): %zu chunks x %d column blocks\n",
             R, o.chunk_tokens, chunks1.size(), s1.num_col_blocks);
  print_chunks(os, plan, R, chunks1, /*pull=*/false, o.max_lines);
  std::vector<int64_t> arrivals;
  for (int p = 0; p < W; ++p) arrivals.push_back(combine_arrivals_expected(plan, R, p, s1.num_col_blocks));
  os << strf("rank %d combine arrivals expected from ranks 0..%d (token x column block): %s\n", R,
             W - 1, list_values(arrivals, kMatrixMaxWorld).c_str());
  return kExitOk;
}

}  // namespace comet::tools
