// Routing: softmax top-k gating, seeded synthetic generators, validation.
#include "comet/routing.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <sstream>

namespace comet {

namespace {
// A routing of num_tokens x topk slots, to be filled in.
Routing sized_routing(int num_tokens, int topk) {
  Routing r;
  r.num_tokens = num_tokens;
  r.topk = topk;
  r.expert_ids.resize(size_t(num_tokens) * topk);
  r.weights.resize(size_t(num_tokens) * topk);
  return r;
}
}  // namespace

uint64_t Rng::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

int Rng::uniform_int(int n) {
  COMET_CHECK(n >= 1, "Rng::uniform_int: n = " << n << " leaves no value in [0, n)");
  return int(next_u64() % uint64_t(n));
}

uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  Rng rng(seed ^ (0xd1b54a32d192ed03ull * (stream + 1)));
  return rng.next_u64();
}

void Routing::check(int num_experts, int rank) const {
  COMET_CHECK(num_tokens >= 0, "rank " << rank << ": negative token count " << num_tokens);
  COMET_CHECK(expert_ids.size() == size_t(num_tokens) * topk && weights.size() == expert_ids.size(),
              "rank " << rank << ": routing arrays hold " << expert_ids.size() << " ids and "
                      << weights.size() << " weights, expected " << size_t(num_tokens) * topk
                      << " (num_tokens " << num_tokens << " x topk " << topk << ")");
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < topk; ++k) {
      const int32_t e = expert(t, k);
      COMET_CHECK(e >= -1 && e < num_experts,
                  "rank " << rank << " token " << t << " slot " << k << ": expert id " << e
                          << " out of range [0, " << num_experts << ") (use -1 to mask a slot)");
      COMET_CHECK(e < 0 || std::isfinite(weight(t, k)),
                  "rank " << rank << " token " << t << " slot " << k << ": routing weight is not finite");
      for (int j = 0; j < k && e >= 0; ++j)
        COMET_CHECK(expert(t, j) != e, "rank " << rank << " token " << t << ": expert " << e
                                               << " appears in slots " << j << " and " << k
                                               << " (each expert at most once per token)");
    }
  }
}

Routing softmax_topk_gating(const std::vector<float>& logits, int num_tokens, int num_experts,
                            int topk, bool renormalize) {
  COMET_CHECK(topk >= 1 && topk <= num_experts, "topk " << topk << " not in [1, " << num_experts << "]");
  COMET_CHECK(logits.size() == size_t(num_tokens) * num_experts,
              "logits hold " << logits.size() << " values, expected num_tokens*E = "
                             << size_t(num_tokens) * num_experts);
  Routing r = sized_routing(num_tokens, topk);
  std::vector<double> prob(num_experts);
  std::vector<int> idx(num_experts);
  for (int t = 0; t < num_tokens; ++t) {
    const float* row = logits.data() + size_t(t) * num_experts;
    // -inf masks an expert (probability 0); NaN and +inf have no probability.
    for (int e = 0; e < num_experts; ++e)
      COMET_CHECK(!std::isnan(row[e]) && row[e] != std::numeric_limits<float>::infinity(),
                  "softmax_topk_gating: token " << t << ", expert " << e << ": logit " << row[e]
                                                << " (a logit must be finite, or -inf to mask the expert)");
    const double max_logit = *std::max_element(row, row + num_experts);
    COMET_CHECK(std::isfinite(max_logit), "softmax_topk_gating: token " << t << ": every logit is -inf");
    double sum = 0;
    for (int e = 0; e < num_experts; ++e) sum += prob[e] = std::exp(double(row[e]) - max_logit);
    for (int e = 0; e < num_experts; ++e) prob[e] /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    // Stable: equal probabilities keep the lower expert id first. Masked experts go last: an
    // unmasked expert whose probability underflowed to 0 still ranks before them.
    const auto masked_logit = [&](int e) { return row[e] == -std::numeric_limits<float>::infinity(); };
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
      if (masked_logit(a) != masked_logit(b)) return !masked_logit(a);
      return prob[a] > prob[b];
    });
    double kept = 0;
    for (int k = 0; k < topk; ++k) kept += prob[idx[k]];
    for (int k = 0; k < topk; ++k) {
      // A slot that only a masked expert could fill is masked itself (-1): it moves no row.
      const bool masked = masked_logit(idx[k]);
      r.expert_ids[size_t(t) * topk + k] = masked ? -1 : idx[k];
      r.weights[size_t(t) * topk + k] = masked ? 0.f : float(renormalize ? prob[idx[k]] / kept : prob[idx[k]]);
    }
  }
  return r;
}

std::string RoutingSpec::describe() const {
  std::ostringstream os;
  switch (kind) {
    case RoutingKind::kUniform: os << "uniform"; break;
    case RoutingKind::kZipf: os << "zipf:" << param; break;
    case RoutingKind::kImbalance: os << "imbalance:" << param; break;
  }
  if (mask_fraction > 0) os << " mask:" << mask_fraction;
  return os.str();
}

RoutingSpec parse_routing_spec(const std::string& text) {
  RoutingSpec spec;
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  auto number = [&](double lo) {
    // strtod rather than stod: stod throws for a value that underflows (1e-310, below the
    // smallest normal double), which is a number all the same and reads as the tiny value it is.
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(arg.c_str(), &end);
    const bool whole = !arg.empty() && end == arg.c_str() + arg.size();
    COMET_CHECK(!whole || errno != ERANGE || std::abs(v) <= std::numeric_limits<double>::min(),
                "routing '" << text << "': " << arg << " is too large for a double");
    COMET_CHECK(whole && std::isfinite(v) && v >= lo,
                "routing '" << text << "': expected a number >= " << lo << " after '" << kind << ":'");
    return v;
  };
  // uniform takes no parameter: "uniform:" (an empty one) is refused as "uniform:1" is, not
  // read as plain uniform.
  if (kind == "uniform" && colon == std::string::npos) {
    spec.kind = RoutingKind::kUniform;
  } else if (kind == "uniform") {
    throw Error("routing '" + text + "': uniform takes no parameter (give it as 'uniform', without a colon)");
  } else if (kind == "zipf") {
    spec.kind = RoutingKind::kZipf;
    spec.param = number(0.0);
  } else if (kind == "imbalance") {
    spec.kind = RoutingKind::kImbalance;
    spec.param = number(0.0);
    COMET_CHECK(spec.param <= kMaxImbalanceStd,
                "routing '" << text << "': STD is the std of an expert's load fraction (1/E on average), "
                            << "at most " << kMaxImbalanceStd << ", got " << arg);
  } else {
    throw Error("unknown routing '" + text + "' (expected uniform, zipf:S or imbalance:STD)");
  }
  return spec;
}

std::vector<double> expert_load_distribution(const RoutingSpec& spec, int num_experts, uint64_t seed) {
  COMET_CHECK(num_experts >= 1, "routing over " << num_experts << " experts");
  // A NaN or negative parameter would skew the loads silently (parse_routing_spec refuses them
  // in text; a spec built in code comes here unchecked).
  COMET_CHECK(spec.kind == RoutingKind::kUniform || (std::isfinite(spec.param) && spec.param >= 0),
              "routing " << spec.describe() << ": the parameter must be a finite number >= 0");
  COMET_CHECK(spec.kind != RoutingKind::kImbalance || spec.param <= kMaxImbalanceStd,
              "routing " << spec.describe() << ": STD must be at most " << kMaxImbalanceStd);
  std::vector<double> p(num_experts, 1.0 / num_experts);
  Rng rng(derive_seed(seed, 0x10ad));
  if (spec.kind == RoutingKind::kZipf) {
    // Popularity rank of each expert is a seeded permutation, so hot experts are spread over
    // EP groups rather than all on rank 0.
    std::vector<int> perm(num_experts);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = num_experts - 1; i > 0; --i) std::swap(perm[i], perm[rng.uniform_int(i + 1)]);
    for (int i = 0; i < num_experts; ++i) p[perm[i]] = 1.0 / std::pow(i + 1.0, spec.param);
  } else if (spec.kind == RoutingKind::kImbalance) {
    for (int e = 0; e < num_experts; ++e)
      p[e] = std::max(0.0, 1.0 / num_experts + spec.param * rng.normal());
  }
  double sum = std::accumulate(p.begin(), p.end(), 0.0);
  // inf or NaN would turn every load into 0 or NaN and generation into silent nonsense.
  COMET_CHECK(std::isfinite(sum), "routing " << spec.describe() << " over " << num_experts
                                             << " experts: the loads sum to " << sum << ", not a finite number");
  if (sum <= 0) {  // every expert clipped to zero: fall back to uniform
    std::fill(p.begin(), p.end(), 1.0);
    sum = num_experts;
  }
  for (double& v : p) v /= sum;
  return p;
}

Routing generate_routing(const RoutingSpec& spec, int num_tokens, int num_experts, int topk,
                         uint64_t seed, int rank) {
  COMET_CHECK(topk >= 1 && topk <= num_experts, "topk " << topk << " not in [1, " << num_experts << "]");
  COMET_CHECK(num_tokens >= 0, "negative token count " << num_tokens);
  COMET_CHECK(spec.mask_fraction >= 0 && spec.mask_fraction <= 1,
              "mask fraction " << spec.mask_fraction << " not in [0, 1]");
  const std::vector<double> load = expert_load_distribution(spec, num_experts, seed);
  Rng rng(derive_seed(seed, 1000 + uint64_t(rank)));
  Routing r = sized_routing(num_tokens, topk);
  // The loads of the experts a token has not drawn yet. Only its drawn experts change, so they
  // are put back after each token instead of copying all E loads again: with topk 1 that copy
  // cost as much as the draw itself. The draws are the same either way.
  std::vector<double> left = load;
  std::vector<double> logit(topk);
  for (int t = 0; t < num_tokens; ++t) {
    // Draw topk distinct experts with probability proportional to load (without replacement).
    double left_sum = 1.0;
    for (int k = 0; k < topk; ++k) {
      double u = rng.uniform() * left_sum;
      int pick = -1;
      for (int e = 0; e < num_experts; ++e) {
        if (left[e] <= 0) continue;
        pick = e;
        if (u < left[e]) break;
        u -= left[e];
      }
      if (pick < 0) {  // the distribution ran dry (zero-load experts): take any unused one
        for (int e = 0; e < num_experts && pick < 0; ++e)
          if (left[e] >= 0) pick = e;
      }
      left_sum -= std::max(0.0, left[pick]);
      left[pick] = -1.0;  // used
      r.expert_ids[size_t(t) * topk + k] = pick;
    }
    for (int k = 0; k < topk; ++k) {
      const int drawn = r.expert_ids[size_t(t) * topk + k];
      left[drawn] = load[drawn];
    }
    // Weights: softmax over seeded logits of the drawn experts (largest logit first).
    double max_logit = -1e300;
    for (int k = 0; k < topk; ++k) max_logit = std::max(max_logit, logit[k] = rng.normal());
    std::sort(logit.begin(), logit.end(), std::greater<>());
    double sum = 0;
    for (int k = 0; k < topk; ++k) sum += logit[k] = std::exp(logit[k] - max_logit);
    for (int k = 0; k < topk; ++k) r.weights[size_t(t) * topk + k] = float(logit[k] / sum);
    for (int k = 0; k < topk; ++k)
      if (spec.mask_fraction > 0 && rng.uniform() < spec.mask_fraction)
        r.expert_ids[size_t(t) * topk + k] = -1;
  }
  return r;
}

}  // namespace comet
