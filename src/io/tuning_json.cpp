// Tuning tables as JSON.
#include "io/tuning_json.h"

#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/replace_file.h"
#include "io/json_text.h"

namespace comet::io {

namespace {
const std::set<std::string> kEntryKeys = {"gpu", "num_sms", "hidden", "ffn", "experts", "topk", "world", "ep",
                                          "tp", "gpus", "tokens_per_rank", "n_comm0", "n_comm1", "latency_us",
                                          "unfused_us", "layer0_copies", "dispatch_order", "layer1_combine"};
}  // namespace

std::string tuning_table_json(const TuningTable& table) {
  nlohmann::json entries = nlohmann::json::array();
  for (const TuningEntry& e : table.entries()) {
    const TuningKey& k = e.key;
    entries.push_back({{"gpu", k.gpu}, {"num_sms", k.num_sms}, {"hidden", k.hidden}, {"ffn", k.ffn},
                       {"experts", k.num_experts}, {"topk", k.topk}, {"world", k.world}, {"ep", k.ep}, {"tp", k.tp},
                       {"gpus", k.gpus}, {"tokens_per_rank", k.tokens_per_rank}, {"n_comm0", e.n_comm0}, {"n_comm1", e.n_comm1},
                       {"latency_us", e.latency_us}, {"unfused_us", e.unfused_us},
                       {"layer0_copies", layer0_copies_name(e.layer0.copies)},
                       {"dispatch_order", dispatch_order_name(e.layer0.order)},
                       {"layer1_combine", layer1_combine_name(e.layer1_combine)}});
  }
  // The GPU name is the driver's bytes, not always UTF-8 (json_text).
  return json_text(nlohmann::json{{"format", kTuningFormat}, {"entries", entries}}, 2) + "\n";
}

TuningTable parse_tuning_table(const std::string& text, const std::string& origin) {
  // nlohmann keeps the last of repeated keys, so `"n_comm0": 8, ..., "n_comm0": 16` would drop
  // the 8 without a word.
  std::optional<RepeatedJsonKey> repeated;
  nlohmann::json j;
  try {
    j = parse_json_unique_keys(text, repeated);
  } catch (const nlohmann::json::exception& e) {
    throw Error("tuning table " + origin + ": not JSON (" + e.what() + ")");
  } catch (const JsonTextError& e) {
    throw Error("tuning table " + origin + ": not JSON (" + e.what() + ")");
  }
  if (repeated) {
    const bool in_entry = repeated->depth > 1 && repeated->top_key == "entries";
    throw Error("tuning table " + origin + (in_entry ? " entry " + std::to_string(repeated->top_index) : "") +
                ": key \"" + repeated->key + "\" appears twice");
  }
  // Types first: j.value("format", "") throws nlohmann's own error, without the file name, when
  // "format" is there but not a string.
  COMET_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() &&
                  j["format"].get<std::string>() == kTuningFormat,
              "tuning table " << origin << ": \"format\" must be \"" << kTuningFormat << "\"");
  // Only the keys tuning_table_json writes: a misspelt "entries" or a setting this reader does
  // not know would otherwise be dropped without a word.
  for (const auto& [key, value] : j.items()) {
    (void)value;
    COMET_CHECK(key == "format" || key == "entries",
                "tuning table " << origin << ": unknown key \"" << key << "\" (a table has \"format\" and \"entries\")");
  }
  COMET_CHECK(j.contains("entries") && j["entries"].is_array(), "tuning table " << origin << ": no \"entries\" array");
  TuningTable table;
  int index = 0;
  for (const nlohmann::json& e : j["entries"]) {
    const std::string where = "tuning table " + origin + " entry " + std::to_string(index++);
    COMET_CHECK(e.is_object(), where << ": not an object");
    for (const auto& [key, value] : e.items()) {
      (void)value;
      COMET_CHECK(kEntryKeys.count(key), where << ": unknown key \"" << key << "\"");
    }
    // Every integer of an entry is a count or a size: within [1, max]. Read as 64 bits and
    // range-checked, since get<int>() wraps 4294967320 to 24 and 2^64 - 1 to -1.
    auto integer = [&](const char* key, int64_t max = std::numeric_limits<int>::max()) {
      COMET_CHECK(e.contains(key) && e[key].is_number_integer(), where << ": \"" << key << "\" must be an integer");
      const nlohmann::json& v = e[key];
      const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= uint64_t(max)
                                                   : v.get<int64_t>() >= 1 && v.get<int64_t>() <= max;
      COMET_CHECK(in_range, where << ": \"" << key << "\" is " << v.dump() << ", must be within [1, " << max << "]");
      return int(v.get<int64_t>());
    };
    COMET_CHECK(e.contains("gpu") && e["gpu"].is_string(), where << ": \"gpu\" must be a string");
    TuningEntry entry;
    // "gpus" came later: tables without it were measured with virtual ranks on one GPU.
    const int gpus = e.contains("gpus") ? integer("gpus") : 1;
    entry.key = {e["gpu"].get<std::string>(), integer("num_sms"), integer("hidden", kMaxModelDim),
                 integer("ffn", kMaxModelDim), integer("experts"), integer("topk"), integer("world"), integer("ep"),
                 integer("tp"), gpus, integer("tokens_per_rank")};
    // A layout that no run can have: the entry was not written by `comet tune`.
    const TuningKey& k = entry.key;
    COMET_CHECK(int64_t(k.ep) * k.tp == k.world,
                where << ": \"world\" is " << k.world << ", must be \"ep\" x \"tp\" = " << k.ep << " x " << k.tp);
    COMET_CHECK(k.topk <= k.num_experts,
                where << ": \"topk\" is " << k.topk << ", more than the " << k.num_experts << " \"experts\"");
    COMET_CHECK(k.num_experts % k.ep == 0,
                where << ": \"experts\" " << k.num_experts << " is not divisible by \"ep\" " << k.ep);
    COMET_CHECK(k.ffn % k.tp == 0, where << ": \"ffn\" " << k.ffn << " is not divisible by \"tp\" " << k.tp);
    COMET_CHECK(gpus >= 1 && entry.key.world % gpus == 0,
                where << ": \"gpus\" is " << gpus << ", must divide world (" << entry.key.world
                      << "): 1 (virtual ranks), world (one rank per GPU) or world / ranks per GPU");
    entry.n_comm0 = integer("n_comm0");
    entry.n_comm1 = integer("n_comm1");
    // The fused kernels leave the GEMM at least one SM: no run of `comet tune` writes more.
    for (const auto& [key, n] : {std::pair{"n_comm0", entry.n_comm0}, {"n_comm1", entry.n_comm1}})
      COMET_CHECK(n < k.num_sms, where << ": \"" << key << "\" is " << n << ", must be below \"num_sms\" " << k.num_sms
                                       << " (the GEMM needs an SM)");
    auto microseconds = [&](const char* key) {  // optional: 0 when absent
      if (!e.contains(key)) return 0.0;
      COMET_CHECK(e[key].is_number() && e[key].get<double>() >= 0 && std::isfinite(e[key].get<double>()),
                  where << ": \"" << key << "\" must be a finite number >= 0");
      return e[key].get<double>();
    };
    entry.latency_us = microseconds("latency_us");
    // "unfused_us" came later: without it the table cannot say the fused forward is faster.
    entry.unfused_us = microseconds("unfused_us");
    // "layer0_copies" and "dispatch_order" came later: without them the entry measured the only
    // mode there was, communication blocks in ring order.
    auto name = [&](const char* key, const char* fallback, const char* allowed) {
      if (!e.contains(key)) return std::string(fallback);
      COMET_CHECK(e[key].is_string(), where << ": \"" << key << "\" must be one of " << allowed);
      return e[key].get<std::string>();
    };
    const auto copies = parse_layer0_copies(name("layer0_copies", "blocks", "\"blocks\", \"gemm\""));
    COMET_CHECK(copies, where << ": \"layer0_copies\" must be \"blocks\" or \"gemm\"");
    const auto order = parse_dispatch_order(name("dispatch_order", "ring", "\"ring\", \"rows\""));
    COMET_CHECK(order, where << ": \"dispatch_order\" must be \"ring\" or \"rows\"");
    entry.layer0 = {*copies, *order};
    // "layer1_combine" came later still: without it the communication blocks ran the combine.
    const auto combine1 = parse_layer1_combine(name("layer1_combine", "blocks", "\"blocks\", \"gemm\""));
    COMET_CHECK(combine1, where << ": \"layer1_combine\" must be \"blocks\" or \"gemm\"");
    entry.layer1_combine = *combine1;
    // TuningTable::add replaces an entry of the same workload: a second one would silently win.
    for (size_t i = 0; i < table.entries().size(); ++i) {
      const TuningKey& old = table.entries()[i].key;
      COMET_CHECK(!(old.same_workload_class(k) && old.tokens_per_rank == k.tokens_per_rank),
                  where << ": the same workload as entry " << i << " (" << k.describe()
                        << "); a table has one entry per workload");
    }
    try {
      table.add(entry);
    } catch (const Error& err) {
      throw Error(where + ": " + err.what());
    }
  }
  return table;
}

TuningTable load_tuning_table(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  COMET_CHECK(in.good(), "tuning table " << path << ": cannot be read");
  // Read in pieces up to a bound: a path such as /dev/zero (or a runaway pipe) is refused by
  // name instead of growing memory until the allocation fails. A pipe (`--tuning <(...)`) is fine.
  std::string text;
  std::array<char, 1 << 16> piece;
  while (in.read(piece.data(), piece.size()) || in.gcount() > 0) {
    text.append(piece.data(), size_t(in.gcount()));
    COMET_CHECK(text.size() <= kMaxTuningTableBytes, "tuning table " << path << ": larger than "
                                                                      << kMaxTuningTableBytes << " bytes; not a table");
  }
  COMET_CHECK(in.eof(), "tuning table " << path << ": read failed");
  return parse_tuning_table(text, path);
}

void save_tuning_table(const TuningTable& table, const std::string& path) {
  const std::string text = tuning_table_json(table);
  replace_file(path, "tuning table", [&](std::ostream& out) { out << text; });
}

}  // namespace comet::io
