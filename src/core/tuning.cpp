// Tuning table lookup and the analytic n_comm fallback.
#include "comet/tuning.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

namespace comet {

bool TuningKey::same_workload_class(const TuningKey& o) const {
  return gpu == o.gpu && num_sms == o.num_sms && hidden == o.hidden && ffn == o.ffn &&
         num_experts == o.num_experts && topk == o.topk && world == o.world && ep == o.ep && tp == o.tp &&
         gpus == o.gpus;
}

std::string TuningKey::describe() const {
  std::ostringstream os;
  os << gpu << " (" << num_sms << " SMs), H " << hidden << " F " << ffn << " E " << num_experts << " topk " << topk
     << ", W " << world << " = EP " << ep << " x TP " << tp << " on " << gpus << (gpus == 1 ? " GPU, " : " GPUs, ")
     << tokens_per_rank << " tokens/rank";
  return os.str();
}

TuningKey tuning_key(const LayerConfig& c, const std::string& gpu, int num_sms, int tokens_per_rank, int gpus) {
  COMET_CHECK(gpus >= 1 && c.layout.world % gpus == 0,
              "tuning key: " << gpus << " GPUs for W = " << c.layout.world << " ranks (a divisor of W: 1, W, or "
                             << "W / ranks per GPU)");
  return {valid_utf8(gpu), num_sms, c.model.hidden, c.model.ffn, c.model.num_experts, c.model.topk,
          c.layout.world, c.layout.ep, c.layout.tp, gpus, tokens_per_rank};
}

std::string valid_utf8(const std::string& text) {
  static const std::string kReplacement = "\xef\xbf\xbd";  // U+FFFD
  std::string out;
  out.reserve(text.size());
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char lead = byte(i);
    // The sequence's length and the range of its second byte (which rules out overlong forms,
    // surrogates and code points past U+10FFFF); 0: not a lead byte.
    int length = 0;
    unsigned char low = 0x80, high = 0xbf;
    if (lead < 0x80) length = 1;
    else if (lead >= 0xc2 && lead <= 0xdf) length = 2;
    else if (lead == 0xe0) length = 3, low = 0xa0;
    else if (lead >= 0xe1 && lead <= 0xec) length = 3;
    else if (lead == 0xed) length = 3, high = 0x9f;
    else if (lead >= 0xee && lead <= 0xef) length = 3;
    else if (lead == 0xf0) length = 4, low = 0x90;
    else if (lead >= 0xf1 && lead <= 0xf3) length = 4;
    else if (lead == 0xf4) length = 4, high = 0x8f;
    // The bytes that begin a well-formed sequence: all `length` of them, or the maximal subpart
    // of one cut short or broken (a lead byte and the continuation bytes valid so far), which
    // becomes one U+FFFD as nlohmann's writer makes it (Unicode's recommended practice); a byte
    // that cannot begin a sequence becomes one U+FFFD of its own.
    size_t valid = length > 0 ? 1 : 0;
    while (valid > 0 && valid < size_t(length) && i + valid < text.size()) {
      const unsigned char b = byte(i + valid);
      if (!(valid == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xbf))) break;
      ++valid;
    }
    if (length > 0 && valid == size_t(length)) {
      out.append(text, i, valid);
    } else {
      out += kReplacement;
    }
    i += std::max<size_t>(valid, 1);
  }
  return out;
}

void TuningTable::add(const TuningEntry& e) {
  COMET_CHECK(e.key.tokens_per_rank > 0 && e.n_comm0 > 0 && e.n_comm1 > 0,
              "tuning entry needs positive tokens and n_comm (" << e.key.describe() << ")");
  for (TuningEntry& old : entries_)
    if (old.key.same_workload_class(e.key) && old.key.tokens_per_rank == e.key.tokens_per_rank) {
      old = e;
      return;
    }
  entries_.push_back(e);
}

std::optional<TuningTable::Match> TuningTable::nearest(const TuningKey& key) const {
  std::optional<Match> best;
  if (key.tokens_per_rank <= 0) return best;
  for (const TuningEntry& e : entries_) {
    if (!e.key.same_workload_class(key)) continue;
    const double d = std::abs(std::log2(double(key.tokens_per_rank) / e.key.tokens_per_rank));
    const bool better = !best || d < best->distance ||
                        (d == best->distance && e.key.tokens_per_rank < best->entry->key.tokens_per_rank);
    if (better) best = Match{&e, d};
  }
  return best;
}

namespace {
constexpr int kMinCommBlocks0 = 32;
constexpr int kCommBlocks1 = 2;

// The lookup every choice below makes: the nearest entry, if within kMaxTuningDistance.
std::optional<TuningTable::Match> near_entry(const TuningTable* table, const TuningKey& key) {
  if (!table) return std::nullopt;
  const auto m = table->nearest(key);
  if (!m || m->distance > kMaxTuningDistance) return std::nullopt;
  return m;
}
// How a choice names its entry, and the absence of one.
std::string entry_words(const TuningTable::Match& m) {
  std::ostringstream os;
  os << "entry for " << m.entry->key.tokens_per_rank << " tokens/rank (distance " << m.distance << ")";
  return os.str();
}
std::string no_entry_words(const TuningKey& key) {
  return "no tuning entry within a factor of 2 in tokens for " + key.describe();
}
}  // namespace

int analytic_n_comm(double flop, double bytes, int num_sms, double tflops, double link_gbps, double per_block_gbps) {
  COMET_CHECK(num_sms >= 2 && tflops > 0 && link_gbps > 0 && per_block_gbps > 0,
              "analytic_n_comm: bad rates (SMs " << num_sms << ", " << tflops << " TFLOP/s, link " << link_gbps
                                                 << " GB/s, " << per_block_gbps << " GB/s per block)");
  int best = 1;
  double best_time = INFINITY;
  for (int n = 1; n <= num_sms / 2; ++n) {
    const double t_gemm = flop / (tflops * 1e12 * double(num_sms - n) / num_sms);
    const double t_comm = bytes / (std::min(link_gbps, n * per_block_gbps) * 1e9);
    const double t = std::max(t_gemm, t_comm);
    if (t < best_time * (1 - 1e-12)) {  // strictly better: the smallest n wins ties
      best_time = t;
      best = n;
    }
  }
  return best;
}

NCommChoice choose_n_comm(const TuningTable* table, const TuningKey& key, const LayerConfig& config,
                          const LayerCost& cost, const GpuSpec& gpu) {
  NCommChoice choice;
  if (const auto m = near_entry(table, key)) {
    choice.n_comm0 = m->entry->n_comm0;
    choice.n_comm1 = m->entry->n_comm1;
    choice.source = "tuning table: " + entry_words(*m);
    return choice;
  }
  // Layer0 carries the gate and up projections (2/3 of a gated FFN's FLOP, 1/2 otherwise) and
  // the dispatch half of the link bytes. The steady-state balance misses that the GEMM's first
  // wave needs its rows at once, and layer0's communication blocks join GEMM0 once the dispatch
  // is done (claimed tiles), so blocks given to it cost little: it is floored at 32, what the
  // W = 8 presets measured best or within 1% of the best (tuning/nvidia-h200.json: 32 or 64 on
  // 13 of 14 workloads). Layer1's GEMM blocks join the combine once their tiles
  // are done, so its dedicated blocks only start early column groups: 2 measured best everywhere.
  const double flop0_share = is_gated(config.model.activation) ? 2.0 / 3.0 : 0.5;
  const int sms = key.num_sms > 0 ? key.num_sms : gpu.num_sms;
  choice.n_comm0 = std::max(std::min(kMinCommBlocks0, sms / 2),
                            analytic_n_comm(cost.flops_max_rank * flop0_share, cost.link_bytes_max_rank / 2, sms,
                                            gpu.bf16_tflops, gpu.link_gbps, gpu.copy_gbps_per_block));
  choice.n_comm1 = std::min(kCommBlocks1, sms / 2);
  choice.source = "cost model: " + no_entry_words(key);
  return choice;
}

PathChoice choose_path(const TuningTable* table, const TuningKey& key) {
  PathChoice choice;
  if (const auto m = near_entry(table, key)) {
    const TuningEntry& e = *m->entry;
    choice.fused = e.fused_faster();
    std::ostringstream os;
    os << (choice.fused ? "fused" : "unfused") << ": tuning table " << entry_words(*m) << ", ";
    if (e.unfused_us > 0 && e.latency_us > 0)
      os << "fused " << e.latency_us << " us, unfused " << e.unfused_us << " us";
    else
      os << "the unfused forward was not measured";
    choice.source = os.str();
    return choice;
  }
  choice.source = "unfused: " + no_entry_words(key);
  return choice;
}

const char* layer0_copies_name(Layer0Copies copies) {
  return copies == Layer0Copies::kGemmBlocks ? "gemm" : "blocks";
}
const char* dispatch_order_name(DispatchOrder order) { return order == DispatchOrder::kRows ? "rows" : "ring"; }
std::optional<Layer0Copies> parse_layer0_copies(std::string_view name) {
  if (name == "blocks") return Layer0Copies::kCommBlocks;
  if (name == "gemm") return Layer0Copies::kGemmBlocks;
  return std::nullopt;
}
std::optional<DispatchOrder> parse_dispatch_order(std::string_view name) {
  if (name == "ring") return DispatchOrder::kRing;
  if (name == "rows") return DispatchOrder::kRows;
  return std::nullopt;
}
std::string describe(const Layer0Mode& mode) {
  return std::string(layer0_copies_name(mode.copies)) + "/" + dispatch_order_name(mode.order);
}

const char* layer1_combine_name(Layer1Combine combine) {
  return combine == Layer1Combine::kGemmBlocks ? "gemm" : "blocks";
}
std::optional<Layer1Combine> parse_layer1_combine(std::string_view name) {
  if (name == "blocks") return Layer1Combine::kCommBlocks;
  if (name == "gemm") return Layer1Combine::kGemmBlocks;
  return std::nullopt;
}

Layer0ModeChoice choose_layer0_mode(const TuningTable* table, const TuningKey& key) {
  Layer0ModeChoice choice;
  if (const auto m = near_entry(table, key)) {
    choice.mode = m->entry->layer0;
    choice.source = describe(choice.mode) + ": tuning table " + entry_words(*m);
    return choice;
  }
  choice.source = describe(choice.mode) + ": " + no_entry_words(key);
  return choice;
}

Layer1CombineChoice choose_layer1_combine(const TuningTable* table, const TuningKey& key) {
  Layer1CombineChoice choice;
  if (const auto m = near_entry(table, key)) {
    choice.combine = m->entry->layer1_combine;
    choice.source = std::string(layer1_combine_name(choice.combine)) + ": tuning table " + entry_words(*m);
    return choice;
  }
  choice.source = std::string(layer1_combine_name(choice.combine)) + ": " + no_entry_words(key);
  return choice;
}

TuneSummary summarize_tuning(const std::vector<TuneSample>& samples) {
  COMET_CHECK(!samples.empty(), "summarize_tuning: no measurements");
  TuneSummary out;
  // Workloads in first-seen order; the fastest sample of each becomes its entry.
  std::vector<TuningKey> workloads;
  auto workload_of = [&](const TuningKey& k) {
    for (size_t i = 0; i < workloads.size(); ++i)
      if (workloads[i].same_workload_class(k) && workloads[i].tokens_per_rank == k.tokens_per_rank) return i;
    workloads.push_back(k);
    return workloads.size() - 1;
  };
  std::vector<const TuneSample*> best;
  // A candidate: n_comm0, n_comm1, the layer0 mode (copies, order) and the layer1 combine as
  // integers.
  using Candidate = std::tuple<int, int, int, int, int>;
  auto candidate_of = [](const TuneSample& s) {
    return Candidate{s.n_comm0, s.n_comm1, int(s.layer0.copies), int(s.layer0.order), int(s.layer1_combine)};
  };
  std::map<Candidate, std::pair<double, size_t>> candidate_totals;  // candidate -> (sum, workloads seen)
  std::map<Candidate, std::vector<bool>> candidate_seen;
  for (const TuneSample& s : samples) {
    const size_t w = workload_of(s.key);
    if (best.size() <= w) best.resize(w + 1, nullptr);
    if (best[w] == nullptr || s.latency_us < best[w]->latency_us) best[w] = &s;
  }
  for (const TuneSample& s : samples) {
    const size_t w = workload_of(s.key);
    auto& seen = candidate_seen[candidate_of(s)];
    seen.resize(workloads.size(), false);
    if (seen[w]) continue;  // a repeated measurement counts once
    seen[w] = true;
    auto& t = candidate_totals[candidate_of(s)];
    t.first += s.latency_us;
    ++t.second;
  }
  for (size_t w = 0; w < workloads.size(); ++w) {
    // The winning row's own unfused time: timed in the same loop as its fused time (a paired
    // comparison; a median over the other rows would set a minimum against a middle value).
    const TuningEntry entry{best[w]->key,        best[w]->n_comm0,    best[w]->n_comm1,
                            best[w]->latency_us, best[w]->unfused_us, best[w]->layer0,
                            best[w]->layer1_combine};
    out.table.add(entry);
    out.tuned_total_us += entry.latency_us;
    if (entry.unfused_us > 0) {
      ++out.path_workloads;
      out.fused_total_us += entry.latency_us;
      out.unfused_total_us += entry.unfused_us;
      out.path_total_us += entry.fused_faster() ? entry.latency_us : entry.unfused_us;  // choose_path's rule
    }
  }
  bool found = false;
  for (const auto& [candidate, t] : candidate_totals) {
    if (t.second != workloads.size()) continue;
    if (!found || t.first < out.fixed_total_us) {
      out.fixed_total_us = t.first;
      out.fixed_n_comm0 = std::get<0>(candidate);
      out.fixed_n_comm1 = std::get<1>(candidate);
      out.fixed_layer0 = {Layer0Copies(std::get<2>(candidate)), DispatchOrder(std::get<3>(candidate))};
      out.fixed_layer1_combine = Layer1Combine(std::get<4>(candidate));
      found = true;
    }
  }
  COMET_CHECK(found, "summarize_tuning: no candidate (n_comm pair, layer0 mode and layer1 combine) was measured on every "
              "workload");
  return out;
}

}  // namespace comet
