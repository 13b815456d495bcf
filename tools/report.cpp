// tools/report.cpp: formatting helpers of the `comet` reports (tools/report.h).
//
//   comet plan --model deepseek-v3 --ep 8 --tokens 1024 --max-lines 20
//
// Units are chosen once per table (from its largest entry) so that columns compare at a glance.
#include "report.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <limits>

namespace comet::tools {

std::string strf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(size_t(std::max(n, 0)), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

std::string format_bytes(double bytes) {
  if (bytes < 1024.0) return strf("%.0f B", bytes);
  if (bytes < 1024.0 * 1024.0) return strf("%.1f KB", bytes / 1024.0);
  if (bytes < 1024.0 * 1024.0 * 1024.0) return strf("%.2f MB", bytes / (1024.0 * 1024.0));
  return strf("%.2f GB", bytes / (1024.0 * 1024.0 * 1024.0));
}

std::string format_us(double us) {
  if (us < 1000.0) return strf("%.1f us", us);
  if (us < 1e6) return strf("%.2f ms", us / 1e3);
  return strf("%.2f s", us / 1e6);
}

IntSummary summarize(const std::vector<int64_t>& values) {
  IntSummary s;
  if (values.empty()) return s;
  s.min = std::numeric_limits<int64_t>::max();
  s.max = std::numeric_limits<int64_t>::min();
  for (int64_t v : values) {
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
    s.sum += v;
  }
  s.count = int64_t(values.size());
  return s;
}

std::string list_values(const std::vector<int64_t>& values, size_t limit, const char* sep) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on
  // `const char* + std::string` temporaries here.
  std::string out;
  for (size_t i = 0; i < values.size() && i < limit; ++i) {
    if (i) out.append(sep);
    out.append(std::to_string(values[i]));
  }
  if (values.size() > limit) {
    out.append(sep);
    out.append("...");
  }
  return out;
}

void print_matrix(std::ostream& os, int world, const std::string& indent,
                  const std::function<double(int, int)>& cell,
                  const std::function<std::string(double)>& format, const std::string& diagonal) {
  const size_t n = size_t(world);
  std::vector<std::vector<std::string>> text(n, std::vector<std::string>(n));
  size_t width = std::to_string(world - 1).size() + 1;
  for (int s = 0; s < world; ++s)
    for (int d = 0; d < world; ++d) {
      auto& t = text[size_t(s)][size_t(d)];
      t = (s == d && !diagonal.empty()) ? diagonal : format(cell(s, d));
      width = std::max(width, t.size());
    }
  const std::string corner = "src\\dst";
  os << indent << corner;
  for (int d = 0; d < world; ++d) os << std::string(width + 2 - std::to_string(d).size(), ' ') << d;
  os << "\n";
  for (int s = 0; s < world; ++s) {
    const std::string label = std::to_string(s);
    os << indent << std::string(corner.size() - label.size(), ' ') << label;
    for (int d = 0; d < world; ++d) {
      const auto& t = text[size_t(s)][size_t(d)];
      os << std::string(width + 2 - t.size(), ' ') << t;
    }
    os << "\n";
  }
}

void print_byte_matrix(std::ostream& os, const std::string& title, int world,
                       const std::function<double(int, int)>& bytes) {
  double largest = 0;
  for (int s = 0; s < world; ++s)
    for (int d = 0; d < world; ++d) largest = std::max(largest, bytes(s, d));
  const bool mb = largest >= 1024.0 * 1024.0;
  const double unit = mb ? 1024.0 * 1024.0 : 1024.0;
  os << title << " (" << (mb ? "MB" : "KB") << "):\n";
  print_matrix(
      os, world, "  ", bytes,
      [&](double v) { return v == 0 ? std::string("0") : strf(mb ? "%.2f" : "%.1f", v / unit); },
      "-");
}

void CappedListing::line(const std::string& text) {
  if (printed_ < max_lines_) {
    os_ << indent_ << text << "\n";
    ++printed_;
  } else {
    ++dropped_;
  }
}

void CappedListing::finish() {
  if (dropped_) os_ << indent_ << "... " << dropped_ << " more " << what_ << "\n";
  dropped_ = 0;
}

std::string tokens_text(const std::vector<int>& tokens_per_rank) {
  bool equal = std::all_of(tokens_per_rank.begin(), tokens_per_rank.end(),
                           [&](int t) { return t == tokens_per_rank.front(); });
  if (equal && !tokens_per_rank.empty()) return std::to_string(tokens_per_rank.front());
  std::string out;
  for (size_t i = 0; i < tokens_per_rank.size(); ++i) {
    if (i) out.append(",");
    out.append(std::to_string(tokens_per_rank[i]));
  }
  return out;
}

std::string config_header(const LayerConfig& c, const std::vector<int>& tokens_per_rank,
                          const RoutingSpec& routing, uint64_t seed) {
  const ModelShape& m = c.model;
  return strf("%s (H %d, F %d, E %d, topk %d, %s) | W %d = EP %d x TP %d | tokens/rank %s | "
              "routing %s | %s | tiles %dx%d/%d | seed %llu",
              m.name.c_str(), m.hidden, m.ffn, m.num_experts, m.topk,
              activation_name(m.activation), c.layout.world, c.layout.ep, c.layout.tp,
              tokens_text(tokens_per_rank).c_str(), routing.describe().c_str(), dtype_name(c.dtype), c.tiles.block_m, c.tiles.block_n0,
              c.tiles.block_n1, static_cast<unsigned long long>(seed));
}

nlohmann::json config_json(const LayerConfig& c, const std::vector<int>& tokens_per_rank,
                           const RoutingSpec& routing, uint64_t seed) {
  const ModelShape& m = c.model;
  return {
      {"model", m.name},
      {"hidden", m.hidden},
      {"ffn", m.ffn},
      {"num_experts", m.num_experts},
      {"topk", m.topk},
      {"activation", activation_name(m.activation)},
      {"world", c.layout.world},
      {"ep", c.layout.ep},
      {"tp", c.layout.tp},
      {"tokens_per_rank", tokens_per_rank},
      {"max_tokens_per_rank", c.max_tokens_per_rank},
      {"routing", routing.describe()},
      {"mask_fraction", routing.mask_fraction},
      {"dtype", dtype_name(c.dtype)},
      {"tiles", {{"block_m", c.tiles.block_m}, {"block_n0", c.tiles.block_n0},
                 {"block_n1", c.tiles.block_n1}}},
      {"seed", seed},
  };
}

void print_rows_per_expert(std::ostream& os, const LayerConfig& c, const DispatchPlan& plan,
                           int max_lines) {
  const int epr = plan.experts_per_rank();
  constexpr int kListAll = 8;  // up to this many local experts, every count is printed
  constexpr size_t kFirstFew = 6;
  os << "rows per expert (A rows of each local expert, per rank):\n";
  CappedListing listing(os, max_lines, "  ", "ranks");
  const int label_width = int(std::to_string(c.model.num_experts - 1).size());
  for (int d = 0; d < plan.world(); ++d) {
    std::vector<int64_t> rows;
    for (int e = 0; e < epr; ++e) rows.push_back(plan.expert_rows(d, e));
    const int first = c.layout.ep_index(d) * epr;
    std::string experts = epr == 1 ? strf("expert %*d", label_width, first)
                                   : strf("experts %*d-%*d", label_width, first, label_width,
                                          first + epr - 1);
    std::string text = strf("rank %-3d %s:", d, experts.c_str());
    if (epr <= kListAll) {
      text.append(" ");
      text.append(list_values(rows, kListAll));
    } else {
      const IntSummary s = summarize(rows);
      text += strf(" min %lld  mean %.1f  max %lld  | first: %s", static_cast<long long>(s.min),
                   s.mean(), static_cast<long long>(s.max), list_values(rows, kFirstFew).c_str());
    }
    listing.line(text);
  }
  listing.finish();
}

void print_rows_per_rank(std::ostream& os, const DispatchPlan& plan) {
  std::vector<int64_t> rows;
  for (int d = 0; d < plan.world(); ++d) rows.push_back(plan.rows_on_rank(d));
  const IntSummary s = summarize(rows);
  constexpr size_t kListAll = 16;
  os << strf("rows per rank: %s  (total %lld, min %lld, mean %.1f, max %lld)\n",
             list_values(rows, kListAll).c_str(), static_cast<long long>(s.sum),
             static_cast<long long>(s.min), s.mean(), static_cast<long long>(s.max));
}

nlohmann::json rows_per_expert_json(const DispatchPlan& plan) {
  nlohmann::json out = nlohmann::json::array();
  for (int d = 0; d < plan.world(); ++d) {
    std::vector<int> rows;
    for (int e = 0; e < plan.experts_per_rank(); ++e) rows.push_back(plan.expert_rows(d, e));
    out.push_back(rows);
  }
  return out;
}

nlohmann::json rows_per_rank_json(const DispatchPlan& plan) {
  std::vector<int> rows;
  for (int d = 0; d < plan.world(); ++d) rows.push_back(plan.rows_on_rank(d));
  return rows;
}

}  // namespace comet::tools
