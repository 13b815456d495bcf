// comet/routing.h: which experts each token goes to, with what weight.
//
// A Routing holds one rank's decision for its num_tokens tokens: expert_ids and weights are
// row-major [num_tokens][topk]. An id of -1 masks the slot (its weight is ignored). A token
// selects each expert at most once, as top-k routers do; check() rejects repeats (they would
// break the buffer bound min(topk, E/EP) rows per token and rank). Generators are
// deterministic functions of (spec, seed, rank).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/config.h"

namespace comet {

struct Routing {
  int num_tokens = 0;
  int topk = 0;
  std::vector<int32_t> expert_ids;  // [num_tokens][topk], -1 = masked
  std::vector<float> weights;       // [num_tokens][topk]

  int32_t expert(int token, int slot) const { return expert_ids[size_t(token) * topk + slot]; }
  float weight(int token, int slot) const { return weights[size_t(token) * topk + slot]; }
  // Throws comet::Error naming (rank, token, slot, id) for an id outside [-1, num_experts), an
  // expert repeated within a token, or a non-finite weight; and a size mismatch.
  void check(int num_experts, int rank) const;
};

// Softmax over each token's E logits, then the topk largest probabilities (ties: lower expert
// id first). With renormalize the kept weights sum to 1 (Mixtral); without they are the raw
// softmax probabilities (Qwen-MoE style). A logit of -inf masks its expert (probability 0): when
// fewer than topk experts of a token are unmasked, its remaining slots are masked (id -1,
// weight 0). NaN, +inf, or a token whose logits are all -inf throw comet::Error naming the token.
Routing softmax_topk_gating(const std::vector<float>& logits, int num_tokens, int num_experts,
                            int topk, bool renormalize = true);

enum class RoutingKind { kUniform, kZipf, kImbalance };

struct RoutingSpec {
  RoutingKind kind = RoutingKind::kUniform;
  double param = 0.0;          // zipf: exponent s; imbalance: std of per-expert load fraction
  double mask_fraction = 0.0;  // fraction of slots set to -1
  std::string describe() const;
};

// The largest imbalance:STD accepted. STD is the std of an expert's load fraction (a number in
// [0, 1] that is 1/E on average), so a larger one describes no distribution; the paper sweeps
// 0..0.05. Much larger values (1e307) overflowed the loads' sum to inf.
inline constexpr double kMaxImbalanceStd = 1.0;

// "uniform", "zipf:1.2", "imbalance:0.03" (STD in [0, kMaxImbalanceStd]); throws comet::Error on
// anything else.
RoutingSpec parse_routing_spec(const std::string& text);

// Expert load distribution of a spec: probability of each expert being picked by one slot.
// uniform: 1/E each. zipf:s: proportional to 1/(i+1)^s over a seeded permutation of experts.
// imbalance:std: 1/E plus Gaussian noise of that std (the paper's sweep), clipped at 0.
std::vector<double> expert_load_distribution(const RoutingSpec& spec, int num_experts,
                                             uint64_t seed);

// Routing of `num_tokens` tokens of `rank`: each token draws topk distinct experts from the
// spec's distribution (without replacement), weights from softmax-top-k of seeded logits over
// the drawn experts; then slots are masked with probability mask_fraction.
Routing generate_routing(const RoutingSpec& spec, int num_tokens, int num_experts, int topk,
                         uint64_t seed, int rank);

// Small deterministic generator used by every seeded function in the project (splitmix64).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  double uniform();         // [0, 1)
  double normal();          // N(0, 1), Box-Muller
  int uniform_int(int n);   // [0, n); throws comet::Error for n < 1
 private:
  uint64_t state_;
};

// Seed for stream `stream` of `seed`, so that rank r's data never depends on how many values
// another rank drew.
uint64_t derive_seed(uint64_t seed, uint64_t stream);

}  // namespace comet
