// unit/config_test.cpp: model presets, parallel layouts, LayerConfig validation, name parsing,
// scaled-down shapes and the CPU scale chooser (include/comet/config.h).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "comet/config.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::contains;
using test::throws_with;

// The layouts of DESIGN §7 for world W: (TP, EP) in {(1,W), (2,W/2), (4,W/4), (W,1)}.
std::vector<ParallelLayout> natural_layouts(int world) {
  std::vector<ParallelLayout> out;
  for (int tp : {1, 2, 4, world}) {
    if (tp > world || world % tp != 0) continue;
    bool seen = false;
    for (const auto& l : out) seen = seen || l.tp == tp;
    if (!seen) out.push_back({world, world / tp, tp});
  }
  return out;
}

LayerConfig small_config() {
  LayerConfig c;
  c.model = {"small", 64, 128, 8, 2, Activation::kSwiGlu};
  c.layout = {4, 2, 2};
  c.max_tokens_per_rank = 32;
  c.dtype = DType::kBF16;
  c.tiles = {16, 32, 32};
  return c;
}

TEST(Presets, TableOfDesign) {
  struct Row {
    const char* name;
    int h, f, e, topk;
  };
  const Row rows[] = {{"mixtral-8x7b", 4096, 14336, 8, 2},
                      {"qwen2-moe-2.7b", 2048, 1408, 64, 4},
                      {"phi-3.5-moe", 4096, 6400, 16, 2},
                      {"qwen3-30b-a3b", 2048, 768, 128, 8},
                      {"deepseek-v3", 7168, 2048, 256, 8}};
  const auto names = ModelPresets::names();
  ASSERT_EQ(names.size(), std::size(rows));
  ASSERT_EQ(ModelPresets::all().size(), std::size(rows));
  for (size_t i = 0; i < std::size(rows); ++i) {
    SCOPED_TRACE(rows[i].name);
    EXPECT_EQ(names[i], rows[i].name);
    const ModelShape& m = ModelPresets::get(rows[i].name);
    EXPECT_EQ(m.name, rows[i].name);
    EXPECT_EQ(m.hidden, rows[i].h);
    EXPECT_EQ(m.ffn, rows[i].f);
    EXPECT_EQ(m.num_experts, rows[i].e);
    EXPECT_EQ(m.topk, rows[i].topk);
    EXPECT_EQ(ModelPresets::all()[i].name, rows[i].name);
  }
}

TEST(Presets, UnknownNameThrowsListingNames) {
  EXPECT_TRUE(throws_with<Error>([] { ModelPresets::get("no-such-model"); },
                                 {"no-such-model", "mixtral-8x7b"}));
}

TEST(Presets, EveryPresetValidatesForItsNaturalLayouts) {
  for (const ModelShape& m : ModelPresets::all()) {
    for (int world : {1, 2, 4, 8}) {
      for (const ParallelLayout& layout : natural_layouts(world)) {
        LayerConfig c;
        c.model = m;
        c.layout = layout;
        c.max_tokens_per_rank = 4096;
        SCOPED_TRACE(m.name + " W=" + std::to_string(world) + " TP=" + std::to_string(layout.tp) +
                     " EP=" + std::to_string(layout.ep));
        const Status s = c.validate();
        EXPECT_TRUE(s.ok) << s.reason;
        EXPECT_TRUE(s.reason.empty());
        EXPECT_NO_THROW(c.check());
      }
    }
  }
}

TEST(Layout, RankIndexing) {
  for (int world : {1, 2, 4, 8}) {
    for (const ParallelLayout& l : natural_layouts(world)) {
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(l.rank_of(l.ep_index(r), l.tp_index(r)), r);
        EXPECT_EQ(l.ep_index(r), r / l.tp);
        EXPECT_EQ(l.tp_index(r), r % l.tp);
      }
    }
  }
}

TEST(LayerConfig, DerivedSizes) {
  LayerConfig c = small_config();  // H 64, F 128, E 8, topk 2, W 4 = EP 2 x TP 2, T_max 32
  EXPECT_EQ(c.experts_per_rank(), 4);
  EXPECT_EQ(c.ffn_per_rank(), 64);
  EXPECT_EQ(c.expert_owner_ep(0), 0);
  EXPECT_EQ(c.expert_owner_ep(3), 0);
  EXPECT_EQ(c.expert_owner_ep(4), 1);
  EXPECT_EQ(c.expert_owner_ep(7), 1);
  EXPECT_EQ(c.num_col_blocks1(), 2);
  // R = round_up(W * T_max * min(topk, E/EP) + E/EP * (block_m - 1), block_m) (workspace.h).
  ASSERT_EQ(c.tiles.block_m, 16);
  EXPECT_EQ(c.max_rows_per_rank(), (4 * 32 * 2 + 4 * 15 + 15) / 16 * 16);
  // MT = R / block_m: segments are tile-aligned.
  EXPECT_EQ(c.max_m_tiles_per_rank(), c.max_rows_per_rank() / 16);

  c.model.topk = 6;  // min(topk, E/EP) = 4
  EXPECT_EQ(c.max_rows_per_rank(), (4 * 32 * 4 + 4 * 15 + 15) / 16 * 16);
  c.tiles.block_n1 = 24;  // ceil(64 / 24)
  EXPECT_EQ(c.num_col_blocks1(), 3);
}

TEST(LayerConfig, DescribeIsOneLineWithTheModel) {
  const LayerConfig c = small_config();
  const std::string d = c.describe();
  EXPECT_TRUE(contains(d, "small"));
  EXPECT_EQ(d.find('\n'), std::string::npos) << d;
}

// The ranks of a multi-process run compare fingerprints: every field counts, and the value is
// FNV-1a of the description, the same in every build (a value fixed here).
TEST(LayerConfig, FingerprintCoversEveryFieldAndIsStable) {
  const LayerConfig c = small_config();
  const std::string text = c.describe() + " padding=" + std::to_string(c.model.padding_experts);
  uint64_t fnv = 14695981039346656037ull;
  for (unsigned char ch : text) fnv = (fnv ^ ch) * 1099511628211ull;
  EXPECT_EQ(config_fingerprint(c), fnv);
  EXPECT_EQ(config_fingerprint(c), config_fingerprint(small_config()));
  const std::vector<std::function<void(LayerConfig&)>> changes = {
      [](LayerConfig& x) { x.model.hidden += 8; },          [](LayerConfig& x) { x.model.ffn += 8; },
      [](LayerConfig& x) { x.model.num_experts *= 2; },     [](LayerConfig& x) { x.model.topk += 1; },
      [](LayerConfig& x) { x.model.padding_experts += 1; }, [](LayerConfig& x) { x.max_tokens_per_rank += 1; },
      [](LayerConfig& x) { x.dtype = DType::kF16; },        [](LayerConfig& x) { x.tiles.block_n1 *= 2; },
      [](LayerConfig& x) { x.model.activation = Activation::kGelu; },
      [](LayerConfig& x) { x.layout = {x.layout.world, x.layout.world, 1}; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    LayerConfig d = c;
    changes[i](d);
    EXPECT_NE(config_fingerprint(d), config_fingerprint(c)) << "change " << i << ": " << d.describe();
  }
}

// One invalid configuration: a name and a mutation of small_config().
struct InvalidCase {
  std::string what;
  std::function<void(LayerConfig&)> mutate;
};

std::vector<InvalidCase> invalid_cases() {
  return {
      {"W != EP*TP", [](LayerConfig& c) { c.layout = {4, 2, 1}; }},
      {"W != EP*TP (too many)", [](LayerConfig& c) { c.layout = {4, 4, 2}; }},
      {"E % EP != 0", [](LayerConfig& c) { c.layout = {3, 3, 1}; }},
      {"E % EP != 0 (E=6, EP=4)", [](LayerConfig& c) { c.model.num_experts = 6; c.layout = {4, 4, 1}; }},
      {"F % TP != 0", [](LayerConfig& c) { c.model.ffn = 100; c.layout = {8, 1, 8}; }},
      {"F % TP != 0 (TP=3)", [](LayerConfig& c) { c.layout = {3, 1, 3}; }},
      {"topk > E", [](LayerConfig& c) { c.model.topk = 9; }},
      {"topk = 0", [](LayerConfig& c) { c.model.topk = 0; }},
      {"topk < 0", [](LayerConfig& c) { c.model.topk = -1; }},
      {"hidden = 0", [](LayerConfig& c) { c.model.hidden = 0; }},
      {"hidden < 0", [](LayerConfig& c) { c.model.hidden = -64; }},
      {"ffn = 0", [](LayerConfig& c) { c.model.ffn = 0; }},
      {"ffn < 0", [](LayerConfig& c) { c.model.ffn = -128; }},
      {"hidden > kMaxModelDim", [](LayerConfig& c) { c.model.hidden = kMaxModelDim + 8; }},
      {"ffn > kMaxModelDim", [](LayerConfig& c) { c.model.ffn = kMaxModelDim + 8; }},
      {"num_experts = 0", [](LayerConfig& c) { c.model.num_experts = 0; c.model.topk = 0; }},
      {"num_experts < 0", [](LayerConfig& c) { c.model.num_experts = -8; }},
      {"world = 0", [](LayerConfig& c) { c.layout = {0, 0, 0}; }},
      {"ep = 0", [](LayerConfig& c) { c.layout = {0, 0, 2}; }},
      {"tp = 0", [](LayerConfig& c) { c.layout = {0, 2, 0}; }},
      {"negative layout", [](LayerConfig& c) { c.layout = {4, -2, -2}; }},
      {"max_tokens_per_rank < 0", [](LayerConfig& c) { c.max_tokens_per_rank = -1; }},
      {"block_m = 0", [](LayerConfig& c) { c.tiles.block_m = 0; }},
      {"block_n0 = 0", [](LayerConfig& c) { c.tiles.block_n0 = 0; }},
      {"block_n1 < 0", [](LayerConfig& c) { c.tiles.block_n1 = -32; }},
  };
}

TEST(LayerConfig, ValidateGivesAReasonAndCheckThrows) {
  ASSERT_TRUE(small_config().validate().ok) << small_config().validate().reason;
  for (const InvalidCase& ic : invalid_cases()) {
    LayerConfig c = small_config();
    ic.mutate(c);
    SCOPED_TRACE("invalid case: " + ic.what);
    const Status s = c.validate();
    EXPECT_FALSE(s.ok);
    EXPECT_FALSE(bool(s));
    EXPECT_FALSE(s.reason.empty());
    std::string message;
    EXPECT_TRUE(throws_with<Error>([&] { c.check(); }, {}, &message));
    if (!s.reason.empty()) {
      EXPECT_TRUE(contains(message, s.reason));
    }
  }
}

TEST(Names, ActivationRoundTripAndBadName) {
  for (Activation a : {Activation::kSwiGlu, Activation::kGelu, Activation::kRelu, Activation::kSilu}) {
    EXPECT_EQ(parse_activation(activation_name(a)), a) << activation_name(a);
  }
  EXPECT_STREQ(activation_name(Activation::kSwiGlu), "swiglu");
  EXPECT_STREQ(activation_name(Activation::kGelu), "gelu");
  EXPECT_STREQ(activation_name(Activation::kRelu), "relu");
  EXPECT_STREQ(activation_name(Activation::kSilu), "silu");
  EXPECT_TRUE(is_gated(Activation::kSwiGlu));
  EXPECT_FALSE(is_gated(Activation::kGelu));
  EXPECT_FALSE(is_gated(Activation::kRelu));
  EXPECT_FALSE(is_gated(Activation::kSilu));
  for (const char* bad : {"", "swish", "ReLU2", "gelu "}) {
    EXPECT_TRUE(throws_with<Error>([&] { parse_activation(bad); })) << "'" << bad << "'";
  }
}

TEST(Names, DtypeRoundTripAndBadName) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d) << dtype_name(d);
  }
  EXPECT_STREQ(dtype_name(DType::kF32), "f32");
  EXPECT_STREQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_STREQ(dtype_name(DType::kF16), "f16");
  EXPECT_EQ(dtype_bytes(DType::kF32), 4);
  EXPECT_EQ(dtype_bytes(DType::kBF16), 2);
  EXPECT_EQ(dtype_bytes(DType::kF16), 2);
  EXPECT_TRUE(throws_with<Error>([] { parse_dtype("fp33"); }, {"fp33"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_dtype(""); }));
  EXPECT_TRUE(throws_with<Error>([] { parse_dtype("int8"); }, {"int8"}));
}

TEST(ModelShape, WeightsAndFlops) {
  ModelShape gated{"g", 64, 96, 8, 2, Activation::kSwiGlu};
  EXPECT_EQ(gated.weights_per_expert(), int64_t(3) * 64 * 96);
  EXPECT_EQ(gated.flops_per_row(), int64_t(2) * 3 * 64 * 96);
  ModelShape plain{"p", 64, 96, 8, 2, Activation::kGelu};
  EXPECT_EQ(plain.weights_per_expert(), int64_t(2) * 64 * 96);
  EXPECT_EQ(plain.flops_per_row(), int64_t(2) * 2 * 64 * 96);
  // Large presets must not overflow 32 bits.
  const ModelShape& ds = ModelPresets::get("mixtral-8x7b");
  EXPECT_EQ(ds.weights_per_expert(), int64_t(3) * 4096 * 14336);
}

TEST(ModelShape, ScaledDownKeepsExpertsAndDividesSizes) {
  for (const ModelShape& m : ModelPresets::all()) {
    SCOPED_TRACE(m.name);
    const ModelShape same = m.scaled_down(1);
    EXPECT_EQ(same.name, m.name);
    EXPECT_EQ(same.hidden, m.hidden);
    EXPECT_EQ(same.ffn, m.ffn);
    for (int factor : {2, 4, 8, 16, 64, 3, 1000, 100000}) {
      SCOPED_TRACE("factor " + std::to_string(factor));
      const ModelShape s = m.scaled_down(factor);
      EXPECT_EQ(s.num_experts, m.num_experts);
      EXPECT_EQ(s.topk, m.topk);
      EXPECT_EQ(s.activation, m.activation);
      EXPECT_EQ(s.name, m.name + "/" + std::to_string(factor));
      for (auto [got, full] : {std::pair{s.hidden, m.hidden}, std::pair{s.ffn, m.ffn}}) {
        const double exact = double(full) / factor;
        EXPECT_EQ(got % 8, 0) << got;
        EXPECT_GE(got, 8);
        EXPECT_GE(got, exact);           // rounded up
        EXPECT_LT(got, std::max(exact, 8.0) + 8);  // to the next multiple of 8 at most
      }
    }
  }
  // Exact cases.
  const ModelShape mix = ModelPresets::get("mixtral-8x7b").scaled_down(64);
  EXPECT_EQ(mix.hidden, 64);
  EXPECT_EQ(mix.ffn, 224);
  const ModelShape qwen3 = ModelPresets::get("qwen3-30b-a3b").scaled_down(64);
  EXPECT_EQ(qwen3.hidden, 32);
  EXPECT_EQ(qwen3.ffn, 16);  // 12 rounded up to a multiple of 8
}

// CPU work of one forward (all ranks): rows * FLOP per row.
double cpu_work(const ModelShape& m, int world, int tokens, CpuScale s) {
  const ModelShape scaled = m.scaled_down(s.shape_factor);
  const double tokens_scaled = double(tokens) / s.token_factor;
  return double(world) * tokens_scaled * m.topk * double(scaled.flops_per_row());
}

bool is_pow2(int v) { return v >= 1 && (v & (v - 1)) == 0; }

TEST(CpuScale, BringsTheWorkUnderBudget) {
  const double budget = 4e9;
  for (const ModelShape& m : ModelPresets::all()) {
    for (int world : {1, 8}) {
      for (int tokens : {128, 4096, 16384}) {
        SCOPED_TRACE(m.name + " W=" + std::to_string(world) + " T=" + std::to_string(tokens));
        const CpuScale s = choose_cpu_scale(m, world, tokens, budget);
        EXPECT_TRUE(is_pow2(s.shape_factor)) << s.shape_factor;
        EXPECT_TRUE(is_pow2(s.token_factor)) << s.token_factor;
        EXPECT_LE(cpu_work(m, world, tokens, s), budget)
            << "shape_factor " << s.shape_factor << " token_factor " << s.token_factor;
        EXPECT_GE(m.scaled_down(s.shape_factor).hidden, 64);
        // H and F first: tokens are scaled only once H cannot shrink further.
        if (s.token_factor > 1) {
          EXPECT_LT(m.scaled_down(s.shape_factor * 2).hidden, 64);
        }
        // The weights of all experts fit the default value budget (16M values).
        const int64_t kWeightValues = int64_t(16) << 20;
        auto weight_values = [&](int f) { return int64_t(m.num_experts) * m.scaled_down(f).weights_per_expert(); };
        EXPECT_LE(weight_values(s.shape_factor), kWeightValues);
        // Smallest: half the factor would not fit (the FLOP budget, or the weights for H and F).
        if (s.token_factor > 1) {
          EXPECT_GT(cpu_work(m, world, tokens, {s.shape_factor, s.token_factor / 2}), budget);
        } else if (s.shape_factor > 1) {
          EXPECT_TRUE(cpu_work(m, world, tokens, {s.shape_factor / 2, 1}) > budget ||
                      weight_values(s.shape_factor / 2) > kWeightValues);
        }
      }
    }
  }
}

TEST(CpuScale, SmallWorkIsUnscaled) {
  const ModelShape m{"tiny", 64, 64, 4, 1, Activation::kRelu};
  const CpuScale s = choose_cpu_scale(m, 2, 16, 4e9);
  EXPECT_EQ(s.shape_factor, 1);
  EXPECT_EQ(s.token_factor, 1);
}

TEST(LayerConfig, RefusesTilesAndRowCountsBeyondInt32) {
  LayerConfig c = small_config();
  c.tiles.block_m = (1 << 16) + 1;
  EXPECT_FALSE(c.validate().ok);
  EXPECT_NE(c.validate().reason.find("tile shapes"), std::string::npos) << c.validate().reason;
  c = small_config();
  c.max_tokens_per_rank = 65536;
  c.model.num_experts = 256;
  c.model.topk = 8;
  c.layout = {1, 1, 1};
  c.model.hidden = 7168;
  c.tiles = {1, 1, 1};  // one tile per row and column: 524288 x 7168 layer1 tiles > 2^31
  EXPECT_FALSE(c.validate().ok);
  EXPECT_NE(c.validate().reason.find("2^31"), std::string::npos) << c.validate().reason;
  EXPECT_THROW(c.check(), Error);
  // Rows per rank within int32 while the send lists of all pairs are not: W = EP = 64, one
  // expert per rank, topk 8, 2^25 - 2 tokens per rank (64 x 33554430 x 8 entries).
  c = small_config();
  c.model.num_experts = 64;
  c.model.topk = 8;
  c.layout = {64, 64, 1};
  c.max_tokens_per_rank = (1 << 25) - 2;
  c.tiles = {64, 1 << 16, 1 << 16};  // one column block: the tile counts fit too
  ASSERT_LE(c.max_rows_per_rank(), (int64_t(1) << 31) - 1);
  EXPECT_FALSE(c.validate().ok);
  EXPECT_NE(c.validate().reason.find("send lists would hold up to 17179868160 entries"), std::string::npos)
      << c.validate().reason;
  c.max_tokens_per_rank = 1 << 16;  // 2^25 entries
  EXPECT_TRUE(c.validate().ok) << c.validate().reason;
}

// H and F up to kMaxModelDim validate; beyond it (where int32 sums such as H + block_n1 - 1
// overflowed into negative sizes) they are refused, naming the value.
TEST(LayerConfig, RefusesHiddenAndFfnBeyondTheBound) {
  LayerConfig c = small_config();
  c.model.hidden = kMaxModelDim;
  c.model.ffn = kMaxModelDim;
  EXPECT_TRUE(c.validate().ok) << c.validate().reason;
  c.model.hidden = 2147483640;
  EXPECT_FALSE(c.validate().ok);
  EXPECT_TRUE(contains(c.validate().reason, "H=2147483640"));
  EXPECT_TRUE(contains(c.validate().reason, std::to_string(kMaxModelDim)));
  c = small_config();
  c.model.ffn = 2147483640;
  EXPECT_TRUE(throws_with<Error>([&] { c.check(); }, {"F=2147483640", std::to_string(kMaxModelDim)}));
}

// EP*TP used to be compared in int: E = EP = 1431655766 with TP = 3 wraps to 2 = W, so the
// config validated and DispatchPlan indexed a two-rank plan with ranks up to 3 * EP.
TEST(LayerConfig, RefusesAWorldThatEpTimesTpMatchesOnlyAfterWrapping) {
  LayerConfig c = small_config();
  c.model.num_experts = 1431655766;
  c.model.ffn = 3 * 64;
  c.layout = {2, 1431655766, 3};
  EXPECT_FALSE(c.validate().ok);
  EXPECT_THROW(c.check(), Error);
  // Within the bound on E: 65536 * 65537 = 2^32 + 65536 wraps to 65536 in int.
  c = small_config();
  c.model.num_experts = 65536;
  c.model.ffn = 65537;
  c.layout = {65536, 65536, 65537};
  const Status s = c.validate();
  EXPECT_FALSE(s.ok);
  EXPECT_TRUE(contains(s.reason, "world size 65536 != EP*TP = 65536*65537"));
}

// E up to kMaxExperts and W up to kMaxWorldSize validate; beyond them they are refused with a
// message naming the field and the value.
TEST(LayerConfig, RefusesExpertsAndWorldBeyondTheBounds) {
  LayerConfig c = small_config();
  c.model.num_experts = kMaxExperts;
  EXPECT_TRUE(c.validate().ok) << c.validate().reason;
  c.model.num_experts = kMaxExperts + 2;  // still divisible by EP = 2
  EXPECT_FALSE(c.validate().ok);
  EXPECT_TRUE(contains(c.validate().reason, "num_experts"));
  EXPECT_TRUE(contains(c.validate().reason, "E=" + std::to_string(kMaxExperts + 2)));
  EXPECT_TRUE(contains(c.validate().reason, std::to_string(kMaxExperts)));

  c = small_config();
  c.model.num_experts = 64;
  c.layout = {kMaxWorldSize, kMaxWorldSize, 1};
  EXPECT_TRUE(c.validate().ok) << c.validate().reason;
  c.model.num_experts = 128;
  c.layout = {2 * kMaxWorldSize, 2 * kMaxWorldSize, 1};
  EXPECT_FALSE(c.validate().ok);
  EXPECT_TRUE(contains(c.validate().reason, "W=" + std::to_string(2 * kMaxWorldSize)));
  EXPECT_TRUE(throws_with<Error>([&] { c.check(); }, {"world size", std::to_string(kMaxWorldSize)}));
}

}  // namespace
}  // namespace comet
