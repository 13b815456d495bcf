// unit/plan_cases.h: the case generator of the plan, schedule and workspace tests.
//
// A PlanCase is a layer config plus every rank's routing, built deterministically from its
// fields. plan_cases() covers W in {1,2,4,8} with (TP,EP) in {(1,W),(2,W/2),(W,1)}, E in
// {4,8,16}, topk 1..4, every routing generator, masked slots, uneven token counts with
// zero-token and full (T_max) ranks, several tile and chunk sizes; plus hand-made routings
// (all tokens to one expert, everything masked, no tokens).
#pragma once

#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "comet/config.h"
#include "comet/routing.h"
#include "support/custom_routing.h"

namespace comet::test {

struct PlanCase {
  int world = 1, tp = 1, ep = 1;
  int hidden = 32, ffn = 64, num_experts = 8, topk = 2;
  int t_max = 16;
  TileConfig tiles{8, 16, 16};
  int chunk_tokens = 4;
  std::vector<int> tokens;  // per rank
  RoutingSpec spec;
  CustomRouting custom = CustomRouting::kNone;
  uint64_t seed = 1;

  LayerConfig config() const {
    LayerConfig c;
    c.model = {"plan-case", hidden, ffn, num_experts, topk, Activation::kSwiGlu};
    c.layout = {world, ep, tp};
    c.max_tokens_per_rank = t_max;
    c.dtype = DType::kBF16;
    c.tiles = tiles;
    return c;
  }

  std::vector<Routing> routing() const {
    std::vector<Routing> out;
    for (int r = 0; r < world; ++r) {
      Routing rt = generate_routing(spec, tokens[r], num_experts, topk, seed, r);
      apply_custom_routing(rt, custom, num_experts);
      out.push_back(std::move(rt));
    }
    return out;
  }

  std::string describe() const {
    std::ostringstream os;
    os << "W=" << world << " TP=" << tp << " EP=" << ep << " H=" << hidden << " F=" << ffn
       << " E=" << num_experts << " topk=" << topk << " T_max=" << t_max << " tiles(m,n0,n1)=("
       << tiles.block_m << "," << tiles.block_n0 << "," << tiles.block_n1 << ") chunk_tokens="
       << chunk_tokens << " routing=" << spec.describe() << " mask=" << spec.mask_fraction
       << " custom=" << custom_name(custom) << " seed=" << seed << " tokens=[";
    for (size_t r = 0; r < tokens.size(); ++r) os << (r ? "," : "") << tokens[r];
    os << "]";
    return os.str();
  }

  std::string short_name() const {
    std::ostringstream os;
    os << "W" << world << "_tp" << tp << "_E" << num_experts << "_k" << topk << "_" << custom_name(custom)
       << "_s" << seed;
    return os.str();
  }
};

// gtest prints a case with every parameter.
inline void PrintTo(const PlanCase& c, std::ostream* os) { *os << c.describe(); }

inline std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> out;
  const RoutingSpec specs[] = {{RoutingKind::kUniform, 0, 0},
                               {RoutingKind::kZipf, 1.2, 0},
                               {RoutingKind::kImbalance, 0.05, 0},
                               {RoutingKind::kUniform, 0, 0.2},
                               {RoutingKind::kZipf, 2.0, 0.3}};
  const int t_maxes[] = {1, 7, 16, 33, 64};
  const int block_ms[] = {1, 4, 8, 16, 128};
  const int chunks[] = {1, 3, 4, 16, 64};
  uint64_t seed = 1;
  for (int world : {1, 2, 4, 8}) {
    for (int tp : {1, 2, world}) {
      if (tp > world) continue;
      bool dup = false;
      for (const auto& c : out) dup = dup || (c.world == world && c.tp == tp);
      if (dup) continue;
      for (int e : {4, 8, 16}) {
        if (e % (world / tp) != 0) continue;
        for (int topk = 1; topk <= 4; ++topk) {
          PlanCase c;
          c.world = world;
          c.tp = tp;
          c.ep = world / tp;
          c.num_experts = e;
          c.topk = topk;
          c.seed = seed++;
          const size_t i = out.size();
          c.spec = specs[i % std::size(specs)];
          c.t_max = t_maxes[(i / 3) % std::size(t_maxes)];
          c.tiles.block_m = block_ms[(i / 2) % std::size(block_ms)];
          c.chunk_tokens = chunks[(i / 7) % std::size(chunks)];
          Rng rng(derive_seed(c.seed, 999));
          for (int r = 0; r < world; ++r) c.tokens.push_back(rng.uniform_int(c.t_max + 1));
          if (world > 1) {
            c.tokens[i % world] = 0;                 // an empty rank
            c.tokens[(i + 1) % world] = c.t_max;     // a full one
          }
          out.push_back(c);
        }
      }
    }
  }
  // Hand-made routings on a few layouts.
  const CustomRouting customs[] = {CustomRouting::kAllToOne, CustomRouting::kAllMasked};
  for (CustomRouting custom : customs) {
    for (auto [world, tp] : {std::pair{1, 1}, {4, 1}, {4, 2}, {8, 8}, {8, 2}}) {
      PlanCase c;
      c.world = world;
      c.tp = tp;
      c.ep = world / tp;
      c.num_experts = 8;
      c.topk = 3;
      c.t_max = 20;
      c.tiles.block_m = 8;
      c.chunk_tokens = 5;
      c.custom = custom;
      c.seed = seed++;
      for (int r = 0; r < world; ++r) c.tokens.push_back(r == 1 ? 0 : 20 - r);
      out.push_back(c);
    }
  }
  // No tokens anywhere.
  PlanCase empty;
  empty.world = 4;
  empty.ep = 4;
  empty.tokens = {0, 0, 0, 0};
  empty.seed = seed++;
  out.push_back(empty);
  return out;
}

}  // namespace comet::test
