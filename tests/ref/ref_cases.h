// ref/ref_cases.h: the case generator of the CPU-backend tests, and the checks they share.
//
// A RefCase is everything one forward depends on: model shape, layout, token counts, routing
// generator (plus an optional hand-made routing), storage dtype, tile shapes, backend options
// and the seed. describe() prints every field, so a failure names its case completely.
// backend_cases() is a covering set (not the cross product) kept small enough for TSan:
//   - every preset scaled down to H <= 64 on each of the 10 layouts (TP,EP), W in {1,2,4,8};
//   - every routing generator, masked slots, f32/bf16/f16, all four activations;
//   - uneven token counts with an empty rank and a full one; all ranks empty;
//   - all tokens to one expert, the same expert twice in a token, everything masked;
//   - topk 1..16 with E >= 16.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "comet/config.h"
#include "comet/plan.h"
#include "comet/problem.h"
#include "ref/oracle.h"
#include "ref/ref_backend.h"
#include "support/custom_routing.h"
#include "support/test_support.h"

namespace comet::test {

// Backend options of the tests: the library defaults, except a generous wait timeout so that a
// healthy run on a loaded 2-core machine under ThreadSanitizer never times out spuriously
// (the stall tests set their own short timeout).
inline ref::RefOptions test_options() {
  ref::RefOptions o;
  o.timeout = std::chrono::milliseconds(30000);
  return o;
}

struct RefCase {
  std::string label;  // short, for the test name
  ModelShape model;
  int world = 1, tp = 1, ep = 1;
  int t_max = 16;
  std::vector<int> tokens;  // per rank
  RoutingSpec spec;
  CustomRouting custom = CustomRouting::kNone;
  DType dtype = DType::kBF16;
  TileConfig tiles{8, 16, 16};
  ref::RefOptions options = test_options();
  uint64_t seed = 1;

  LayerConfig config() const {
    LayerConfig c;
    c.model = model;
    c.layout = {world, ep, tp};
    c.max_tokens_per_rank = t_max;
    c.dtype = dtype;
    c.tiles = tiles;
    return c;
  }

  // The problem of make_problem(), with the hand-made routing applied.
  MoeProblem problem() const {
    MoeProblem p = make_problem(config(), tokens, spec, seed);
    for (Routing& rt : p.routing) apply_custom_routing(rt, custom, model.num_experts);
    return p;
  }

  std::string describe() const {
    std::ostringstream os;
    os << "[" << label << "] model=" << model.name << " H=" << model.hidden << " F=" << model.ffn
       << " E=" << model.num_experts << " topk=" << model.topk
       << " act=" << activation_name(model.activation) << " W=" << world << " TP=" << tp
       << " EP=" << ep << " T_max=" << t_max << " tokens=[";
    for (size_t r = 0; r < tokens.size(); ++r) os << (r ? "," : "") << tokens[r];
    os << "] routing=" << spec.describe() << " mask=" << spec.mask_fraction
       << " custom=" << custom_name(custom) << " dtype=" << dtype_name(dtype) << " tiles(m,n0,n1)=("
       << tiles.block_m << "," << tiles.block_n0 << "," << tiles.block_n1 << ") comm_workers="
       << options.comm_workers << " compute_workers=" << options.compute_workers
       << " comm_chunk_tokens=" << options.comm_chunk_tokens << " layer0_stages=" << options.layer0_stages
       << " timeout_ms=" << options.timeout.count() << " check_inputs=" << options.check_inputs
       << " seed=" << seed;
    return os.str();
  }
};

// gtest prints a case with every parameter.
inline void PrintTo(const RefCase& c, std::ostream* os) { *os << c.describe(); }

// Token counts for `world` ranks in [0, t_max], with rank `empty` at 0 and rank `full` at
// t_max (when world > 1; pass -1 to skip either).
inline std::vector<int> uneven_tokens(int world, int t_max, uint64_t seed, int empty, int full) {
  Rng rng(derive_seed(seed, 4242));
  std::vector<int> out;
  for (int r = 0; r < world; ++r) out.push_back(rng.uniform_int(t_max + 1));
  if (world > 1 && empty >= 0) out[empty % world] = 0;
  if (world > 1 && full >= 0) out[full % world] = t_max;
  return out;
}

// The preset scaled by the smallest power of two that brings H to <= 64.
inline ModelShape small_preset(const std::string& name) {
  const ModelShape& m = ModelPresets::get(name);
  int factor = 1;
  while ((m.hidden + factor - 1) / factor > 64) factor *= 2;
  return m.scaled_down(factor);
}

inline std::vector<RefCase> backend_cases() {
  std::vector<RefCase> out;
  uint64_t seed = 100;
  const DType dtypes[] = {DType::kBF16, DType::kF32, DType::kF16};
  const RoutingSpec specs[] = {{RoutingKind::kUniform, 0, 0},
                               {RoutingKind::kZipf, 1.2, 0},
                               {RoutingKind::kImbalance, 0.05, 0},
                               {RoutingKind::kUniform, 0, 0.2}};
  const TileConfig tiles[] = {{8, 16, 16}, {16, 32, 32}, {8, 32, 16}, {16, 16, 32}};
  const int chunks[] = {16, 3, 1, 64};

  // 1. Every preset on every layout; dtype, routing, tiles and chunk size rotate along.
  const std::pair<int, int> layouts[] = {{1, 1}, {1, 2}, {2, 1}, {1, 4}, {2, 2},
                                         {4, 1}, {1, 8}, {2, 4}, {4, 2}, {8, 1}};  // (TP, EP)
  const std::vector<std::string> presets = ModelPresets::names();
  int i = 0;
  for (size_t j = 0; j < std::size(layouts); ++j) {
    for (size_t pi = 0; pi < presets.size(); ++pi) {
      RefCase c;
      c.model = small_preset(presets[pi]);
      c.tp = layouts[j].first;
      c.ep = layouts[j].second;
      c.world = c.tp * c.ep;
      if (c.model.num_experts % c.ep != 0 || c.model.ffn % c.tp != 0) continue;
      c.t_max = c.world == 8 ? 32 : 64;
      c.tokens = uneven_tokens(c.world, c.t_max, seed, i, i + 1);
      c.spec = specs[i % 4];
      c.dtype = dtypes[i % 3];
      c.tiles = tiles[i % 4];
      c.options.comm_chunk_tokens = chunks[i % 4];
      c.seed = seed++;
      c.label = presets[pi] + "_tp" + std::to_string(c.tp) + "_ep" + std::to_string(c.ep);
      out.push_back(c);
      ++i;
    }
  }

  // 2. Activations (F/TP not a multiple of the tile: partial N tiles), H not a multiple of n1.
  const Activation acts[] = {Activation::kSwiGlu, Activation::kGelu, Activation::kRelu, Activation::kSilu};
  for (Activation act : acts) {
    for (auto [tp, ep] : {std::pair{2, 2}, std::pair{1, 4}}) {
      RefCase c;
      c.model = {"act", 40, 56, 8, 2, act};
      c.tp = tp;
      c.ep = ep;
      c.world = tp * ep;
      c.t_max = 24;
      c.tokens = uneven_tokens(c.world, c.t_max, seed, 2, 0);
      c.dtype = act == Activation::kGelu ? DType::kF32 : DType::kBF16;
      c.tiles = {8, 16, 16};
      c.seed = seed++;
      c.label = std::string("act_") + activation_name(act) + "_tp" + std::to_string(tp);
      out.push_back(c);
    }
  }

  // 3. topk from 1 to 16 with E >= 16.
  for (auto [e, topk, tp, ep] : {std::tuple{16, 1, 1, 4}, {16, 3, 2, 2}, {16, 8, 1, 8},
                                 {16, 16, 4, 1}, {32, 16, 2, 4}, {16, 5, 1, 2}}) {
    RefCase c;
    c.model = {"topk", 32, 32, e, topk, Activation::kSwiGlu};
    c.tp = tp;
    c.ep = ep;
    c.world = tp * ep;
    c.t_max = 16;
    c.tokens = uneven_tokens(c.world, c.t_max, seed, 1, 0);
    c.spec = specs[topk % 4];
    c.dtype = topk % 2 ? DType::kF32 : DType::kBF16;
    c.tiles = {8, 16, 16};
    c.seed = seed++;
    c.label = "E" + std::to_string(e) + "_topk" + std::to_string(topk) + "_tp" + std::to_string(tp) +
              "_ep" + std::to_string(ep);
    out.push_back(c);
  }

  // 4. Irregular routing.
  struct Irregular {
    CustomRouting custom;
    int tp, ep, topk;
    DType dtype;
    const char* name;
  };
  for (const Irregular& ir : {Irregular{CustomRouting::kAllToOne, 1, 8, 2, DType::kBF16, "all_to_one"},
                              Irregular{CustomRouting::kAllToOne, 2, 4, 2, DType::kF32, "all_to_one"},
                              Irregular{CustomRouting::kAllMasked, 1, 2, 2, DType::kBF16, "all_masked"}}) {
    RefCase c;
    c.model = {"irregular", 32, 48, 8, ir.topk, Activation::kSwiGlu};
    c.tp = ir.tp;
    c.ep = ir.ep;
    c.world = ir.tp * ir.ep;
    c.t_max = 32;
    c.tokens = uneven_tokens(c.world, c.t_max, seed, 1, 2);
    c.custom = ir.custom;
    c.dtype = ir.dtype;
    c.tiles = {8, 16, 16};
    c.seed = seed++;
    c.label = std::string(ir.name) + "_tp" + std::to_string(ir.tp) + "_ep" + std::to_string(ir.ep);
    out.push_back(c);
  }
  {
    RefCase c;  // no tokens anywhere
    c.model = {"empty", 32, 32, 8, 2, Activation::kSwiGlu};
    c.world = 4, c.tp = 2, c.ep = 2;
    c.t_max = 8;
    c.tokens = {0, 0, 0, 0};
    c.seed = seed++;
    c.label = "no_tokens";
    out.push_back(c);
  }
  {
    RefCase c;  // every rank full, masked slots, skewed, one chunk per token
    c.model = {"full", 48, 64, 8, 2, Activation::kSwiGlu};
    c.world = 8, c.tp = 1, c.ep = 8;
    c.t_max = 64;
    c.tokens.assign(8, 64);
    c.spec = {RoutingKind::kZipf, 1.2, 0.2};
    c.tiles = {16, 32, 16};
    c.options.comm_chunk_tokens = 1;
    c.seed = seed++;
    c.label = "all_full_zipf_masked";
    out.push_back(c);
  }
  {
    RefCase c;  // one worker of each kind, one big tile
    c.model = {"one_tile", 32, 32, 4, 2, Activation::kSwiGlu};
    c.world = 2, c.tp = 1, c.ep = 2;
    c.t_max = 16;
    c.tokens = {16, 5};
    c.tiles = {128, 128, 128};
    c.options.comm_workers = 1;
    c.options.compute_workers = 1;
    c.seed = seed++;
    c.label = "one_worker_big_tiles";
    out.push_back(c);
  }
  return out;
}

inline std::string ref_case_name(const ::testing::TestParamInfo<RefCase>& info) {
  return std::to_string(info.index) + "_" + param_name(info.param.label);
}

// got must be the storage dtype's values, finite, shaped like want, and within the dtype's
// tolerance of the oracle. An all-zero oracle (no unmasked slot) requires exact zeros.
inline ::testing::AssertionResult matches_oracle(const std::vector<std::vector<float>>& got,
                                                 const std::vector<std::vector<double>>& want,
                                                 DType dtype, int hidden) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "output has " << got.size() << " ranks, expected " << want.size();
  }
  double want_norm = 0;
  for (size_t r = 0; r < got.size(); ++r) {
    if (got[r].size() != want[r].size()) {
      return ::testing::AssertionFailure() << "rank " << r << " output has " << got[r].size()
                                           << " values, expected " << want[r].size();
    }
    for (size_t i = 0; i < got[r].size(); ++i) {
      const float v = got[r][i];
      if (!std::isfinite(v)) {
        return ::testing::AssertionFailure() << "rank " << r << " element " << i << " is " << v;
      }
      if (float_bits(round_to(dtype, v)) != float_bits(v)) {
        return ::testing::AssertionFailure() << "rank " << r << " element " << i << " = " << v
                                             << " is not a " << dtype_name(dtype) << " value";
      }
      want_norm += want[r][i] * want[r][i];
    }
  }
  if (want_norm == 0) {
    for (size_t r = 0; r < got.size(); ++r) {
      for (size_t i = 0; i < got[r].size(); ++i) {
        if (got[r][i] != 0.0f) {
          return ::testing::AssertionFailure() << "oracle is zero but rank " << r << " element " << i
                                               << " = " << got[r][i];
        }
      }
    }
    return ::testing::AssertionSuccess();
  }
  const ref::Comparison cmp = ref::compare_outputs(got, want, hidden);
  const double tol = ref::tolerance_for(dtype);
  if (!cmp.within(tol)) {
    // Name the worst element's token to make the failure actionable.
    std::ostringstream worst;
    double worst_err = -1;
    for (size_t r = 0; r < got.size(); ++r) {
      for (size_t i = 0; i < got[r].size(); ++i) {
        const double err = std::abs(got[r][i] - want[r][i]);
        if (err > worst_err) {
          worst_err = err;
          worst.str("");
          worst << "rank " << r << " token " << i / hidden << " column " << i % hidden << ": got "
                << got[r][i] << " want " << want[r][i];
        }
      }
    }
    return ::testing::AssertionFailure() << cmp.describe() << " (tolerance " << tol << "); worst "
                                         << worst.str();
  }
  return ::testing::AssertionSuccess() << cmp.describe();
}

inline bool bitwise_equal(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t r = 0; r < a.size(); ++r) {
    if (a[r].size() != b[r].size()) return false;
    for (size_t i = 0; i < a[r].size(); ++i) {
      if (float_bits(a[r][i]) != float_bits(b[r][i])) return false;
    }
  }
  return true;
}

}  // namespace comet::test
