// io/tuning_json.h: tuning tables on disk (tuning/*.json), written by `comet tune`.
//
// Format (one object; unknown keys, a key repeated in one object and two entries of one
// workload, the same GPU, shape, layout and tokens per rank, are rejected so a typo cannot
// silently drop a setting):
//   {"format": "comet-tuning-1",
//    "entries": [{"gpu": "NVIDIA H200", "num_sms": 132, "hidden": 4096, "ffn": 14336,
//                 "experts": 8, "topk": 2, "world": 8, "ep": 8, "tp": 1, "gpus": 1,
//                 "tokens_per_rank": 4096, "n_comm0": 24, "n_comm1": 20, "latency_us": 1234.5,
//                 "unfused_us": 1300.0, "layer0_copies": "blocks", "dispatch_order": "ring",
//                 "layer1_combine": "blocks"}]}
// "gpus" (TuningKey::gpus: 1, world, or a divisor between) may be absent: 1, as in tables
// written before it existed.
// "latency_us" (the fused forward) and "unfused_us" (the unfused forward, same run) may be
// absent: 0, not measured; an entry without both never chooses the fused path (choose_path).
// "layer0_copies" ("blocks" | "gemm"), "dispatch_order" ("ring" | "rows") and "layer1_combine"
// ("blocks" | "gemm") may be absent: "blocks", "ring" and "blocks", the only modes there were
// when such tables were written. A reader older than a key refuses the table (unknown key).
#pragma once

#include <cstddef>
#include <string>

#include "comet/tuning.h"

namespace comet::io {

inline constexpr const char* kTuningFormat = "comet-tuning-1";

std::string tuning_table_json(const TuningTable& table);
// Throws comet::Error naming the file (or "<text>"), the entry and the bad field: a wrong
// type, an integer outside [1, INT_MAX] (H and F: [1, kMaxModelDim]), a layout no run has
// (world != ep x tp, topk > experts, E % EP, F % TP), a time that is negative or not finite, a
// key that appears twice in one object, an entry of the same workload as an earlier one.
TuningTable parse_tuning_table(const std::string& text, const std::string& origin = "<text>");
// The largest file load_tuning_table reads (a table of every preset, layout and token count
// is well under 1 MB).
inline constexpr size_t kMaxTuningTableBytes = size_t(64) << 20;
TuningTable load_tuning_table(const std::string& path);
// Through replace_file (`path`.tmp renamed over `path`): a failed write leaves the old
// table whole.
void save_tuning_table(const TuningTable& table, const std::string& path);

}  // namespace comet::io
