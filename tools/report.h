// tools/report.h: the small formatting vocabulary of the `comet` reports: numbers with units,
// W x W matrices, min/mean/max summaries, listings capped at --max-lines.
//
//   comet run --model qwen3-30b-a3b --ep 8 --tokens 512     (prints a byte matrix per link)
//
// Reports are for people; `--json` carries the same numbers unrounded for tools.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comet/config.h"
#include "comet/plan.h"
#include "comet/routing.h"

namespace comet::tools {

// printf-style formatting into a std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// "512 B", "3.5 KB", "1.25 MB", "2.00 GB" (powers of 1024).
std::string format_bytes(double bytes);
// "12.3 us", "4.56 ms", "1.23 s".
std::string format_us(double us);

struct IntSummary {
  int64_t min = 0, max = 0, sum = 0, count = 0;
  double mean() const { return count ? double(sum) / double(count) : 0.0; }
};
IntSummary summarize(const std::vector<int64_t>& values);

// "1,2,...": the first `limit` values, then ", ..." when there are more.
std::string list_values(const std::vector<int64_t>& values, size_t limit, const char* sep = " ");

// A W x W matrix with src rows and dst columns, right-aligned. `cell` returns the value;
// `format` turns it into text. Diagonal cells print `diagonal` when it is not empty.
void print_matrix(std::ostream& os, int world, const std::string& indent,
                  const std::function<double(int, int)>& cell,
                  const std::function<std::string(double)>& format,
                  const std::string& diagonal = "");

// Byte matrix in one unit chosen from its largest entry (KB or MB), named in `title`.
void print_byte_matrix(std::ostream& os, const std::string& title, int world,
                       const std::function<double(int, int)>& bytes);

// Prints at most max_lines lines, then "... N more <what>".
class CappedListing {
 public:
  CappedListing(std::ostream& os, int max_lines, std::string indent, std::string what)
      : os_(os), max_lines_(max_lines), indent_(std::move(indent)), what_(std::move(what)) {}
  void line(const std::string& text);
  void finish();  // prints the "... N more" line if anything was dropped

 private:
  std::ostream& os_;
  int max_lines_;
  std::string indent_, what_;
  int64_t printed_ = 0, dropped_ = 0;
};

// Shared report pieces of `run` and `plan`.
std::string config_header(const LayerConfig& config, const std::vector<int>& tokens_per_rank,
                          const RoutingSpec& routing, uint64_t seed);
nlohmann::json config_json(const LayerConfig& config, const std::vector<int>& tokens_per_rank,
                           const RoutingSpec& routing, uint64_t seed);
std::string tokens_text(const std::vector<int>& tokens_per_rank);

// Rows of each local expert on each rank (plan.expert_rows), printed one line per rank: the
// values themselves for up to 8 experts per rank, else min/mean/max and the first few.
void print_rows_per_expert(std::ostream& os, const LayerConfig& config, const DispatchPlan& plan,
                           int max_lines);
void print_rows_per_rank(std::ostream& os, const DispatchPlan& plan);
nlohmann::json rows_per_expert_json(const DispatchPlan& plan);
nlohmann::json rows_per_rank_json(const DispatchPlan& plan);

}  // namespace comet::tools
